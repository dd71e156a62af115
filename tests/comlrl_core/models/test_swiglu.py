"""comlrl_core.models.swiglu: the MLP keeps gate and up only for its backward, and gives the
same values and gradients as transformers' MLP."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from comlrl_core.models.swiglu import SiluMul, use_lean_swiglu
from comlrl_core.models.tiny import TINY_CONFIG


def _saved_bytes(fn) -> int:
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.nn.Parameter):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 6), width=st.integers(1, 40), scale=st.floats(0.1, 8.0), seed=st.integers(0, 2**16))
def test_silu_mul_matches_autograd_of_the_stock_expression(rows, width, scale, seed):
    g = torch.Generator().manual_seed(seed)
    gate = (torch.randn(rows, width, generator=g, dtype=torch.float64) * scale).requires_grad_()
    up = torch.randn(rows, width, generator=g, dtype=torch.float64).requires_grad_()
    grad = torch.randn(rows, width, generator=g, dtype=torch.float64)
    ours = SiluMul.apply(gate, up)
    d_gate, d_up = torch.autograd.grad(ours, (gate, up), grad)
    stock = torch.nn.functional.silu(gate) * up
    s_gate, s_up = torch.autograd.grad(stock, (gate, up), grad)
    torch.testing.assert_close(ours, stock, rtol=0, atol=0)
    torch.testing.assert_close(d_gate, s_gate, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(d_up, s_up, rtol=1e-12, atol=1e-12)


def test_a_frozen_gate_gets_no_gradient_and_up_still_does():
    gate, up = torch.randn(3, 5), torch.randn(3, 5, requires_grad=True)
    (SiluMul.apply(gate, up) * 2).sum().backward()
    assert gate.grad is None and up.grad is not None


@pytest.mark.parametrize("lora", [False, True])
def test_a_model_trains_the_same_and_keeps_less(lora):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    stock = LlamaForCausalLM(LlamaConfig(vocab_size=64, **TINY_CONFIG))
    if lora:
        from peft import LoraConfig, get_peft_model

        stock = get_peft_model(stock, LoraConfig(r=4, target_modules=["gate_proj", "up_proj", "down_proj", "q_proj"]))
    lean = copy.deepcopy(stock)
    assert use_lean_swiglu(lean) == stock.config.num_hidden_layers
    assert use_lean_swiglu(lean) == 0  # already switched
    ids = torch.randint(0, stock.config.vocab_size, (2, 12))

    def loss_of(model):
        return lambda: model(input_ids=ids, labels=ids).loss.backward()

    saved_stock, saved_lean = _saved_bytes(loss_of(stock)), _saved_bytes(loss_of(lean))
    grads = {n: p.grad for n, p in stock.named_parameters() if p.grad is not None}
    assert grads
    for name, param in lean.named_parameters():
        if name in grads:
            torch.testing.assert_close(param.grad, grads[name], rtol=1e-5, atol=1e-6)
    # one intermediate-width vector a token and layer fewer (silu's output)
    intermediate = stock.config.intermediate_size * 4 * ids.numel() * stock.config.num_hidden_layers
    assert saved_stock - saved_lean >= intermediate
    with torch.no_grad():  # no gradients: the stock arithmetic
        torch.testing.assert_close(lean(input_ids=ids).logits, stock(input_ids=ids).logits, rtol=0, atol=0)
