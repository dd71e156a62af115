"""Building a trainer from components, the way CoMLRL and TRL users do.

Every trainer class offers ``Trainer.from_components(...)`` (defined once on
:class:`learners.common.trainer_utils.TrainerCommon`), which lands here::

    trainer = MAGRPOTrainer.from_components(
        agent_model="Qwen/Qwen2.5-0.5B", num_agents=2, tokenizer=tokenizer,
        train_dataset=dataset, reward_func=reward_func, formatters=[f1, f2], args=config,
    )
    trainer.train()

The dataset, formatters, reward function, reward processor and external transition
become a ``comlrl/Dataset-v0`` environment, built through the registry (learners never
import an environment package); the agents become a :class:`~comlrl_core.models.team.Team`.

:func:`build_team` is also what ``comlrl train`` and ``comlrl main`` build their team with.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from comlrl_core.policy import Policy
from comlrl_core.registry import make
from learners.common.setup import build_env

__all__ = ["DATASET_ENV_ID", "DatasetEnvFactory", "build_from_components", "build_team", "env_agent_count"]

DATASET_ENV_ID = "comlrl/Dataset-v0"


def env_agent_count(env: str | Callable[..., Any], env_kwargs: dict[str, Any] | None = None) -> int:
    """How many agents ``env`` (an id or a factory) has when built with ``env_kwargs``.

    The kwargs matter: an option such as ``agents: single`` or ``num_agents`` changes the
    team size, so the probe must be built exactly as the trainer will build it.
    """
    probe = build_env(env, **dict(env_kwargs or {}))
    try:
        return len(probe.possible_agents)
    finally:
        close = getattr(probe, "close", None)
        if callable(close):
            close()


def build_team(config: Any, env: str | Callable[..., Any]) -> Any:
    """One AgentSpec per agent from the config's team options (``agent_models``,
    ``num_agents``, ``lora`` ...); without ``num_agents`` and with one model, the team
    size is the env's, built with the config's ``env_kwargs``."""
    from comlrl_core.models.agent_spec import AgentSpec
    from comlrl_core.models.team import Team
    from learners.common.distributed import DistributedContext

    # one process per GPU under a launcher: each rank takes its own device
    default_device = DistributedContext.current().default_device()

    models = list(config.agent_models)
    count = config.num_agents
    if count is None:
        count = len(models) if len(models) > 1 else env_agent_count(env, getattr(config, "env_kwargs", None))
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
            gradient_checkpointing=getattr(config, "gradient_checkpointing", False),
            device=config.device or default_device,
        )
        for m in models
    ]
    # the config's seed draws the new weights (LoRA adapters), as it draws everything else
    return Team.from_specs(specs, seed=getattr(config, "seed", None))


class DatasetEnvFactory:
    """Builds ``comlrl/Dataset-v0`` with the user's components; the trainer adds its own
    keyword arguments (``num_turns``, ``task_slice``, the config's ``env_kwargs`` ...)."""

    def __init__(self, components: dict[str, Any]) -> None:
        self.components = dict(components)

    def __call__(self, **kwargs: Any) -> Any:
        clash = sorted(set(kwargs) & set(self.components))
        if clash:
            raise ValueError(
                f"{clash} given both to from_components and in env_kwargs / the config; give each only once"
            )
        return make(DATASET_ENV_ID, **self.components, **kwargs)

    def __repr__(self) -> str:
        return f"DatasetEnvFactory({DATASET_ENV_ID}, components={sorted(self.components)})"


def _is_transformers_model(obj: Any) -> bool:
    return not isinstance(obj, Policy) and callable(getattr(obj, "generate", None)) and hasattr(obj, "config")


def _team_from_objects(agents: Sequence[Any], tokenizer: Any, seed: int | None) -> Any:
    """A Team from policies, AgentSpecs, model sources or transformers model objects."""
    from comlrl_core.models.hf_policy import TransformersPolicy
    from comlrl_core.models.team import Team

    items: list[Any] = []
    for i, agent in enumerate(agents):
        if _is_transformers_model(agent):
            if tokenizer is None:
                raise ValueError(
                    f"agents[{i}] is a transformers model object: pass tokenizer=... (its tokenizer) as well"
                )
            items.append(TransformersPolicy(agent, tokenizer, name=f"agent_{i}"))
        else:
            items.append(agent)
    return Team.from_specs(items, seed=seed)


def _check_tokenizer(team: Any, tokenizer: Any) -> None:
    """A tokenizer given next to model sources must be the models' own (the policies load it)."""
    if tokenizer is None or not hasattr(tokenizer, "get_vocab"):
        return
    vocab = tokenizer.get_vocab()
    for i, policy in enumerate(team):
        own = getattr(policy, "tokenizer", None)
        if own is not None and hasattr(own, "get_vocab") and own.get_vocab() != vocab:
            raise ValueError(
                f"the tokenizer given does not match agent {i}'s model (different vocabularies); each agent "
                "uses its model's own tokenizer: drop tokenizer=..., or name the matching model"
            )


def _rows(dataset: Any, name: str) -> list[Any]:
    if isinstance(dataset, (str, bytes)) or not hasattr(dataset, "__iter__"):
        raise TypeError(
            f"{name} must be a list of dicts or a datasets.Dataset when eval_dataset is given, got "
            f"{type(dataset).__name__}; for files, put both splits in one file and set "
            "train_task_slice / eval_task_slice"
        )
    return list(dataset)


def build_from_components(
    trainer_cls: type,
    *,
    reward_func: Callable[..., Any] | str,
    train_dataset: Any,
    agents: Any = None,
    agent_model: str | None = None,
    num_agents: int | None = None,
    tokenizer: Any = None,
    formatters: Any = None,
    external_transition: Callable[..., Sequence[str]] | str | None = None,
    reward_processor: Any = None,
    eval_dataset: Any = None,
    args: Any = None,
    **trainer_kwargs: Any,
) -> Any:
    """``trainer_cls(config, team, env_factory, **trainer_kwargs)`` from CoMLRL-style parts.

    * ``agents`` (a Team, or a list of policies / AgentSpecs / model sources / transformers
      models with ``tokenizer``) or ``agent_model`` (one model source for every agent; the
      config's team options such as ``lora`` apply). Neither: the config's ``agent_models``.
    * ``num_agents``: the team size (default: the number of formatters or agents, else the
      config's ``num_agents``, else 2).
    * ``train_dataset`` / ``eval_dataset``: lists of dicts or ``datasets.Dataset`` objects
      (``train_dataset`` may also be a .json / .jsonl path). With ``eval_dataset`` the two
      are joined and the config's ``train_task_slice`` / ``eval_task_slice`` select them.
    * ``reward_func``, ``formatters``, ``external_transition``, ``reward_processor``: see
      ``envs.dataset`` (CoMLRL's signatures).
    * ``args``: the trainer's config (default: its defaults).
    """
    config_cls = getattr(trainer_cls, "config_class", None)
    if config_cls is None:
        raise TypeError(f"{trainer_cls.__name__} names no config_class; it cannot be built from components")
    config = config_cls() if args is None else args
    if not isinstance(config, config_cls):
        raise TypeError(f"args must be a {config_cls.__name__} for {trainer_cls.__name__}, got {type(config).__name__}")
    if agents is not None and agent_model is not None:
        raise ValueError("give agents=... or agent_model=..., not both")

    counts = {}
    if num_agents is not None:
        counts["num_agents"] = num_agents
    if isinstance(formatters, (list, tuple)):
        counts["formatters"] = len(formatters)
    if isinstance(agents, (list, tuple)) or (agents is not None and hasattr(agents, "policies")):
        counts["agents"] = len(agents)
    if len(set(counts.values())) > 1:
        raise ValueError(f"the team sizes disagree: {counts}; give as many formatters and agents as num_agents")
    if counts:
        count = next(iter(counts.values()))
    elif config.num_agents is not None:
        count = config.num_agents
    elif len(config.agent_models) > 1:
        count = len(config.agent_models)
    else:
        count = 2  # CoMLRL's default team: two agents
    overrides: dict[str, Any] = {"num_agents": count}
    if agent_model is not None:
        overrides["agent_models"] = [agent_model]
    elif agents is not None and isinstance(agents, (list, tuple)) and all(isinstance(a, str) for a in agents):
        overrides["agent_models"] = list(agents)  # model sources: the config's team options apply
        agents = None

    components: dict[str, Any] = {"reward_func": reward_func, "dataset": train_dataset}
    if formatters is not None:
        components["formatters"] = list(formatters) if isinstance(formatters, (list, tuple)) else formatters
    if not isinstance(formatters, (list, tuple)):
        components["num_agents"] = count
    if external_transition is not None:
        components["external_transition"] = external_transition
    if reward_processor is not None:
        components["reward_processor"] = reward_processor
    if eval_dataset is not None:
        if config.train_task_slice is not None or config.eval_task_slice is not None:
            raise ValueError(
                "eval_dataset is given and the config sets train_task_slice / eval_task_slice: "
                "give one or the other (the slices select parts of the one train_dataset)"
            )
        train_rows, eval_rows = _rows(train_dataset, "train_dataset"), _rows(eval_dataset, "eval_dataset")
        if not train_rows or not eval_rows:
            raise ValueError("train_dataset and eval_dataset must each hold at least one item")
        components["dataset"] = train_rows + eval_rows
        overrides["train_task_slice"] = f"0:{len(train_rows)}"
        overrides["eval_task_slice"] = f"{len(train_rows)}:"
    config = dataclasses.replace(config, **overrides)  # validated again by __post_init__
    factory = DatasetEnvFactory(components)

    if agents is None:
        team = build_team(config, factory)
        _check_tokenizer(team, tokenizer)
    elif hasattr(agents, "policies"):
        team = agents
    else:
        team = _team_from_objects(list(agents), tokenizer, config.seed)
    return trainer_cls(config, team, factory, **trainer_kwargs)
