"""The preallocated KV cache of comlrl_core.models.sampling subclasses a transformers internal
(``DynamicLayer``): it is probed once per process, and where the probe fails decoding keeps
transformers' own growing cache, with the same tokens and one log line saying why."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from comlrl_core.models import kv_cache, sampling
from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.policy import GenerationConfig

PROMPTS = ["def add(a, b):", "Write a story about a team", "x"]
FALLBACK_LOG = "preallocated KV cache is off"


@pytest.fixture
def fresh_probe():
    kv_cache.preallocated_cache_unavailable.cache_clear()
    yield
    kv_cache.preallocated_cache_unavailable.cache_clear()


@pytest.fixture(scope="module")
def policy() -> TransformersPolicy:
    torch.manual_seed(0)
    return TransformersPolicy.from_source("tiny-random", device="cpu")


def _samples(
    policy: TransformersPolicy, temperature: float, prefill_token_budget: int | None = 2048
) -> list[list[list[int]]]:
    cfg = GenerationConfig(
        max_new_tokens=10, temperature=temperature, top_k=20, prefill_token_budget=prefill_token_budget
    )
    out = policy.generate(PROMPTS, num_samples=3, generation_config=cfg, seed=5)
    return [[c.token_ids for c in row] for row in out]


def _layer_types_after_reserve(policy, monkeypatch) -> list[set[str]]:
    seen: list[set[str]] = []
    real = sampling.reserve_cache

    def spy(cache, extra_tokens):
        cache = real(cache, extra_tokens)
        seen.append({type(layer).__name__ for layer in cache.layers})
        return cache

    monkeypatch.setattr(sampling, "reserve_cache", spy)
    return seen


def test_the_probe_passes_here(fresh_probe, policy, monkeypatch):
    assert kv_cache.preallocated_cache_unavailable() is None
    seen = _layer_types_after_reserve(policy, monkeypatch)
    _samples(policy, 0.0, prefill_token_budget=None)  # one prefill pass, then reserve_cache
    assert seen == [{"PreallocatedLayer"}]
    chunked: list[set[str]] = []
    real = sampling.chunked_prefill

    def spy(*args, **kwargs):
        cache, logits, mask = real(*args, **kwargs)
        chunked.append({type(layer).__name__ for layer in cache.layers})
        return cache, logits, mask

    monkeypatch.setattr(sampling, "chunked_prefill", spy)
    _samples(policy, 0.0)  # the chunked prefill builds the preallocated cache itself
    assert chunked == [{"PreallocatedLayer"}] and len(seen) == 1


def test_the_probe_passes_under_bf16_autocast(fresh_probe):
    # the first generate call of a mixed-precision policy probes inside its autocast region
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert kv_cache.preallocated_cache_unavailable() is None


def _counting_dynamic_layer(monkeypatch) -> None:
    """DynamicLayer as a transformers version could change it: the sequence length comes
    from a counter that ``update`` keeps, which the preallocated subclass never touches."""
    real_update = DynamicLayer.update

    def update(self, key_states, value_states, *args, **kwargs):
        self.tokens_seen = getattr(self, "tokens_seen", 0) + key_states.shape[-2]
        return real_update(self, key_states, value_states, *args, **kwargs)

    monkeypatch.setattr(DynamicLayer, "update", update)
    monkeypatch.setattr(DynamicLayer, "get_seq_length", lambda self: getattr(self, "tokens_seen", 0))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_changed_dynamic_layer_keeps_the_growing_cache_and_the_same_tokens(
    temperature, fresh_probe, policy, monkeypatch, caplog
):
    expected = _samples(policy, temperature)
    _counting_dynamic_layer(monkeypatch)
    kv_cache.preallocated_cache_unavailable.cache_clear()  # as in a new process
    seen = _layer_types_after_reserve(policy, monkeypatch)
    with caplog.at_level("WARNING", logger=sampling.__name__):
        got = _samples(policy, temperature)
        _samples(policy, temperature)
    assert got == expected
    assert seen and all(types == {"DynamicLayer"} for types in seen)
    messages = [r.getMessage() for r in caplog.records if FALLBACK_LOG in r.getMessage()]
    assert len(messages) == 1 and "cache length" in messages[0]


def test_a_raising_subclass_keeps_the_growing_cache(fresh_probe, policy, monkeypatch, caplog):
    expected = _samples(policy, 1.0)
    _, preallocated = kv_cache._preallocated_layer_type()

    def reserve(self, extra_tokens):
        raise AttributeError("'DynamicLayer' object has no attribute 'keys'")

    monkeypatch.setattr(preallocated, "reserve", reserve)
    kv_cache.preallocated_cache_unavailable.cache_clear()
    with caplog.at_level("WARNING", logger=sampling.__name__):
        assert _samples(policy, 1.0) == expected
    assert "AttributeError: 'DynamicLayer' object has no attribute 'keys'" in caplog.text
