"""What handing freed memory back costs: paging it in again, with 4 KiB and 2 MiB pages.

``release_freed_memory`` (docs/performance.md) returns the allocator's free memory to the
OS between phases; the next phase then page-faults its memory in again. This prints, per
allocator and page size, the seconds to allocate and fill 80 tensors of 12 MiB (960 MiB)
four times, with the memory reused between rounds (``kept``) or released (``released``).
Every case runs in a fresh process (the allocator and ``THP_MEM_ALLOC_ENABLE`` are read at
start-up)::

    .venv/bin/python bench/page_in.py            # glibc and, when installed, tcmalloc
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TENSORS, ELEMENTS, ROUNDS = 80, 3 << 20, 4  # 80 x 12 MiB


def worker(release: bool) -> dict:
    import torch

    from comlrl_core.models.cpu.memory_stats import release_free_memory

    torch.set_num_threads(1)
    seconds = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        tensors = [torch.empty(ELEMENTS).fill_(1.0) for _ in range(TENSORS)]
        seconds.append(time.perf_counter() - t0)
        del tensors
        if release:
            release_free_memory()
    return {"seconds": seconds}


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        print("RESULT " + json.dumps(worker(sys.argv[2] == "released")), flush=True)
        return 0
    from comlrl_core.models.cpu.allocator import find_library, preload_env
    from comlrl_core.models.precision import cpu_model_name

    print(f"CPU: {cpu_model_name()}; {TENSORS} x {ELEMENTS * 4 >> 20} MiB filled, {ROUNDS} rounds, 1 thread")
    allocators = ["glibc"] + (["tcmalloc"] if find_library("tcmalloc") else [])
    for allocator in allocators:
        for pages, thp in (("4 KiB", "0"), ("2 MiB", "1")):
            for mode in ("kept", "released"):
                env = {**preload_env(allocator), "THP_MEM_ALLOC_ENABLE": thp, "PYTHONPATH": ROOT}
                out = subprocess.run(
                    [sys.executable, __file__, "--worker", mode], capture_output=True, text=True, env=env, check=True
                )
                line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
                seconds = json.loads(line[len("RESULT ") :])["seconds"]
                later = seconds[1:]
                print(
                    f"{allocator:8s} {pages} pages, memory {mode:8s}: first round {seconds[0]:.3f} s, "
                    f"later rounds {min(later):.3f}-{max(later):.3f} s"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
