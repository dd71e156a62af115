"""A TransformersPolicy on disk (comlrl_core/models/policy_files.py): save and load round
trips for full and LoRA agents, and the checkpoints that are refused."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.models.policy_files import load_full_weights


def _train_step(policy, prompts, completions, lr=0.05):
    opt = torch.optim.SGD(list(policy.parameters()), lr=lr)
    loss = -policy.sequence_logprobs(prompts, completions).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_full_policy_save_load_roundtrip(tiny_path, tmp_path):
    policy = TransformersPolicy.from_source(tiny_path, device="cpu")
    before = policy.sequence_logprobs([[1, 2, 3]], [[4, 5, 6]]).detach()
    _train_step(policy, [[1, 2, 3]], [[4, 5, 6]])
    trained = policy.sequence_logprobs([[1, 2, 3]], [[4, 5, 6]]).detach()
    assert trained > before  # the step raised the likelihood it was trained on
    policy.save(str(tmp_path / "ckpt"))
    assert json.loads((tmp_path / "ckpt" / "comlrl_policy.json").read_text())["kind"] == "full"
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()

    fresh = TransformersPolicy.from_source(tiny_path, device="cpu")
    assert not torch.allclose(fresh.sequence_logprobs([[1, 2, 3]], [[4, 5, 6]]), trained)
    fresh.load(str(tmp_path / "ckpt"))
    assert torch.allclose(fresh.sequence_logprobs([[1, 2, 3]], [[4, 5, 6]]).detach(), trained, atol=1e-6)
    # the saved folder is itself a loadable model source
    again = TransformersPolicy.from_source(str(tmp_path / "ckpt"), device="cpu")
    assert torch.allclose(again.sequence_logprobs([[1, 2, 3]], [[4, 5, 6]]).detach(), trained, atol=1e-6)


def test_lora_save_is_adapter_only_and_roundtrips(tiny_path, tmp_path):
    policy = TransformersPolicy.from_source(tiny_path, lora=True, lora_r=4, device="cpu")
    _train_step(policy, [[1, 2, 3]], [[4, 5, 6]], lr=0.5)
    trained = policy.sequence_logprobs([[1, 2, 3]], [[4, 5, 6]]).detach()
    policy.save(str(tmp_path / "lora"))
    files = sorted(os.listdir(tmp_path / "lora"))
    assert files == ["adapter_config.json", "adapter_model.safetensors", "comlrl_policy.json"]
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "lora" / "adapter_model.safetensors"))
    assert saved and all("lora_" in k for k in saved)
    assert sum(v.numel() for v in saved.values()) == sum(p.numel() for p in policy.parameters())

    fresh = TransformersPolicy.from_source(tiny_path, lora=True, lora_r=4, device="cpu")
    params_before = [id(p) for p in fresh.parameters()]
    fresh.load(str(tmp_path / "lora"))
    assert [id(p) for p in fresh.parameters()] == params_before  # optimizers stay valid
    assert torch.allclose(fresh.sequence_logprobs([[1, 2, 3]], [[4, 5, 6]]).detach(), trained, atol=1e-6)

    full = TransformersPolicy.from_source(tiny_path, device="cpu")
    with pytest.raises(ValueError, match="lora checkpoint"):
        full.load(str(tmp_path / "lora"))


def _saved_full(tiny_path, tmp_path):
    policy = TransformersPolicy.from_source(tiny_path, device="cpu")
    folder = tmp_path / "ckpt"
    policy.save(str(folder))
    return policy, folder


def test_a_full_checkpoint_with_weights_the_model_lacks_is_refused(tiny_path, tmp_path):
    policy, folder = _saved_full(tiny_path, tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    state["model.extra.weight"] = torch.zeros(2)
    save_file(state, str(folder / "model.safetensors"))
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    with pytest.raises(ValueError, match=r"has weights this model lacks: \['model.extra.weight'\]"):
        load_full_weights(policy.model, str(folder))
    # refused before anything was loaded: the model is as it was
    assert all(torch.equal(before[k], v) for k, v in policy.model.state_dict().items())


def test_a_full_checkpoint_missing_an_untied_weight_is_refused(tiny_path, tmp_path):
    policy, folder = _saved_full(tiny_path, tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    dropped = next(k for k in state if k.endswith("mlp.down_proj.weight"))
    del state[dropped]
    save_file(state, str(folder / "model.safetensors"))
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    _train_step(policy, [[1, 2, 3]], [[4, 5, 6]], lr=0.5)  # the checkpoint now differs from the model
    trained = {k: v.clone() for k, v in policy.model.state_dict().items()}
    assert any(not torch.equal(before[k], trained[k]) for k in before)
    with pytest.raises(ValueError, match=f"lacks weights for \\['{dropped}'\\]"):
        policy.load(str(folder))
    # refused before anything was loaded: the trained weights are untouched
    assert all(torch.equal(trained[k], v) for k, v in policy.model.state_dict().items())


def test_a_sharded_full_checkpoint_loads_through_its_index(tiny_path, tmp_path):
    policy, folder = _saved_full(tiny_path, tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    os.remove(folder / "model.safetensors")
    names = sorted(state)
    halves = {"model-1.safetensors": names[: len(names) // 2], "model-2.safetensors": names[len(names) // 2 :]}
    weight_map = {}
    for file, keys in halves.items():
        save_file({k: state[k] + 1.0 for k in keys}, str(folder / file))  # shifted: visible once loaded
        weight_map.update({k: file for k in keys})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    policy.load(str(folder))
    loaded = policy.model.state_dict()
    assert all(torch.equal(loaded[k], state[k] + 1.0) for k in names)


def test_a_folder_without_weights_is_refused_with_its_name(tiny_path, tmp_path):
    policy = TransformersPolicy.from_source(tiny_path, device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        policy.load(str(tmp_path / "empty"))
