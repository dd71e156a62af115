"""Writing-v0: reward values, reward properties, task data, prompts and transitions."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs.writing import EXPANDER, MAX_REWARD, SUMMARIZER, WritingEnv, WritingRewardConfig, score_writing
from envs.writing.passages import DATA_FILE, build_passages, load_passages
from envs.writing.reward import closeness

CONFIG = WritingRewardConfig()
PASSAGE = load_passages()[0]["passage"]  # the Mirpri town passage
GOOD_SUMMARY = "Mirpri, a hillside river town, makes wool blankets and holds a winter song festival."
GOOD_EXPANSION = (
    "Mirpri is a small hillside town that sits on the banks of the Wensil river. For five generations, local "
    "families have woven wool blankets there, and these blankets are what the town is best known for. Every "
    "winter the town holds a festival, and visitors come to learn old songs from the people who live there. "
    "In recent years, however, many young people have moved to the city."
)
any_text = st.text(alphabet=st.characters(), max_size=400)  # includes lone surrogates


# ---- reward values on hand-made examples ---------------------------------------------------
def test_closeness_values():
    assert closeness(10, 10) == 1.0
    assert closeness(21, 10) == pytest.approx(0.5)  # (21+1)/(10+1) = 2: one width away
    assert closeness(4.5, 10) == pytest.approx(0.5)
    assert closeness(43, 10, width=2.0) == pytest.approx(0.5)


def test_reward_by_hand():
    passage = "alpha beta gamma delta"  # 22 characters -> summary target 11 with fraction 0.5
    config = WritingRewardConfig(summary_fraction=0.5, expansion_ratio=3.0)
    summary = "alpha gamma"  # 11 characters, on target; expansion target 3 * 11 = 33
    expansion = "alpha gamma delta beta zeta omega"  # 33 characters
    reward, details = score_writing(passage, summary, expansion, config)
    # length 1; overlap (1 + 4/6 + 1) / 3; diversity (2/8 + 4/8) / 2 (nothing copied: no shared 4-gram)
    assert details["levels"]["length"] == pytest.approx(1.0)
    assert details["levels"]["overlap"] == pytest.approx(8 / 9, abs=1e-6)
    assert details["levels"]["diversity"] == pytest.approx(0.375)
    assert reward == pytest.approx(1.0 + 8 / 9 + 0.375, abs=1e-6)
    assert details["stats"]["summary_target_chars"] == 11 and details["stats"]["expansion_target_chars"] == 33


def test_empty_texts_score_only_a_small_length_term():
    reward, details = score_writing(PASSAGE, "", "", CONFIG)
    target_s = round(0.3 * len(PASSAGE))
    expected = 0.5 * closeness(0, target_s) + 0.5 * closeness(0, round(3 * target_s / 2))
    assert reward == pytest.approx(expected) and reward < 0.05
    assert details["levels"]["overlap"] == 0 and details["levels"]["diversity"] == 0


def test_good_team_passes_and_garbage_does_not():
    good, _ = score_writing(PASSAGE, GOOD_SUMMARY, GOOD_EXPANSION, CONFIG)
    copy, copy_details = score_writing(PASSAGE, PASSAGE[:70], PASSAGE, CONFIG)
    repeat, _ = score_writing(PASSAGE, "the the the the", "the the the", CONFIG)
    gibberish, _ = score_writing(PASSAGE, "qzx vrk plm " * 6, "wqe rty uio " * 20, CONFIG)
    threshold = WritingEnv().success_threshold
    assert good >= threshold > copy and copy_details["stats"]["expansion_copied"] == 1.0
    assert repeat < 0.5 and gibberish < 1.1
    assert good > copy > gibberish > repeat


def test_expansion_target_follows_the_summary_but_has_a_floor():
    _, long_summary = score_writing(PASSAGE, "x" * 100, "", CONFIG)
    _, empty_summary = score_writing(PASSAGE, "", "", CONFIG)
    target_s = round(0.3 * len(PASSAGE))
    assert long_summary["stats"]["expansion_target_chars"] == 300
    assert empty_summary["stats"]["expansion_target_chars"] == round(3 * target_s / 2)


def test_length_level_rises_steadily_towards_the_target():
    # what a tiny model learns first: stopping at the right time. No plateau, no cliff.
    summary = "word " * 15
    target_e = score_writing(PASSAGE, summary, "", CONFIG)[1]["stats"]["expansion_target_chars"]
    levels = [
        score_writing(PASSAGE, summary, "z" * n, CONFIG)[1]["levels"]["length"] for n in range(0, target_e + 1, 10)
    ]
    assert all(b > a for a, b in itertools.pairwise(levels))
    above = [
        score_writing(PASSAGE, summary, "z" * n, CONFIG)[1]["levels"]["length"]
        for n in range(target_e, 20 * target_e, 200)
    ]
    assert all(b < a for a, b in itertools.pairwise(above)) and above[-1] > 0


# ---- reward properties -----------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(passage=any_text.filter(str.strip), summary=any_text, expansion=any_text)
def test_reward_is_bounded_deterministic_and_total(passage, summary, expansion):
    reward, details = score_writing(passage, summary, expansion, CONFIG)
    assert 0.0 <= reward <= MAX_REWARD and math.isfinite(reward)
    assert all(0.0 <= v <= 1.0 for v in details["levels"].values())
    assert reward == pytest.approx(sum(details["levels"].values()), abs=1e-5)
    assert score_writing(passage, summary, expansion, CONFIG) == (reward, details)


@settings(max_examples=100, deadline=None)
@given(value=st.floats(0, 1e7), target=st.floats(0, 1e6), width=st.floats(0.1, 5))
def test_closeness_is_in_unit_interval_and_peaks_at_target(value, target, width):
    c = closeness(value, target, width)
    assert 0.0 < c <= 1.0
    assert c <= closeness(target, target, width) == 1.0


@settings(max_examples=60, deadline=None)
@given(
    summary=st.one_of(any_text, st.binary(max_size=200), st.none(), st.integers(), st.floats(allow_nan=True)),
    expansion=st.one_of(any_text, st.binary(max_size=200), st.none(), st.lists(st.integers(), max_size=3)),
)
def test_env_step_never_raises_on_garbage(summary, expansion):
    env = WritingEnv()
    env.reset(options={"task": 3})
    _, rewards, _, truncations, infos = env.step({SUMMARIZER: summary, EXPANDER: expansion})
    assert 0.0 <= rewards[SUMMARIZER] == rewards[EXPANDER] <= MAX_REWARD
    assert truncations == {SUMMARIZER: True, EXPANDER: True}
    if not isinstance(summary, str):
        assert infos[SUMMARIZER]["action_diagnostics"]


def test_huge_and_binary_completions_score_low():
    env = WritingEnv()
    env.reset(options={"task": 0})
    rewards, infos = env.step({SUMMARIZER: "a" * 1_000_000, EXPANDER: "\x00\xff\x01" * 5000})[1::3]
    assert rewards[SUMMARIZER] < 0.05
    assert any(d.startswith("truncated") for d in infos[SUMMARIZER]["action_diagnostics"])
    assert any(d.startswith("binary_looking") for d in infos[EXPANDER]["action_diagnostics"])


# ---- data and env -------------------------------------------------------------------------
def test_shipped_tasks_are_the_deterministic_generator_output():
    items = load_passages()
    assert items == build_passages()
    assert len(items) >= 300 and len({i["passage"] for i in items}) == len(items)
    assert all(150 <= len(i["passage"]) <= 400 for i in items)
    assert DATA_FILE.parent.name == "writing"


def test_custom_data_file(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps([{"passage": "One short passage about rivers and boats."}]))
    env = WritingEnv(data_file=str(path))
    assert env.num_tasks == 1 and "rivers and boats" in env.reset()[0][SUMMARIZER]
    path.write_text(json.dumps([{"text": "no passage key"}]))
    with pytest.raises(ValueError, match="passage"):
        _ = WritingEnv(data_file=str(path)).num_tasks


def test_prompts_state_roles_and_targets():
    env = WritingEnv()
    obs, _ = env.reset(options={"task": 0})
    target_s = round(0.3 * len(PASSAGE))
    assert PASSAGE in obs[SUMMARIZER] and PASSAGE in obs[EXPANDER]
    assert f"about {target_s} characters" in obs[SUMMARIZER]
    assert f"about {3 * target_s} characters" in obs[EXPANDER]
    assert env._task_prompt(env.task(0)) == PASSAGE


def test_step_reports_levels_stats_and_pass():
    env = envs.make("comlrl/Writing-v0", reward_processor={"scale": 2.0})
    env.reset(options={"task": 0})
    _, rewards, _, _, infos = env.step({SUMMARIZER: GOOD_SUMMARY, EXPANDER: GOOD_EXPANSION})
    info = infos[EXPANDER]
    expected, details = score_writing(PASSAGE, GOOD_SUMMARY, GOOD_EXPANSION, CONFIG)
    assert info["raw_reward"] == pytest.approx(expected) and rewards[EXPANDER] == pytest.approx(2 * expected)
    assert info["levels"] == details["levels"] and info["stats"] == details["stats"] and info["passed"] is True


@pytest.mark.parametrize("mode, marker", [("plain", "Revise your response."), ("level_feedback", "Team scores")])
def test_multi_turn_transitions(mode, marker):
    env = WritingEnv(num_turns=2, external_transition=mode)
    env.reset(options={"task": 0})
    obs, _, _, trunc, _ = env.step({SUMMARIZER: "short one", EXPANDER: "long one"})
    assert not trunc[SUMMARIZER]
    for agent, own, other in [(SUMMARIZER, "short one", "long one"), (EXPANDER, "long one", "short one")]:
        assert obs[agent].startswith("Passage:\n" + PASSAGE) and marker in obs[agent]
        assert own in obs[agent] and other in obs[agent]
    if mode == "level_feedback":
        assert "characters (target" in obs[EXPANDER]
    assert env.step({SUMMARIZER: "a", EXPANDER: "b"})[3][SUMMARIZER] is True


def test_same_seed_same_episode():
    def run():
        env = WritingEnv(num_turns=3)
        out = [env.reset(seed=5)]
        for turn in range(3):
            out.append(env.step({SUMMARIZER: f"s{turn} wool", EXPANDER: f"e{turn} river town"}))
        return out

    assert run() == run()


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="expansion_ratio"):
        WritingEnv(expansion_ratio=0)
    with pytest.raises(ValueError, match="success_threshold"):
        WritingEnv(success_threshold=5)
    with pytest.raises(ValueError, match="external_transition"):
        WritingEnv(external_transition="expert_edits")


def test_step_many_equals_sequential_steps():
    from comlrl_core.env_api import step_many

    def fresh():
        base = WritingEnv(num_turns=2)
        out = []
        for task in range(4):
            env = base.clone()
            env.reset(options={"task": task})
            out.append(env)
        return out

    actions = [{SUMMARIZER: f"summary {i} wool river", EXPANDER: "expansion " * (i + 1)} for i in range(4)]
    assert step_many(fresh(), actions) == [env.step(a) for env, a in zip(fresh(), actions, strict=True)]
