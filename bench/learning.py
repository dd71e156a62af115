"""Does every learner learn? Held-out team reward before / after a fixed small budget.

For each learner and each seed (fixed up front), a fresh ``comlrl train`` subprocess trains
on ``comlrl/Writing-v0`` from the learner's shipped config (``configs/<learner>_writing.yaml``)
with the budget below, and the trainer's own evaluation (the episode engine) plays the
held-out tasks twice: once before the first update and once when training ends
(``eval_interval`` far beyond the budget, so only those two). The held-out tasks are the
first ``--eval-tasks`` of the config's ``eval_task_slice`` (the last 40 passages), disjoint
from ``train_task_slice``; each is played ``--eval-samples`` times with the same
per-episode seeds before and after, so episode ``(task, sample)`` pairs up and
:func:`comlrl_core.episodes.intervals.compare_episode_rows` gives the difference with its
paired bootstrap 95 % interval (problems resampled).

Where the "before" evaluation is: the run folder's first evaluation, except MARLHF
(``rl/``: the RL backend evaluates before its first update, after the reward model is fit)
and iterative MARLHF (``rl/iteration_0000/``); the "after" is always the run folder's last.
Preference learners collect their pairs before that first evaluation, but collecting does
not change the policies.

Every learner plays single-turn episodes here (``num_turns=1``; the preference learners are
single-turn only), so the team reward is the same quantity in every row. The budget per
learner (``--steps`` = S):

- MAGRPO family: S task items, 4 generations each, an update every 2 items;
- IAC / MAAC: S task items, one episode each, an update every 2 items;
- MADPO: pairs from S training tasks (4 candidates, 2 pairs each), one epoch of batch 2;
- MARLHF: pairs from S tasks, a reward model fit for one epoch, then S MAGRPO task items;
- the iterative ones: 2 rounds of S // 2 tasks (MARLHF-iter: S // 2 RL items a round).

``--learning-rate`` sets the agents' rate for every learner (default 5e-4: the configs'
5e-5 moves a LoRA adapter too little to show in a handful of updates); ``config`` keeps
each config's own rate.

    nice -n 19 .venv/bin/python bench/learning.py --out runs/learning.md
    .venv/bin/python bench/learning.py --quick      # tiny random model, 2 learners, seconds
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import math
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from comlrl_core.episodes.intervals import DiffInterval, compare_episode_rows  # noqa: E402
from learners.common.evaluation import read_eval_episodes  # noqa: E402

ENV_ID = "comlrl/Writing-v0"
#: evaluate at step 0 and at the end only (the budget never reaches this step)
BEFORE_AND_AFTER = 10**9

#: learner -> name in the table
LEARNERS: dict[str, str] = {
    "magrpo": "MAGRPO",
    "mareinforce": "MAREINFORCE",
    "marloo": "MARLOO",
    "maremax": "MAReMax",
    "iac": "IAC",
    "maac": "MAAC",
    "madpo": "MADPO",
    "madpo_iter": "MADPO-iter",
    "marlhf": "MARLHF (magrpo)",
    "marlhf_iter": "MARLHF-iter",
}
QUICK_LEARNERS = ("magrpo", "madpo")
MAGRPO_FAMILY = ("magrpo", "mareinforce", "marloo", "maremax")


@dataclass(frozen=True)
class Budget:
    """What every run gets (see the module docstring for the per-learner meaning of ``steps``)."""

    steps: int = 8
    max_new_tokens: int = 32
    eval_tasks: int = 12
    eval_samples: int = 2
    model: str = "smollm2-135m-instruct"
    learning_rate: float | None = 5e-4  # None: each config's own
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        for name in ("steps", "max_new_tokens", "eval_tasks", "eval_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.steps < 2:
            raise ValueError("--steps must be >= 2 (the iterative learners split it over 2 rounds)")


def learner_overrides(learner: str, budget: Budget) -> dict[str, Any]:
    """The learner-specific ``key=value`` options that size its run to ``budget``."""
    s, half = budget.steps, max(1, budget.steps // 2)
    pairs = {"preference_num_candidates": 4, "preference_pairs_per_sample": 2, "preference_task_batch_size": 4}
    if learner in MAGRPO_FAMILY:
        return {"num_turns": 1, "max_steps": s, "num_generations": 4, "rollout_buffer_size": 2}
    if learner in ("iac", "maac"):
        return {"num_turns": 1, "max_steps": s, "num_generations": 1, "rollout_buffer_size": 2}
    if learner == "madpo":
        return {**pairs, "preference_max_tasks": s, "num_train_epochs": 1, "train_batch_size": 2}
    if learner == "madpo_iter":
        return {**pairs, "preference_max_tasks": half, "num_iterations": 2, "train_batch_size": 2}
    if learner == "marlhf":
        return {
            **pairs,
            "preference_max_tasks": s,
            "reward_num_train_epochs": 1,
            "max_steps": s,
            "rollout_buffer_size": 2,
        }
    if learner == "marlhf_iter":
        return {
            **pairs,
            "preference_max_tasks": half,
            "num_iterations": 2,
            "reward_num_train_epochs": 1,
            "max_steps": half,
            "rollout_buffer_size": 2,
        }
    raise ValueError(f"unknown learner {learner!r}; choose from {', '.join(LEARNERS)}")


def train_command(learner: str, budget: Budget, seed: int, run_dir: pathlib.Path) -> list[str]:
    """The ``comlrl train`` command line of one run."""
    options: dict[str, Any] = {
        **learner_overrides(learner, budget),
        "max_new_tokens": budget.max_new_tokens,
        "eval_interval": BEFORE_AND_AFTER,
        "eval_num_samples": budget.eval_tasks,
        "eval_episodes_per_task": budget.eval_samples,
        "agent_models": f"[{budget.model}]",
        "lora": "true",
        "seed": seed,
        "output_dir": str(run_dir),
        "progress_bar": "false",
    }
    if learner not in ("iac", "maac"):  # the actor-critic trainers always write their final checkpoint
        options["save_final_checkpoint"] = "false"
    if budget.learning_rate is not None:
        options["agent_learning_rate"] = budget.learning_rate
    config = ROOT / "configs" / f"{learner}_writing.yaml"
    return [
        sys.executable,
        "-m",
        "comlrl_core.cli",
        "train",
        learner,
        "--env",
        ENV_ID,
        "--config",
        str(config),
        *(f"{k}={v}" for k, v in options.items()),
    ]


@dataclass
class RunResult:
    learner: str
    seed: int
    wall_s: float
    interval: DiffInterval | None = None
    error: str | None = None
    log: str = ""

    @property
    def improved(self) -> bool:
        return self.interval is not None and self.interval.difference > 0


def before_after(learner: str, run_dir: pathlib.Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The held-out episode rows before the first update and after training."""
    finals = read_eval_episodes(run_dir)
    if not finals:
        raise ValueError(f"no evaluation in {run_dir}")
    if learner == "marlhf":
        firsts = read_eval_episodes(run_dir / "rl")
    elif learner == "marlhf_iter":
        rounds = sorted(p for p in (run_dir / "rl").glob("iteration_*") if p.is_dir())
        firsts = read_eval_episodes(rounds[0]) if rounds else []
    else:
        firsts = finals if len(finals) >= 2 else []
    if not firsts:
        raise ValueError(f"no evaluation before training in {run_dir}")
    return firsts[0], finals[-1]


def _last_line(path: pathlib.Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(empty log)"


def run_one(learner: str, seed: int, budget: Budget, root: pathlib.Path, threads: int | None = None) -> RunResult:
    """Train one (learner, seed) in a fresh subprocess and compare its two evaluations
    (``threads``: the subprocess's OpenMP / torch thread count; None: its default)."""
    run_dir = root / f"{learner}_seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "train.log"
    command = train_command(learner, budget, seed, run_dir)
    env = dict(os.environ)
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    t0 = time.perf_counter()
    with log.open("w") as fh:
        fh.write(shlex.join(command) + "\n")
        fh.flush()
        try:
            rc = subprocess.run(
                command,
                stdout=fh,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                timeout=budget.timeout_s,
                check=False,
                env=env,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    wall = time.perf_counter() - t0
    result = RunResult(learner, seed, wall, log=str(log))
    if rc != 0:
        result.error = f"exit {rc}" if rc != -1 else f"timed out after {budget.timeout_s:.0f} s"
        result.error += f": {_last_line(log)}"
        return result
    try:
        before, after = before_after(learner, run_dir)
        result.interval = compare_episode_rows(before, after)["return_mean"]
    except (ValueError, KeyError) as err:
        result.error = str(err)
    return result


def _fmt(x: float) -> str:
    return f"{x:+.3f}" if x < 0 or x > 0 else "0.000"


def table_lines(results: Sequence[RunResult]) -> list[str]:
    """One markdown row per run."""
    lines = [
        "| learner | seed | before | after | after - before [95% CI] | improved | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        name = LEARNERS[r.learner]
        if r.interval is None:
            lines.append(f"| {name} | {r.seed} | - | - | failed: {r.error} | - | {r.wall_s:.0f} |")
            continue
        i = r.interval
        diff = f"{_fmt(i.difference)} [{_fmt(i.low)}, {_fmt(i.high)}]"
        mark = "yes" if i.difference > 0 else ("no change" if i.difference == 0 else "no")
        lines.append(f"| {name} | {r.seed} | {i.before:.3f} | {i.after:.3f} | {diff} | {mark} | {r.wall_s:.0f} |")
    return lines


def summary_lines(results: Sequence[RunResult]) -> list[str]:
    """Per learner over its seeds: mean difference, seeds improved, seeds whose interval is above 0."""
    lines = [
        "| learner | seeds run | mean after - before | seeds improved | interval above 0 | interval below 0 |"
        " mean wall s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    by_learner: dict[str, list[RunResult]] = {}
    for r in results:
        by_learner.setdefault(r.learner, []).append(r)
    for learner, runs in by_learner.items():
        done = [r.interval for r in runs if r.interval is not None]
        mean = _fmt(math.fsum(i.difference for i in done) / len(done)) if done else "-"
        up = sum(i.difference > 0 for i in done)
        above = sum(i.low > 0 for i in done)
        below = sum(i.high < 0 for i in done)
        wall = math.fsum(r.wall_s for r in runs) / len(runs)
        lines.append(
            f"| {LEARNERS[learner]} | {len(done)}/{len(runs)} | {mean} | {up}/{len(done)} | {above} | {below} |"
            f" {wall:.0f} |"
        )
    return lines


def cpu_model() -> str:
    """``lscpu``'s model name."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown (no lscpu)"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--learners", type=_csv(str), default=list(LEARNERS), help="comma list (default: all ten)")
    p.add_argument("--seeds", type=_csv(int), default=[0, 1, 2], help="comma list (default 0,1,2)")
    p.add_argument("--steps", type=int, default=Budget.steps)
    p.add_argument("--max-new-tokens", type=int, default=Budget.max_new_tokens)
    p.add_argument("--eval-tasks", type=int, default=Budget.eval_tasks, help="held-out tasks per evaluation")
    p.add_argument("--eval-samples", type=int, default=Budget.eval_samples, help="episodes per held-out task")
    p.add_argument("--model", default=Budget.model, help="agent model alias or path (LoRA adapters on it)")
    p.add_argument("--learning-rate", default="5e-4", help="agents' learning rate, or 'config' for each config's")
    p.add_argument("--timeout", type=float, default=Budget.timeout_s, help="seconds per run")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (each gets cores // jobs threads)")
    p.add_argument("--run-root", help="folder for the run folders (default: a fresh temporary folder)")
    p.add_argument("--out", help="also write the tables as markdown to this file")
    p.add_argument("--quick", action="store_true", help="tiny random model, 2 steps, seed 0, MAGRPO and MADPO")
    args = p.parse_args(argv)
    if args.quick:
        args.learners, args.seeds, args.steps, args.model = list(QUICK_LEARNERS), [0], 2, "tiny-random"
        args.max_new_tokens, args.eval_tasks = 8, 2
    if args.jobs < 1:
        p.error(f"--jobs must be >= 1, got {args.jobs}")
    unknown = [x for x in args.learners if x not in LEARNERS]
    if unknown:
        p.error(f"unknown learner(s) {', '.join(unknown)}; choose from {', '.join(LEARNERS)}")
    return args


def main(argv: Sequence[str] | None = None, log: Callable[[str], None] = print) -> list[RunResult]:
    args = parse_args(argv)
    rate = None if args.learning_rate == "config" else float(args.learning_rate)
    budget = Budget(
        steps=args.steps,
        max_new_tokens=args.max_new_tokens,
        eval_tasks=args.eval_tasks,
        eval_samples=args.eval_samples,
        model=args.model,
        learning_rate=rate,
        timeout_s=args.timeout,
    )
    root = pathlib.Path(args.run_root or tempfile.mkdtemp(prefix="learning_bench_"))
    # concurrent runs share the cores instead of each starting one thread per core
    threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None
    head = [
        f"CPU: {cpu_model()} ({os.cpu_count()} logical cores), niceness {os.nice(0)}",
        f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"command: {shlex.join(['bench/learning.py', *(argv if argv is not None else sys.argv[1:])])}",
        f"env {ENV_ID}, model {budget.model} + LoRA, steps {budget.steps}, max_new_tokens "
        f"{budget.max_new_tokens}, held-out {budget.eval_tasks} tasks x {budget.eval_samples} samples, "
        f"agent learning rate {'config' if rate is None else rate}, seeds {args.seeds}, "
        f"{args.jobs} run(s) at a time" + (f" ({threads} thread(s) each)" if threads else ""),
        f"run folders: {root}",
    ]
    for line in head:
        log(line)
    results: list[RunResult] = []
    # seed by seed, every learner in each: a run cut short still has every learner's first seeds
    plan = [(learner, seed) for seed in args.seeds for learner in args.learners]
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_one, learner, seed, budget, root, threads) for learner, seed in plan]
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            results.append(result)
            log(table_lines([result])[-1])  # progress, one row per finished run
            if args.out:  # rewritten after every run, so an interrupted bench leaves its rows
                _write_markdown(pathlib.Path(args.out), head, _tables(results))
    tables = _tables(results)
    for line in tables:
        log(line)
    return results


def _tables(results: Sequence[RunResult]) -> list[str]:
    ordered = sorted(results, key=lambda r: (list(LEARNERS).index(r.learner), r.seed))
    tables = ["", "Per run (team reward on held-out tasks; paired bootstrap over tasks):", ""]
    tables += table_lines(ordered)
    tables += ["", "Per learner over seeds:", ""]
    return tables + summary_lines(ordered)


def _write_markdown(path: pathlib.Path, head: Sequence[str], tables: Sequence[str]) -> None:
    path.write_text("\n".join([*(f"- {h}" for h in head), *tables]) + "\n")


if __name__ == "__main__":
    failed = any(r.interval is None for r in main())
    sys.exit(1 if failed else 0)
