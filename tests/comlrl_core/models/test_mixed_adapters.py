"""Mixed-adapter forwards on row slices: same outputs as peft's gathered sub-batches."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from comlrl_core.models.agent_spec import AgentSpec
from comlrl_core.models.mixed_adapters import adapter_runs, sliced_adapter_batches
from comlrl_core.models.team import Team


@given(st.lists(st.sampled_from(["a", "b", "__base__"]), max_size=30))
def test_runs_rebuild_the_names_and_never_touch(names):
    runs = adapter_runs(names)
    assert [n for n, start, stop in runs for _ in range(start, stop)] == names
    assert all(runs[i][0] != runs[i + 1][0] for i in range(len(runs) - 1))
    assert all(stop > start for _, start, stop in runs)


def test_slices_give_peft_outputs_and_are_restored():
    torch.manual_seed(0)
    team = Team.from_specs([AgentSpec(model="tiny-random", lora=True), AgentSpec(model="tiny-random", lora=True)])
    for policy in team:
        for name, weight in policy.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(weight, std=0.5)
    model = team[0].model.eval()
    ids = torch.randint(3, 50, (5, 7))
    names = ["agent_0", "agent_0", "agent_1", "__base__", "agent_1"]
    with torch.no_grad():
        expected = model(input_ids=ids, adapter_names=names).logits
        with sliced_adapter_batches(model) as switched:
            got = model(input_ids=ids, adapter_names=names).logits
        again = model(input_ids=ids, adapter_names=names).logits
    assert switched > 0
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(again, expected, atol=1e-5)
    assert not any("_mixed_batch_forward" in m.__dict__ for m in model.modules())
    # the adapters really differ per row: agent_0's rows differ from the base's
    with torch.no_grad():
        base = model(input_ids=ids, adapter_names=["__base__"] * 5).logits
    assert not torch.allclose(expected[0], base[0], atol=1e-3)
