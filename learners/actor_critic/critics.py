"""Critics for IAC and MAAC: a value head on a causal-LM trunk.

A critic reads text -- a history ``h`` for V(h), or a history plus an action for
Q(h, a) -- tokenises it with its trunk's tokenizer (chat template included), runs the
trunk once and maps the hidden state of the last token to a scalar with a small head.

* :class:`ValueHeadCritic` puts the head on an agent's own model (IAC with
  ``use_separate_critic=False``). Its trainable parameters are the head's only; the
  trunk is the actor's and learns from ``actor + value_loss_coef * critic`` through the
  actor's optimizer.
* :class:`ModelCritic` owns a separate trunk (IAC's per-agent critics, MAAC's
  centralized critic) and trains trunk and head together.

Inputs are left-padded, so the last column is every row's last real token; with
``logits_to_keep=1`` the LM head runs on that column only. Works with any
``TransformersPolicy``-like object exposing ``model``, ``encode_prompt``,
``tokenizer`` and ``pad_token_id`` (and ``shared_base`` / ``adapter_name`` for LoRA).
"""

from __future__ import annotations

import abc
import contextlib
import os
from typing import Any, Sequence

import torch
from torch import nn

from comlrl_core.models.sampling import padded_position_ids, supports_logits_to_keep

HEAD_FILE = "value_head.pt"


class ValueHead(nn.Module):
    """``hidden -> scalar``: one linear layer, or an MLP with ``hidden_dim`` units."""

    def __init__(self, in_features: int, hidden_dim: int | None = None, init_std: float = 0.01) -> None:
        super().__init__()
        self.net: nn.Linear | nn.Sequential
        if hidden_dim is None:
            self.net = last = nn.Linear(in_features, 1)
        else:
            first = nn.Linear(in_features, hidden_dim)  # built in layer order: seeded runs draw the same weights
            last = nn.Linear(hidden_dim, 1)
            self.net = nn.Sequential(first, nn.GELU(), last)
        # small output weights: initial values near 0 instead of a random offset the
        # critic must first unlearn
        nn.init.normal_(last.weight, std=init_std)
        nn.init.zeros_(last.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden.float()).squeeze(-1)


def _hidden_size(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    size = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    if not isinstance(size, int):
        raise ValueError(f"cannot read the hidden size of {type(model).__name__}'s config")
    return size


def last_token_hidden(backbone: Any, rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """``[B, hidden]``: the final hidden state of each row's last token (differentiable)."""
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("every critic input needs at least one token")
    device = next(backbone.model.parameters()).device
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), int(backbone.pad_token_id), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = torch.as_tensor(list(row), dtype=torch.long)
        mask[b, width - len(row) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    backbone.activate()
    extra = {"logits_to_keep": 1} if supports_logits_to_keep(backbone.model) else {}
    compute = getattr(backbone, "compute_context", None)
    with compute() if callable(compute) else contextlib.nullcontext():  # mixed precision
        out = backbone.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=padded_position_ids(mask),
            use_cache=False,
            output_hidden_states=True,
            **extra,
        )
    return out.hidden_states[-1][:, -1, :].float()  # the value head stays fp32


class Critic(abc.ABC):
    """V(h) or Q(h, a) from text, on a causal-LM trunk plus a :class:`ValueHead`."""

    def __init__(self, backbone: Any, head: ValueHead) -> None:
        self.backbone = backbone
        self.head = head.to(next(backbone.model.parameters()).device)

    def encode(self, history: str, action: str | None = None) -> list[int]:
        """Token ids of the critic input: the history as a prompt (chat template), then
        the action's tokens for Q(h, a)."""
        ids = list(self.backbone.encode_prompt(history))
        if action is not None:
            ids += list(self.backbone.tokenizer(action, add_special_tokens=False)["input_ids"])
        return ids

    def values(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """``[B]`` float32 estimates for encoded inputs (differentiable)."""
        return self.head(last_token_hidden(self.backbone, rows))

    @torch.no_grad()
    def values_nograd(self, rows: Sequence[Sequence[int]], micro_batch_size: int) -> list[float]:
        out: list[float] = []
        for start in range(0, len(rows), micro_batch_size):
            out.extend(self.values(rows[start : start + micro_batch_size]).float().cpu().tolist())
        return out

    @abc.abstractmethod
    def trainable_parameters(self) -> list[nn.Parameter]:
        """What the critic's own optimizer updates."""

    def train(self, mode: bool = True) -> None:
        self.head.train(mode)
        self.backbone.model.train(mode)

    # -- persistence (the checkpoint module calls save/load with a folder) --------------
    def save(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        torch.save(self.head.state_dict(), os.path.join(directory, HEAD_FILE))

    def load(self, directory: str) -> None:
        path = os.path.join(directory, HEAD_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no value head at {path}")
        state = torch.load(path, map_location=next(self.head.parameters()).device, weights_only=True)
        self.head.load_state_dict(state)


class ValueHeadCritic(Critic):
    """A value head on an agent's own model; the trunk is trained by the actor's optimizer."""

    def __init__(self, actor: Any, hidden_dim: int | None = None) -> None:
        super().__init__(actor, ValueHead(_hidden_size(actor.model), hidden_dim))

    def trainable_parameters(self) -> list[nn.Parameter]:
        return list(self.head.parameters())

    def train(self, mode: bool = True) -> None:
        self.head.train(mode)  # the trunk's mode is the actor's business


class ModelCritic(Critic):
    """A separate critic model (its own trunk + head), trained as a whole."""

    def __init__(self, backbone: Any, hidden_dim: int | None = None) -> None:
        super().__init__(backbone, ValueHead(_hidden_size(backbone.model), hidden_dim))

    @classmethod
    def from_source(cls, source: str, hidden_dim: int | None = None, **spec_fields: Any) -> "ModelCritic":
        """Load the trunk with ``TransformersPolicy.from_source`` (AgentSpec fields apply)."""
        from comlrl_core.models.hf_policy import TransformersPolicy

        return cls(TransformersPolicy.from_source(source, **spec_fields), hidden_dim)

    def trainable_parameters(self) -> list[nn.Parameter]:
        trunk = [p for p in self.backbone.parameters() if p.requires_grad]
        return trunk + list(self.head.parameters())

    def save(self, directory: str) -> None:
        super().save(directory)
        self.backbone.save(os.path.join(directory, "backbone"))

    def load(self, directory: str) -> None:
        super().load(directory)
        self.backbone.load(os.path.join(directory, "backbone"))
