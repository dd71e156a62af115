"""Per-episode values and rows of the evaluation: test pass rate, syntax, cooperation."""

from __future__ import annotations

import copy

import pytest
from episode_fakes import SeededTextPolicy

from comlrl_core.episodes.engine import EpisodeRecord, play_episodes, step_numbers
from comlrl_core.episodes.evaluation import evaluate_episodes
from comlrl_core.episodes.metrics import episode_metrics, episode_rows, episode_values
from comlrl_core.policy import GenerationConfig


def _info(pass_rate: float, syntax: float = 1.0, aux_found: bool = True, calls_aux: bool = True) -> dict:
    return {
        "pass_rate": pass_rate,
        "levels": {"syntax": syntax, "tests": pass_rate, "cooperation": None},
        "found": {"aux": aux_found, "main": True},
        "cooperation": {"calls_aux": calls_aux, "num_calls": 1},
        "diagnostics": ["text is dropped"],
    }


def _episode(task, sample, rewards, infos, passed=False):
    return EpisodeRecord(task, sample, list(rewards), passed=passed, step_infos=[step_numbers(i) for i in infos])


def test_step_numbers_keeps_numbers_and_flattens_one_level():
    numbers = step_numbers(_info(0.5, aux_found=False))
    assert numbers["pass_rate"] == 0.5 and numbers["levels/syntax"] == 1.0
    assert numbers["found/aux"] == 0.0 and numbers["cooperation/calls_aux"] == 1.0
    assert "levels/cooperation" not in numbers and "diagnostics" not in numbers


def test_episode_values_read_the_final_step():
    ep = _episode(0, 0, [1.0, 2.5], [_info(0.25, syntax=0.0, calls_aux=False), _info(0.75)])
    values = episode_values(ep)
    assert values == {
        "return": 3.5,
        "turn_1/test_pass_rate": 0.25,
        "turn_2/test_pass_rate": 0.75,
        "test_pass_rate": 0.75,
        "syntax_valid": 1.0,
        "cooperation": 1.0,
    }
    # cooperation needs BOTH a defined aux and a call of it
    assert episode_values(_episode(0, 0, [1.0], [_info(1.0, aux_found=False)]))["cooperation"] == 0.0


def test_episode_metrics_report_the_new_rates_and_rows_keep_each_episode():
    eps = [
        _episode(0, 0, [1.0, 2.0], [_info(0.0), _info(0.5)]),
        _episode(0, 1, [3.0], [_info(1.0, syntax=0.0, calls_aux=False)], passed=True),  # ended early
        _episode(1, 0, [0.0, 0.0], [_info(0.0), _info(0.0, aux_found=False)]),
        _episode(1, 1, [1.0, 1.0], [_info(0.25), _info(0.25)]),
    ]
    m = episode_metrics(eps, k=(1,))
    assert m["test_pass_rate"] == pytest.approx((0.5 + 1.0 + 0.0 + 0.25) / 4)
    assert m["turn_1/test_pass_rate"] == pytest.approx((0.0 + 1.0 + 0.0 + 0.25) / 4)
    assert m["turn_2/test_pass_rate"] == pytest.approx((0.5 + 0.0 + 0.25) / 3)  # episodes that reached turn 2
    assert m["syntax_valid_rate"] == 0.75 and m["cooperation_rate"] == 0.5
    rows = episode_rows(eps)
    assert [(r["task"], r["sample"], r["passed"]) for r in rows] == [
        (0, 0, False),
        (0, 1, True),
        (1, 0, False),
        (1, 1, False),
    ]
    assert rows[1]["rewards"] == [3.0] and rows[1]["test_pass_rate"] == 1.0


def test_envs_without_these_infos_report_only_the_old_metrics():
    eps = [EpisodeRecord(0, 0, [1.0], passed=True, step_infos=[{"raw_reward": 1.0}])]
    m = episode_metrics(eps)
    assert not any(k.startswith(("test_pass", "syntax", "cooperation", "turn_1/test")) for k in m)
    assert set(episode_values(eps[0])) == {"return"}


class InfoEnv:
    """One agent-pair turn per episode; the info reports pass_rate = task / 4."""

    possible_agents = ["aux", "main"]
    num_tasks = 3

    def __init__(self):
        self.task, self.agents = 0, []

    def reset(self, seed=None, options=None):
        self.task, self.agents = int(options["task"]), list(self.possible_agents)
        return {a: f"task {self.task}" for a in self.agents}, {}

    def clone(self):
        return copy.copy(self)

    def step(self, actions):
        info = _info(self.task / 4)
        return (
            {a: "" for a in self.agents},
            {a: 1.0 for a in self.agents},
            {},
            {a: True for a in self.agents},
            {a: dict(info, passed=self.task == 2) for a in self.agents},
        )


def test_the_engine_records_each_steps_info_numbers_and_evaluation_exports_rows():
    eps = play_episodes(
        InfoEnv(), [0, 1, 2], [SeededTextPolicy(), SeededTextPolicy()], generation_config=GenerationConfig(), seed=0
    )
    assert [e.step_infos[0]["pass_rate"] for e in eps] == [0.0, 0.25, 0.5]
    result = evaluate_episodes(InfoEnv(), [SeededTextPolicy(), SeededTextPolicy()], episodes_per_task=2)
    assert result["test_pass_rate"] == pytest.approx(0.25) and result["cooperation_rate"] == 1.0
    rows = result.to_dict()["episodes"]
    assert len(rows) == 6 and rows[-1] == {
        "task": 2,
        "sample": 1,
        "passed": True,
        "rewards": [1.0],
        "return": 1.0,
        "turn_1/test_pass_rate": 0.5,
        "test_pass_rate": 0.5,
        "syntax_valid": 1.0,
        "cooperation": 1.0,
    }
