"""Shared fixtures: a tiny deterministic env on the base class, to test the base alone."""

from __future__ import annotations

from typing import Any

import pytest

from envs.base import TextParallelEnv


class HeavyResource:
    """Stands in for a sandbox pool / dataset: clones must share it, never copy it."""

    def __deepcopy__(self, memo):  # pragma: no cover - reaching this is the failure
        raise AssertionError("a shared resource was deep-copied")


class ToyEnv(TextParallelEnv):
    """Two agents; the raw reward is the fraction of agents that answered ``"good"``."""

    possible_agents = ["a", "b"]
    score_calls: list[int] = []  # batch sizes of every _score_batch call (class-wide)

    def __init__(self, num_tasks: int = 6, **kwargs: Any) -> None:
        self._n = num_tasks
        self.pool = HeavyResource()
        super().__init__(**kwargs)

    def _load_tasks(self):
        return [{"prompt": f"task {i}", "index": i} for i in range(self._n)]

    def _initial_prompt(self, task, agent):
        return f"[{agent}] {task['prompt']}"

    def _score_batch(self, items):
        type(self).score_calls.append(len(items))
        out = []
        for _task, actions in items:
            good = [a for a in self.possible_agents if actions[a] == "good"]
            raw = len(good) / len(self.possible_agents)
            details = {
                "passed": raw == 1.0,
                "lengths": {a: len(actions[a]) for a in self.possible_agents},
                "per_agent": {a: {"own_good": a in good} for a in self.possible_agents},
            }
            out.append((raw, details))
        return out

    def _shared_resources(self):
        return ("pool",)


@pytest.fixture
def toy_cls():
    ToyEnv.score_calls = []
    return ToyEnv


@pytest.fixture
def toy_env(toy_cls):
    return toy_cls()
