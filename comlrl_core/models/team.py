"""Team: the agents' policies, possibly on different models, possibly sharing a base.

Public API::

    AgentSpec(model, lora=False, lora_r=8, lora_alpha=16, lora_dropout=0.0,
              lora_target_modules=None, dtype="fp32", device="auto",
              gradient_checkpointing=False, use_chat_template=True, system_prompt=None,
              share_base=True, name=None)                 (from comlrl_core.models.agent_spec)
    Team.from_specs(agents: Sequence[AgentSpec | Policy | str | callable], seed=None) -> Team
        str -> AgentSpec(model=str); a plain callable -> CallablePolicy; a Policy is used as is.
        seed: new weights (LoRA adapters, any weight a checkpoint lacks) drawn from it, agent
        by agent, so the same seed builds the same team in any process (None: from torch's
        global random state, which a fresh process seeds from the OS).
    Team(policies: Sequence[Policy])
    team[i], len(team), iter(team), team.policies, team.names
    team.trainable_parameters(i) -> list[Parameter]   (agent i's own, e.g. its adapter)
    team.shared_groups -> list[list[int]]             agents that share one base model
    team.train(mode=True) / team.eval()
    team.save(directory) / team.load(directory)       one sub-folder per trainable agent

Warm starts: an agent's model may be a PEFT adapter folder (its base is shared like any
other; the agent's adapter starts from the saved weights) or a ``save_pretrained`` folder.

Sharing: LoRA agents (``lora=True, share_base=True``) whose model resolves to the same
weights, with the same dtype and device, share ONE frozen base inside one peft model
with adapters ``agent_<i>`` (i = the agent's index in the team). Each agent's policy
activates its adapter for its own forward passes, so n such agents cost about one
model of memory.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, Sequence, Union

from torch import nn

from comlrl_core.models.agent_spec import AgentSpec
from comlrl_core.models.hf_policy import TransformersPolicy, load_base_model
from comlrl_core.models.lora import SharedLoraBase
from comlrl_core.models.model_source import load_tokenizer, resolve_model_source
from comlrl_core.policy import Policy
from comlrl_core.run.seeds import derive_seed, torch_seeded

__all__ = ["AgentSpec", "Team"]

_INIT_TAG = 0x7EA4  # seed-path tag of the weights drawn while building agent i

AgentLike = Union[AgentSpec, Policy, str, Callable[..., Any]]


def _as_spec_or_policy(agent: AgentLike, index: int) -> AgentSpec | Policy:
    if isinstance(agent, (AgentSpec, Policy)):
        return agent
    if isinstance(agent, (str, os.PathLike)):
        return AgentSpec(model=os.fspath(agent))
    if callable(agent):
        from comlrl_core.models.simple_policies import CallablePolicy

        return CallablePolicy(agent)
    raise TypeError(
        f"agent {index}: expected an AgentSpec, a Policy, a model source string or a "
        f"callable prompt -> text, got {type(agent).__name__}"
    )


class Team:
    """An ordered collection of agent policies (agent i is ``team[i]``)."""

    def __init__(self, policies: Sequence[Policy]) -> None:
        policies = list(policies)
        if not policies:
            raise ValueError("a Team needs at least one agent")
        for i, p in enumerate(policies):
            if not isinstance(p, Policy):
                raise TypeError(
                    f"agent {i}: Team(...) takes Policy objects, got {type(p).__name__}; "
                    "use Team.from_specs for AgentSpecs, model sources or callables"
                )
        self._policies = policies

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_specs(cls, agents: Sequence[AgentLike], seed: int | None = None) -> "Team":
        """Build agents, loading each distinct shared base only once. With ``seed``, every
        weight that is drawn rather than loaded (a new LoRA adapter's A matrix, say) comes
        from a seed derived from ``seed`` and the agent's index, the same in every process;
        the global random state is left as it was."""

        def drawing(index: int) -> contextlib.AbstractContextManager[None]:
            # per agent, so an agent's initial weights do not depend on the agents before it
            return torch_seeded(derive_seed(seed, _INIT_TAG, index)) if seed is not None else contextlib.nullcontext()

        if isinstance(agents, (str, AgentSpec, Policy)):
            raise TypeError("Team.from_specs takes a list of agents, e.g. [spec0, spec1]")
        items = [_as_spec_or_policy(a, i) for i, a in enumerate(agents)]
        if not items:
            raise ValueError("a Team needs at least one agent")

        # Group shareable LoRA agents by (weights, dtype, device).
        sources = {}
        groups: dict[tuple, list[int]] = {}
        specs: dict[int, AgentSpec] = {}
        for i, item in enumerate(items):
            if isinstance(item, AgentSpec):
                specs[i] = item
                sources[i] = resolve_model_source(item.model)
                if item.lora and item.share_base:
                    key = (sources[i].key, str(item.base_torch_dtype), item.resolved_device())
                    groups.setdefault(key, []).append(i)
        for members in groups.values():
            flags = {specs[i].gradient_checkpointing for i in members}
            if len(flags) > 1:
                raise ValueError(
                    f"agents {members} share the base model {sources[members[0]].spec!r} but "
                    "disagree on gradient_checkpointing; give them the same value (or set "
                    "share_base=False to load separate copies)"
                )

        policies: list[Policy | None] = [None] * len(items)
        for members in groups.values():
            first = specs[members[0]]
            source = sources[members[0]]
            tokenizer = load_tokenizer(source)
            with drawing(members[0]):
                shared = SharedLoraBase(load_base_model(source, first))
            for i in members:
                # sources[i]: members share the base but not a warm-start adapter folder
                with drawing(i):
                    policies[i] = TransformersPolicy.with_new_adapter(
                        shared, tokenizer, specs[i], f"agent_{i}", sources[i]
                    )
        built: list[Policy] = []
        for i, item in enumerate(items):
            policy = policies[i]
            if policy is None and isinstance(item, Policy):
                policy = item
            elif policy is None:
                with drawing(i):
                    policy = TransformersPolicy.from_spec(specs[i], adapter_name=f"agent_{i}")
            built.append(policy)
        return cls(built)

    # -- sequence protocol -------------------------------------------------------------
    def __getitem__(self, index: int) -> Policy:
        return self._policies[index]

    def __len__(self) -> int:
        return len(self._policies)

    def __iter__(self) -> Iterator[Policy]:
        return iter(self._policies)

    def __repr__(self) -> str:
        return f"Team({self._policies!r})"

    @property
    def policies(self) -> list[Policy]:
        return list(self._policies)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self._policies]

    @property
    def shared_groups(self) -> list[list[int]]:
        """Indices of agents that share one base model (groups of size >= 2)."""
        by_base: dict[int, list[int]] = {}
        for i, p in enumerate(self._policies):
            base = getattr(p, "shared_base", None)
            if base is not None:
                by_base.setdefault(id(base), []).append(i)
        return [g for g in by_base.values() if len(g) > 1]

    def trainable_parameters(self, index: int) -> list[nn.Parameter]:
        """Agent ``index``'s own trainable parameters (empty for non-trainable agents)."""
        return list(self._policies[index].parameters())

    def train(self, mode: bool = True) -> "Team":
        for p in self._policies:
            if hasattr(p, "train"):
                p.train(mode)
        return self

    def eval(self) -> "Team":
        return self.train(False)

    # -- persistence -------------------------------------------------------------------
    def save(self, directory: str) -> None:
        """Each trainable agent saves into ``directory/agent_<i>``."""
        os.makedirs(directory, exist_ok=True)
        for i, p in enumerate(self._policies):
            if p.trainable:
                p.save(os.path.join(directory, f"agent_{i}"))

    def load(self, directory: str) -> None:
        for i, p in enumerate(self._policies):
            if p.trainable:
                path = os.path.join(directory, f"agent_{i}")
                if not os.path.isdir(path):
                    raise FileNotFoundError(f"no checkpoint for agent {i} at {path}")
                p.load(path)
