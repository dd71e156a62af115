"""``comlrl train ...``: train a team on a registered environment from the command line.

    comlrl train magrpo --env comlrl/CoopCode-v0 --config cfg.yaml num_generations=4 lora=true
    comlrl train marloo --env comlrl/Writing-v0 --resume max_steps=20

Options come from the YAML file (``--config``) and ``key=value`` overrides, checked
against the algorithm's config dataclass. The team is built from the config's team
options (``agent_models``, ``num_agents``, ``lora``, ``lora_r``, ``lora_alpha``,
``lora_dropout``, ``device``). Give the ``--`` options before the ``key=value`` list. The run folder (``output_dir``) gets ``metrics.jsonl``,
``checkpoints/`` and ``reward_curve.png``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

ALGORITHMS = {
    "magrpo": "MAGRPO: group-relative advantages on tree rollouts",
    "mareinforce": "MAREINFORCE: MAGRPO's tree with no baseline",
    "marloo": "MARLOO: leave-one-out baseline",
    "maremax": "MAReMax: the group maximum as baseline",
    "iac": "IAC: independent critics (separate models or value heads)",
    "maac": "MAAC: one centralized critic on the joint history",
    "madpo": "MADPO: multi-agent DPO on pairs collected from task items",
    "madpo_iter": "iterative MADPO: comparator rounds and a preference replay buffer",
    "marlhf": "MARLHF: joint reward model (Bradley-Terry), then an RL backend (rl_algorithm)",
    "marlhf_iter": "iterative MARLHF: comparator rounds, a fresh reward model every round",
}


def learner_classes(algorithm: str) -> tuple[type, type]:
    """``(config class, trainer class)`` of an algorithm name (imports only that family)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")
    if algorithm in ("magrpo", "mareinforce", "marloo", "maremax"):
        from learners.magrpo import TRAINERS, MAGRPOConfig

        return MAGRPOConfig, TRAINERS[algorithm]
    if algorithm in ("iac", "maac"):
        from learners.actor_critic import TRAINERS
    elif algorithm.startswith("madpo"):
        from learners.madpo import TRAINERS
    else:
        from learners.marlhf import TRAINERS
    return TRAINERS[algorithm]


def add_commands(subparsers: Any) -> None:
    train = subparsers.add_parser(
        "train",
        help="train a team of agents on an environment",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    algos = train.add_subparsers(dest="algorithm", metavar="ALGORITHM")
    for name, text in ALGORITHMS.items():
        p = algos.add_parser(name, help=text, description=text)
        p.add_argument("--env", required=True, help="registered environment id, e.g. comlrl/CoopCode-v0")
        p.add_argument("--config", help="YAML file of options")
        p.add_argument(
            "--resume", action="store_true", help="resume from the latest complete checkpoint under output_dir"
        )
        p.add_argument("--resume-from", metavar="PATH", help="resume from this checkpoint folder")
        p.add_argument("--print-config", action="store_true", help="print the resolved options and exit")
        p.add_argument("overrides", nargs="*", metavar="key=value", help="option overrides")
        p.set_defaults(func=run_train)
    train.set_defaults(func=lambda args: (train.print_help(), 2)[1])


def build_config(algorithm: str, config_path: str | None, overrides: list[str]):
    config_cls, _ = learner_classes(algorithm)
    if config_path:
        return config_cls.from_yaml(config_path, overrides=overrides)
    return config_cls().with_overrides(overrides)


def build_team(config: Any, env_id: str):
    """One AgentSpec per agent from the config's team options."""
    from comlrl_core.models.agent_spec import AgentSpec
    from comlrl_core.models.team import Team
    from learners.common.distributed import DistributedContext

    # one process per GPU under a launcher: each rank takes its own device
    default_device = DistributedContext.current().default_device()

    models = list(config.agent_models)
    count = config.num_agents
    if count is None:
        if len(models) > 1:
            count = len(models)
        else:  # one model for every agent: ask the environment how many there are
            from comlrl_core.registry import make

            probe = make(env_id)
            count = len(probe.possible_agents)
            probe.close()
    if len(models) == 1:
        models = models * count
    if len(models) != count:
        raise ValueError(
            f"agent_models names {len(models)} models for {count} agents; give one per agent or one for all"
        )
    specs = [
        AgentSpec(
            model=m,
            lora=config.lora,
            lora_r=config.lora_r,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            dtype=config.dtype,
            mixed_precision=config.mixed_precision,
            device=config.device or default_device,
        )
        for m in models
    ]
    return Team.from_specs(specs)


def run_train(args: argparse.Namespace) -> int:
    try:
        config = build_config(args.algorithm, args.config, list(args.overrides))
    except (ValueError, OSError) as err:
        print(f"comlrl train: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        print("\n".join(config.to_overrides()))
        return 0
    team = build_team(config, args.env)
    trainer = learner_classes(args.algorithm)[1](config, team, args.env)
    if args.resume or args.resume_from:
        path = trainer.resume_from_checkpoint(args.resume_from)
        print(f"resumed from {path} at step {trainer.global_step}", file=sys.stderr)
    trainer.train()
    run_dir = trainer.run_dir
    print(
        f"done: {trainer.global_step} steps; metrics {run_dir / 'metrics.jsonl'}; "
        f"plot {run_dir / 'reward_curve.png'}; checkpoints {run_dir / 'checkpoints'}"
    )
    return 0
