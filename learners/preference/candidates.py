"""Candidate joint responses for task items, and the oracles that score them.

Users supply task items, not preference data. For each task item every agent samples
``preference_num_candidates`` responses to its own prompt; responses with the same index
form one joint response (aligned mode). An *oracle* then scores every joint response:

* :class:`TaskRewardOracle` -- the environment's own reward: a fresh clone of the env, reset
  on the task, is stepped with the joint action (``reward_func`` then ``reward_processor``).
  The processed reward decides preferences; the raw one (``infos[agent]["raw_reward"]``) is
  recorded. All joint responses of a batch of tasks go through ONE ``step_many`` call.
* any object with the same ``score`` method, e.g. MARLHF's reward-model oracle.

Generation is batched too: one ``generate`` call per agent covers every task of a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from comlrl_core.env_api import step_many, team_reward
from comlrl_core.policy import GenerationConfig, Policy

Score = tuple[float, float]  # (reward that decides preferences, raw reward)


@dataclass
class JointCandidate:
    """One joint response: a completion per agent (agent order) and, when our own policies
    generated it, the completion token ids."""

    completions: list[str]
    token_ids: list[list[int]] | None = None
    reward: float | None = None
    raw_reward: float | None = None


@dataclass
class TaskCandidates:
    """A task item reset in ``env`` (not stepped), its prompts and its candidates.

    ``candidates[i]`` is None when candidate ``i`` was dropped (e.g. an unparseable
    centralized response); dropped candidates are never scored nor compared.
    """

    task: int
    env: Any
    prompts: list[str]
    prompt_ids: list[list[int]] | None = None
    candidates: list[JointCandidate | None] = field(default_factory=list)

    @property
    def rewards(self) -> list[float | None]:
        return [None if c is None else c.reward for c in self.candidates]

    def scored_rewards(self) -> list[float]:
        return [c.reward for c in self.candidates if c is not None and c.reward is not None]


class Oracle(Protocol):
    def score(self, requests: Sequence[tuple[TaskCandidates, JointCandidate]]) -> list[Score]:
        """``(reward, raw_reward)`` of each (task, joint response)."""


class TaskRewardOracle:
    """Scores with the environment's reward by stepping a fresh clone per joint response."""

    def __init__(self, agent_names: Sequence[str]) -> None:
        self.agent_names = list(agent_names)

    def score(self, requests: Sequence[tuple[TaskCandidates, JointCandidate]]) -> list[Score]:
        if not requests:
            return []
        envs = [task.env.clone() for task, _ in requests]
        actions = [dict(zip(self.agent_names, cand.completions, strict=True)) for _, cand in requests]
        results = step_many(envs, actions)
        scores = []
        for env, (_obs, rewards, _t, _tr, infos) in zip(envs, results, strict=True):
            reward = team_reward(env, rewards)
            info = infos.get(self.agent_names[0], {}) if isinstance(infos, dict) else {}
            raw = info.get("raw_reward", reward) if isinstance(info, dict) else reward
            scores.append((reward, float(raw)))
            close = getattr(env, "close", None)
            if callable(close):
                close()
        return scores


def reset_tasks(
    env: Any, tasks: Sequence[int], agent_names: Sequence[str], seeds: Sequence[int]
) -> list[TaskCandidates]:
    """One clone of ``env`` reset on each task, with every agent's turn-1 prompt."""
    out = []
    for task, seed in zip(tasks, seeds, strict=True):
        obs, _ = env.reset(seed=int(seed), options={"task": int(task)})
        out.append(TaskCandidates(task=int(task), env=env.clone(), prompts=[obs[a] for a in agent_names]))
    return out


def sample_candidates(
    tasks: Sequence[TaskCandidates],
    policies: Sequence[Policy],
    num_candidates: int,
    generation_config: GenerationConfig,
    seeds: Sequence[int],
) -> None:
    """Fill ``tasks[*].candidates`` with ``num_candidates`` aligned joint responses.

    ``seeds[i]`` seeds agent i's generate call (one call per agent for all tasks).
    """
    per_agent = []
    for i, policy in enumerate(policies):
        per_agent.append(
            policy.generate(
                [t.prompts[i] for t in tasks],
                num_samples=num_candidates,
                generation_config=generation_config,
                seed=int(seeds[i]),
            )
        )
    for k, task in enumerate(tasks):
        groups = [per_agent[i][k] for i in range(len(policies))]
        task.prompt_ids = [list(g[0].prompt_token_ids) if g else [] for g in groups]
        task.candidates = [
            JointCandidate(completions=[g[c].text for g in groups], token_ids=[list(g[c].token_ids) for g in groups])
            for c in range(num_candidates)
        ]


def score_tasks(oracle: Oracle, tasks: Sequence[TaskCandidates]) -> None:
    """Score every kept candidate of every task in one oracle call."""
    requests = [(t, c) for t in tasks for c in t.candidates if c is not None]
    for (_, cand), (reward, raw) in zip(requests, oracle.score(requests), strict=True):
        cand.reward, cand.raw_reward = float(reward), float(raw)


def close_tasks(tasks: Sequence[TaskCandidates]) -> None:
    for t in tasks:
        close = getattr(t.env, "close", None)
        if callable(close):
            close()
