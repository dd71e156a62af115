"""StopWatch: rows stop at the first check after they write a stop string, never before."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.models.stop_watch import StopWatch


@pytest.fixture(scope="module")
def tokenizer():
    return TransformersPolicy.from_source("tiny-random", device="cpu").tokenizer


def _run(watch, rows):
    """Feed the rows' tokens step by step; the step at which each row was stopped (None: never)."""
    steps = max(len(r) for r in rows)
    tokens, running, stopped_at = [], torch.ones(len(rows), dtype=torch.bool), [None] * len(rows)
    for step in range(steps):
        tokens.append(torch.tensor([r[step] if step < len(r) else 0 for r in rows]))
        if watch.due(step):
            for row in torch.nonzero(watch.watch(tokens, running)).flatten().tolist():
                stopped_at[row] = step
                running[row] = False
    return stopped_at


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), every=st.integers(1, 5))
def test_each_row_stops_at_the_first_check_after_its_stop_string(tokenizer, data, every):
    vocab = [i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids]
    rows = data.draw(st.lists(st.lists(st.sampled_from(vocab), min_size=1, max_size=24), min_size=1, max_size=4))
    source = data.draw(st.sampled_from(rows))
    text = tokenizer.decode(source, skip_special_tokens=True)
    start = data.draw(st.integers(0, max(0, len(text) - 1)))
    stop = text[start : start + data.draw(st.integers(1, 4))] or "x"
    watch = StopWatch(tokenizer, [stop, "never seen \x00"], every=every)
    got = _run(watch, rows)
    for row, stopped in zip(rows, got, strict=True):
        # the first step whose prefix text holds the stop string
        first = next(
            (k for k in range(len(row)) if stop in tokenizer.decode(row[: k + 1], skip_special_tokens=True)), None
        )
        if first is None:
            assert stopped is None
            continue
        expected_check = first + (-(first + 1)) % every  # the first due step at or after it
        if expected_check < len(row):  # a row that ends before the check keeps running (fed zeros)
            assert stopped == expected_check


def test_stop_watch_refuses_empty_stops(tokenizer):
    with pytest.raises(ValueError, match="stop string"):
        StopWatch(tokenizer, ["", ""])
    with pytest.raises(ValueError, match="every"):
        StopWatch(tokenizer, ["a"], every=0)
