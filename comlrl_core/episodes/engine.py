"""The episode engine: every evaluation episode of the library is played here.

:func:`play_episodes` plays ``episodes_per_task`` episodes of each task with a team, all of
them in the same batched calls: each turn makes ONE ``generate`` call per agent over every
running episode (turn 1: each distinct prompt once, with ``num_samples``; agents that are
adapters of one shared LoRA base sample in the same forward passes, see
:func:`comlrl_core.models.joint_generation.generate_together`) and ONE
:func:`comlrl_core.env_api.step_many` call, so scoring (e.g. a sandbox) batches too.

Seeding (:mod:`comlrl_core.episodes.seeds`): episode ``(task, sample)`` resets its env with
``episode_seed(seed, task, sample)`` and every completion gets its own seed
``generation_seed(seed, task, sample, turn, agent)`` through the per-completion seeds of
:meth:`comlrl_core.policy.Policy.generate`. An episode's result therefore does not depend on
which other tasks are evaluated with it, nor on the batch it ran in.

Reading a step goes through the contract: :func:`~comlrl_core.env_api.team_reward`,
:func:`~comlrl_core.env_api.episode_over` and :func:`~comlrl_core.env_api.step_passed`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from comlrl_core.env_api import episode_over, episode_terminated, step_many, step_passed, team_reward
from comlrl_core.episodes.seeds import episode_seed, generation_seed
from comlrl_core.models.joint_generation import GenerationRequest, generate_together
from comlrl_core.policy import Completion, GenerationConfig, Policy

__all__ = ["EpisodeRecord", "TurnRecord", "play_episodes", "step_numbers"]


@dataclass
class TurnRecord:
    """One joint step: each agent's prompt and completion (agent order), the team reward,
    and (when asked for) the joint state text before the step."""

    prompts: list[str]
    completions: list[Completion]
    reward: float
    joint_state: str = ""


@dataclass
class EpisodeRecord:
    """One played episode. ``passed`` is None when the env has no notion of success."""

    task: int
    sample: int
    rewards: list[float] = field(default_factory=list)
    terminated: bool = False  # ended early (threshold) rather than by the turn limit
    passed: bool | None = None
    raw_reward: float | None = None  # the last step's raw reward
    turns: list[TurnRecord] = field(default_factory=list)  # filled with record=True
    # per step: the numbers of the first agent's info (see step_numbers), e.g. "pass_rate",
    # "levels/syntax"; what the evaluation's per-episode metrics read
    step_infos: list[dict[str, float]] = field(default_factory=list)

    def discounted_return(self, discount: float) -> float:
        """``sum_t discount**(t-1) * reward_t`` from turn 1."""
        total = 0.0
        for reward in reversed(self.rewards):
            total = reward + discount * total
        return total


def _completion(value: Any) -> Completion:
    if isinstance(value, Completion):
        return value
    if isinstance(value, str):
        return Completion(text=value)
    text = getattr(value, "text", None)
    if isinstance(text, str):
        return Completion(text=text, token_ids=list(getattr(value, "token_ids", []) or []))
    raise TypeError(f"a policy returned {type(value).__name__}, not a Completion")


def _checked(agent: str, out: list[list[Any]], num_prompts: int, num_samples: int) -> list[list[Completion]]:
    if len(out) != num_prompts or any(len(row) != num_samples for row in out):
        raise ValueError(
            f"the policy of agent {agent!r} returned {len(out)} rows for {num_prompts} prompts "
            f"(each must hold num_samples={num_samples} completions)"
        )
    return [[_completion(c) for c in row] for row in out]


def _agent_request(
    prompts: list[str],
    running: list[EpisodeRecord],
    turn: int,
    agent_index: int,
    n: int,
    config: GenerationConfig,
    seed: int,
) -> GenerationRequest:
    """One agent's generate call for the running episodes (in their order)."""
    seeds = [generation_seed(seed, r.task, r.sample, turn, agent_index) for r in running]
    # turn 1: every episode runs, in blocks of n per task; a block sharing one prompt is
    # prefilled once and sampled n times (same per-completion seeds, same results)
    if turn == 1 and n > 1 and all(len(set(prompts[b : b + n])) == 1 for b in range(0, len(prompts), n)):
        return GenerationRequest(prompts[::n], n, config, seeds)
    return GenerationRequest(prompts, 1, config, seeds)


def _team_turn(
    policies: Sequence[Policy], agents: list[str], requests: list[GenerationRequest]
) -> list[list[Completion]]:
    """Each agent's completions for the running episodes: ONE generate call per agent (agents
    of a shared base in one decode loop), flattened to one completion per episode."""
    outs = generate_together(policies, requests)
    per_agent = []
    for agent, request, out in zip(agents, requests, outs, strict=True):
        rows = _checked(agent, out, len(request.prompts), request.num_samples)
        per_agent.append([c for row in rows for c in row])
    return per_agent


def step_numbers(info: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of one info dict: top-level numbers and bools as they are, those of a
    nested dict as ``"outer/inner"`` (e.g. ``levels/syntax``); everything else is dropped
    (texts, lists, None) so that a record stays small."""
    out: dict[str, float] = {}
    for key, value in info.items():
        items = value.items() if isinstance(value, Mapping) else [(None, value)]
        for inner, number in items:
            if isinstance(number, (bool, int, float)) and math.isfinite(number):
                out[str(key) if inner is None else f"{key}/{inner}"] = float(number)
    return out


def _first_info(infos: Mapping[str, Any]) -> Mapping[str, Any]:
    for info in infos.values():
        if isinstance(info, Mapping):
            return info
    return {}


def play_episodes(
    env: Any,
    tasks: Sequence[int],
    policies: Sequence[Policy],
    *,
    generation_config: GenerationConfig,
    seed: int,
    episodes_per_task: int = 1,
    max_turns: int | None = None,
    record: bool = False,
    joint_state: Callable[[Any, list[str]], str] | None = None,
) -> list[EpisodeRecord]:
    """Play ``episodes_per_task`` episodes of every task in ``tasks``; task-major order.

    ``env`` is an environment of the split the task indices refer to (it is reset, then
    cloned once per episode; the clones are closed at the end). ``policies`` holds one
    policy per agent, in ``env.possible_agents`` order. An episode runs until the env
    ends it (:func:`~comlrl_core.env_api.episode_over`) or for ``max_turns`` turns.
    ``record=True`` keeps each turn's prompts and completions; ``joint_state(env, prompts)``
    then also records a text view of the joint state before each step.
    """
    agents = list(env.possible_agents)
    if len(policies) != len(agents):
        raise ValueError(f"got {len(policies)} policies for the env's {len(agents)} agents {agents}")
    if isinstance(episodes_per_task, bool) or not isinstance(episodes_per_task, int) or episodes_per_task < 1:
        raise ValueError(f"episodes_per_task must be an int >= 1, got {episodes_per_task!r}")
    if max_turns is not None and max_turns < 1:
        raise ValueError(f"max_turns must be >= 1 or None, got {max_turns}")
    n = episodes_per_task
    envs: list[Any] = []
    records: list[EpisodeRecord] = []
    prompts: list[list[str]] = []
    for task in tasks:
        for sample in range(n):
            obs, _ = env.reset(seed=episode_seed(seed, int(task), sample), options={"task": int(task)})
            envs.append(env.clone())
            records.append(EpisodeRecord(task=int(task), sample=sample))
            prompts.append([obs[a] for a in agents])
    try:
        live = list(range(len(envs)))
        turn = 0
        while live and (max_turns is None or turn < max_turns):
            turn += 1
            states = [joint_state(envs[e], prompts[e]) if record and joint_state else "" for e in live]
            running = [records[e] for e in live]
            requests = [
                _agent_request([prompts[e][j] for e in live], running, turn, j, n, generation_config, seed)
                for j in range(len(agents))
            ]
            per_agent = _team_turn(policies, agents, requests)
            actions = [{agent: per_agent[j][k].text for j, agent in enumerate(agents)} for k in range(len(live))]
            results = step_many([envs[e] for e in live], actions)
            still = []
            for k, (e, (obs, rew, terms, truncs, infos)) in enumerate(zip(live, results, strict=True)):
                rec = records[e]
                reward = team_reward(envs[e], rew)
                rec.rewards.append(reward)
                if record:
                    rec.turns.append(
                        TurnRecord(list(prompts[e]), [per_agent[j][k] for j in range(len(agents))], reward, states[k])
                    )
                info = _first_info(infos)
                rec.step_infos.append(step_numbers(info))
                rec.passed = step_passed(envs[e], infos)
                raw = info.get("raw_reward")
                rec.raw_reward = float(raw) if raw is not None else None
                rec.terminated = episode_terminated(terms)
                if not episode_over(envs[e], terms, truncs):
                    prompts[e] = [obs[a] for a in agents]
                    still.append(e)
            live = still
    finally:
        for clone in envs:
            close = getattr(clone, "close", None)
            if callable(close):
                close()
    return records
