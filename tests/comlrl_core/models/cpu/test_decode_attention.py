"""The compiled decoding attention: torch's numbers on every shape it takes, refusals that
leave the caller on torch's ops, and a build that fails or disagrees switching it off."""

from __future__ import annotations

import logging
import shutil
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from comlrl_core.models import lean_ops
from comlrl_core.models.cpu import c_library, decode_attention
from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.policy import GenerationConfig

CAN_BUILD = sys.platform.startswith("linux") and c_library.compiler() is not None


def _cache_like(heads: int, groups: int, dim: int, length: int, room: int, padded: int, seed: int):
    """Inputs laid out as a decoding step finds them: keys token-contiguous and values
    row-contiguous in buffers with ``room`` extra tokens, ``padded`` masked tokens in front
    of every other head's row."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, groups, dim, generator=generator)
    keys = torch.randn(heads, dim, length + room, generator=generator).transpose(1, 2)[:, :length]
    values = torch.randn(heads, length + room, dim, generator=generator)[:, :length]
    bias = torch.zeros(heads, 1, length)
    bias[::2, :, : min(padded, length - 1)] = float("-inf")
    return q, keys, values, bias


def _torch_ops(q, keys, values, bias, scale):
    scores = torch.baddbmm(bias, q, keys.transpose(1, 2), alpha=scale)
    return torch.bmm(scores.softmax(dim=-1), values)


@pytest.mark.skipif(not CAN_BUILD, reason="needs Linux and a C compiler")
def test_the_kernel_is_on_where_linux_a_compiler_and_torchs_openmp_are():
    assert decode_attention.kernel_status() == "on"


@pytest.mark.skipif(not CAN_BUILD, reason="needs Linux and a C compiler")
@settings(max_examples=60, deadline=None)
@given(
    heads=st.integers(1, 9),
    groups=st.integers(1, decode_attention.MAX_GROUPS),
    dim=st.sampled_from([1, 4, 8, 15, 16, 33, 64, 128, 256]),
    length=st.integers(1, 70),
    room=st.integers(0, 9),
    padded=st.integers(0, 12),
    sharpness=st.floats(0.01, 2.0),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**16),
)
def test_it_computes_torchs_attention_on_any_shape_it_takes(
    heads, groups, dim, length, room, padded, sharpness, threads, seed
):
    scale = sharpness / dim**0.5  # as attention scales its scores
    q, keys, values, bias = _cache_like(heads, groups, dim, length, room, padded, seed)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = decode_attention.decode_attention(q, keys, values, bias, scale)
    finally:
        torch.set_num_threads(previous)
    assert got is not None and got.shape == (heads, groups, dim)
    torch.testing.assert_close(got, _torch_ops(q, keys, values, bias, scale), rtol=1e-4, atol=2e-5)


@pytest.mark.skipif(not CAN_BUILD, reason="needs Linux and a C compiler")
def test_a_fully_masked_prefix_gets_no_weight():
    q, keys, values, bias = _cache_like(2, 3, 8, 12, 0, 0, 1)
    bias[:, :, :11] = float("-inf")  # only the newest token is visible
    got = decode_attention.decode_attention(q, keys, values, bias, 0.5)
    assert got is not None
    torch.testing.assert_close(got, values[:, -1:].expand(2, 3, 8), rtol=0, atol=0)


def _refused_inputs():
    q, keys, values, bias = _cache_like(3, 3, 8, 10, 2, 0, 0)
    yield "token-major keys", (q, keys.contiguous(), values, bias)
    yield "column-major values", (q, keys, values.transpose(1, 2).contiguous().transpose(1, 2), bias)
    yield "fp64", (q.double(), keys.double(), values.double(), bias.double())
    yield "bf16", (q.bfloat16(), keys.bfloat16(), values.bfloat16(), bias.bfloat16())
    yield "non-contiguous queries", (q.transpose(0, 1).contiguous().transpose(0, 1), keys, values, bias)
    yield "too many groups", (torch.zeros(3, decode_attention.MAX_GROUPS + 1, 8), keys, values, bias)
    yield "mismatched lengths", (q, keys, values[:, :9], bias)
    yield "a gradient to track", (q.clone().requires_grad_(), keys, values, bias)
    big = torch.zeros(1, 1, decode_attention.MAX_HEAD_DIM + 1)
    yield "head size past the limit", (big, big.transpose(1, 2).contiguous().transpose(1, 2), big, torch.zeros(1, 1, 1))


@pytest.mark.parametrize("name, inputs", list(_refused_inputs()), ids=[name for name, _ in _refused_inputs()])
def test_inputs_it_cannot_take_are_left_to_torch(name, inputs, monkeypatch):
    monkeypatch.setattr(decode_attention, "_kernel", lambda: pytest.fail("the kernel was looked up"))
    assert decode_attention.decode_attention(*inputs, 0.5) is None


def test_the_switch_turns_it_off(fresh_kernel, monkeypatch):
    monkeypatch.setenv(decode_attention.ENV_VAR, "off")
    assert decode_attention.kernel_status() == f"{decode_attention.ENV_VAR} is off"
    q, keys, values, bias = _cache_like(3, 3, 8, 10, 2, 0, 0)
    assert decode_attention.decode_attention(q, keys, values, bias, 0.5) is None
    assert not (fresh_kernel / "kernels").exists()  # nothing was compiled


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the compiler is looked up on Linux only")
def test_a_failing_compiler_leaves_torchs_ops_with_one_warning(fresh_kernel, monkeypatch, caplog):
    monkeypatch.setenv("CC", shutil.which("false") or "/bin/false")
    with caplog.at_level(logging.WARNING, logger=decode_attention.__name__):
        status = decode_attention.kernel_status()
        assert decode_attention.kernel_status() == status  # decided once per process
    assert status.startswith("it could not be built or loaded")
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    q, keys, values, bias = _cache_like(3, 3, 8, 10, 2, 0, 0)
    assert decode_attention.decode_attention(q, keys, values, bias, 0.5) is None
    assert not list((fresh_kernel / "kernels").glob("*.so"))  # no half-built library left


@pytest.mark.skipif(not CAN_BUILD, reason="needs Linux and a C compiler")
def test_a_kernel_that_disagrees_with_torch_is_switched_off(fresh_kernel, monkeypatch, caplog):
    real_run = decode_attention._run
    monkeypatch.setattr(decode_attention, "_run", lambda *a: real_run(*a) * 1.01)
    with caplog.at_level(logging.WARNING, logger=decode_attention.__name__):
        status = decode_attention.kernel_status()
    assert status.startswith("its results differ from torch's")
    assert "decoding attention kernel is off" in caplog.text


@pytest.mark.skipif(not CAN_BUILD, reason="needs Linux and a C compiler")
def test_the_library_is_built_once_and_kept_per_cpu(fresh_kernel, monkeypatch):
    assert decode_attention.kernel_status() == "on"
    built = sorted((fresh_kernel / "kernels").glob("*.so"))
    assert len(built) == 1
    decode_attention._kernel.cache_clear()
    assert decode_attention.kernel_status() == "on"  # loaded from the cache
    assert sorted((fresh_kernel / "kernels").glob("*.so")) == built
    monkeypatch.setattr(c_library, "cpu_flags", lambda: "flags : another cpu")
    assert c_library.library_path("decode_attention", decode_attention._SOURCE, c_library.compiler()) != str(built[0])


@pytest.mark.skipif(not CAN_BUILD, reason="needs Linux and a C compiler")
def test_a_sampling_call_attends_through_it_with_torchs_tokens(monkeypatch, record_results):
    """Every decoding step's attention in every layer went through the kernel, and greedy
    decoding picks the tokens it picks with torch's ops (the lean step's logits against
    transformers' forward, kernel included: test_lean_decode.py)."""
    torch.manual_seed(0)
    policy = TransformersPolicy.from_source("tiny-random", device="cpu")
    prompts = ["def add(a, b):", "Write a story about a team of agents that", "x"]
    config = GenerationConfig(max_new_tokens=6, temperature=0.0)
    calls = record_results(lean_ops, "decode_attention")  # True: the kernel attended
    through_kernel = [[c.token_ids for c in group] for group in policy.generate(prompts, 2, config)]
    layers = policy.model.config.num_hidden_layers
    assert calls and all(calls), "a decoding step's attention did not run in the kernel"
    assert len(calls) % layers == 0 and len(calls) >= 4 * layers
    monkeypatch.setattr(lean_ops, "decode_attention", lambda *args: None)
    assert [[c.token_ids for c in group] for group in policy.generate(prompts, 2, config)] == through_kernel
