"""CoopCodeEnv: API conformance, batching, sharing, garbage inputs, sandbox outages."""

import random
import string

import pytest
from code_fakes import DownSandbox, FakeSandbox

import envs
from envs.code import CodeSandboxError, CoopCodeEnv
from sandbox.types import SandboxUnavailable

TASK = {
    "task_id": "custom/abs_sum",
    "prompt": "def abs_sum(xs):\n    '''Sum of absolute values.'''\n",
    "entry_point": "abs_sum",
    "test": "def check(candidate):\n    assert candidate([1, -2]) == 3\n    assert candidate([]) == 0\n"
    "    assert candidate([-5]) == 5\n",
}
GOOD = {
    "aux": "def aux(x):\n    return -x if x < 0 else x\n",
    "main": "def abs_sum(xs):\n    return sum(aux(x) for x in xs)\n",
}
BROKEN = {"aux": "def aux(x):\n    return x\n", "main": "def abs_sum(xs):\n    return sum(aux(x) for x in xs)\n"}


def _env(box=None, **kwargs):
    return CoopCodeEnv(tasks=[TASK, TASK], sandbox=box or FakeSandbox(), **kwargs)


def test_registry_builds_coopcode():
    env = envs.make("comlrl/CoopCode-v0", tasks=[TASK], sandbox=FakeSandbox(), num_turns=2)
    assert isinstance(env, CoopCodeEnv) and env.possible_agents == ["aux", "main"] and env.num_turns == 2


def test_spaces_are_cached_text_spaces():
    env = _env()
    assert env.observation_space("aux") is env.observation_space("aux")
    assert env.action_space("main") is env.action_space("main")


def test_step_many_scores_every_joint_action_in_one_sandbox_run():
    box = FakeSandbox()
    base = _env(box, num_turns=2)
    base.reset(options={"task": 0})
    group = [base.clone() for _ in range(6)]
    results = CoopCodeEnv.step_many(group, [GOOD, BROKEN] * 3)
    assert len(box.calls) == 1 and len(box.calls[0]) == 6
    rewards = [r[1]["main"] for r in results]
    assert rewards == [4.0, 0.5 + 0.5 + 2.0 / 3 + 1.0] * 3
    assert [r[4]["aux"]["passed"] for r in results] == [True, False] * 3
    assert base.turn == 0  # clones are independent


def test_nothing_to_run_skips_the_sandbox():
    box = FakeSandbox()
    env = _env(box)
    env.reset(options={"task": 0})
    _, rewards, _, _, infos = env.step({"aux": "", "main": "hello"})
    assert box.calls == [] and rewards["main"] == 0.0
    assert infos["main"]["tests_passed"] == 0 and infos["main"]["sandbox_status"] is None


def _random_text(rng, n):
    return "".join(rng.choice(string.printable) for _ in range(n))


GARBAGE = {
    "empty": "",
    "whitespace": "   \n\t  ",
    "huge_1mb": "x = 1\n" * ((1 << 20) // 6) + "def abs_sum(",
    "huge_code_1mb": "#" * (1 << 20),
    "binary_looking": "".join(chr(c) for c in range(0, 32)) * 500 + "\x00\x01def aux(x):\x00",
    "random": _random_text(random.Random(0), 2000),
    "surrogates": "def aux(x):\n    return '\udcff'\n",
    "deep_nesting": "(" * 5000 + ")" * 5000,
    "deep_unary": "def abs_sum(xs):\n    return " + "-" * 100_000 + "1\n",
    "bytes": b"\xff\xfe def aux(x): return x",
    "none": None,
}


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_garbage_gets_low_reward_and_diagnostics(kind):
    env = _env(num_turns=2, external_transition="level_feedback")
    env.reset(options={"task": 0})
    obs, rewards, _, _, infos = env.step({"aux": GARBAGE[kind], "main": GARBAGE[kind]})
    assert rewards["aux"] == rewards["main"] <= 0.5
    info = infos["main"]
    assert info["diagnostics"] and info["passed"] is False and info["tests_passed"] == 0
    assert isinstance(obs["main"], str) and "NOT found" in obs["main"]


def test_random_completions_never_raise():
    rng = random.Random(1)
    env = _env(num_turns=3, external_transition="level_feedback")
    for episode in range(5):
        env.reset(seed=episode)
        while env.agents:
            acts = {a: _random_text(rng, rng.randint(0, 300)) for a in env.agents}
            _, rewards, _, _, infos = env.step(acts)
            assert all(0.0 <= r <= 0.5 for r in rewards.values())


def test_sandbox_outage_names_the_backend():
    env = _env(DownSandbox())
    env.reset(options={"task": 0})
    with pytest.raises(CodeSandboxError, match="backend 'docker'.*SandboxUnavailable.*no Docker engine"):
        env.step(GOOD)


def test_sandbox_dying_mid_run_names_the_backend():
    env = _env(FakeSandbox(fail_with=BrokenPipeError("worker pipe closed")))
    env.reset(options={"task": 0})
    with pytest.raises(CodeSandboxError, match="backend 'fake'.*BrokenPipeError: worker pipe closed"):
        env.step(GOOD)


class LosingSandbox(FakeSandbox):
    """Every program's worker died twice (the real sandbox already retried once)."""

    def run(self, programs):
        from sandbox.protocol import lost_result

        return [lost_result("fake", "the sandbox worker was lost twice running this program") for _ in programs]


def test_a_program_lost_twice_raises_instead_of_scoring():
    env = _env(LosingSandbox())
    env.reset(options={"task": 0})
    with pytest.raises(CodeSandboxError, match="lost their sandbox worker twice.*backend 'fake'"):
        env.step(GOOD)


def test_sandbox_that_cannot_start_names_the_backend(monkeypatch):
    import sandbox

    def refuse(**kwargs):
        raise SandboxUnavailable("no Docker engine answers")

    monkeypatch.setattr(sandbox, "Sandbox", refuse, raising=False)
    env = CoopCodeEnv(tasks=[TASK], sandbox_backend="docker")
    env.reset(options={"task": 0})
    with pytest.raises(CodeSandboxError, match="backend 'docker'.*no Docker engine answers"):
        env.step(GOOD)


def test_clones_share_the_sandbox_and_only_the_owner_closes_it(monkeypatch):
    import sandbox

    made = []

    def factory(**kwargs):
        made.append(kwargs)
        return FakeSandbox()

    monkeypatch.setattr(sandbox, "Sandbox", factory, raising=False)
    env = CoopCodeEnv(tasks=[TASK], sandbox_backend="process", sandbox_pool_size=3)
    env.reset(options={"task": 0})
    twin = env.clone()
    env.step(GOOD)
    twin.step(GOOD)
    assert made == [{"backend": "process", "pool_size": 3}]  # created once, lazily, shared
    box = env._sandbox.sandbox
    twin.close()
    assert not box.closed
    env.close()
    assert box.closed


def test_a_given_sandbox_is_never_closed_by_the_env():
    box = FakeSandbox()
    env = _env(box)
    env.close()
    assert not box.closed


def test_state_and_render_show_the_joint_history():
    env = _env(num_turns=2, render_mode="ansi")
    env.reset(options={"task": 1})
    env.step(BROKEN)
    text = env.render()
    assert text == env.state() and "abs_sum" in text and BROKEN["aux"].strip() in text


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"agents": "trio"}, "agents must be"),
        ({"num_agents": 3}, "num_agents must be"),
        ({"sandbox_backend": "vm"}, "sandbox_backend"),
        ({"sandbox_timeout": 0}, "sandbox_timeout"),
        ({"aux_name": "not valid"}, "aux_name"),
        ({"external_transition": "telepathy"}, "telepathy"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CoopCodeEnv(tasks=[TASK], **kwargs)


def test_reset_with_a_raw_task_record():
    env = _env()
    obs, infos = env.reset(options={"task": dict(TASK, task_id="given")})
    assert "abs_sum" in obs["main"] and infos["main"]["task_index"] is None
    _, rewards, *_ = env.step(GOOD)
    assert rewards["main"] == 4.0


def test_separate_envs_given_one_sandbox_batch_together_unless_scoring_differs():
    box = FakeSandbox()
    a, b = _env(box), _env(box)
    c = _env(box, reward_weights={"tests": 1.0})  # scored differently: its own batch
    for env in (a, b, c):
        env.reset(options={"task": 0})
    steps = CoopCodeEnv.step_many([a, b, c], [GOOD, BROKEN, GOOD])
    assert sorted(len(call) for call in box.calls) == [1, 2]
    assert [s[1]["main"] for s in steps] == [4.0, 0.5 + 0.5 + 2.0 / 3 + 1.0, 3.0]
