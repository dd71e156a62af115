"""A sampling call runs the model in eval mode and puts the root's mode back, switching
only where a flag would change (comlrl_core/models/eval_mode.py)."""

from __future__ import annotations

import pytest
from torch import nn

from comlrl_core.models.eval_mode import sampling_eval_mode
from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.policy import GenerationConfig


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)))


def _modes(model: nn.Module) -> list[bool]:
    return [m.training for m in model.modules()]


def _count_train_calls(model: nn.Module, monkeypatch) -> list[bool]:
    calls: list[bool] = []
    real = type(model).train

    def counted(self, mode=True):
        if self is model:
            calls.append(mode)
        return real(self, mode)

    monkeypatch.setattr(type(model), "train", counted)
    return calls


def test_a_training_model_samples_in_eval_mode_and_trains_again_after(monkeypatch):
    model = _net().train()
    calls = _count_train_calls(model, monkeypatch)
    with sampling_eval_mode(model):
        assert _modes(model) == [False] * 6  # dropout off inside
    assert _modes(model) == [True] * 6 and calls == [False, True]


def test_a_model_already_in_eval_mode_is_not_switched(monkeypatch):
    model = _net().eval()
    calls = _count_train_calls(model, monkeypatch)
    with sampling_eval_mode(model):
        assert _modes(model) == [False] * 6
    assert _modes(model) == [False] * 6 and calls == []  # neither eval() nor train() ran


def test_one_training_submodule_is_enough_to_switch_and_the_roots_mode_comes_back(monkeypatch):
    model = _net().eval()
    model[2][1].train()  # a dropout deep inside left in training mode
    calls = _count_train_calls(model, monkeypatch)
    with sampling_eval_mode(model):
        assert _modes(model) == [False] * 6
    # as model.eval() ... model.train(root's mode) leaves it: everything in eval mode
    assert _modes(model) == [False] * 6 and calls == [False, False]


def test_the_mode_comes_back_when_the_block_fails():
    model = _net().train()
    with pytest.raises(RuntimeError, match="sampling failed"), sampling_eval_mode(model):
        raise RuntimeError("sampling failed")
    assert _modes(model) == [True] * 6


def test_generate_samples_without_dropout_and_leaves_the_policys_mode(tiny_path, monkeypatch):
    policy = TransformersPolicy.from_source(tiny_path, device="cpu")
    seen: list[bool] = []
    layer = policy.model.model.layers[0]
    handle = layer.register_forward_pre_hook(lambda module, args: seen.append(module.training))
    cfg = GenerationConfig(max_new_tokens=3)
    try:
        policy.train()
        policy.generate(["def add(a, b):"], 1, cfg, seed=0)
        assert seen and not any(seen) and policy.model.training and layer.training
        policy.eval()
        calls = _count_train_calls(policy.model, monkeypatch)
        policy.generate(["def add(a, b):"], 1, cfg, seed=0)
        assert calls == [] and not policy.model.training
    finally:
        handle.remove()
    # a forward hook keeps the lean decoding step off, so every pass was seen by the hook
    assert len(seen) == 2 * 3  # the prompt pass and two decoding steps per call


def test_a_sampling_call_walks_the_model_once_for_the_mode_check_and_the_packing(tiny_path, monkeypatch):
    from comlrl_core.models.cpu import model_walk

    policy = TransformersPolicy.from_source(tiny_path, device="cpu")
    policy.train()  # the mode check then switches, as in training
    walks: list[int] = []
    real = model_walk.module_tree

    def counted(root):
        if root is policy.model:
            walks.append(1)
        return real(root)

    monkeypatch.setattr(model_walk, "module_tree", counted)
    policy.generate(["def add(a, b):"], 1, GenerationConfig(max_new_tokens=3), seed=0)
    assert walks == [1]  # one ModelWalk, shared by sampling_eval_mode and prepacked_linears
    assert policy.model.training
