"""CoopCode against the real sandbox: the process backend always, Docker when marked.

Docker tests (``-m docker``) skip when no engine answers, and fail under ``CI=true``
(where the CI is expected to provide one).
"""

import os

import pytest

import sandbox
from envs.code import CoopCodeEnv

TASK = {
    "task_id": "custom/clip",
    "prompt": "def clip_all(xs, lo, hi):\n    '''Clip every number into [lo, hi].'''\n",
    "entry_point": "clip_all",
    "test": "def check(candidate):\n"
    "    assert candidate([1, 5, 9], 2, 8) == [2, 5, 8]\n"
    "    assert candidate([], 0, 1) == []\n"
    "    assert candidate([-3], -1, 1) == [-1]\n",
}
GOOD = {
    "aux": "def aux(x, lo, hi):\n    return max(lo, min(hi, x))\n",
    "main": "def clip_all(xs, lo, hi):\n    return [aux(x, lo, hi) for x in xs]\n",
}
HOSTILE = {
    "infinite_loop": "def clip_all(xs, lo, hi):\n    while True:\n        pass\n",
    "memory_bomb": "def clip_all(xs, lo, hi):\n    return [0] * (10 ** 10)\n",
    "sys_exit": "import sys\n\ndef clip_all(xs, lo, hi):\n    sys.exit(0)\n",
    "os_exit": "import os\n\ndef clip_all(xs, lo, hi):\n    os._exit(0)\n",
    "fake_pass_print": "def clip_all(xs, lo, hi):\n    print('passed')\n    return None\n",
    "import_time_crash": "RESULT = 1 / 0\n\ndef clip_all(xs, lo, hi):\n    return xs\n",
}


def _steps(box, actions_list, **kwargs):
    env = CoopCodeEnv(
        tasks=[TASK],
        sandbox=box,
        sandbox_timeout=2.0,
        num_turns=2,
        external_transition="level_feedback",
        sandbox_slice="all",
        **kwargs,
    )
    clones = []
    for _ in actions_list:
        clone = env.clone()
        clone.reset(options={"task": 0})
        clones.append(clone)
    return CoopCodeEnv.step_many(clones, actions_list)


@pytest.fixture(scope="module")
def process_box():
    box = sandbox.Sandbox(backend="process", pool_size=2)
    yield box
    box.close()


def test_real_sandbox_scores_and_batches(process_box, monkeypatch):
    calls = []
    real_run = process_box.run
    monkeypatch.setattr(process_box, "run", lambda programs: calls.append(len(programs)) or real_run(programs))
    hostile = [{"aux": GOOD["aux"], "main": main} for main in HOSTILE.values()]
    steps = _steps(process_box, [GOOD] + hostile)
    assert calls == [1 + len(HOSTILE)]  # one sandbox batch for everything
    first = steps[0][4]["main"]
    assert steps[0][1]["main"] == 4.0 and first["passed"] and first["sandbox_status"] == "passed"
    for (kind, _), (obs, rewards, _, _, infos) in zip(HOSTILE.items(), steps[1:], strict=True):
        info = infos["main"]
        assert not info["passed"], kind
        assert rewards["main"] <= 1.0 + 2.0 / 3, kind  # definitions + syntax, at most [] passing
        assert info["diagnostics"], kind
        assert "Tests:" in obs["main"], kind
    by_kind = dict(zip(HOSTILE, (s[4]["main"] for s in steps[1:]), strict=True))
    assert by_kind["infinite_loop"]["sandbox_status"] == "timeout"
    assert by_kind["memory_bomb"]["sandbox_status"] in ("memory", "error")
    assert by_kind["sys_exit"]["sandbox_status"] == "killed"
    assert by_kind["os_exit"]["sandbox_status"] == "killed"
    assert by_kind["import_time_crash"]["sandbox_error"]["type"] == "ZeroDivisionError"
    assert any("ZeroDivisionError" in d for d in by_kind["import_time_crash"]["diagnostics"])


def test_real_per_assert_outcomes_feed_level_feedback(process_box):
    wrong = {"aux": "def aux(x, lo, hi):\n    return min(lo, max(hi, x))\n", "main": GOOD["main"]}
    ((obs, _, _, _, infos),) = _steps(process_box, [wrong])
    info = infos["main"]
    assert [o["passed"] for o in info["test_outcomes"]] == [False, True, True]
    assert info["tests_passed"] == 2 and info["levels"]["tests"] == pytest.approx(2 / 3)
    assert "- FAILED: assert candidate([1, 5, 9], 2, 8) == [2, 5, 8] -> AssertionError: got [2, 2, 2]" in obs["main"]


def test_env_created_process_sandbox_is_closed_by_the_env():
    env = CoopCodeEnv(tasks=[TASK], sandbox_backend="process", sandbox_pool_size=1)
    env.reset(options={"task": 0})
    _, rewards, *_ = env.step(GOOD)
    box = env._sandbox.sandbox
    assert rewards["main"] == 4.0 and box.backend == "process"
    env.close()
    assert env._sandbox.sandbox is None and box._closed


@pytest.mark.docker
def test_docker_backend_scores_like_the_process_backend(process_box):
    try:
        box = sandbox.Sandbox(backend="docker", pool_size=2)
    except sandbox.SandboxUnavailable as err:
        if os.environ.get("CI", "").lower() == "true":
            raise
        pytest.skip(f"no Docker engine: {err}")
    try:
        actions = [GOOD] + [{"aux": GOOD["aux"], "main": m} for m in HOSTILE.values()]
        docker_steps = _steps(box, actions)
        process_steps = _steps(process_box, actions)
        assert [s[1]["main"] for s in docker_steps] == [s[1]["main"] for s in process_steps]
        assert [s[4]["main"]["passed"] for s in docker_steps] == [s[4]["main"]["passed"] for s in process_steps]
    finally:
        box.close()


def test_no_docker_engine_is_a_clear_error_naming_the_backend(monkeypatch):
    from envs.code import CodeSandboxError

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    env = CoopCodeEnv(tasks=[TASK], sandbox_backend="docker")
    env.reset(options={"task": 0})
    with pytest.raises(CodeSandboxError, match="backend 'docker'.*SandboxUnavailable"):
        env.step(GOOD)
    env.close()


def test_a_sandbox_that_went_away_is_a_clear_error_naming_the_backend():
    from envs.code import CodeSandboxError

    box = sandbox.Sandbox(backend="process", pool_size=1)
    env = CoopCodeEnv(tasks=[TASK], sandbox=box)
    env.reset(options={"task": 0})
    box.close()  # e.g. shut down by another owner mid-training
    with pytest.raises(CodeSandboxError, match="backend 'process'.*closed"):
        env.step(GOOD)
