"""Reward levels on hand-written aux / main pairs (fake in-process sandbox)."""

import pytest
from code_fakes import FakeSandbox
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.code import CoopCodeEnv, RewardWeights

TASK = {
    "task_id": "custom/even_squares",
    "prompt": "from typing import List\n\ndef sum_even_squares(xs: List[int]) -> int:\n"
    "    '''Sum of the squares of the even numbers in xs.'''\n",
    "entry_point": "sum_even_squares",
    "test": "def check(candidate):\n    assert candidate([1, 2, 3, 4]) == 20\n    assert candidate([]) == 0\n"
    "    assert candidate([2]) == 4\n    assert candidate([1, 3]) == 0\n",
}
AUX_SQ_EVEN = "def aux(x):\n    return x * x if x % 2 == 0 else 0\n"
AUX_SQ = "def aux(x):\n    return x * x\n"
MAIN_USES = "def sum_even_squares(xs):\n    return sum(aux(x) for x in xs)\n"
SOLO = "def sum_even_squares(xs):\n    return sum(x * x for x in xs if x % 2 == 0)\n"


def _step(actions, **kwargs):
    env = CoopCodeEnv(tasks=[TASK], sandbox=FakeSandbox(), **kwargs)
    env.reset(options={"task": 0})
    obs, rewards, terms, truncs, infos = env.step(actions)
    assert len(set(rewards.values())) == 1  # one team reward
    return rewards["main"], infos["main"]


@pytest.mark.parametrize(
    "aux, main, reward, levels",
    [
        # aux and main both right, main really uses aux
        (AUX_SQ_EVEN, MAIN_USES, 4.0, (1, 1, 1, 1)),
        # thin wrapper: aux does everything
        (
            "def aux(xs):\n    return sum(x * x for x in xs if x % 2 == 0)\n",
            "def sum_even_squares(xs):\n    r = aux(xs)\n    out = r\n    return out\n",
            3.25,
            (1, 1, 1, 0.25),
        ),
        # main solves alone; aux only named in a comment
        (AUX_SQ, "def sum_even_squares(xs):\n    # aux(x) could help\n" + SOLO.split("\n", 1)[1], 3.0, (1, 1, 1, 0)),
        # main calls aux but throws the value away
        (AUX_SQ, "def sum_even_squares(xs):\n    aux(0)\n" + SOLO.split("\n", 1)[1], 3.0, (1, 1, 1, 0)),
        # half the tests pass ([1,2,3,4] -> 30, [1,3] -> 10 are wrong)
        (AUX_SQ, MAIN_USES, 3.0, (1, 1, 0.5, 1)),
        # aux missing: main's call raises NameError except on [] (nothing to call aux on)
        ("", MAIN_USES, 1.25, (0.5, 1, 0.25, 0)),
        # main does not parse: nothing can run
        (AUX_SQ_EVEN, "def sum_even_squares(xs):\n    return sum(aux(x) for x in xs\n", 0.25, (0.5, 0, 0, 0)),
        # cooperation pays only once a test passes
        (AUX_SQ_EVEN, "def sum_even_squares(xs):\n    return aux(len(xs)) - 7\n", 1.0, (1, 1, 0, 0)),
    ],
)
def test_levels_on_hand_written_pairs(aux, main, reward, levels):
    got, info = _step({"aux": aux, "main": main})
    assert got == pytest.approx(reward)
    lv = info["levels"]
    assert (lv["definitions"], lv["syntax"], lv["tests"], lv["cooperation"]) == pytest.approx(levels)
    assert info["raw_reward"] == pytest.approx(reward) and info["max_reward"] == 4.0
    assert info["reward_scale"] == "0.5*definitions + 0.5*syntax + 2.0*tests + 1.0*cooperation"
    assert info["tests_total"] == 4 and info["tests_passed"] == round(levels[2] * 4)
    assert info["passed"] == (levels[2] == 1)
    assert isinstance(info["diagnostics"], list) and info["diagnostics"]


def test_infos_report_syntax_error_position_and_missing_definition():
    _, info = _step({"aux": AUX_SQ, "main": "def sum_even_squares(xs):\n    return (1 +\n"})
    assert info["found"] == {"aux": True, "main": False}
    err = info["syntax_errors"][0]
    assert err["agent"] == "main" and err["line"] == 2 and err["column"]
    assert any("SyntaxError at line 2" in d for d in info["diagnostics"])
    assert any("no function `sum_even_squares`" in d for d in info["diagnostics"])


def test_main_redefining_aux_is_ignored():
    main = "def aux(x):\n    return x * x if x % 2 == 0 else 0\n\n" + MAIN_USES
    _, info = _step({"aux": AUX_SQ, "main": main})  # the aux agent's (wrong) aux is the one used
    assert info["tests_passed"] == 2
    assert any("definition of `aux` was ignored" in d for d in info["diagnostics"])


def test_fenced_completions_with_prose_are_accepted():
    aux = "Sure! Here is the helper:\n```python\n" + AUX_SQ_EVEN + "```\nIt squares even numbers."
    main = "```python\n" + MAIN_USES + "\nprint(sum_even_squares([2]))\n```"
    reward, info = _step({"aux": aux, "main": main})
    assert reward == 4.0 and info["passed"]


def test_single_agent_mode_scale_and_levels():
    for kwargs in ({"agents": "single"}, {"num_agents": 1}):
        env = CoopCodeEnv(tasks=[TASK], sandbox=FakeSandbox(), **kwargs)
        assert env.possible_agents == ["main"] and env.max_reward == 3.0
        env.reset(options={"task": 0})
        _, rewards, _, _, infos = env.step({"main": AUX_SQ_EVEN + "\n" + MAIN_USES})
        assert rewards == {"main": 3.0}
        assert infos["main"]["levels"]["cooperation"] is None and infos["main"]["passed"]
        assert infos["main"]["cooperation"] is None


def test_custom_weights_change_scale():
    weights = RewardWeights(definitions=0.0, syntax=0.0, tests=1.0, cooperation=0.0)
    reward, info = _step({"aux": AUX_SQ, "main": MAIN_USES}, reward_weights=weights)
    assert reward == pytest.approx(0.5) and info["max_reward"] == 1.0
    with pytest.raises(ValueError, match="RewardWeights.tests"):
        RewardWeights(tests=-1)


def test_early_termination_at_full_reward():
    env = CoopCodeEnv(tasks=[TASK], sandbox=FakeSandbox(), num_turns=3, early_termination_threshold=4.0)
    env.reset(options={"task": 0})
    _, _, terms, truncs, _ = env.step({"aux": AUX_SQ_EVEN, "main": MAIN_USES})
    assert terms == {"aux": True, "main": True} and truncs == {"aux": False, "main": False}
    assert env.agents == []


FRAGMENTS = [
    AUX_SQ,
    AUX_SQ_EVEN,
    MAIN_USES,
    SOLO,
    "def aux(:\n",
    "```python\n",
    "```\n",
    "return 1\n",
    "    return aux(x)\n",
    "print(1)\n",
    "import math\n",
    "def sum_even_squares(xs):\n",
    "\x00",
    "# aux(x)\n",
]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(FRAGMENTS), max_size=5),
    st.lists(st.sampled_from(FRAGMENTS), max_size=5),
    st.sampled_from([True, False]),
)
def test_reward_is_the_weighted_sum_of_its_levels(aux_parts, main_parts, single):
    env = CoopCodeEnv(tasks=[TASK], sandbox=FakeSandbox(), agents="single" if single else "team")
    env.reset(options={"task": 0})
    actions = {"main": "".join(main_parts)} if single else {"aux": "".join(aux_parts), "main": "".join(main_parts)}
    _, rewards, _, _, infos = env.step(actions)
    info = infos["main"]
    lv, w = info["levels"], RewardWeights()
    expected = (
        w.definitions * lv["definitions"]
        + w.syntax * lv["syntax"]
        + w.tests * lv["tests"]
        + (w.cooperation * lv["cooperation"] if lv["cooperation"] is not None else 0.0)
    )
    assert rewards["main"] == pytest.approx(expected)
    assert 0.0 <= rewards["main"] <= info["max_reward"]
    assert all(v is None or 0.0 <= v <= 1.0 for v in lv.values())
    assert info["passed"] == (info["tests_passed"] == info["tests_total"] and lv["tests"] == 1.0)
