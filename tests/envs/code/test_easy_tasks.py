"""The easy cooperative problem set shipped with CoopCode (``dataset="easy"``)."""

from __future__ import annotations

import ast
import json

import pytest

import sandbox
from envs.code import CoopCodeEnv
from envs.code.tasks import EASY_COOP_FILE, EASY_HELD_OUT_SLICE, EASY_TRAIN_SLICE, load_tasks


def _raw() -> list[dict]:
    with open(EASY_COOP_FILE, encoding="utf-8") as fh:
        return json.load(fh)


def test_easy_set_loads_offline_with_its_fixed_split():
    tasks = load_tasks("easy")
    assert len(tasks) == 72 and {t["source"] for t in tasks} == {"easy"}
    assert len({t["entry_point"] for t in tasks}) == 72  # 72 different problems
    train = CoopCodeEnv(dataset="easy", task_slice=EASY_TRAIN_SLICE, sandbox_backend="process")
    held_out = CoopCodeEnv(dataset="easy", task_slice=EASY_HELD_OUT_SLICE, sandbox_backend="process")
    assert (train.num_tasks, held_out.num_tasks) == (36, 36)
    train.close()
    held_out.close()


@pytest.mark.parametrize("task", load_tasks("easy"), ids=lambda t: t["entry_point"])
def test_every_problem_is_humaneval_style_with_a_helper_split(task):
    tree = ast.parse(task["prompt"])
    (func,) = tree.body
    assert isinstance(func, ast.FunctionDef) and func.name == task["entry_point"]
    doc = ast.get_docstring(func) or ""
    assert "Helper: aux(" in doc and f">>> {task['entry_point']}(" in doc  # the split and an example
    assert 3 <= len(task["assert_indices"]) <= 5


@pytest.fixture(scope="module")
def process_box():
    box = sandbox.Sandbox(backend="process", pool_size=2)
    yield box
    box.close()


def test_every_canonical_split_earns_the_full_team_reward(process_box):
    """aux_solution as the aux agent and main_solution as main: every assert passes in the
    sandbox and main really uses aux (cooperation level 1.0), so the reward is the maximum."""
    raw = _raw()
    env = CoopCodeEnv(dataset="easy", sandbox=process_box, sandbox_timeout=5.0, num_turns=1)
    clones = []
    for index in range(len(raw)):
        clone = env.clone()
        clone.reset(options={"task": index})
        clones.append(clone)
    actions = [{"aux": r["aux_solution"], "main": r["main_solution"]} for r in raw]
    results = CoopCodeEnv.step_many(clones, actions)
    for record, (_, rewards, _, _, infos) in zip(raw, results, strict=True):
        info = infos["main"]
        assert info["task_id"] == record["task_id"]
        assert info["passed"] and info["tests_passed"] == info["tests_total"] >= 3, (record["task_id"], info)
        assert info["levels"]["cooperation"] == 1.0, (record["task_id"], info["diagnostics"])
        assert rewards["main"] == env.max_reward
    env.close()


def test_canonical_solution_is_the_two_parts_joined():
    for record in _raw():
        assert record["canonical_solution"].startswith(record["aux_solution"])
        assert record["canonical_solution"].rstrip().endswith(record["main_solution"].rstrip())
