"""TextParallelEnv: spaces, episodes, reward processing, transitions, clones, step_many."""

from __future__ import annotations

import string

import pytest

from comlrl_core.env_api import step_many
from envs.base import TEXT_CHARSET, parse_task_slice
from envs.reward_processing import RewardProcessor

GOOD = {"a": "good", "b": "good"}
HALF = {"a": "good", "b": "bad"}


# ---- spaces --------------------------------------------------------------------------
def test_spaces_are_cached_text_with_printable_charset_and_newline(toy_env):
    for agent in toy_env.possible_agents:
        assert toy_env.action_space(agent) is toy_env.action_space(agent)
        assert toy_env.observation_space(agent) is toy_env.observation_space(agent)
        charset = toy_env.action_space(agent).character_set
        assert "\n" in charset and set(string.ascii_letters + string.digits + string.punctuation + " ") <= charset
    assert set(TEXT_CHARSET) <= set(string.printable)
    with pytest.raises(KeyError, match="unknown agent"):
        toy_env.action_space("nobody")


def test_sampled_actions_lie_in_the_space(toy_env):
    space = toy_env.action_space("a")
    space.seed(3)
    samples = [space.sample() for _ in range(5)]
    assert all(space.contains(s) for s in samples)
    assert len(set(samples)) == 5


# ---- reset and tasks ---------------------------------------------------------------------
def test_reset_selects_task_by_index_dict_or_seed(toy_env):
    obs, infos = toy_env.reset(options={"task": 2})
    assert obs == {"a": "[a] task 2", "b": "[b] task 2"}
    assert infos["a"] == {"turn": 0, "task_index": 2}
    obs, _ = toy_env.reset(options={"task": -1})
    assert obs["a"] == "[a] task 5" and toy_env._task_index == 5
    obs, infos = toy_env.reset(options={"task": {"prompt": "custom"}})
    assert obs["b"] == "[b] custom" and infos["b"]["task_index"] is None
    first = [toy_env.reset(seed=7)[0]["a"]] + [toy_env.reset()[0]["a"] for _ in range(5)]
    again = [toy_env.reset(seed=7)[0]["a"]] + [toy_env.reset()[0]["a"] for _ in range(5)]
    assert first == again and len(set(first)) > 1
    with pytest.raises(IndexError):
        toy_env.reset(options={"task": 6})


def test_task_slice_selects_a_split(toy_cls):
    env = toy_cls(task_slice="2:4")
    assert env.num_tasks == 2 and env.task(0)["index"] == 2
    assert toy_cls(task_slice=":-2").num_tasks == 4
    assert parse_task_slice("::2") == slice(None, None, 2)
    with pytest.raises(ValueError, match="task_slice"):
        parse_task_slice("first ten")
    with pytest.raises(ValueError, match="selects no task"):
        _ = toy_cls(task_slice="10:20").num_tasks


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_turns": 0}, "num_turns"),
        ({"external_transition": "telepathy"}, "telepathy"),
        ({"formatters": {"c": str.upper}}, "unknown agents"),
        ({"render_mode": "human"}, "render_mode"),
        ({"reward_processor": {"scale": 2, "offset": 1}}, "scale"),
    ],
)
def test_bad_constructor_arguments_are_named(toy_cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        toy_cls(**kwargs)


# ---- stepping ------------------------------------------------------------------------------
def test_reward_processor_scales_and_keeps_raw_in_infos(toy_cls):
    for processor, expected in [
        ({"scale": 2.0, "shift": -1.0}, 0.0),
        (RewardProcessor(3, 1), 2.5),
        (lambda r: -r, -0.5),
    ]:
        env = toy_cls(reward_processor=processor)
        env.reset(options={"task": 0})
        _, rewards, _, _, infos = env.step(HALF)
        assert rewards == {"a": expected, "b": expected}
        for agent in "ab":
            assert infos[agent]["raw_reward"] == 0.5 and infos[agent]["reward"] == expected


def test_infos_carry_details_and_per_agent_fields(toy_env):
    toy_env.reset(options={"task": 1})
    _, _, _, _, infos = toy_env.step(HALF)
    assert infos["a"]["lengths"] == {"a": 4, "b": 3} and infos["a"]["passed"] is False
    assert infos["a"]["own_good"] is True and infos["b"]["own_good"] is False
    assert "per_agent" not in infos["a"]
    assert infos["a"]["turn"] == 1 and infos["a"]["task_index"] == 1
    infos["a"]["lengths"]["a"] = 99  # infos are independent copies
    assert infos["b"]["lengths"]["a"] == 4


def test_truncation_after_num_turns(toy_cls):
    env = toy_cls(num_turns=3)
    env.reset(options={"task": 0})
    for turn in (1, 2):
        _, _, term, trunc, infos = env.step(HALF)
        assert not any(term.values()) and not any(trunc.values())
        assert env.agents == ["a", "b"] and env.turn == turn
    obs, _, term, trunc, infos = env.step(HALF)
    assert trunc == {"a": True, "b": True} and term == {"a": False, "b": False}
    assert env.agents == [] and infos["a"]["turn"] == 3
    assert obs["a"] == env.prompt_history["a"][-1]  # final observation: the last prompt
    with pytest.raises(RuntimeError, match="reset"):
        env.step(HALF)


def test_early_termination_on_processed_reward(toy_cls):
    env = toy_cls(num_turns=3, early_termination_threshold=1.0)
    env.reset(options={"task": 0})
    _, _, term, trunc, _ = env.step(HALF)
    assert not term["a"] and not trunc["a"]
    _, _, term, trunc, _ = env.step(GOOD)
    assert term == {"a": True, "b": True} and trunc == {"a": False, "b": False}
    assert env.agents == [] and env.turn == 2
    # the threshold applies after the processor: scaled by 0.5, a perfect answer is 0.5 < 1
    env = toy_cls(num_turns=2, early_termination_threshold=1.0, reward_processor={"scale": 0.5})
    env.reset(options={"task": 0})
    assert not env.step(GOOD)[2]["a"]


def test_histories_hold_every_prompt_and_response(toy_cls):
    env = toy_cls(num_turns=3)
    env.reset(options={"task": 4})
    env.step({"a": "first a", "b": "first b"})
    env.step({"a": "second a", "b": "second b"})
    assert env.response_history == {"a": ["first a", "second a"], "b": ["first b", "second b"]}
    assert len(env.prompt_history["a"]) == 3 and env.prompt_history["a"][0] == "[a] task 4"
    plain = env.prompt_history["a"][2]
    assert plain.startswith("[a] task 4") and "first a" in plain and "second a" in plain
    assert "second b" in plain and plain.rstrip().endswith("Revise your response.")
    env.reset(options={"task": 0})
    assert env.response_history == {"a": [], "b": []} and env.prompt_history["a"] == ["[a] task 0"]


def test_formatters_apply_to_every_prompt_unless_passthrough(toy_cls):
    fmts = {"a": lambda p: f"<a>{p}</a>", "b": lambda p: p.upper()}
    env = toy_cls(num_turns=2, formatters=fmts)
    obs, _ = env.reset(options={"task": 0})
    assert obs == {"a": "<a>[a] task 0</a>", "b": "[B] TASK 0"}
    obs = env.step(HALF)[0]
    assert obs["a"].startswith("<a>[a] task 0") and obs["a"].endswith("</a>") and obs["b"] == obs["b"].upper()

    env = toy_cls(num_turns=2, formatters=fmts, external_prompt_passthrough=True)
    obs, _ = env.reset(options={"task": 0})
    assert obs["a"] == "<a>[a] task 0</a>"  # turn 1 is always formatted
    obs = env.step(HALF)[0]
    assert obs["a"].startswith("[a] task 0") and "</a>" not in obs["a"]


@pytest.mark.parametrize("passthrough", [False, True])
def test_custom_transition_gets_documented_arguments(toy_cls, passthrough):
    calls = []

    def custom(prompt, agent_completions, num_agents, prompt_history_per_agent=None, response_history_per_agent=None):
        calls.append((prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent))
        return [f"next for a after {agent_completions[0]}", f"next for b after {agent_completions[1]}"]

    env = toy_cls(
        num_turns=3,
        external_transition=custom,
        external_prompt_passthrough=passthrough,
        formatters={"a": lambda p: "A:" + p, "b": lambda p: "B:" + p},
    )
    env.reset(options={"task": 3})
    obs = env.step({"a": "x1", "b": "y1"})[0]
    assert calls == [("task 3", ["x1", "y1"], 2, [["A:[a] task 3"], ["B:[b] task 3"]], [["x1"], ["y1"]])]
    prefix = ("", "") if passthrough else ("A:", "B:")
    assert obs == {"a": prefix[0] + "next for a after x1", "b": prefix[1] + "next for b after y1"}
    env.step({"a": "x2", "b": "y2"})
    assert calls[1][3] == [["A:[a] task 3", obs["a"]], ["B:[b] task 3", obs["b"]]]
    assert calls[1][4] == [["x1", "x2"], ["y1", "y2"]]
    env.step({"a": "x3", "b": "y3"})
    assert len(calls) == 2  # no transition after the last turn


def test_custom_transition_with_wrong_output_is_a_clear_error(toy_cls):
    env = toy_cls(num_turns=2, external_transition=lambda *a, **k: ["only one"])
    env.reset(options={"task": 0})
    with pytest.raises(ValueError, match="list of 2 str"):
        env.step(HALF)


@pytest.mark.parametrize(
    "action, diagnostic",
    [
        (None, "missing_action"),
        (12345, "non_str_action"),
        (b"\xff\xfegood", "bytes_decoded"),
        ("bad \ud800 surrogate", "invalid_utf8"),
        ("", "empty_action"),
        ("x" * 1_000_000, "truncated"),
        ("\x00\x01\x02\x03" * 100, "binary_looking"),
    ],
)
def test_garbage_actions_score_low_with_diagnostics(toy_env, action, diagnostic):
    toy_env.reset(options={"task": 0})
    obs, rewards, _, _, infos = toy_env.step({"a": "good", "b": action})
    assert rewards["b"] == 0.5
    assert any(d.startswith(diagnostic) for d in infos["b"]["action_diagnostics"])
    assert infos["a"]["action_diagnostics"] == []
    response = toy_env.response_history["b"][-1]
    assert isinstance(response, str) and len(response) <= toy_env.action_char_limit
    response.encode("utf-8")  # always encodable


def test_missing_agent_is_empty_and_unknown_agent_is_an_error(toy_env):
    toy_env.reset(options={"task": 0})
    infos = toy_env.step({"a": "good"})[4]
    assert infos["b"]["action_diagnostics"][0].startswith("missing_action")
    toy_env.reset(options={"task": 0})
    with pytest.raises(ValueError, match="unknown agents"):
        toy_env.step({"a": "good", "c": "good"})


def test_completion_objects_are_accepted(toy_env):
    from comlrl_core.policy import Completion

    toy_env.reset(options={"task": 0})
    assert toy_env.step({"a": Completion("good"), "b": Completion("good")})[1]["a"] == 1.0


# ---- clone -----------------------------------------------------------------------------------
def test_clone_is_independent_and_shares_heavy_resources(toy_cls):
    env = toy_cls(num_turns=3, formatters={"a": str.upper})
    env.reset(seed=11, options={"task": 2})
    env.step({"a": "one", "b": "two"})
    clone = env.clone()
    assert clone.pool is env.pool and clone._split is env._split and clone.formatters is env.formatters
    assert clone.prompt_history == env.prompt_history and clone.prompt_history is not env.prompt_history
    before = (
        env.turn,
        [list(v) for v in env.prompt_history.values()],
        [list(v) for v in env.response_history.values()],
    )
    clone.step({"a": "three", "b": "four"})
    clone.step(GOOD)
    assert clone.agents == [] and env.agents == ["a", "b"]
    assert (
        env.turn,
        [list(v) for v in env.prompt_history.values()],
        [list(v) for v in env.response_history.values()],
    ) == before
    # the original goes on exactly as if the clone had never existed
    twin = toy_cls(num_turns=3, formatters={"a": str.upper})
    twin.reset(seed=11, options={"task": 2})
    twin.step({"a": "one", "b": "two"})
    assert env.step(HALF)[0] == twin.step(HALF)[0]
    # the random task stream is copied, not shared
    c2 = env.clone()
    assert c2.reset()[0] == env.reset()[0]


# ---- batched stepping ---------------------------------------------------------------------
def test_step_many_equals_sequential_steps_with_one_score_call(toy_cls):
    def fresh():
        base = toy_cls(num_turns=2)
        base.reset(options={"task": 0})
        envs = [base]
        for i in range(1, 5):
            e = base.clone()
            e.reset(options={"task": i})
            envs.append(e)
        return envs

    actions = [GOOD, HALF, {"a": "bad", "b": "bad"}, {"a": None, "b": "good"}, HALF]
    sequential = [e.step(a) for e, a in zip(fresh(), actions, strict=True)]
    toy_cls.score_calls.clear()
    batched = step_many(fresh(), actions)
    assert toy_cls.score_calls == [5]
    assert batched == sequential
    with pytest.raises(ValueError, match="joint actions"):
        toy_cls.step_many(fresh(), actions[:2])


def test_step_many_scores_differently_keyed_envs_separately(toy_cls):
    a, b = toy_cls(), toy_cls()  # separate pools -> separate scoring keys
    a.reset(options={"task": 0})
    b.reset(options={"task": 1})
    toy_cls.score_calls.clear()
    step_many([a, b], [GOOD, HALF])
    assert sorted(toy_cls.score_calls) == [1, 1]


# ---- views -----------------------------------------------------------------------------------
def test_state_and_render(toy_cls):
    env = toy_cls(num_turns=2, render_mode="ansi")
    assert "reset" in env.state()
    env.reset(options={"task": 1})
    env.step({"a": "alpha", "b": "beta"})
    state = env.state()
    for piece in ("task 1", "turn 1 of 2", "alpha", "beta", "## a prompt 2", "## b response 1"):
        assert piece in state
    assert env.render() == state
    quiet = toy_cls()
    quiet.reset(options={"task": 0})
    with pytest.warns(UserWarning, match="render_mode"):
        assert quiet.render() is None
    env.close()
