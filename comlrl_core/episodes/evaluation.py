"""Evaluate a team on an environment: the one evaluation of the library.

Every trainer's ``eval/...`` rows, ``comlrl eval`` (and ``envs.evaluate``), MARLHF's
task-reward evaluation and the main job's before/after table call
:func:`evaluate_episodes`, which plays the episodes with the engine
(:func:`comlrl_core.episodes.engine.play_episodes`: one batched generate call per agent
per turn, seeds per episode) and names the results with the vocabulary of
:mod:`comlrl_core.episodes.metrics`.

* :func:`evaluate_episodes` -- on an env object, with a team of policies;
* :func:`run_evaluation` -- from an :class:`~comlrl_core.episodes.spec.EvalSpec`;
* :func:`evaluate` -- the convenience form ``evaluate(env_id, team, n_samples, k)``.

A team is an indexable sequence of ``comlrl_core.Policy`` (e.g. a ``Team``), a list of
policies, or plain callables ``fn(prompt: str) -> str`` in a list (agent order) or a
dict keyed by agent name; one member plays every agent.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from comlrl_core.episodes.engine import EpisodeRecord, play_episodes
from comlrl_core.episodes.metrics import COUNT_METRICS, episode_metrics, episode_rows, pass_at_k
from comlrl_core.episodes.spec import EvalSpec
from comlrl_core.models.simple_policies import CallablePolicy
from comlrl_core.policy import GenerationConfig, Policy
from comlrl_core.registry import make

__all__ = [
    "EvalResult",
    "TaskResult",
    "as_policies",
    "evaluate",
    "evaluate_episodes",
    "pass_at_k",
    "run_evaluation",
]


def as_policies(team: Any, agents: Sequence[str]) -> dict[str, Policy]:
    """Map each agent to its policy from a Team, a list of policies/callables, or a dict."""
    if isinstance(team, Policy) or (callable(team) and not hasattr(team, "__getitem__")):
        members: dict[str, Any] = {a: team for a in agents}  # one policy plays every role
    elif isinstance(team, Mapping):
        missing = [a for a in agents if a not in team]
        if missing:
            raise ValueError(f"team dict lacks agents {missing}; the env's agents are {list(agents)}")
        members = {a: team[a] for a in agents}
    else:
        try:
            size = len(team)
        except TypeError as err:
            raise TypeError(
                f"team must be a Team, a list of policies/callables or a dict, got {type(team).__name__}"
            ) from err
        if size == 1:
            members = {a: team[0] for a in agents}
        elif size == len(agents):
            members = {a: team[i] for i, a in enumerate(agents)}
        else:
            raise ValueError(f"team has {size} members but the env has {len(agents)} agents {list(agents)}")
    out: dict[str, Policy] = {}
    for agent, member in members.items():
        if isinstance(member, Policy) or hasattr(member, "generate"):
            out[agent] = member
        elif callable(member):
            out[agent] = CallablePolicy(member)
        else:
            raise TypeError(f"team member for {agent!r} is neither a Policy nor a callable: {type(member).__name__}")
    return out


@dataclass
class TaskResult:
    task_index: int
    num_samples: int
    num_passed: int
    final_rewards: list[float] = field(default_factory=list)


@dataclass
class EvalResult:
    """``metrics`` (flat floats, also reachable as ``result["pass@1"]``), per-task and
    per-episode detail (:meth:`episode_rows`: each episode's values, for paired comparisons)."""

    env_id: str
    metrics: dict[str, float]
    per_task: list[TaskResult]
    episodes: list[EpisodeRecord] = field(default_factory=list)

    discount: float = 1.0

    def __getitem__(self, key: str) -> float:
        return self.metrics[key]

    def episode_rows(self) -> list[dict[str, Any]]:
        """One dict per episode (task, sample, passed, rewards, return, test_pass_rate, ...)."""
        return episode_rows(self.episodes, self.discount)

    def to_dict(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "metrics": dict(self.metrics),
            "per_task": [asdict(t) for t in self.per_task],
            "episodes": self.episode_rows(),
        }

    def markdown(self) -> str:
        rows = ["| metric | value |", "|---|---|"]
        for key, value in self.metrics.items():
            is_count = key.endswith(COUNT_METRICS)
            rows.append(f"| {key} | {int(value)} |" if is_count else f"| {key} | {value:.4f} |")
        return "\n".join(rows)


def evaluate_episodes(
    env: Any,
    team: Any,
    *,
    num_tasks: int | None = None,
    episodes_per_task: int = 1,
    generation_config: GenerationConfig | None = None,
    seed: int = 0,
    discount: float = 1.0,
    k: Iterable[int] = (1,),
    max_turns: int | None = None,
    prefix: str = "",
    env_name: str | None = None,
) -> EvalResult:
    """Play ``episodes_per_task`` episodes of each of the first ``num_tasks`` tasks of
    ``env``'s split (None: all) and compute the metrics (keys prefixed with ``prefix``)."""
    if isinstance(episodes_per_task, bool) or not isinstance(episodes_per_task, int) or episodes_per_task < 1:
        raise ValueError(f"episodes per task (n_samples) must be an int >= 1, got {episodes_per_task!r}")
    total = int(env.num_tasks)
    if num_tasks is not None:
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1 or None, got {num_tasks}")
        total = min(int(num_tasks), total)
    agents = list(env.possible_agents)
    policies = as_policies(team, agents)
    episodes = play_episodes(
        env,
        list(range(total)),
        [policies[a] for a in agents],
        generation_config=generation_config or GenerationConfig(),
        seed=seed,
        episodes_per_task=episodes_per_task,
        max_turns=max_turns,
    )
    metrics = episode_metrics(episodes, discount=discount, k=k, prefix=prefix)
    per_task = []
    for t in range(total):
        eps = episodes[t * episodes_per_task : (t + 1) * episodes_per_task]
        per_task.append(
            TaskResult(t, episodes_per_task, sum(bool(e.passed) for e in eps), [e.rewards[-1] for e in eps])
        )
    return EvalResult(env_name or type(env).__name__, metrics, per_task, episodes, discount)


def run_evaluation(spec: EvalSpec, team: Any, prefix: str = "") -> EvalResult:
    """Evaluate ``team`` as ``spec`` says (the env is built from the registry)."""
    env = make(spec.env, **spec.env_kwargs)
    try:
        return evaluate_episodes(
            env,
            team,
            num_tasks=spec.num_tasks,
            episodes_per_task=spec.episodes_per_task,
            generation_config=spec.generation,
            seed=spec.seed,
            discount=spec.discount,
            k=spec.k,
            max_turns=spec.max_turns,
            prefix=prefix,
            env_name=spec.env,
        )
    finally:
        env.close()


def evaluate(
    env_id: str | Callable[..., Any],
    team: Any,
    n_samples: int = 1,
    k: int | Iterable[int] = (1, 5),
    num_tasks: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    generation_config: GenerationConfig | Mapping[str, Any] | None = None,
    seed: int = 0,
    discount: float = 1.0,
    max_turns: int | None = None,
) -> EvalResult:
    """Play ``n_samples`` episodes per task with ``team``; report pass@k and turn rewards.

    ``env_id`` is a registered id, or a factory called as ``env_id(**env_kwargs)``.
    ``num_tasks`` evaluates the first ``num_tasks`` items of the env's split (all if None).
    """
    ks = [int(k)] if isinstance(k, int) else [int(x) for x in k]
    if not ks or min(ks) < 1:
        raise ValueError(f"k values must be >= 1, got {ks}")
    if isinstance(generation_config, Mapping):
        generation_config = GenerationConfig(**generation_config)
    kwargs = dict(env_kwargs or {})
    env = make(env_id, **kwargs) if isinstance(env_id, str) else env_id(**kwargs)
    name = env_id if isinstance(env_id, str) else getattr(env_id, "__name__", type(env).__name__)
    try:
        return evaluate_episodes(
            env,
            team,
            num_tasks=num_tasks,
            episodes_per_task=n_samples,
            generation_config=generation_config,
            seed=seed,
            discount=discount,
            k=ks,
            max_turns=max_turns,
            env_name=name,
        )
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()
