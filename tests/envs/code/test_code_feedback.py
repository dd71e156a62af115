"""Next-turn prompts of every mode, and the sandbox_slice semantics."""

import pytest
from code_fakes import FakeSandbox

from envs.code import CoopCodeEnv
from envs.code.feedback import select_tests, validate_sandbox_slice

# five tests; the wrong aux below makes tests 1, 2 and 4 (0-based) fail
TASK = {
    "task_id": "custom/inc",
    "prompt": "def inc_all(xs):\n    '''Add one to every number.'''\n",
    "entry_point": "inc_all",
    "test": "def check(candidate):\n"
    "    assert candidate([]) == []\n"
    "    assert candidate([1]) == [2]\n"
    "    assert candidate([5, 6]) == [6, 7]\n"
    "    assert candidate([0, 0]) == [1, 1] or True\n"
    "    assert candidate([9]) == [10]\n",
}
AUX_WRONG = "def aux(x):\n    return x + 2\n"
MAIN = "def inc_all(xs):\n    return [aux(x) for x in xs]\n"
TEST_TEXT = [
    "assert candidate([]) == []",
    "assert candidate([1]) == [2]",
    "assert candidate([5, 6]) == [6, 7]",
    "assert candidate([0, 0]) == [1, 1] or True",
    "assert candidate([9]) == [10]",
]


@pytest.mark.parametrize(
    "sandbox_slice, shown",
    [
        (1, [0]),
        (3, [0, 1, 2]),
        (-2, [3, 4]),
        (0, [0, 1, 2, 3, 4]),
        (None, [0, 1, 2, 3, 4]),
        ("all", [0, 1, 2, 3, 4]),
        (10, [0, 1, 2, 3, 4]),
    ],
)
def test_select_tests(sandbox_slice, shown):
    assert select_tests(list(range(5)), validate_sandbox_slice(sandbox_slice)) == shown


@pytest.mark.parametrize("bad", [1.5, "first", True, [1]])
def test_bad_sandbox_slice_is_rejected(bad):
    with pytest.raises(ValueError, match="sandbox_slice"):
        CoopCodeEnv(tasks=[TASK], sandbox=FakeSandbox(), sandbox_slice=bad)


def _two_turns(mode, **kwargs):
    box = FakeSandbox()
    env = CoopCodeEnv(tasks=[TASK], sandbox=box, num_turns=2, external_transition=mode, **kwargs)
    env.reset(options={"task": 0})
    obs, rewards, _, _, infos = env.step({"aux": AUX_WRONG, "main": MAIN})
    return env, box, obs, infos


@pytest.mark.parametrize(
    "sandbox_slice, shown",
    [
        (1, [0]),
        (3, [0, 1, 2]),
        (-2, [3, 4]),
        (0, [0, 1, 2, 3, 4]),
        (None, [0, 1, 2, 3, 4]),
        ("all", [0, 1, 2, 3, 4]),
    ],
)
def test_level_feedback_shows_the_sliced_tests_but_reward_uses_all(sandbox_slice, shown):
    env, box, obs, infos = _two_turns("level_feedback", sandbox_slice=sandbox_slice)
    # the reward always runs (and counts) every test, in one sandbox run
    assert len(box.calls) == 1 and len(box.calls[0][0].tests) == 5
    assert infos["main"]["tests_total"] == 5 and infos["main"]["tests_passed"] == 2
    for agent in ("aux", "main"):
        prompt = obs[agent]
        for i, text in enumerate(TEST_TEXT):
            assert (text in prompt) == (i in shown), (agent, i)
        assert f"{len(shown)} of 5 test(s) shown; 2 of 5 passed overall" in prompt


def test_level_feedback_prompt_content():
    env, _, obs, _ = _two_turns("level_feedback", sandbox_slice="all")
    aux_prompt, main_prompt = obs["aux"], obs["main"]
    assert aux_prompt.startswith(env._initial_prompt(env.task(0), "aux").rstrip())
    assert "Your code in turn 1:\n```python\n" + AUX_WRONG.strip() in aux_prompt
    assert "Latest code of your teammate (main)" in aux_prompt
    assert "`aux` (aux): found" in aux_prompt and "`inc_all` (main): found" in aux_prompt
    # a failing test with its exception and the value main returned
    assert "- FAILED: assert candidate([1]) == [2] -> AssertionError: got [3]" in main_prompt
    assert "- PASSED: assert candidate([]) == []" in main_prompt
    assert "main calls `aux` and uses its result" in main_prompt
    assert main_prompt.rstrip().endswith("Revise your function `inc_all` and reply with its complete code only.")
    assert aux_prompt.rstrip().endswith("Revise your function `aux` and reply with its complete code only.")


def test_level_feedback_static_diagnostics_and_wrapper_note():
    env = CoopCodeEnv(tasks=[TASK], sandbox=FakeSandbox(), num_turns=2, external_transition="level_feedback")
    env.reset(options={"task": 0})
    obs, *_ = env.step({"aux": "def helper(:\n", "main": "def inc_all(xs):\n    return aux(xs)\n"})
    prompt = obs["aux"]
    assert "`aux` (aux): NOT found" in prompt
    assert "syntax error in aux's code at line 1, column" in prompt
    assert "thin wrapper" in prompt
    assert "FAILED: assert candidate([]) == [] -> NameError" in prompt  # aux undefined at run time


def test_level_feedback_when_nothing_could_run():
    env = CoopCodeEnv(tasks=[TASK], sandbox=FakeSandbox(), num_turns=2, external_transition="level_feedback")
    env.reset(options={"task": 0})
    obs, *_ = env.step({"aux": "", "main": "print('hi')"})
    assert "the tests did not run: the program could not be built" in obs["main"]
    assert "main does not call `aux`" in obs["main"]


def test_plain_mode_executes_nothing_and_asks_to_revise():
    box = FakeSandbox()
    env = CoopCodeEnv(tasks=[TASK], sandbox=box, num_turns=3, external_transition="plain")
    env.reset(options={"task": 0})
    obs, _, _, _, infos = env.step({"aux": AUX_WRONG, "main": MAIN})
    assert len(box.calls) == 1  # the reward run only; the transition runs nothing
    prompt = obs["main"]
    assert "Your code in turn 1:\n```python\n" + MAIN.strip() in prompt
    assert "Latest code of your teammate (aux):\n```python\n" + AUX_WRONG.strip() in prompt
    assert "FAILED" not in prompt and "Tests:" not in prompt
    assert prompt.rstrip().endswith("Revise your function `inc_all` and reply with its complete code only.")
    obs, *_ = env.step({"aux": "def aux(x):\n    return x + 1\n", "main": MAIN})
    assert "Your code in turn 2:" in obs["aux"] and "Your code in turn 1:" in obs["aux"]
    assert len(box.calls) == 2


def test_custom_callable_transition_gets_the_design_signature():
    seen = {}

    def custom(prompt, agent_completions, num_agents, prompt_history_per_agent=None, response_history_per_agent=None):
        seen.update(prompt=prompt, completions=agent_completions, n=num_agents, responses=response_history_per_agent)
        return [f"again {i}" for i in range(num_agents)]

    env = CoopCodeEnv(
        tasks=[TASK], sandbox=FakeSandbox(), num_turns=2, external_transition=custom, external_prompt_passthrough=True
    )
    env.reset(options={"task": 0})
    obs, *_ = env.step({"aux": AUX_WRONG, "main": MAIN})
    assert obs == {"aux": "again 0", "main": "again 1"}
    assert seen["prompt"] == TASK["prompt"] and seen["completions"] == [AUX_WRONG, MAIN] and seen["n"] == 2
    assert seen["responses"] == [[AUX_WRONG], [MAIN]]


def test_runaway_code_is_cut_in_the_next_prompt():
    env = CoopCodeEnv(tasks=[TASK], sandbox=FakeSandbox(), num_turns=2, external_transition="plain")
    env.reset(options={"task": 0})
    obs, *_ = env.step({"aux": "x = 1\n" * 50_000, "main": MAIN})
    assert "more characters cut]" in obs["aux"] and len(obs["aux"]) < 60_000


def test_fenced_replies_are_shown_fenced_once():
    from envs.code.feedback import history_section

    fenced = "Here it is:\n```python\ndef aux(x):\n    return x // 2\n```\nDone."
    text = history_section("main", [fenced], {"aux": fenced})
    assert text.count("```python") == 2  # one fence per block, not a fence inside a fence
    assert "Here it is" not in text and "Done." not in text
    assert "def aux(x):\n    return x // 2\n```" in text
