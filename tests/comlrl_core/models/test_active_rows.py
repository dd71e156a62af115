"""Finished rows leave the decoding batch: same tokens, fewer rows per forward."""

from __future__ import annotations

import pytest
import torch

from comlrl_core.models import sampling
from comlrl_core.models.active_rows import ActiveRows
from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.policy import GenerationConfig

PROMPTS = ["def add(a, b):", "Write about the river.", "x", "class Counter:\n    def __init__(self):"]


@pytest.fixture(scope="module")
def policy():
    return TransformersPolicy.from_source("tiny-random", device="cpu")


def _sample(policy, seed, monkeypatch=None, keep_rows=False, **cfg):
    if keep_rows:
        monkeypatch.setattr(ActiveRows, "can_drop", staticmethod(lambda generator: False))
    sampling.FORWARD_COUNTER.take()
    config = GenerationConfig(max_new_tokens=32, temperature=1.0, top_k=0, **cfg)
    out = policy.generate(PROMPTS, num_samples=3, generation_config=config, seed=seed)
    _, rows = sampling.FORWARD_COUNTER.take()
    if keep_rows:
        monkeypatch.setattr(ActiveRows, "can_drop", staticmethod(ActiveRows.__dict__["can_drop"].__func__))
    return [[(c.token_ids, c.finish_reason, c.text) for c in group] for group in out], rows


def _common_token(policy, seeds):
    """A token that some sampled rows write and others do not: as EOS it ends rows at
    different steps (the tiny random model never samples its real EOS)."""
    free, _ = _sample(policy, seeds)
    rows = [ids for group in free for ids, _, _ in group]
    counts = {t: sum(t in ids[:16] for ids in rows) for t in {t for ids in rows for t in ids[:16]}}
    return max((t for t, n in counts.items() if n < len(rows)), key=counts.__getitem__)


@pytest.mark.parametrize("budget", [None, 64])
def test_dropping_finished_rows_changes_no_token(policy, monkeypatch, budget):
    seeds = list(range(100, 100 + 3 * len(PROMPTS)))  # one generator per completion: rows may leave
    monkeypatch.setattr(policy, "eos_token_ids", [_common_token(policy, seeds)])
    dropped, rows_dropped = _sample(policy, seeds, prefill_token_budget=budget)
    kept, rows_kept = _sample(policy, seeds, monkeypatch, keep_rows=True, prefill_token_budget=budget)
    assert dropped == kept
    lengths = [len(ids) for group in kept for ids, _, _ in group]
    assert min(lengths) < max(lengths)  # some rows end early: the case being tested
    assert rows_dropped < rows_kept


def test_a_shared_generator_keeps_every_row(policy, monkeypatch):
    # one generator for the call: finished rows keep drawing, so the stream is unchanged
    shared, rows_shared = _sample(policy, 7)
    kept, rows_kept = _sample(policy, 7, monkeypatch, keep_rows=True)
    assert shared == kept and rows_shared == rows_kept


def test_stop_strings_end_rows_early_with_the_same_cut(policy, monkeypatch):
    seeds = list(range(300, 300 + 3 * len(PROMPTS)))
    free, _ = _sample(policy, seeds)
    text = max((t for group in free for _, _, t in group), key=len)
    stop = text[3:5]
    watched, rows_watched = _sample(policy, seeds, stop=(stop,))
    # the reference: the same stop strings, rows never leave and the sampler never watches
    monkeypatch.setattr(sampling.StopWatch, "due", lambda self, step: False)
    cut, rows_cut = _sample(policy, seeds, monkeypatch, keep_rows=True, stop=(stop,))
    assert watched == cut
    assert any(reason == "stop" for group in cut for _, reason, _ in group)
    assert rows_watched < rows_cut


def test_active_rows_drop_only_when_enough_finished():
    rows = ActiveRows(8, "cpu", min_drop_fraction=0.25)
    finished = torch.zeros(8, dtype=torch.bool)
    finished[0] = True
    assert not rows.worth_dropping(finished)  # 1 of 8 < a quarter
    finished[1] = True
    assert rows.worth_dropping(finished)
    assert not ActiveRows.can_drop(torch.Generator()) and not ActiveRows.can_drop(None)
    assert ActiveRows.can_drop([torch.Generator()])
