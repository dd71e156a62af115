"""Agents of one shared LoRA base sample together: same completions, fewer forward passes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from comlrl_core.models.active_rows import ActiveRows
from comlrl_core.models.joint_generation import GenerationRequest, generate_together
from comlrl_core.models.sampling import FORWARD_COUNTER, prompt_groups_within_budget
from comlrl_core.policy import GenerationConfig

CFG = GenerationConfig(max_new_tokens=10, temperature=1.0, top_k=20)


def _requests(cfg: GenerationConfig = CFG) -> list[GenerationRequest]:
    return [
        GenerationRequest(["hello there", "a much longer prompt about many things"], 3, cfg, list(range(11, 17))),
        GenerationRequest(["x", "yy zz"], 3, cfg, list(range(21, 27))),
    ]


def _ids(results):
    return [[[c.token_ids for c in group] for group in agent] for agent in results]


def test_shared_base_agents_sample_in_one_loop_with_the_same_results(lora_team):
    separate = [
        p.generate(list(r.prompts), r.num_samples, r.config, r.seed)
        for p, r in zip(lora_team, _requests(), strict=True)
    ]
    FORWARD_COUNTER.take()
    for p, r in zip(lora_team, _requests(), strict=True):
        p.generate(list(r.prompts), r.num_samples, r.config, r.seed)
    separate_passes, _ = FORWARD_COUNTER.take()
    together = generate_together(list(lora_team), _requests())
    passes, rows = FORWARD_COUNTER.take()
    assert _ids(together) == _ids(separate)
    assert [[[c.text for c in g] for g in a] for a in together] == [[[c.text for c in g] for g in a] for a in separate]
    assert _ids(separate)[0] != _ids(separate)[1]  # the adapters differ, so the rows really went their own ways
    assert passes <= separate_passes / 2 + 1  # one loop for both agents, not one each
    assert rows / passes > 4  # both agents' rows in each pass


def test_a_token_budget_splits_the_calls_not_the_samples(lora_team):
    together = generate_together(list(lora_team), _requests())
    FORWARD_COUNTER.take()
    tight = GenerationConfig(max_new_tokens=10, temperature=1.0, top_k=20, max_batch_tokens=40)
    split = generate_together(list(lora_team), _requests(tight))
    passes, rows = FORWARD_COUNTER.take()
    assert _ids(split) == _ids(together)
    assert rows / passes <= 3  # 40 tokens hold one prompt's 3 rows at a time


def test_one_seed_per_call_is_not_merged(lora_team):
    # one generator for a call draws in batch order: merging would change its samples
    requests = [GenerationRequest(["hi"], 2, CFG, 5), GenerationRequest(["ho"], 2, CFG, 6)]
    alone = [p.generate(["hi" if i == 0 else "ho"], 2, CFG, 5 + i) for i, p in enumerate(lora_team)]
    assert _ids(generate_together(list(lora_team), requests)) == _ids(alone)


def test_requests_must_match_policies(lora_team):
    with pytest.raises(ValueError, match="2 policies for 1 requests"):
        generate_together(list(lora_team), _requests()[:1])


@settings(max_examples=200, deadline=None)
@given(
    widths=st.lists(st.integers(1, 60), max_size=25),
    samples=st.integers(1, 4),
    new=st.integers(1, 20),
    budget=st.one_of(st.none(), st.integers(1, 600)),
    by_length=st.booleans(),
)
def test_prompt_groups_cover_every_prompt_once_within_the_budget(widths, samples, new, budget, by_length):
    groups = prompt_groups_within_budget(widths, samples, new, budget, by_length)
    assert sorted(p for g in groups for p in g) == list(range(len(widths)))
    if not by_length:
        assert [p for g in groups for p in g] == list(range(len(widths)))
    for g in groups:
        if len(g) > 1 and budget is not None:
            assert len(g) * samples * (max(widths[p] for p in g) + new) <= budget
    if budget is None:
        assert len(groups) == (1 if widths else 0)


def test_a_wrapped_generate_is_honoured(lora_team):
    calls = []
    original = lora_team[0].generate

    def wrapped(prompts, num_samples=1, generation_config=None, seed=None):
        calls.append(len(prompts))
        return original(prompts, num_samples, generation_config, seed)

    lora_team[0].generate = wrapped
    try:
        generate_together(list(lora_team), _requests())
    finally:
        del lora_team[0].generate
    assert calls == [2]


def test_rows_that_finish_leave_the_joint_batch_with_the_same_results(lora_team, monkeypatch):
    # a common token as EOS makes rows of both adapters end at different steps, so the
    # joint batch shrinks (adapter runs re-sliced) while the others keep decoding
    cfg = GenerationConfig(max_new_tokens=24, temperature=1.0, top_k=20)
    first = generate_together(list(lora_team), _requests(cfg))
    tokens = [t for agent in _ids(first) for group in agent for ids in group for t in ids[:12]]
    common = max(set(tokens), key=tokens.count)
    for policy in lora_team:
        monkeypatch.setattr(policy, "eos_token_ids", [common])
    separate = [
        p.generate(list(r.prompts), r.num_samples, r.config, r.seed)
        for p, r in zip(lora_team, _requests(cfg), strict=True)
    ]
    FORWARD_COUNTER.take()
    together = generate_together(list(lora_team), _requests(cfg))
    _, rows_dropping = FORWARD_COUNTER.take()
    monkeypatch.setattr(ActiveRows, "can_drop", staticmethod(lambda generator: False))
    generate_together(list(lora_team), _requests(cfg))
    _, rows_keeping = FORWARD_COUNTER.take()
    assert _ids(together) == _ids(separate)
    lengths = [len(ids) for agent in _ids(together) for group in agent for ids in group]
    assert min(lengths) < max(lengths)
    assert any(c.finish_reason == "eos" for agent in together for g in agent for c in g)
    assert rows_dropping < rows_keeping  # finished rows really left the joint batch
