"""A sampling call runs the model in eval mode and puts the modes back, setting the flags
directly where train() does nothing else (comlrl_core/models/eval_mode.py)."""

from __future__ import annotations

import pytest
from torch import nn

from comlrl_core.models.eval_mode import sampling_eval_mode, without_idle_hub_kernels
from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.policy import GenerationConfig


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)))


def _modes(model: nn.Module) -> list[bool]:
    return [m.training for m in model.modules()]


def _count_train_calls(model: nn.Module, monkeypatch) -> list[bool]:
    """The modes ``model``'s train() is called with (nn.Module.train itself is counted, so
    classes that inherit it still count as flag-only)."""
    calls: list[bool] = []
    real = nn.Module.train

    def counted(self, mode=True):
        if self is model:
            calls.append(mode)
        return real(self, mode)

    monkeypatch.setattr(nn.Module, "train", counted)
    return calls


def test_a_training_model_samples_in_eval_mode_and_trains_again_after_without_train_calls(monkeypatch):
    model = _net().train()
    calls = _count_train_calls(model, monkeypatch)
    with sampling_eval_mode(model):
        assert _modes(model) == [False] * 6  # dropout off inside
    # nn.Module.train only sets flags: they are set directly, no train() call at all
    assert _modes(model) == [True] * 6 and calls == []


def test_a_model_already_in_eval_mode_is_not_switched(monkeypatch):
    model = _net().eval()
    calls = _count_train_calls(model, monkeypatch)
    with sampling_eval_mode(model):
        assert _modes(model) == [False] * 6
    assert _modes(model) == [False] * 6 and calls == []  # neither eval() nor train() ran


def test_each_module_gets_its_own_mode_back(monkeypatch):
    model = _net().train()
    model[2].eval()  # a part its user froze in eval mode while the rest trains
    with sampling_eval_mode(model):
        assert _modes(model) == [False] * 6
    assert _modes(model) == [True, True, True, False, False, False]  # model.train() would flip it


def test_one_training_submodule_is_enough_to_switch(monkeypatch):
    model = _net().eval()
    model[2][1].train()  # a dropout deep inside left in training mode
    with sampling_eval_mode(model):
        assert _modes(model) == [False] * 6
    assert _modes(model) == [False, False, False, False, False, True]


class _OwnTrain(nn.Sequential):
    """A module whose train() does more than set flags."""

    def train(self, mode: bool = True):
        self.switches = getattr(self, "switches", 0) + 1
        return super().train(mode)


def _transformers_like_train(self, mode: bool = True):
    self.kernel_switches = getattr(self, "kernel_switches", 0) + 1
    return nn.Module.train(self, mode)


_transformers_like_train.__module__ = "transformers.modeling_utils"
_transformers_like_train.__qualname__ = "PreTrainedModel.train"


class _TransformersLike(nn.Sequential):
    train = _transformers_like_train


def test_a_module_with_its_own_train_is_switched_through_it():
    model = _OwnTrain(nn.Linear(2, 2), nn.Dropout(0.5)).train()
    model.switches = 0
    with sampling_eval_mode(model):
        assert _modes(model) == [False] * 3
    assert model.switches == 2 and _modes(model) == [True] * 3  # eval() then train(True), as before


class _FlagElsewhere(nn.Sequential):
    """A module whose training flag is a property over other state."""

    @property
    def training(self) -> bool:
        return self.__dict__.get("_mode", True)

    @training.setter
    def training(self, mode: bool) -> None:
        self.__dict__["_mode"] = mode


def test_a_flag_kept_elsewhere_is_switched_through_train():
    model = _FlagElsewhere(nn.Linear(2, 2), nn.Dropout(0.5)).train()
    with sampling_eval_mode(model):
        assert _modes(model) == [False] * 3  # writing __dict__["training"] would leave it on
    assert _modes(model) == [True] * 3


def test_transformers_train_is_bypassed_only_without_hub_kernels():
    without = _TransformersLike(nn.Linear(2, 2), nn.Dropout(0.5)).train()
    without.use_kernels, without.kernel_switches = False, 0
    with sampling_eval_mode(without):
        assert _modes(without) == [False] * 3
    assert without.kernel_switches == 0 and _modes(without) == [True] * 3
    with_kernels = _TransformersLike(nn.Linear(2, 2), nn.Dropout(0.5)).train()
    with_kernels.use_kernels, with_kernels.kernel_switches = True, 0
    with sampling_eval_mode(with_kernels):
        assert _modes(with_kernels) == [False] * 3
    assert with_kernels.kernel_switches == 2 and _modes(with_kernels) == [True] * 3  # its mode switch ran


def test_the_modes_come_back_when_the_block_fails():
    model = _net().train()
    model[2].eval()
    with pytest.raises(RuntimeError, match="sampling failed"), sampling_eval_mode(model):
        raise RuntimeError("sampling failed")
    assert _modes(model) == [True, True, True, False, False, False]
    own = _OwnTrain(nn.Linear(2, 2), nn.Dropout(0.5)).train()
    with pytest.raises(RuntimeError, match="sampling failed"), sampling_eval_mode(own):
        raise RuntimeError("sampling failed")
    assert _modes(own) == [True] * 3


def test_a_cpu_transformers_model_loads_without_hub_kernels(tiny_path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    if not getattr(model, "use_kernels", False):
        pytest.skip("this transformers loads without hub kernels already")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
    assert without_idle_hub_kernels(model) is True and model.use_kernels is False
    assert without_idle_hub_kernels(model) is False  # nothing left to turn off
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, before)  # no layer changed
    policy = TransformersPolicy.from_source(tiny_path, device="cpu")
    assert policy.model.use_kernels is False  # the policy's loader turned them off


def test_generate_samples_without_dropout_and_leaves_the_policys_mode(tiny_path, monkeypatch):
    policy = TransformersPolicy.from_source(tiny_path, device="cpu")
    seen: list[bool] = []
    layer = policy.model.model.layers[0]
    handle = layer.register_forward_pre_hook(lambda module, args: seen.append(module.training))
    cfg = GenerationConfig(max_new_tokens=3)
    try:
        policy.train()
        calls = _count_train_calls(policy.model, monkeypatch)
        policy.generate(["def add(a, b):"], 1, cfg, seed=0)
        assert seen and not any(seen) and policy.model.training and layer.training
        assert calls == []  # flags set directly: the model's train() did not run
        policy.eval()
        policy.generate(["def add(a, b):"], 1, cfg, seed=0)
        assert calls == [False] and not policy.model.training  # policy.eval() only
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
