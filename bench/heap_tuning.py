"""Heap tuning (``retain_freed_memory``) off and on: MAGRPO step time and memory side by side.

Each configuration runs bench/magrpo_step.py's worker in a fresh process, once with
``retain_freed_memory: false`` (glibc's defaults throughout) and once with the default
``true`` (freed memory kept in the heap while ``train()`` runs, handed back when it
returns: :func:`comlrl_core.models.cpu.heap.retained_heap`). Printed per model: mean step
time after the warm-up step, peak RSS, and the RSS left once training is over (what a
longer-lived host process, a notebook, keeps).

    .venv/bin/python bench/heap_tuning.py                          # tiny and SmolLM2, full fine-tuning
    .venv/bin/python bench/heap_tuning.py --models tiny --steps 4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def worker(spec: dict) -> dict:
    sys.path.insert(0, HERE)
    import magrpo_step

    result = magrpo_step.worker(dict(spec, retain_freed_memory=spec["heap"] == "retained"))
    with open("/proc/self/statm") as f:
        result["rss_after_gib"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    return result


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--models", default="tiny,smollm2", help="comma list of: tiny, smollm2")
    ap.add_argument("--mode", default="full", choices=["full", "lora"])
    ap.add_argument("--steps", type=int, default=3, help="task items per run (first = warm-up)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=3600)
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0

    sys.path.insert(0, HERE)
    import magrpo_step

    print(f"CPU: {cpu_model()}, {args.threads} threads, python {platform.python_version()}")
    failed = False
    for key in args.models.split(","):
        base = dict(
            model=magrpo_step.MODELS[key],
            mode=args.mode,
            precision="fp32",
            env="comlrl/CoopCode-v0",
            sandbox="process",
            steps=args.steps,
            G=4,
            T=2,
            max_new_tokens=48,
            rollout_buffer_size=2,
            micro_batch=16,
            threads=args.threads,
        )
        rows = {}
        for heap in ("glibc", "retained"):
            result = magrpo_step.run_subprocess(
                sys.executable, os.path.abspath(__file__), dict(base, heap=heap), args.timeout
            )
            line = magrpo_step.summarize(result)
            if "error" not in result:
                line += f", RSS after training {result['rss_after_gib']:.2f} GiB"
            else:
                failed = True
            rows[heap] = result
            print(f"{key:8s} {args.mode:5s} heap={heap:9s} {line}", flush=True)
        if all("step_mean_s" in r for r in rows.values()):
            ratio = rows["glibc"]["step_mean_s"] / rows["retained"]["step_mean_s"]
            print(f"{key:8s} {args.mode:5s} retained heap: {ratio:.2f}x the speed of glibc's defaults")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
