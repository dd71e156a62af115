"""``comlrl train ...``: train a team on a registered environment from the command line.

    comlrl train magrpo --env comlrl/CoopCode-v0 --config cfg.yaml num_generations=4 lora=true
    comlrl train marloo --env comlrl/Writing-v0 --resume max_steps=20

Options come from the YAML file (``--config``) and ``key=value`` overrides, checked
against the algorithm's config dataclass. The team is built from the config's team
options (``agent_models``, ``num_agents``, ``lora``, ``lora_r``, ``lora_alpha``,
``lora_dropout``, ``device``). Give the ``--`` options before the ``key=value`` list.
The run folder (``output_dir``) gets ``metrics.jsonl``, ``checkpoints/`` and ``reward_curve.png``.

Before any model loads, the command checks the options (finite, in range), that
``output_dir`` is a writable folder, that the env id and ``env_kwargs`` build the env,
that the models resolve, and with ``--resume`` that the newest checkpoint is intact (a
damaged one is named and kept; ``--resume-skip-corrupt`` falls back past it). Bad input
ends with one or two lines and exit code 2; ``--debug`` shows the traceback.

``comlrl export DIR --out OUT`` writes a run's agents (from a checkpoint folder, or a run
folder's latest checkpoint) as Hugging Face folders: merged models, or with
``--adapters-only`` portable PEFT adapters (see :mod:`comlrl_core.models.export`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from comlrl_core.cli import UsageError, add_debug_flag
from learners.catalog import ALGORITHMS, learner_classes

__all__ = ["ALGORITHMS", "add_commands", "learner_classes", "run_export", "run_train"]


def add_commands(subparsers: Any) -> None:
    train = subparsers.add_parser(
        "train",
        help="train a team of agents on an environment",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    algos = train.add_subparsers(dest="algorithm", metavar="ALGORITHM")
    for name, (_, text) in ALGORITHMS.items():
        p = algos.add_parser(name, help=text, description=text)
        p.add_argument("--env", required=True, help="registered environment id, e.g. comlrl/CoopCode-v0")
        p.add_argument("--config", help="YAML file of options")
        p.add_argument(
            "--resume", action="store_true", help="resume from the latest complete checkpoint under output_dir"
        )
        p.add_argument("--resume-from", metavar="PATH", help="resume from this checkpoint folder")
        p.add_argument(
            "--resume-skip-corrupt",
            action="store_true",
            help="like --resume, but when the latest checkpoint is damaged fall back to the newest intact one "
            "(the damaged ones are named and kept)",
        )
        add_debug_flag(p)
        p.add_argument("--print-config", action="store_true", help="print the resolved options and exit")
        p.add_argument("overrides", nargs="*", metavar="key=value", help="option overrides")
        p.set_defaults(func=run_train)
    train.set_defaults(func=lambda args: (train.print_help(), 2)[1])
    _add_export(subparsers)


def _add_export(subparsers: Any) -> None:
    text = (
        "write a trained run's agents as Hugging Face folders: merged models that "
        "AutoModelForCausalLM.from_pretrained loads, or with --adapters-only portable PEFT adapters"
    )
    p = subparsers.add_parser("export", help=text, description=text)
    p.add_argument("checkpoint", metavar="DIR", help="a checkpoint folder, or a run folder (its latest checkpoint)")
    p.add_argument("--out", required=True, help="new (or empty) folder to write agent_<i>/ folders into")
    p.add_argument(
        "--adapters-only",
        action="store_true",
        help="LoRA agents as PEFT adapter folders (base recorded as a hub id or alias) instead of merged models",
    )
    p.add_argument(
        "--base-model",
        default=None,
        help="with --adapters-only: the base's hub id or alias to record (default: the run's, when portable)",
    )
    add_debug_flag(p)
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    """``comlrl export DIR --out OUT``: see :mod:`comlrl_core.models.export`."""
    from comlrl_core.models.export import export_checkpoint
    from comlrl_core.run.checkpoint import CheckpointError

    try:
        exported = export_checkpoint(
            args.checkpoint, args.out, adapters_only=args.adapters_only, base_model=args.base_model
        )
    except (CheckpointError, FileExistsError, ValueError) as err:
        raise UsageError(str(err)) from None
    for agent in exported:
        print(f"{agent.name}: {agent.kind} -> {agent.folder}")
    return 0


def build_config(algorithm: str, config_path: str | None, overrides: list[str]):
    config_cls, _ = learner_classes(algorithm)
    if config_path:
        return config_cls.from_yaml(config_path, overrides=overrides)
    return config_cls().with_overrides(overrides)


def build_team(config: Any, env_id: str) -> Any:
    """One AgentSpec per agent from the config's team options; without ``num_agents`` the
    env is probed WITH the config's ``env_kwargs`` (see :func:`learners.common.components.build_team`)."""
    from learners.common.components import build_team as build_team_from_config

    return build_team_from_config(config, env_id)


def run_train(args: argparse.Namespace) -> int:
    """Check everything that can be checked without a model, then build the team and train.

    Bad input (options, ``output_dir``, env id / kwargs, models, the checkpoint to resume)
    raises ``UsageError``: ``comlrl`` prints it in one or two lines and exits with 2.
    """
    from learners.common.distributed import DistributedContext, refuse_launcher
    from learners.common.preflight import check_training_start

    try:
        config = build_config(args.algorithm, args.config, list(args.overrides))
    except OSError as err:
        raise UsageError(f"--config: cannot read {args.config}: {err.strerror or err}") from None
    if args.print_config:
        print("\n".join(config.to_overrides()))
        return 0
    trainer_cls = learner_classes(args.algorithm)[1]
    if not getattr(trainer_cls, "data_parallel", False):  # before any process group or model
        try:
            refuse_launcher(args.algorithm)
        except RuntimeError as err:
            raise UsageError(str(err)) from None
    resume_path = check_training_start(
        config,
        args.env,
        algorithm_name=getattr(trainer_cls, "algorithm_name", None),
        resume=args.resume,
        resume_from=args.resume_from,
        skip_corrupt=args.resume_skip_corrupt,
        tidy=DistributedContext.current().is_main,
    )
    team = build_team(config, args.env)
    trainer = trainer_cls(config, team, args.env)
    if resume_path is not None:
        path = trainer.resume_from_checkpoint(resume_path)
        print(f"resumed from {path} at step {trainer.global_step}", file=sys.stderr)
    trainer.train()
    trainer.logger.close()  # finishes a W&B run, flushes TensorBoard
    run_dir = trainer.run_dir
    print(
        f"done: {trainer.global_step} steps; metrics {run_dir / 'metrics.jsonl'}; "
        f"plot {run_dir / 'reward_curve.png'}; checkpoints {run_dir / 'checkpoints'}"
    )
    return 0
