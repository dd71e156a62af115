"""``comlrl main``: the library's main job, end to end, on an embedded default.

It trains two SmolLM2-135M-Instruct agents (one shared frozen base, one LoRA adapter
each) with MAGRPO on ``comlrl/CoopCode-v0`` (the package's easy cooperative problem set,
``level_feedback``, 2 turns, Docker sandbox), evaluating the team before and after training
on held-out problems: tasks ``0:36`` train, ``36:`` (36 problems x 2 samples) held out.
The defaults are sized to finish within about 20 minutes on 2 CPU cores; on a machine
with CUDA the same command places the agents on the GPU (``magrpo.device=None`` means
CUDA when present).

The run folder (``--out``, default ``runs/main``) receives:

* ``metrics.jsonl`` -- training and evaluation metrics (``turn_t/reward_mean``, ``level/...``,
  ``eval/...``);
* ``eval_episodes.jsonl`` -- every held-out episode of each evaluation (the pairing data);
* ``reward_curve.png`` -- the training team reward (raw and smoothed) and each reward level
  per step; ``eval_components.png`` -- the held-out metrics before / after and the
  difference with its paired bootstrap 95% interval;
* ``eval.md`` and ``eval.json`` -- the evaluation table (before, after, difference, 95%
  interval), the episode count, the seed and the command;
* ``checkpoints/`` -- the final checkpoint (adapters, optimizers, RNG states, cursor);
* ``config.yaml`` -- the exact options of the run.

Every option can be changed with ``key=value`` (nested MAGRPO options as
``magrpo.num_generations=4``) or a YAML file (``--config``); ``--print-config`` shows them.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping

from comlrl_core.cli import add_debug_flag
from comlrl_core.config.options import BaseConfig, ConfigError, check_positive, option
from comlrl_core.episodes.intervals import DiffInterval, compare_episode_rows
from comlrl_core.models.cpu import fp32_layout
from comlrl_core.models.cpu.allocator import loaded_allocator
from comlrl_core.models.precision import cpu_model_name
from learners.common.evaluation import read_eval_episodes
from learners.common.options import report_to_backends
from learners.common.preflight import check_output_dir
from learners.magrpo.magrpo_config import MAGRPOConfig


def _default_magrpo() -> MAGRPOConfig:
    return MAGRPOConfig(
        agent_models=["smollm2-135m-instruct"],
        num_agents=2,
        lora=True,
        lora_r=8,
        lora_alpha=16,
        num_generations=2,
        num_turns=2,
        joint_mode="aligned",
        max_new_tokens=96,
        # a reply ends at its closing code fence (the prose after it is never scored)
        stop=["\n```\n"],
        temperature=0.8,
        top_p=0.95,
        top_k=50,
        agent_learning_rate=2e-4,
        # 4 task items' trees sampled together per step (batches 4x larger), 7 steps = 28
        # training problems (about 105 s a step on 2 cores); an update every 4 node groups
        # (3 per agent per step)
        tasks_per_step=4,
        max_steps=28,
        rollout_buffer_size=4,
        # memory (docs/performance.md): LoRA updates of at most 1024 padded tokens, each
        # group's prompt encoded once (no gradient checkpointing: it would switch that off
        # and double the update time), sampling calls of at most 12288 tokens (a KV cache of
        # at most ~0.55 GiB) with the prefill in chunks
        logprob_token_budget=1024,
        generation_token_budget=12288,
        # freed memory back to the OS after each sampling call, phase and scored group: peak
        # RSS 2.40 instead of 2.74 GiB for about a fifth more time (docs/performance.md)
        release_freed_memory="micro_batch",
        train_task_slice="0:36",  # envs.code.tasks.EASY_TRAIN_SLICE (tested)
        eval_interval=0,  # the main job evaluates before and after, on the held-out split
        logging_steps=1,
        save_final_checkpoint=True,
        seed=7,
    )


@dataclass
class MainJobConfig(BaseConfig):
    """Options of ``comlrl main`` (the MAGRPO options are nested under ``magrpo``)."""

    env_id: str = option("comlrl/CoopCode-v0", help="registered environment id")
    env_kwargs: dict[str, Any] = option(
        {"dataset": "easy", "external_transition": "level_feedback", "sandbox_backend": "docker"},
        help="environment keyword arguments, shared by training and evaluation",
    )
    eval_task_slice: str = option("36:", help="held-out problems (task_slice of the evaluation env)")
    eval_num_tasks: int = option(36, help="held-out problems evaluated before and after training")
    eval_n_samples: int = option(2, help="episodes per held-out problem (n of pass@k)")
    eval_k: list[int] = option([1, 2], help="k values of pass@k (k > eval_n_samples is dropped)")
    eval_temperature: float = option(0.8, help="sampling temperature during evaluation")
    eval_max_new_tokens: int | None = option(None, help="new tokens per response in evaluation (None: magrpo's)")
    report_to: list[str] | str | None = option(
        None, help="logging backends of the job: any of jsonl, tensorboard, wandb (None: magrpo.report_to)"
    )
    run_name: str | None = option(None, help="W&B run name and TensorBoard sub-folder (None: magrpo.run_name)")
    project: str | None = option(None, help="W&B project (None: magrpo.project)")
    magrpo: MAGRPOConfig = option(_default_magrpo(), help="MAGRPO options")

    def validate(self) -> None:
        super().validate()
        check_positive("eval_num_tasks", self.eval_num_tasks)
        check_positive("eval_n_samples", self.eval_n_samples)
        if not self.eval_k or min(self.eval_k) < 1:
            raise ConfigError(f"option 'eval_k' needs k values >= 1, got {self.eval_k}", "eval_k")
        if self.report_to is not None:
            report_to_backends(self.report_to)

    def logging_options(self) -> dict[str, Any]:
        """The job's logging options that replace magrpo's (those set at the top level)."""
        return {k: getattr(self, k) for k in ("report_to", "run_name", "project") if getattr(self, k) is not None}


# -- the job -------------------------------------------------------------------------
# Evaluation is the trainer's own (the episode engine, logged as ``eval/...`` rows and saved
# as RUN_DIR/evaluation.json): the table's "after" row is what ``comlrl eval --checkpoint``
# prints for the run folder. An eval_interval of 0 means before and after training only.
_BEFORE_AND_AFTER = 10**9


def _eval_options(cfg: MainJobConfig) -> dict[str, Any]:
    """The trainer's evaluation options from the job's held-out settings."""
    return {
        "eval_task_slice": cfg.eval_task_slice,
        "eval_num_samples": cfg.eval_num_tasks,
        "eval_episodes_per_task": cfg.eval_n_samples,
        "eval_k": list(cfg.eval_k),
        "eval_temperature": cfg.eval_temperature,
        "eval_max_new_tokens": cfg.eval_max_new_tokens,
        "eval_interval": cfg.magrpo.eval_interval or _BEFORE_AND_AFTER,
    }


def _first_and_last_eval(history: list[dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    rows = [{k: v for k, v in row.items() if k.startswith("eval/")} for row in history]
    rows = [row for row in rows if row]
    if not rows:
        raise RuntimeError("the trainer logged no evaluation (eval_num_tasks selects no held-out task?)")
    return rows[0], rows[-1]


def _report(label: str, metrics: dict[str, float]) -> None:
    prefixes = ("eval/pass@", "eval/turn_", "eval/return", "eval/test_pass", "eval/cooperation", "eval/syntax")
    shown = [f"{k}={v:.3f}" for k, v in metrics.items() if k.startswith(prefixes)]
    print(f"[main] evaluation {label}: " + ", ".join(s for s in shown if "/num_episodes" not in s), file=sys.stderr)


#: the held-out comparison's bootstrap: resamples and seed (fixed, so a rerun gives the same table)
BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 0
#: reward levels of CoopCode's infos, logged by MAGRPO as ``level/{name}``
_LEVELS = ("definitions", "syntax", "tests", "cooperation")


def _plot_reward_curve(out_dir: pathlib.Path) -> pathlib.Path | None:
    """reward_curve.png: the training team reward per step (the mean return of the step's
    rollout tree from turn 1), raw and smoothed, and each reward level per step."""
    from comlrl_core.run.metrics import plot_training_reward

    try:
        return plot_training_reward(
            out_dir / "metrics.jsonl",
            "turn_1/expected_return",
            [f"level/{name}" for name in _LEVELS],
            out_dir / "reward_curve.png",
            title="MAGRPO training team reward",
        )
    except (ImportError, KeyError) as err:
        print(f"[main] no reward curve: {err}", file=sys.stderr)
        return None


def _compare(cfg: MainJobConfig, out_dir: pathlib.Path) -> dict[str, DiffInterval]:
    """Before / after / difference / paired bootstrap interval of every held-out metric,
    from the first and the last evaluation's episodes."""
    evaluations = read_eval_episodes(out_dir)
    if len(evaluations) < 2:
        return {}
    comparison = compare_episode_rows(
        evaluations[0], evaluations[-1], k=cfg.eval_k, resamples=BOOTSTRAP_RESAMPLES, seed=BOOTSTRAP_SEED
    )
    return {f"eval/{name}": interval for name, interval in comparison.items()}


def _eval_table(before: dict[str, float], after: dict[str, float], comparison: Mapping[str, DiffInterval]) -> str:
    """The table: metrics with a paired interval first, then the per-turn rewards (episodes
    that end early leave them unpaired: no interval). Before / after are the logged values."""
    rows = ["| metric | before | after | difference | 95% CI |", "|---|---|---|---|---|"]
    for key, iv in comparison.items():
        b, a = before.get(key, iv.before), after.get(key, iv.after)
        rows.append(f"| {key} | {b:.4f} | {a:.4f} | {iv.difference:+.4f} | [{iv.low:+.4f}, {iv.high:+.4f}] |")
    rest = [k for k in before if k.startswith(("eval/pass@", "eval/turn_", "eval/return_mean")) and k not in comparison]
    for key in [k for k in rest if not k.endswith("num_episodes")]:
        b, a = before[key], after.get(key, float("nan"))
        rows.append(f"| {key} | {b:.4f} | {a:.4f} | {a - b:+.4f} | n/a |")
    return "\n".join(rows) + "\n"


def _plot_components(comparison: Mapping[str, DiffInterval], out: pathlib.Path) -> pathlib.Path | None:
    from comlrl_core.run.metrics import plot_before_after

    rates = {k.removeprefix("eval/"): iv.to_dict() for k, iv in comparison.items() if "turn_" not in k}
    try:
        return plot_before_after(rates, out, title="held-out evaluation, before vs after training") if rates else None
    except ImportError as err:
        print(f"[main] no components plot: {err}", file=sys.stderr)
        return None


def peak_rss_gib() -> float:
    """This process's peak resident set size so far, in GiB (the sandbox runs in Docker's
    daemon, not in a child process, so this is the job's own memory)."""
    import resource

    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib / 2**20 if sys.platform != "darwin" else kib / 2**30  # macOS reports bytes


def run_main_job(cfg: MainJobConfig, out_dir: pathlib.Path, command: str | None = None) -> dict[str, Any]:
    """Evaluate, train, evaluate again, and write the run folder. Returns the summary.

    ``command`` is the command line reported in eval.md (None: ``comlrl main`` with the run's
    saved ``config.yaml``, which reproduces it)."""
    from learners.cli import build_team
    from learners.magrpo import MAGRPOTrainer

    check_output_dir(out_dir, option="--out")
    magrpo = MAGRPOConfig.from_dict(
        {
            **cfg.magrpo.to_dict(),
            "output_dir": str(out_dir),
            "env_kwargs": {**cfg.env_kwargs, **cfg.magrpo.env_kwargs},
            **cfg.logging_options(),
            **_eval_options(cfg),
        }
    )
    cfg = MainJobConfig.from_dict({**cfg.to_dict(), "magrpo": magrpo.to_dict()})
    _check_start(cfg, magrpo)
    cfg.to_yaml(out_dir / "config.yaml")
    started = time.perf_counter()
    print(
        f"[main] building the team: {magrpo.num_agents} x {magrpo.agent_models} (LoRA={magrpo.lora})", file=sys.stderr
    )
    team = build_team(magrpo, cfg.env_id)
    allocator = loaded_allocator()
    print(f"[main] device: {team[0].device}, allocator: {allocator}", file=sys.stderr)
    if allocator == "glibc":
        print(
            "[main] note: glibc's malloc lets a CPU update's freed activations fragment the heap (peak RSS about "
            "1 GiB higher here); scripts/main.sh starts the job on tcmalloc when it is installed "
            "(docs/performance.md, Allocator)",
            file=sys.stderr,
        )
    trainer = MAGRPOTrainer(magrpo, team, cfg.env_id)
    trainer.train()  # evaluates with the episode engine at step 0 and after the last step
    before, after = _first_and_last_eval(trainer.history)
    _report("before training", before)
    _report("after training", after)
    _plot_reward_curve(out_dir)
    comparison = _compare(cfg, out_dir)
    table = _eval_table(before, after, comparison)
    episodes = int(before.get("eval/num_episodes", 0))
    command = command or "comlrl main " + shlex.join(["--out", str(out_dir), "--config", str(out_dir / "config.yaml")])
    seconds, peak = round(time.perf_counter() - started, 1), round(peak_rss_gib(), 3)
    layouts = fp32_layout.decision_lines()
    (out_dir / "eval.md").write_text(
        f"# Held-out evaluation ({cfg.env_id}, tasks {cfg.eval_task_slice}, first {cfg.eval_num_tasks}, "
        f"n={cfg.eval_n_samples})\n\n" + table + f"\n{episodes} held-out episodes before and after "
        f"(paired by problem and sample), seed {magrpo.seed}; 95% CI: paired bootstrap over problems, "
        f"{BOOTSTRAP_RESAMPLES} resamples, bootstrap seed {BOOTSTRAP_SEED}.\n\nCommand: `{command}`\n\n"
        f"Wall time {seconds} s after start-up (team building, training, both evaluations); "
        f"peak RSS {peak:.2f} GiB ({allocator} malloc); CPU: {cpu_model_name()}.\n\n"
        # the layouts sum in different orders: which ones ran is part of what the numbers are
        "fp32 weight layouts of the sampling calls:\n" + "".join(f"- {line}\n" for line in layouts)
    )
    eval_json = {
        "before": before,
        "after": after,
        "comparison": {k: iv.to_dict() for k, iv in comparison.items()},
        "num_episodes": episodes,
        "seed": magrpo.seed,
        "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "seed": BOOTSTRAP_SEED, "level": 0.95},
        "command": command,
        "seconds": seconds,
        "peak_rss_gib": peak,
        "allocator": allocator,
        "cpu": cpu_model_name(),
        "fp32_layouts": layouts,
    }
    (out_dir / "eval.json").write_text(json.dumps(eval_json, indent=2))
    _plot_components(comparison, out_dir / "eval_components.png")
    trainer.logger.close()
    summary = {
        "run_dir": str(out_dir),
        "steps": trainer.global_step,
        "seconds": seconds,
        "peak_rss_gib": peak,
        "before": before,
        "after": after,
    }
    print(table)
    print(
        f"[main] done in {seconds} s, peak RSS {peak:.2f} GiB: {out_dir}/ (metrics.jsonl, reward_curve.png, "
        "eval_components.png, eval.md, eval.json, checkpoints/)",
        file=sys.stderr,
    )
    return summary


def _check_start(cfg: MainJobConfig, magrpo: MAGRPOConfig) -> None:
    """Before any model loads: the training and held-out envs build, the team fits, the models resolve."""
    from learners.common.preflight import (
        check_environment,
        check_model_sources,
        check_team_size,
        env_build_kwargs,
        model_options,
    )

    agents = check_environment(cfg.env_id, env_build_kwargs(magrpo, magrpo.train_task_slice))
    held_out = {**cfg.env_kwargs, "num_turns": magrpo.num_turns, "task_slice": cfg.eval_task_slice}
    check_environment(cfg.env_id, held_out, kwargs_option="eval_task_slice")
    check_team_size(magrpo, agents)
    check_model_sources((f"magrpo.{option}", source) for option, source in model_options(magrpo))


# -- command line --------------------------------------------------------------------
def add_commands(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "main",
        help="the main job: MAGRPO on CoopCode with SmolLM2, evaluated before/after",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="runs/main", help="run folder (default: runs/main)")
    p.add_argument("--config", help="YAML file of MainJobConfig options")
    p.add_argument("--print-config", action="store_true", help="print the resolved options and exit")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="option overrides, e.g. magrpo.max_steps=8")
    add_debug_flag(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        if args.config:
            cfg = MainJobConfig.from_yaml(args.config, overrides=list(args.overrides))
        else:
            cfg = MainJobConfig().with_overrides(list(args.overrides))
    except (ValueError, OSError) as err:
        print(f"comlrl main: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        print("\n".join(cfg.to_overrides()))
        return 0
    command = ["comlrl", "main", "--out", args.out, *(["--config", args.config] if args.config else [])]
    # bad input raises a UsageError: exit code 2
    run_main_job(cfg, pathlib.Path(args.out), shlex.join([*command, *args.overrides]))
    return 0
