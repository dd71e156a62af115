"""Level-batched evaluation episodes: one response per agent per turn, many tasks at once.

All running episodes of a turn share one ``generate`` call per agent and one
``step_many`` call, like the training tree.
"""

from __future__ import annotations

from typing import Any, Sequence

from comlrl_core.env_api import step_many
from comlrl_core.policy import GenerationConfig, Policy
from learners.common.seeding import derive_seed


def run_episodes(
    env: Any,
    task_indices: Sequence[int],
    policies: Sequence[Policy],
    agent_names: Sequence[str],
    *,
    num_turns: int,
    generation_config: GenerationConfig,
    seed: int,
) -> list[list[float]]:
    """Per task, the team reward of each turn it reached (a list of length <= num_turns)."""
    episodes, prompts = [], []
    for task in task_indices:
        obs, _ = env.reset(seed=derive_seed(seed, task), options={"task": int(task)})
        episodes.append(env.clone())
        prompts.append([obs[a] for a in agent_names])
    rewards: list[list[float]] = [[] for _ in task_indices]
    active = list(range(len(episodes)))
    for turn in range(1, num_turns + 1):
        if not active:
            break
        texts = []
        for i, policy in enumerate(policies):
            outs = policy.generate(
                [prompts[e][i] for e in active],
                num_samples=1,
                generation_config=generation_config,
                seed=derive_seed(seed, turn, i),
            )
            texts.append([o[0].text for o in outs])
        actions = [{agent_names[i]: texts[i][k] for i in range(len(policies))} for k in range(len(active))]
        results = step_many([episodes[e] for e in active], actions)
        still = []
        for e, (obs, rew, terms, truncs, _info) in zip(active, results):
            rewards[e].append(float(next(iter(rew.values()))) if rew else 0.0)
            over = any(terms.values()) or any(truncs.values()) or not getattr(episodes[e], "agents", [1])
            if not over and turn < num_turns:
                prompts[e] = [obs[a] for a in agent_names]
                still.append(e)
        active = still
    return rewards


def episode_metrics(
    rewards: Sequence[Sequence[float]], num_turns: int, discount: float, prefix: str = "eval"
) -> dict[str, float]:
    """``{prefix}/turn_{t}/reward_mean`` (over episodes that reached turn t),
    ``{prefix}/turn_{t}/expected_return`` and ``{prefix}/return_mean``."""
    out: dict[str, float] = {}
    returns_by_turn: list[list[float]] = [[] for _ in range(num_turns)]
    for ep in rewards:
        ret = 0.0
        for t in range(len(ep) - 1, -1, -1):
            ret = ep[t] + discount * ret
            returns_by_turn[t].append(ret)
    for t in range(num_turns):
        reached = [ep[t] for ep in rewards if len(ep) > t]
        if reached:
            out[f"{prefix}/turn_{t + 1}/reward_mean"] = sum(reached) / len(reached)
            out[f"{prefix}/turn_{t + 1}/expected_return"] = sum(returns_by_turn[t]) / len(returns_by_turn[t])
            out[f"{prefix}/turn_{t + 1}/reached_fraction"] = len(reached) / max(1, len(rewards))
    if returns_by_turn[0]:
        out[f"{prefix}/return_mean"] = sum(returns_by_turn[0]) / len(returns_by_turn[0])
    return out
