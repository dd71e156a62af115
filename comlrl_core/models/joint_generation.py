"""Sample for several agents at once: agents on one shared LoRA base share the forward passes.

A turn of a multi-agent episode asks every agent for completions. Agents that are LoRA
adapters of one frozen base (the default team) would each run their own decode loop,
reading the base weights once per agent per token. :func:`generate_together` instead
samples their rows in ONE loop, each row through its own adapter (peft's mixed-adapter
batches): the base weights are read once per token for the whole team, and the batch the
GEMMs see is the team's, not one agent's.

Results equal separate ``generate`` calls when every request carries per-completion seeds
(a list of seeds; see :meth:`comlrl_core.policy.Policy.generate`): each row then draws from
its own generator whatever batch it runs in. Requests without them, other policies, and
agents on different bases are served by their own ``generate`` calls.

Public API::

    generate_together(policies, requests) -> one ``generate`` result per request
    GenerationRequest(prompts, num_samples, config, seed)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.policy import Completion, GenerationConfig, Policy

__all__ = ["GenerationRequest", "generate_together"]


@dataclass
class GenerationRequest:
    """The arguments of one agent's ``Policy.generate`` call."""

    prompts: Sequence[str]
    num_samples: int
    config: GenerationConfig
    seed: int | Sequence[int] | None = None


def _merge_key(policy: Policy, request: GenerationRequest) -> tuple | None:
    """Requests with equal keys can share one decode loop; None: this one cannot."""
    if not isinstance(policy, TransformersPolicy) or policy.shared_base is None or policy.adapter_name is None:
        return None
    if type(policy).sample_encoded is not TransformersPolicy.sample_encoded:  # a subclass samples its own way
        return None
    if type(policy).generate is not TransformersPolicy.generate or "generate" in vars(policy):
        return None  # generate is overridden (a subclass, or wrapped on the instance): honour it
    if isinstance(request.seed, int) or request.seed is None or not request.prompts:
        return None  # one generator for the call: its draws depend on the batch
    return (id(policy.shared_base), request.num_samples, request.config, policy._share_prompt_prefill)


def generate_together(
    policies: Sequence[Policy], requests: Sequence[GenerationRequest]
) -> list[list[list[Completion]]]:
    """``[policies[i].generate(*requests[i]) for i]``, with the requests of agents on one
    shared LoRA base (same sampling settings, per-completion seeds) sampled together."""
    if len(policies) != len(requests):
        raise ValueError(f"got {len(policies)} policies for {len(requests)} requests")
    results: list[list[list[Completion]] | None] = [None] * len(policies)
    groups: dict[tuple, list[int]] = {}
    for i, (policy, request) in enumerate(zip(policies, requests, strict=True)):
        key = _merge_key(policy, request)
        if key is None:
            results[i] = policy.generate(list(request.prompts), request.num_samples, request.config, request.seed)
        else:
            groups.setdefault(key, []).append(i)
    for members in groups.values():
        if len(members) == 1:
            i = members[0]
            r = requests[i]
            results[i] = policies[i].generate(list(r.prompts), r.num_samples, r.config, r.seed)
            continue
        for i, block in zip(members, _sample_shared_base(policies, requests, members), strict=True):
            results[i] = block
    return [r if r is not None else [] for r in results]


def _sample_shared_base(
    policies: Sequence[Policy], requests: Sequence[GenerationRequest], members: list[int]
) -> list[list[list[Completion]]]:
    """One decode loop for ``members`` (agents of one shared base): their prompts end to end,
    each prompt's rows through its agent's adapter."""
    team = [policies[i] for i in members]
    assert all(isinstance(p, TransformersPolicy) for p in team)
    lead = team[0]
    assert isinstance(lead, TransformersPolicy)
    num_samples, cfg = requests[members[0]].num_samples, requests[members[0]].config
    encoded: list[list[int]] = []
    generators: list = []
    adapters: list[str] = []
    spans: list[tuple[int, int]] = []
    for i, policy in zip(members, team, strict=True):
        assert isinstance(policy, TransformersPolicy) and policy.adapter_name is not None
        request = requests[i]
        mine = [policy.encode_prompt(p) for p in request.prompts]
        row_generators = policy._generators(request.seed, len(mine), num_samples)
        assert isinstance(row_generators, list)  # per-completion seeds (checked by _merge_key)
        spans.append((len(encoded), len(encoded) + len(mine)))
        encoded.extend(mine)
        generators.extend(row_generators)
        adapters.extend([policy.adapter_name] * len(mine))
    tokens, lengths, on_eos = lead.sample_encoded(encoded, num_samples, cfg, generators, row_adapters=adapters)
    out = []
    for policy, (start, stop) in zip(team, spans, strict=True):
        assert isinstance(policy, TransformersPolicy)
        rows = slice(start * num_samples, stop * num_samples)
        out.append(
            policy.completions_from_rows(
                encoded[start:stop], num_samples, cfg, tokens[rows], lengths[rows], on_eos[rows]
            )
        )
    return out
