"""``comlrl export``: a checkpoint's agents as folders that plain transformers / peft load,
with the same logits as the team's agents."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl_core.cli import main as comlrl_main
from comlrl_core.models.export import export_checkpoint
from comlrl_core.models.team import AgentSpec, Team
from comlrl_core.models.tiny import tiny_model_path
from comlrl_core.run.checkpoint import checkpoint_path, save_checkpoint

IDS = torch.tensor([[1, 5, 9, 12, 7, 3]])


def _logits_of_policy(policy) -> torch.Tensor:
    policy.activate()
    with torch.no_grad():
        return policy.model(input_ids=IDS).logits


def _logits_of_model(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


@pytest.fixture()
def run(tmp_path):
    """A run folder with one checkpoint of a team: two LoRA agents (distinct, non-zero
    adapters on one shared base) and one fully trained agent."""
    torch.manual_seed(0)
    team = Team.from_specs(
        [
            AgentSpec("tiny-random", lora=True, lora_r=4, device="cpu"),
            AgentSpec("tiny-random", lora=True, lora_r=4, device="cpu"),
            AgentSpec("tiny-random", device="cpu"),
        ]
    )
    agents: list[Any] = team.policies
    with torch.no_grad():
        for i, policy in enumerate(agents):
            for name, p in policy.named_parameters():
                if "lora_B" in name or i == 2:
                    p.add_(0.05 * (i + 1) * torch.randn(p.shape, generator=torch.Generator().manual_seed(i)))
    run_dir = tmp_path / "run"
    save_checkpoint(checkpoint_path(run_dir / "checkpoints", 3), policies={f"agent_{i}": p for i, p in enumerate(team)})
    return run_dir, team


def test_merged_export_loads_with_plain_transformers(run, tmp_path):
    run_dir, team = run
    out = tmp_path / "export"
    exported = export_checkpoint(run_dir, out)  # a run folder: its latest checkpoint
    assert [(a.name, a.kind) for a in exported] == [("agent_0", "merged"), ("agent_1", "merged"), ("agent_2", "full")]
    for i, policy in enumerate(team):
        model = AutoModelForCausalLM.from_pretrained(out / f"agent_{i}")
        assert not any("lora" in n for n, _ in model.named_parameters())
        assert torch.allclose(_logits_of_model(model), _logits_of_policy(policy), atol=1e-4)
        tokenizer = AutoTokenizer.from_pretrained(out / f"agent_{i}")
        assert tokenizer.eos_token == team[i].tokenizer.eos_token
    assert not torch.allclose(_logits_of_policy(team[0]), _logits_of_policy(team[1]), atol=1e-3)


def test_adapters_only_export_is_portable_and_loads_with_peft(run, tmp_path):
    from peft import PeftModel

    run_dir, team = run
    out = tmp_path / "adapters"
    checkpoint = run_dir / "checkpoints" / "checkpoint-000003"
    exported = export_checkpoint(checkpoint, out, adapters_only=True)
    assert [a.kind for a in exported] == ["adapter", "adapter", "full"]
    for i in range(2):
        config = json.loads((out / f"agent_{i}" / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == "tiny-random"  # an alias, no path of this machine
        base = AutoModelForCausalLM.from_pretrained(tiny_model_path())
        model = PeftModel.from_pretrained(base, out / f"agent_{i}")
        assert torch.allclose(_logits_of_model(model), _logits_of_policy(team[i]), atol=1e-4)
    # the exported adapter is a warm start for a new team
    again = Team.from_specs([AgentSpec(str(out / "agent_1"), lora=True, device="cpu")])
    assert torch.allclose(_logits_of_policy(again[0]), _logits_of_policy(team[1]), atol=1e-4)


def test_adapters_only_refuses_a_path_as_base(run, tmp_path):
    run_dir, _ = run
    with pytest.raises(ValueError, match="hub id or alias"):
        export_checkpoint(run_dir, tmp_path / "a", adapters_only=True, base_model="/opt/models/base")


def test_cli_export(run, tmp_path, capsys):
    run_dir, _ = run
    out = tmp_path / "cli"
    assert comlrl_main(["export", str(run_dir), "--out", str(out), "--adapters-only"]) == 0
    assert "agent_0: adapter" in capsys.readouterr().out
    assert (out / "agent_0" / "adapter_model.safetensors").is_file()
    assert comlrl_main(["export", str(run_dir), "--out", str(out)]) == 2  # never mixes with an older export
    assert "not an empty folder" in capsys.readouterr().err
    assert comlrl_main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "x")]) == 2
