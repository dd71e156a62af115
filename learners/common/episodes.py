"""Recorded episodes: one response per agent per turn, many episodes stepped together.

:func:`collect_episodes` plays complete episodes (``num_generations`` per task item, each
an independent clone of the env reset on that task) and records everything a learner
needs afterwards: each agent's prompt and completion (text and token ids), the team
reward, and a text view of the joint state before each step (``env.state()``, or the
agents' prompts joined when the env has none) for centralized critics.

The episodes are played by the episode engine (:mod:`comlrl_core.episodes.engine`):
all running episodes of a turn share one ``generate`` call per agent and one
``step_many`` call, and each episode is seeded by its (seed, task, sample) alone.
Records are plain lists / strings / numbers, so they checkpoint
exactly (``Episode.to_dict`` / ``from_dict``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from comlrl_core.episodes.engine import play_episodes
from comlrl_core.policy import GenerationConfig, Policy


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
    return "\n".join(f"## {name}\n{prompt}" for name, prompt in zip(agent_names, prompts, strict=True))


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
    """Play ``num_generations`` episodes per task until each ends; task-major order.

    The episodes are played by the library's one episode engine
    (:func:`comlrl_core.episodes.engine.play_episodes`: batched calls, per-episode seeds,
    the contract's team reward and episode end); this adds the token ids learners need.
    """
    if list(agent_names) != list(env.possible_agents):
        raise ValueError(f"agent_names {list(agent_names)} must be the env's agents {list(env.possible_agents)}")
    names = list(agent_names)
    records = play_episodes(
        env,
        [int(t) for t in task_indices],
        list(policies),
        generation_config=generation_config,
        seed=seed,
        episodes_per_task=num_generations,
        max_turns=num_turns,
        record=True,
        joint_state=(lambda e, prompts: joint_state_text(e, names, prompts)) if record_joint_state else None,
    )
    episodes = []
    for rec in records:
        turns = []
        for turn in rec.turns:
            agents = []
            for i, policy in enumerate(policies):
                c = turn.completions[i]
                pids = list(c.prompt_token_ids) or list(policy.encode_prompt(turn.prompts[i]))
                agents.append(AgentTurn(turn.prompts[i], c.text, pids, list(c.token_ids)))
            turns.append(Turn(agents=agents, reward=turn.reward, joint_state=turn.joint_state))
        episodes.append(Episode(task=rec.task, turns=turns, terminated=rec.terminated))
    return episodes
