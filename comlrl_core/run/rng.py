"""Capture and restore every random number generator a run depends on.

A state covers Python's ``random``, NumPy's global (legacy) generator, torch's CPU
generator, every CUDA device's generator when CUDA is initialised, and any named
``torch.Generator`` / ``numpy.random.Generator`` objects a trainer owns. After
:func:`restore_rng_state` the next draws equal those that followed the capture.

The state is made only of tensors, ints, strings, lists and dicts, so it can be saved
with ``torch.save`` and read back with ``torch.load(weights_only=True)`` (no pickled
code runs on load).
"""

from __future__ import annotations

import json
import random
import warnings
from typing import Any, Mapping

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state", "RNG_STATE_VERSION"]

RNG_STATE_VERSION = 1


def _python_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    return {"version": version, "internal": list(internal), "gauss": gauss}


def _numpy_legacy_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "name": name,
        "keys": [int(k) for k in keys],
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def _capture_generator(name: str, gen: Any) -> dict[str, Any]:
    if isinstance(gen, torch.Generator):
        return {"kind": "torch", "device": str(gen.device), "state": gen.get_state()}
    if isinstance(gen, np.random.Generator):
        # PCG64 state ints exceed 64 bits: keep the dict as JSON text.
        return {"kind": "numpy", "state": json.dumps(gen.bit_generator.state)}
    raise TypeError(f"generator {name!r} must be a torch.Generator or numpy.random.Generator, got {type(gen).__name__}")


def capture_rng_state(generators: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Snapshot of all global generators plus the named ``generators``."""
    state: dict[str, Any] = {
        "version": RNG_STATE_VERSION,
        "python": _python_state(),
        "numpy": _numpy_legacy_state(),
        "torch_cpu": torch.get_rng_state(),
        "torch_cuda": None,
        "generators": {name: _capture_generator(name, g) for name, g in (generators or {}).items()},
    }
    # Only when CUDA is already in use: capturing must not initialise a CUDA context.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(
    state: Mapping[str, Any], generators: Mapping[str, Any] | None = None, *, restore_globals: bool = True
) -> None:
    """Put the generators back to ``state``; the named ``generators`` must all be in it.

    ``restore_globals=False`` restores only the named generators.
    """
    if state.get("version") != RNG_STATE_VERSION:
        raise ValueError(f"unsupported RNG state version {state.get('version')!r} (expected {RNG_STATE_VERSION})")
    saved = state.get("generators", {})
    missing = sorted(set(generators or {}) - set(saved))
    if missing:
        raise KeyError(f"no saved state for generator(s) {missing}; saved: {sorted(saved)}")
    if restore_globals:
        _restore_globals(state)
    for name, gen in (generators or {}).items():
        _restore_generator(name, gen, saved[name])


def _restore_globals(state: Mapping[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(
        (npy["name"], np.asarray(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    )
    torch.set_rng_state(state["torch_cpu"])
    cuda_states = state.get("torch_cuda")
    if cuda_states:
        if not torch.cuda.is_available():
            warnings.warn("the saved CUDA RNG states are not restored: CUDA is not available here", stacklevel=2)
        elif torch.cuda.device_count() != len(cuda_states):
            warnings.warn(
                f"CUDA RNG states saved for {len(cuda_states)} device(s), {torch.cuda.device_count()} here: "
                "restoring the common ones",
                stacklevel=2,
            )
            for index, s in enumerate(cuda_states[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(s, index)
        else:
            torch.cuda.set_rng_state_all(cuda_states)


def _restore_generator(name: str, gen: Any, entry: Mapping[str, Any]) -> None:
    if isinstance(gen, torch.Generator):
        if entry["kind"] != "torch":
            raise TypeError(f"generator {name!r} was saved as a {entry['kind']} generator, got a torch.Generator")
        gen.set_state(entry["state"])
    elif isinstance(gen, np.random.Generator):
        if entry["kind"] != "numpy":
            raise TypeError(f"generator {name!r} was saved as a {entry['kind']} generator, got a numpy Generator")
        gen.bit_generator.state = json.loads(entry["state"])
    else:
        raise TypeError(f"generator {name!r} must be a torch.Generator or numpy.random.Generator")
