"""``comlrl main``: the library's main job, end to end, on an embedded default.

It trains two SmolLM2-135M-Instruct agents (one shared frozen base, one LoRA adapter
each) with MAGRPO on ``comlrl/CoopCode-v0`` (HumanEval, ``level_feedback``, 2 turns,
Docker sandbox), evaluating the team before and after training on held-out problems.
The defaults are sized to finish within about 20 minutes on 2 CPU cores; on a machine
with CUDA the same command places the agents on the GPU (``magrpo.device=None`` means
CUDA when present).

The run folder (``--out``, default ``runs/main``) receives:

* ``metrics.jsonl`` -- training and evaluation metrics (``turn_t/reward_mean``, ``eval/...``);
* ``reward_curve.png`` and ``pass_at_k.png`` -- the training reward and pass@k before/after;
* ``eval.md`` and ``eval.json`` -- the evaluation table (before, after, change);
* ``checkpoints/`` -- the final checkpoint (adapters, optimizers, RNG states, cursor);
* ``config.yaml`` -- the exact options of the run.

Every option can be changed with ``key=value`` (nested MAGRPO options as
``magrpo.num_generations=4``) or a YAML file (``--config``); ``--print-config`` shows them.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from dataclasses import dataclass
from typing import Any

from comlrl_core.config.options import BaseConfig, ConfigError, check_positive, option
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
        temperature=0.8,
        top_p=0.95,
        top_k=50,
        agent_learning_rate=2e-4,
        rollout_buffer_size=2,
        max_steps=4,
        train_task_slice="0:144",
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
        {"dataset": "humaneval", "external_transition": "level_feedback", "sandbox_backend": "docker"},
        help="environment keyword arguments, shared by training and evaluation",
    )
    eval_task_slice: str = option("144:", help="held-out problems (task_slice of the evaluation env)")
    eval_num_tasks: int = option(4, help="held-out problems evaluated before and after training")
    eval_n_samples: int = option(2, help="episodes per held-out problem (n of pass@k)")
    eval_k: list[int] = option([1, 2], help="k values of pass@k (k > eval_n_samples is dropped)")
    eval_temperature: float = option(0.8, help="sampling temperature during evaluation")
    eval_max_new_tokens: int | None = option(None, help="new tokens per response in evaluation (None: magrpo's)")
    magrpo: MAGRPOConfig = option(_default_magrpo(), help="MAGRPO options")

    def validate(self) -> None:
        super().validate()
        check_positive("eval_num_tasks", self.eval_num_tasks)
        check_positive("eval_n_samples", self.eval_n_samples)
        if not self.eval_k or min(self.eval_k) < 1:
            raise ConfigError(f"option 'eval_k' needs k values >= 1, got {self.eval_k}", "eval_k")


# -- the job -------------------------------------------------------------------------
def _evaluate(cfg: MainJobConfig, team: Any, label: str) -> dict[str, float]:
    from comlrl_core.episodes.evaluation import evaluate
    from comlrl_core.policy import GenerationConfig

    m = cfg.magrpo
    gen = GenerationConfig(
        max_new_tokens=cfg.eval_max_new_tokens or m.max_new_tokens,
        temperature=cfg.eval_temperature,
        top_p=m.top_p,
        top_k=m.top_k or 0,
    )
    kwargs = {**cfg.env_kwargs, "num_turns": m.num_turns, "task_slice": cfg.eval_task_slice}
    ks = [k for k in cfg.eval_k if k <= cfg.eval_n_samples]
    start = time.perf_counter()
    result = evaluate(
        cfg.env_id,
        team,
        n_samples=cfg.eval_n_samples,
        k=ks,
        num_tasks=cfg.eval_num_tasks,
        env_kwargs=kwargs,
        generation_config=gen,
        seed=m.seed,
    )
    print(
        f"[main] evaluation {label}: "
        + ", ".join(
            f"{k}={v:.3f}"
            for k, v in result.metrics.items()
            if k.startswith(("pass@", "turn_")) and not k.endswith("num_episodes")
        )
        + f" ({time.perf_counter() - start:.0f} s)",
        file=sys.stderr,
    )
    return dict(result.metrics)


def _eval_table(before: dict[str, float], after: dict[str, float]) -> str:
    keys = [k for k in before if k.startswith(("pass@", "turn_", "reward_mean")) and not k.endswith("num_episodes")]
    rows = ["| metric | before | after | change |", "|---|---|---|---|"]
    for key in keys:
        b, a = before[key], after.get(key, float("nan"))
        rows.append(f"| {key} | {b:.4f} | {a:.4f} | {a - b:+.4f} |")
    return "\n".join(rows) + "\n"


def _plot_pass_at_k(before: dict[str, float], after: dict[str, float], out: pathlib.Path) -> pathlib.Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[main] matplotlib is missing (pip install 'comlrl-gym[viz]'): no pass@k plot", file=sys.stderr)
        return None
    keys = sorted((k for k in before if k.startswith("pass@")), key=lambda k: int(k.split("@")[1]))
    xs = range(len(keys))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    width = 0.38
    ax.bar([x - width / 2 for x in xs], [before[k] for k in keys], width, label="before training")
    ax.bar([x + width / 2 for x in xs], [after.get(k, 0.0) for k in keys], width, label="after training")
    ax.set_xticks(list(xs), keys)
    ax.set_ylim(0, 1)
    ax.set_ylabel("held-out pass@k")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def run_main_job(cfg: MainJobConfig, out_dir: pathlib.Path) -> dict[str, Any]:
    """Evaluate, train, evaluate again, and write the run folder. Returns the summary."""
    from learners.cli import build_team
    from learners.magrpo import MAGRPOTrainer

    out_dir.mkdir(parents=True, exist_ok=True)
    magrpo = MAGRPOConfig.from_dict(
        {**cfg.magrpo.to_dict(), "output_dir": str(out_dir), "env_kwargs": {**cfg.env_kwargs, **cfg.magrpo.env_kwargs}}
    )
    cfg = MainJobConfig.from_dict({**cfg.to_dict(), "magrpo": magrpo.to_dict()})
    cfg.to_yaml(out_dir / "config.yaml")
    started = time.perf_counter()
    print(
        f"[main] building the team: {magrpo.num_agents} x {magrpo.agent_models} (LoRA={magrpo.lora})", file=sys.stderr
    )
    team = build_team(magrpo, cfg.env_id)
    print(f"[main] device: {team[0].device}", file=sys.stderr)
    before = _evaluate(cfg, team, "before training")
    trainer = MAGRPOTrainer(magrpo, team, cfg.env_id)
    trainer.logger.log({f"eval_before/{k}": v for k, v in before.items()}, step=0)
    trainer.train()
    after = _evaluate(cfg, team, "after training")
    trainer.logger.log({f"eval_after/{k}": v for k, v in after.items()}, step=trainer.global_step)
    table = _eval_table(before, after)
    (out_dir / "eval.md").write_text(
        f"# Held-out evaluation ({cfg.env_id}, tasks {cfg.eval_task_slice}, first {cfg.eval_num_tasks}, "
        f"n={cfg.eval_n_samples})\n\n" + table
    )
    (out_dir / "eval.json").write_text(json.dumps({"before": before, "after": after}, indent=2))
    _plot_pass_at_k(before, after, out_dir / "pass_at_k.png")
    trainer.logger.close()
    summary = {
        "run_dir": str(out_dir),
        "steps": trainer.global_step,
        "seconds": round(time.perf_counter() - started, 1),
        "before": before,
        "after": after,
    }
    print(table)
    print(
        f"[main] done in {summary['seconds']} s: {out_dir}/ (metrics.jsonl, reward_curve.png, pass_at_k.png, "
        f"eval.md, checkpoints/)",
        file=sys.stderr,
    )
    return summary


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
    run_main_job(cfg, pathlib.Path(args.out))
    return 0
