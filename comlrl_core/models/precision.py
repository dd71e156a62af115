"""Whether bf16 mixed precision pays on a device, and a warning where it does not.

Public API::

    cpu_bf16_hardware() -> bool | None
        True / False on x86 Linux (AVX512-BF16 or AMX-BF16 in /proc/cpuinfo) and on ARM
        Linux (the ``bf16`` feature); None where the check can't tell (other systems).
    device_bf16_hardware(device: str) -> bool | None
        the same for a device string ("auto", "cpu", "cuda", "cuda:N"); CUDA asks torch.
    warn_if_bf16_is_slow(device: str, stacklevel: int = 2) -> bool
        logs a WARNING and issues a ``warnings.warn`` (once per process and device kind)
        when ``mixed_precision='bf16'`` would run on a device without bf16 hardware;
        returns whether it warned. ``stacklevel`` as in ``warnings.warn``, counted from
        the caller.

Why it matters: without bf16 matrix instructions the CPU's bf16 products are emulated
(each operand converted to fp32 and back), so bf16 autocast makes every step slower, not
faster. Measured on a 2-core AMD EPYC without AVX512-BF16 or AMX (issue 15): a MAGRPO run
under ``mixed_precision: bf16`` was more than 3x slower than the same run in fp32.
"""

from __future__ import annotations

import logging
import platform
import sys
import warnings

logger = logging.getLogger(__name__)

_CPUINFO = "/proc/cpuinfo"
# x86 flags for bf16 matrix hardware: AVX512-BF16 (Cooper Lake, Zen 4 and later) and AMX (Sapphire Rapids and later)
_X86_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
_X86_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686"})
_ARM_MACHINES = frozenset({"aarch64", "arm64"})

# device kinds ("cpu", "cuda") already warned about in this process
_warned: set[str] = set()

SLOW_BF16_MESSAGE = (
    "mixed_precision='bf16' on {where}: this runs SLOWER than fp32 here, not faster. The device "
    "has no bf16 matrix hardware ({why}), so every bf16 product is emulated through fp32 "
    "conversions. Measured on a 2-core AMD EPYC without bf16 hardware: a MAGRPO run under "
    "bf16 mixed precision was more than 3x slower than in fp32. Use mixed_precision='no' "
    "(fp32) on this machine; bf16 pays on CPUs with AMX-BF16 or AVX512-BF16 and on GPUs that "
    "support it (see docs/performance.md, 'Mixed precision on CPU')."
)


def _read_cpuinfo() -> str:
    """The text of /proc/cpuinfo ('' where there is none); the tests replace it."""
    try:
        with open(_CPUINFO, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _first_field(cpuinfo: str, names: tuple[str, ...]) -> str | None:
    """The value of the first ``name : value`` line of /proc/cpuinfo whose name is in ``names``."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in names:
            return value.strip()
    return None


def _machine() -> str:
    return platform.machine().lower()


def cpu_model_name() -> str:
    """The CPU's model name from /proc/cpuinfo (x86: 'model name'), or platform's guess."""
    name = _first_field(_read_cpuinfo(), ("model name",))
    return name or platform.processor() or _machine() or "unknown CPU"


def cpu_bf16_hardware() -> bool | None:
    """Whether this CPU has bf16 matrix instructions; None where the check can't tell."""
    if not sys.platform.startswith("linux"):
        return None
    machine = _machine()
    cpuinfo = _read_cpuinfo()
    if machine in _X86_MACHINES:
        flags = _first_field(cpuinfo, ("flags",))
        return None if flags is None else bool(_X86_BF16_FLAGS & set(flags.split()))
    if machine in _ARM_MACHINES:
        features = _first_field(cpuinfo, ("features",))
        return None if features is None else "bf16" in features.split()
    return None


def _device_type(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device).type


def device_bf16_hardware(device: str) -> bool | None:
    """Whether ``device`` ("auto", "cpu", "cuda[:N]") computes bf16 in hardware; None: unknown."""
    import torch

    kind = _device_type(device)
    if kind == "cpu":
        return cpu_bf16_hardware()
    if kind == "cuda":
        if not torch.cuda.is_available():
            return None  # building the model on it fails with its own message
        return bool(torch.cuda.is_bf16_supported())
    return None


def warn_if_bf16_is_slow(device: str, stacklevel: int = 2) -> bool:
    """Warn (once per process and device kind) when bf16 mixed precision would run on
    ``device`` without bf16 hardware. Returns whether it warned this time. ``stacklevel``:
    which frame the warning names, as in ``warnings.warn`` seen from the caller."""
    if device_bf16_hardware(device) is not False:
        return False
    kind = _device_type(device)
    if kind in _warned:
        return False
    _warned.add(kind)
    if kind == "cpu":
        where = f"the CPU {cpu_model_name()!r}"
        why = "neither avx512_bf16 nor amx_bf16 among the /proc/cpuinfo flags"
        if _machine() in _ARM_MACHINES:
            why = "no bf16 among the /proc/cpuinfo features"
    else:
        where = f"CUDA device {device!r}"
        why = "torch.cuda.is_bf16_supported() is False"
    message = SLOW_BF16_MESSAGE.format(where=where, why=why)
    logger.warning(message)
    warnings.warn(message, UserWarning, stacklevel=stacklevel + 1)
    return True
