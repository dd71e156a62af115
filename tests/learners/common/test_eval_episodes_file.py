"""Each trainer evaluation appends its episode rows to RUN_DIR/eval_episodes.jsonl."""

from __future__ import annotations

import copy
import random
from typing import Any

from comlrl_core.models.simple_policies import CallablePolicy
from comlrl_core.policy import GenerationConfig
from learners.common.evaluation import EPISODES_FILE, read_eval_episodes, trainer_evaluation


class SeedEnv:
    """One-turn episodes; the reward is drawn from the reset seed (so samples differ)."""

    possible_agents = ["a", "b"]
    num_tasks = 3

    def __init__(self) -> None:
        self.agents: list[str] = []
        self.value = 0.0

    def reset(self, seed: Any = None, options: Any = None) -> tuple[dict, dict]:
        self.agents, self.value = list(self.possible_agents), random.Random(seed).random()
        return {a: "prompt" for a in self.agents}, {}

    def clone(self) -> "SeedEnv":
        return copy.copy(self)

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        agents, self.agents = self.agents, []
        info = {"passed": self.value > 0.5, "pass_rate": self.value}
        return (
            {a: "" for a in agents},
            {a: self.value for a in agents},
            {},
            {a: True for a in agents},
            {a: info for a in agents},
        )


def _evaluate(run_dir, seed):
    return trainer_evaluation(
        SeedEnv(),
        [CallablePolicy(lambda prompt: "code"), CallablePolicy(lambda prompt: "code")],
        num_tasks=2,
        episodes_per_task=2,
        num_turns=2,
        discount=1.0,
        k=(1,),
        generation_config=GenerationConfig(),
        seed=seed,
        run_dir=run_dir,
    )


def test_every_evaluation_appends_its_episodes_in_order(tmp_path):
    assert read_eval_episodes(tmp_path) == []
    first = _evaluate(tmp_path, seed=0)
    _evaluate(tmp_path, seed=1)
    evaluations = read_eval_episodes(tmp_path)
    assert (tmp_path / EPISODES_FILE).is_file() and len(evaluations) == 2
    rows = evaluations[0]
    assert [(r["task"], r["sample"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert sum(r["return"] for r in rows) / 4 == first["eval/return_mean"]
    assert rows[0]["test_pass_rate"] == rows[0]["return"] and "passed" in rows[0]
    assert evaluations[0] != evaluations[1]  # another seed, other episodes


def test_no_run_dir_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _evaluate(None, seed=0)
    assert not list(tmp_path.iterdir())
