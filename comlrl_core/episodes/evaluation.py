"""Evaluate a team on an environment (used by `envs.evaluate`, `comlrl eval` and the learners).

``evaluate(env_id, team, n_samples, k=(1, 5))`` plays ``n_samples`` multi-turn episodes
per task and reports

* ``pass@k`` -- the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` of Chen et al. (2021,
  "Evaluating Large Language Models Trained on Code"), averaged over tasks, where ``c``
  of the ``n`` joint samples passed. A joint sample passes when its final step's
  ``infos[agent]["passed"]`` is true; environments without tests report no ``passed`` and
  then ``raw_reward >= env.success_threshold`` decides. ``k > n`` is omitted.
* ``turn_{t}/reward_mean`` -- the mean team reward at turn ``t`` over the episodes still
  running at that turn (early termination ends an episode), and
  ``turn_{t}/num_episodes``.

Generation is batched: each turn makes ONE ``generate`` call per agent over all live
episodes (turn 1: every task's prompt with ``num_samples=n_samples``), and the envs are
stepped together through :func:`comlrl_core.env_api.step_many` so that scoring batches too.

A team is an indexable sequence of ``comlrl_core.Policy`` (e.g. a ``Team``), a list of
policies, or plain callables ``fn(prompt: str) -> str`` in a list (agent order) or a
dict keyed by agent name.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from comlrl_core.env_api import step_many
from comlrl_core.models.simple_policies import CallablePolicy
from comlrl_core.policy import GenerationConfig, Policy
from comlrl_core.registry import make


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for ``c`` passing samples out of ``n``.

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``, which equals
    ``1 - C(n-c, k) / C(n, k)`` without huge binomials.
    """
    if not (0 <= c <= n) or k < 1 or k > n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


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
    """``metrics`` (flat floats, also reachable as ``result["pass@1"]``) and per-task detail."""

    env_id: str
    metrics: dict[str, float]
    per_task: list[TaskResult]

    def __getitem__(self, key: str) -> float:
        return self.metrics[key]

    def to_dict(self) -> dict[str, Any]:
        return {"env_id": self.env_id, "metrics": dict(self.metrics), "per_task": [asdict(t) for t in self.per_task]}

    def markdown(self) -> str:
        rows = ["| metric | value |", "|---|---|"]
        for key, value in self.metrics.items():
            is_count = key in ("num_tasks", "n_samples") or key.endswith("/num_episodes")
            rows.append(f"| {key} | {int(value)} |" if is_count else f"| {key} | {value:.4f} |")
        return "\n".join(rows)


def _check_shape(out: Any, num_prompts: int, num_samples: int, agent: str) -> None:
    if len(out) != num_prompts or any(len(row) != num_samples for row in out):
        raise ValueError(
            f"the policy of agent {agent!r} returned {len(out)} rows for {num_prompts} prompts "
            f"(each must hold num_samples={num_samples} completions)"
        )


def _completion_text(c: Any) -> Any:
    return c.text if isinstance(getattr(c, "text", None), str) else c


def _episode_passed(env: Any, info: Mapping[str, Any]) -> bool:
    if "passed" in info:
        return bool(info["passed"])
    threshold = getattr(env, "success_threshold", None)
    return threshold is not None and float(info.get("raw_reward", -math.inf)) >= float(threshold)


def evaluate(
    env_id: str | Callable[..., Any],
    team: Any,
    n_samples: int = 1,
    k: int | Iterable[int] = (1, 5),
    num_tasks: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    generation_config: GenerationConfig | Mapping[str, Any] | None = None,
    seed: int = 0,
) -> EvalResult:
    """Play ``n_samples`` episodes per task with ``team``; report pass@k and turn rewards.

    ``env_id`` is a registered id, or a factory called as ``env_id(**env_kwargs)``.
    ``num_tasks`` evaluates the first ``num_tasks`` items of the env's split (all if None).
    """
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be an int >= 1, got {n_samples!r}")
    ks = sorted({int(k)} if isinstance(k, (int, np.integer)) else {int(x) for x in k})
    if not ks or ks[0] < 1:
        raise ValueError(f"k values must be >= 1, got {ks}")
    if isinstance(generation_config, Mapping):
        generation_config = GenerationConfig(**generation_config)
    kwargs = dict(env_kwargs or {})
    base = make(env_id, **kwargs) if isinstance(env_id, str) else env_id(**kwargs)
    env_name = env_id if isinstance(env_id, str) else getattr(env_id, "__name__", type(base).__name__)
    total = base.num_tasks
    if num_tasks is not None:
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1 or None, got {num_tasks}")
        total = min(int(num_tasks), total)
    agents = list(base.possible_agents)
    policies = as_policies(team, agents)

    # One env per (task, sample); clones share the heavy resources of `base`.
    envs, observations, task_of = [], [], []
    for t in range(total):
        for s in range(n_samples):
            env = base.clone()
            obs, _ = env.reset(seed=seed + t * n_samples + s, options={"task": t})
            envs.append(env)
            observations.append(obs)
            task_of.append(t)

    live = list(range(len(envs)))
    final_info: list[dict[str, Any]] = [{} for _ in envs]
    turn_rewards: dict[int, list[float]] = {}
    turn = 0
    while live:
        turn += 1
        actions: list[dict[str, Any]] = [{} for _ in live]
        for j, agent in enumerate(agents):
            gen_seed = seed + 1_000_003 * turn + 7919 * j
            if turn == 1:  # same prompt for all samples of a task: let the policy sample n
                prompts = [observations[t * n_samples][agent] for t in range(total)]
                out = policies[agent].generate(prompts, n_samples, generation_config, gen_seed)
                _check_shape(out, len(prompts), n_samples, agent)
                texts = [out[task_of[i]][i % n_samples] for i in live]
            else:
                prompts = [observations[i][agent] for i in live]
                out = policies[agent].generate(prompts, 1, generation_config, gen_seed)
                _check_shape(out, len(prompts), 1, agent)
                texts = [row[0] for row in out]
            for slot, completion in enumerate(texts):
                actions[slot][agent] = _completion_text(completion)
        results = step_many([envs[i] for i in live], actions)
        still = []
        rewards_t = turn_rewards.setdefault(turn, [])
        for i, (obs, rew, term, trunc, info) in zip(live, results):
            first = agents[0]
            rewards_t.append(float(rew[first]))
            final_info[i] = {"reward": float(rew[first]), **info[first]}
            if term[first] or trunc[first]:
                continue
            observations[i] = obs
            still.append(i)
        live = still

    per_task: list[TaskResult] = []
    metrics: dict[str, float] = {}
    for t in range(total):
        members = range(t * n_samples, (t + 1) * n_samples)
        passed = sum(_episode_passed(envs[i], final_info[i]) for i in members)
        per_task.append(TaskResult(t, n_samples, passed, [final_info[i]["reward"] for i in members]))
    for kk in ks:
        if kk <= n_samples:
            metrics[f"pass@{kk}"] = float(np.mean([pass_at_k(n_samples, r.num_passed, kk) for r in per_task]))
    for t, values in sorted(turn_rewards.items()):
        metrics[f"turn_{t}/reward_mean"] = float(np.mean(values))
        metrics[f"turn_{t}/num_episodes"] = float(len(values))
    metrics["reward_mean"] = float(np.mean([r for task in per_task for r in task.final_rewards]))
    metrics["num_tasks"] = float(total)
    metrics["n_samples"] = float(n_samples)
    for env in envs:
        env.close()
    base.close()
    return EvalResult(env_name, metrics, per_task)
