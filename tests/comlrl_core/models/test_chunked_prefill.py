"""Chunked prefill (``prefill_token_budget``): the prompt pass of a sampling call runs in row
chunks written into one preallocated cache, with the same tokens as one full prefill."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from comlrl_core.models import prefill, sampling
from comlrl_core.models.agent_spec import AgentSpec
from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.models.joint_generation import GenerationRequest, generate_together
from comlrl_core.models.team import Team
from comlrl_core.policy import GenerationConfig

MAX_NEW = 6


@pytest.fixture(scope="module")
def lora_team() -> Team:
    torch.manual_seed(0)
    team = Team.from_specs([AgentSpec(model="tiny-random", lora=True), AgentSpec(model="tiny-random", lora=True)])
    for policy in team:  # fresh adapters are zero: make the agents differ
        assert isinstance(policy, TransformersPolicy)
        for name, weight in policy.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(weight, std=0.5)
    return team


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 200, (n,), generator=gen).tolist() for n in lengths]


class _PrefillSpy:
    """Input shapes of the model's prefill passes (those without a cache)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.shapes: list[tuple[int, int]] = []
        self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids")
        if ids is not None and kwargs.get("past_key_values") is None and kwargs.get("cache") is None:
            self.shapes.append((ids.shape[0], ids.shape[1]))


def _sample(sample_rows, policy, prompts, num_samples, budget, adapters=None, temperature=1.0):
    spy = _PrefillSpy(policy.model)
    try:
        out = sample_rows(policy, prompts, num_samples, budget, adapters, temperature, max_new=MAX_NEW)
    finally:
        spy.handle.remove()
    return out, spy.shapes


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=6),
    budget=st.integers(1, 120),
    num_samples=st.integers(1, 3),
    mixed=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_chunked_prefill_samples_the_same_tokens(lora_team, sample_rows, lengths, budget, num_samples, mixed, seed):
    policy = lora_team[0]
    policy.model.eval()
    prompts = _prompts(lengths, seed)
    # adapters contiguous per agent, as the joint sampler orders them
    adapters = sorted(["agent_0", "agent_1"][i % 2] for i in range(len(prompts))) if mixed else None
    if adapters is None:
        policy.activate()
    whole, whole_shapes = _sample(sample_rows, policy, prompts, num_samples, None, adapters)
    chunked, shapes = _sample(sample_rows, policy, prompts, num_samples, budget, adapters)
    assert torch.equal(chunked.tokens, whole.tokens)
    assert torch.equal(chunked.lengths, whole.lengths)
    assert torch.equal(chunked.stopped_on_eos, whole.stopped_on_eos)
    assert whole_shapes == [(len(prompts), max(lengths))]
    # every chunk within the budget (a lone prompt may exceed it), each cut to its own longest prompt
    assert sum(rows for rows, _ in shapes) == len(prompts)
    assert all(rows * width <= budget or rows == 1 for rows, width in shapes)


def test_a_tight_budget_prefills_row_chunks_of_their_own_width(lora_team, sample_rows):
    policy = lora_team[0]
    policy.activate()
    prompts = _prompts([3, 4, 20, 21], seed=1)
    whole, _ = _sample(sample_rows, policy, prompts, 2, None)
    chunked, shapes = _sample(sample_rows, policy, prompts, 2, budget=42)
    assert shapes == [(2, 4), (2, 21)]
    assert torch.equal(chunked.tokens, whole.tokens)


def test_the_cache_is_built_at_its_final_size_once(lora_team, sample_rows, monkeypatch):
    # no fan-out copy and no copy into the reservation: reserve_cache never runs
    policy = lora_team[0]
    policy.activate()
    calls: list[int] = []
    real = sampling.reserve_cache

    def spy(cache, extra_tokens):
        calls.append(extra_tokens)
        return real(cache, extra_tokens)

    monkeypatch.setattr(sampling, "reserve_cache", spy)
    _sample(sample_rows, policy, _prompts([5, 9], seed=2), 3, budget=1000)
    assert calls == []
    _sample(sample_rows, policy, _prompts([5, 9], seed=2), 3, budget=None)
    assert calls == [MAX_NEW - 1]


def test_without_the_preallocated_cache_the_prefill_is_one_pass(lora_team, sample_rows, monkeypatch):
    policy = lora_team[0]
    policy.activate()
    prompts = _prompts([4, 7, 12], seed=3)
    expected, _ = _sample(sample_rows, policy, prompts, 2, None)
    monkeypatch.setattr(prefill, "preallocated_cache_unavailable", lambda: "probe failed")
    got, shapes = _sample(sample_rows, policy, prompts, 2, budget=8)
    assert shapes == [(3, 12)]
    assert torch.equal(got.tokens, expected.tokens)


def test_generation_config_budget_reaches_the_joint_sampler(lora_team):
    cfg = GenerationConfig(max_new_tokens=8, temperature=1.0, top_k=20, prefill_token_budget=None)
    tight = GenerationConfig(max_new_tokens=8, temperature=1.0, top_k=20, prefill_token_budget=6)

    def requests(c: GenerationConfig) -> list[GenerationRequest]:
        return [
            GenerationRequest(["hello there", "a much longer prompt about many things"], 3, c, list(range(11, 17))),
            GenerationRequest(["x", "yy zz"], 3, c, list(range(21, 27))),
        ]

    spy = _PrefillSpy(lora_team[0].model)
    try:
        whole = generate_together(list(lora_team), requests(cfg))
        passes = len(spy.shapes)
        chunked = generate_together(list(lora_team), requests(tight))
    finally:
        spy.handle.remove()
    assert [[[c.token_ids for c in g] for g in a] for a in chunked] == [
        [[c.token_ids for c in g] for g in a] for a in whole
    ]
    assert passes == 1 and len(spy.shapes) - passes == 4  # every prompt is wider than 6 tokens: one a chunk


def test_the_budget_must_be_positive():
    with pytest.raises(ValueError, match="prefill_token_budget must be >= 1"):
        GenerationConfig(prefill_token_budget=0)
