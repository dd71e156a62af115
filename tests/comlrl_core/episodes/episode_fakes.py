"""Duck-typed envs and seeded policies for the episode-engine tests."""

from __future__ import annotations

import copy
import random
from typing import Callable

from comlrl_core.policy import Completion, Policy, completion_seeds


class SeededTextPolicy(Policy):
    """Completion = a number drawn from the completion's own seed (per-completion seeds),
    or from one stream for the whole call (an int seed). Records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (prompts, num_samples)

    def encode_prompt(self, prompt: str) -> list[int]:
        return [ord(c) for c in prompt[-4:]]

    def generate(self, prompts, num_samples=1, generation_config=None, seed=None):
        self.calls.append((len(prompts), num_samples))
        rows = completion_seeds(seed, len(prompts), num_samples)
        shared = random.Random(seed if rows is None else 0)
        out = []
        for p, prompt in enumerate(prompts):
            group = []
            for s in range(num_samples):
                rng = random.Random(rows[p * num_samples + s]) if rows else shared
                group.append(Completion(text=f"{rng.randrange(1000):03d}|{prompt[-12:]}"))
            out.append(group)
        return out


def digit(text: str) -> int:
    """The text's first character when it is a digit, else its length mod 10."""
    return int(text[0]) if text[:1].isdigit() else len(text) % 10


class DigitEnv:
    """Two agents; turn reward per agent = digit(its text) / 9, so agents get
    DIFFERENT rewards. ``passed`` when both texts start with an even digit. The reset seed
    picks a task-specific suffix, so episodes of one task get different prompts only if
    ``vary_prompt``."""

    possible_agents = ["a", "b"]

    def __init__(
        self,
        num_turns: int = 2,
        num_tasks: int = 6,
        vary_prompt: bool = False,
        team_rule: Callable[[dict], float] | None = None,
    ) -> None:
        self.num_turns, self.num_tasks, self.vary_prompt = num_turns, num_tasks, vary_prompt
        if team_rule is not None:
            self.team_reward = team_rule
        self.agents: list[str] = []
        self.task = self.turn = 0
        self.salt = 0
        self.closed = False

    def reset(self, seed=None, options=None):
        self.task = int((options or {})["task"])
        self.salt = random.Random(seed).randrange(100) if self.vary_prompt else 0
        self.turn, self.agents = 0, list(self.possible_agents)
        return {a: f"task {self.task} salt {self.salt} turn 1 {a}" for a in self.agents}, {}

    def clone(self):
        return copy.copy(self)

    def step(self, actions):
        self.turn += 1
        rewards = {a: digit(actions[a]) / 9 for a in self.agents}
        passed = all(digit(actions[a]) % 2 == 0 for a in self.agents)
        done = self.turn >= self.num_turns
        infos = {a: {"passed": passed, "raw_reward": rewards[a]} for a in self.agents}
        obs = {
            a: f"task {self.task} turn {self.turn + 1} {a} saw {actions['b' if a == 'a' else 'a']}" for a in self.agents
        }
        terms = {a: False for a in self.agents}
        truncs = {a: done for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos

    def close(self):
        self.closed = True
