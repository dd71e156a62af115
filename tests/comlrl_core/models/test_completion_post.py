"""Stop strings in TransformersPolicy.generate, and the completion counts trainers log."""

from __future__ import annotations

import pytest

from comlrl_core.models.completion_post import CompletionStats, cut_at_stop
from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.policy import Completion, GenerationConfig


@pytest.fixture(scope="module")
def policy():
    return TransformersPolicy.from_source("tiny-random", device="cpu")


def _sample(policy, stop=()):
    config = GenerationConfig(max_new_tokens=24, temperature=1.0, stop=stop)
    return policy.generate(["Write about the river."], num_samples=4, generation_config=config, seed=5)[0]


def test_stop_string_cuts_text_and_tokens(policy):
    free = _sample(policy)
    long = max(free, key=lambda c: len(c.text))
    assert len(long.text) >= 4
    stop = long.text[2:4]  # a string this completion holds
    cut = _sample(policy, stop=(stop, "never-appears-anywhere"))
    for before, after in zip(free, cut, strict=True):
        if stop not in before.text:
            assert after == before  # untouched
            continue
        assert after.finish_reason == "stop"
        assert after.text == before.text[: before.text.index(stop)]
        # the token ids end with the token that completed the stop string
        assert before.token_ids[: len(after.token_ids)] == after.token_ids
        assert stop in policy.tokenizer.decode(after.token_ids, skip_special_tokens=True)
        assert stop not in policy.tokenizer.decode(after.token_ids[:-1], skip_special_tokens=True)
    assert any(c.finish_reason == "stop" for c in cut)


def test_cut_at_stop_without_a_match(policy):
    ids = policy.tokenizer("hello there", add_special_tokens=False)["input_ids"]
    assert cut_at_stop(policy.tokenizer, ids, ["zzz"]) is None
    cut = cut_at_stop(policy.tokenizer, ids, ["the"])
    assert cut is not None
    text, kept = cut
    assert text == "hello " and "the" in policy.tokenizer.decode(kept)
    assert "the" not in policy.tokenizer.decode(kept[:-1])  # the shortest prefix that holds it


def test_generation_config_stop_coerces_and_validates():
    assert GenerationConfig(stop=["a", "b"]).stop == ("a", "b")
    assert GenerationConfig(stop="x").stop == ("x",)
    with pytest.raises(ValueError, match="stop"):
        GenerationConfig(stop=["", "a"])


def test_completion_stats_count_and_take(policy):
    stats = CompletionStats()
    stats.record(Completion("a", [1, 2, 3], "length"))
    stats.record(Completion("b", [1], "eos"))
    taken = stats.take()
    assert (taken.count, taken.tokens, taken.clipped) == (2, 4, 1)
    assert stats.count == 0
    policy.completion_stats.take()
    _sample(policy)
    assert policy.completion_stats.take().count == 4
