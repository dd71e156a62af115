"""Fixtures shared by the model tests."""

from __future__ import annotations

import pytest
import torch

from comlrl_core.models import sampling
from comlrl_core.models.agent_spec import AgentSpec
from comlrl_core.models.cpu.packed_linear import prepacked_linears
from comlrl_core.models.mixed_adapters import sliced_adapter_batches
from comlrl_core.models.team import Team


@pytest.fixture(scope="module")
def lora_team():
    """Two LoRA agents of the tiny model on one shared base, adapters made to differ."""
    torch.manual_seed(0)
    team = Team.from_specs([AgentSpec(model="tiny-random", lora=True), AgentSpec(model="tiny-random", lora=True)])
    for policy in team:  # fresh adapters are zero: make the agents differ
        for name, weight in policy.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(weight, std=0.5)
    return team


def _sample_rows(policy, prompts, num_samples, budget, adapters=None, temperature=1.0, share_prefix=True, max_new=6):
    """``sample_tokens`` on left-padded ``prompts`` as ``sample_encoded`` runs it (weights
    packed for the call's rows, adapters on row slices), one seeded generator per row."""
    input_ids, mask = policy._left_pad(prompts)
    rows = len(prompts) * num_samples
    generators = [torch.Generator().manual_seed(100 + r) for r in range(rows)]
    with prepacked_linears(policy.model, rows=rows), sliced_adapter_batches(policy.model):
        return sampling.sample_tokens(
            policy.model,
            input_ids,
            mask,
            max_new_tokens=max_new,
            temperature=temperature,
            top_k=20,
            eos_token_ids=policy.eos_token_ids,
            pad_token_id=policy.pad_token_id,
            generator=generators,
            num_samples=num_samples,
            row_adapters=adapters,
            prefill_token_budget=budget,
            share_prefix=share_prefix,
        )


@pytest.fixture
def sample_rows():
    """The sampling call of the prefill tests (see :func:`_sample_rows`)."""
    return _sample_rows


@pytest.fixture
def record_results(monkeypatch):
    """Call it with ``(owner, name)``: ``owner.name`` is replaced for the test by a wrapper
    that records, per call, whether the real function gave a result (not None); returns
    that list. A compiled kernel's entry point returns None where it did not run."""

    def start(owner, name: str) -> list[bool]:
        calls: list[bool] = []
        real = getattr(owner, name)

        def recording(*args):
            out = real(*args)
            calls.append(out is not None)
            return out

        monkeypatch.setattr(owner, name, recording)
        return calls

    return start
