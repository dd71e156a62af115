"""Recorded episodes: one response per agent per turn, many episodes stepped together.

:func:`collect_episodes` plays complete episodes (``num_generations`` per task item, each
an independent clone of the env reset on that task) and records everything a learner
needs afterwards: each agent's prompt and completion (text and token ids), the team
reward, and a text view of the joint state before each step (``env.state()``, or the
agents' prompts joined when the env has none) for centralized critics.

All running episodes of a turn share one ``generate`` call per agent and one
``step_many`` call. Records are plain lists / strings / numbers, so they checkpoint
exactly (``Episode.to_dict`` / ``from_dict``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from comlrl_core.env_api import step_many
from comlrl_core.policy import GenerationConfig, Policy
from learners.common.seeding import derive_seed


@dataclass
class AgentTurn:
    """One agent's action at one turn."""

    prompt: str
    completion: str
    prompt_ids: list[int]
    completion_ids: list[int]


@dataclass
class Turn:
    """One joint step: every agent's action (agent order), the team reward, and the joint
    state text before the step."""

    agents: list[AgentTurn]
    reward: float
    joint_state: str


@dataclass
class Episode:
    task: int
    turns: list[Turn] = field(default_factory=list)
    terminated: bool = False  # ended early (threshold) rather than by the turn limit

    def __len__(self) -> int:
        return len(self.turns)

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.turns]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Episode":
        turns = [
            Turn(agents=[AgentTurn(**a) for a in t["agents"]], reward=float(t["reward"]), joint_state=t["joint_state"])
            for t in data["turns"]
        ]
        return cls(task=int(data["task"]), turns=turns, terminated=bool(data["terminated"]))


def joined_prompts(agent_names: Sequence[str], prompts: Sequence[str]) -> str:
    """The joint view used when an env has no ``state()``: each agent's prompt, labelled."""
    return "\n".join(f"## {name}\n{prompt}" for name, prompt in zip(agent_names, prompts))


def joint_state_text(env: Any, agent_names: Sequence[str], prompts: Sequence[str]) -> str:
    state = getattr(env, "state", None)
    if callable(state):
        text = state()
        if isinstance(text, str):
            return text
    return joined_prompts(agent_names, prompts)


def collect_episodes(
    env: Any,
    task_indices: Sequence[int],
    policies: Sequence[Policy],
    agent_names: Sequence[str],
    *,
    num_turns: int,
    num_generations: int,
    generation_config: GenerationConfig,
    seed: int,
    record_joint_state: bool = True,
) -> list[Episode]:
    """Play ``num_generations`` episodes per task until each ends; task-major order."""
    envs, episodes, prompts = [], [], []
    for task in task_indices:
        obs, _ = env.reset(seed=derive_seed(seed, int(task)), options={"task": int(task)})
        for _ in range(num_generations):
            envs.append(env.clone())
            episodes.append(Episode(task=int(task)))
            prompts.append([obs[a] for a in agent_names])
    active = list(range(len(envs)))
    for turn in range(1, num_turns + 1):
        if not active:
            break
        states = [joint_state_text(envs[e], agent_names, prompts[e]) if record_joint_state else "" for e in active]
        per_agent = []
        for i, policy in enumerate(policies):
            outs = policy.generate(
                [prompts[e][i] for e in active],
                num_samples=1,
                generation_config=generation_config,
                seed=derive_seed(seed, turn, i),
            )
            per_agent.append([o[0] for o in outs])
        actions = [{agent_names[i]: per_agent[i][k].text for i in range(len(policies))} for k in range(len(active))]
        results = step_many([envs[e] for e in active], actions)
        still = []
        for k, (e, (obs, rew, terms, truncs, _info)) in enumerate(zip(active, results)):
            agents = []
            for i, policy in enumerate(policies):
                c = per_agent[i][k]
                pids = list(c.prompt_token_ids) or list(policy.encode_prompt(prompts[e][i]))
                agents.append(AgentTurn(prompts[e][i], c.text, pids, list(c.token_ids)))
            reward = float(next(iter(rew.values()))) if rew else 0.0
            episodes[e].turns.append(Turn(agents=agents, reward=reward, joint_state=states[k]))
            terminated = any(terms.values())
            over = terminated or any(truncs.values()) or not getattr(envs[e], "agents", [1])
            episodes[e].terminated = terminated
            if not over and turn < num_turns:
                prompts[e] = [obs[a] for a in agent_names]
                still.append(e)
        active = still
    for e in envs:
        close = getattr(e, "close", None)
        if callable(close):
            close()
    return episodes
