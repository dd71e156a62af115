"""Cost of the per-step NaN/Inf guard (``find_nonfinite_state``) on an AdamW optimizer.

Prints, side by side, the guard as shipped (one sum per tensor, exact check only for a
non-finite sum) and a plain element-wise ``isfinite(t).all()`` per tensor, for the
parameters and both AdamW moments of a model of ``--params`` million weights.

    .venv/bin/python bench/nonfinite_check.py --params 133
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import time

import torch

from comlrl_core.run.checkpoint import find_nonfinite_state


def _cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown CPU"


def _elementwise(opt: torch.optim.Optimizer) -> bool:
    tensors = [p for g in opt.param_groups for p in g["params"]]
    tensors += [v for s in opt.state.values() for v in s.values() if v.is_floating_point()]
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _time(fn, repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=float, default=133, help="millions of trainable weights")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shape = (576, 1536)  # one SmolLM2-135M-sized projection
    count = max(1, round(args.params * 1e6 / (shape[0] * shape[1])))
    params = [torch.nn.Parameter(torch.randn(shape)) for _ in range(count)]
    opt = torch.optim.AdamW(params, lr=1e-5)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    shipped = _time(lambda: find_nonfinite_state({"agent_0": opt}), args.repeats)
    plain = _time(lambda: _elementwise(opt), args.repeats)
    print(f"CPU: {_cpu_name()}; torch threads: {torch.get_num_threads()}")
    print(f"{count * shape[0] * shape[1] / 1e6:.0f}M weights + AdamW moments, per check:")
    print(f"  find_nonfinite_state (sum screen): {shipped * 1000:8.1f} ms")
    print(f"  isfinite(t).all() per tensor:      {plain * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
