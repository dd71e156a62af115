"""JointRewardModel: a causal-LM backbone that reads the whole joint response and says how
good it is, trained with the Bradley-Terry loss on preference pairs.

The input is one text holding every agent's prompt and response (:func:`joint_text`). The
score is a linear head on the final hidden state of the LAST NON-PAD token, found from the
attention mask, so left- and right-padded batches give the same scores (position ids are
counted over real tokens only, which makes left padding harmless too).

Bradley-Terry: ``P(w preferred to l) = sigmoid(r(w) - r(l))``; the loss is
``-log sigmoid(r(w) - r(l))`` averaged over a batch of pairs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from comlrl_core.models.model_source import load_causal_lm, load_tokenizer, resolve_model_source
from comlrl_core.models.sampling import padded_position_ids
from comlrl_core.models.tokens import chunks
from learners.common.optim import adamw
from learners.preference.records import PreferencePair


def joint_text(prompts: Sequence[str], completions: Sequence[str], agent_names: Sequence[str] | None = None) -> str:
    """Every agent's prompt and response as one text (agent order)."""
    names = list(agent_names) if agent_names is not None else [f"agent {i + 1}" for i in range(len(prompts))]
    parts = ["Joint response of the team"]
    for name, prompt, completion in zip(names, prompts, completions, strict=True):
        parts.append(f"[{name}] prompt:\n{prompt}")
        parts.append(f"[{name}] response:\n{completion}")
    return "\n\n".join(parts)


def last_real_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Per row, the index of the last position whose mask is 1 (either padding side)."""
    positions = torch.arange(attention_mask.size(1), device=attention_mask.device).expand_as(attention_mask)
    return torch.where(attention_mask.bool(), positions, torch.zeros_like(positions)).max(dim=1).values


def bradley_terry_loss(winner_scores: torch.Tensor, loser_scores: torch.Tensor) -> torch.Tensor:
    return -F.logsigmoid(winner_scores - loser_scores).mean()


@dataclass
class FitResult:
    loss: float  # mean loss of the last epoch
    accuracy: float  # fraction of training pairs ranked correctly after fitting
    steps: int


class JointRewardModel(nn.Module):
    """``JointRewardModel(backbone, tokenizer)``; ``from_source("tiny-random")`` builds one."""

    def __init__(
        self,
        backbone: nn.Module,
        tokenizer,
        *,
        freeze_backbone: bool = False,
        max_length: int | None = None,
        agent_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.agent_names = list(agent_names) if agent_names is not None else None
        config = getattr(backbone, "config", None)
        hidden = (
            getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or getattr(config, "d_model", None)
        )
        if hidden is None:
            raise ValueError("cannot tell the backbone's hidden size (config.hidden_size / n_embd / d_model)")
        ref = next(backbone.parameters())
        self.head = nn.Linear(int(hidden), 1).to(device=ref.device, dtype=ref.dtype)
        if freeze_backbone:
            backbone.requires_grad_(False)
        if tokenizer.pad_token_id is None:  # some tokenizers have none: pad with EOS (masked anyway)
            tokenizer.pad_token = tokenizer.eos_token

    @classmethod
    def from_source(cls, source: str, *, device: str = "cpu", **kwargs) -> "JointRewardModel":
        src = resolve_model_source(source)
        model = cls(load_causal_lm(src), load_tokenizer(src), **kwargs)
        return model.to(device)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=padded_position_ids(attention_mask),
            output_hidden_states=True,
            use_cache=False,
        )
        hidden = out.hidden_states[-1]
        rows = torch.arange(hidden.size(0), device=hidden.device)
        pooled = hidden[rows, last_real_token_index(attention_mask).to(hidden.device)]
        return self.head(pooled).squeeze(-1).float()

    def encode(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        # A joint text longer than max_length loses its START: the responses come last, and
        # cutting the end instead would score a text without them (every candidate alike).
        side = self.tokenizer.truncation_side
        self.tokenizer.truncation_side = "left"
        try:
            enc = self.tokenizer(
                list(texts),
                padding=True,
                truncation=self.max_length is not None,
                max_length=self.max_length,
                return_tensors="pt",
            )
        finally:
            self.tokenizer.truncation_side = side
        return {"input_ids": enc["input_ids"].to(self.device), "attention_mask": enc["attention_mask"].to(self.device)}

    def score_texts(self, texts: Sequence[str]) -> torch.Tensor:
        return self(**self.encode(texts))

    @torch.no_grad()
    def score_joint(self, items: Sequence[tuple[Sequence[str], Sequence[str]]], batch_size: int = 16) -> list[float]:
        """Scores of (prompts, completions) joint responses, without gradients."""
        was = self.training
        self.eval()
        out: list[float] = []
        try:
            for chunk in chunks(list(items), batch_size):
                out.extend(self.score_texts([joint_text(p, c, self.agent_names) for p, c in chunk]).tolist())
        finally:
            self.train(was)
        return out

    def pair_texts(self, pair: PreferencePair) -> tuple[str, str]:
        return (
            joint_text(pair.prompts, pair.winner_completions, self.agent_names),
            joint_text(pair.prompts, pair.loser_completions, self.agent_names),
        )

    def fit(
        self,
        pairs: Sequence[PreferencePair],
        *,
        epochs: int = 1,
        batch_size: int = 1,
        learning_rate: float = 1e-5,
        seed: int = 0,
        weight_decay: float = 0.0,
    ) -> FitResult:
        """Bradley-Terry training on ``pairs`` (seeded shuffles); the model is left in eval mode."""
        if not pairs:
            raise ValueError("a reward model needs at least one preference pair to fit")
        params = [p for p in self.parameters() if p.requires_grad]
        optimizer = adamw(params, lr=learning_rate, weight_decay=weight_decay)
        rng = random.Random(seed)
        self.train()
        steps = 0
        epoch_losses: list[float] = []
        for _ in range(epochs):
            order = list(range(len(pairs)))
            rng.shuffle(order)
            epoch_losses = []
            for start in range(0, len(order), batch_size):
                batch = [pairs[i] for i in order[start : start + batch_size]]
                texts = [self.pair_texts(p) for p in batch]
                scores = self.score_texts([w for w, _ in texts] + [lose for _, lose in texts])
                loss = bradley_terry_loss(scores[: len(batch)], scores[len(batch) :])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                epoch_losses.append(float(loss.detach()))
                steps += 1
        self.eval()
        w = self.score_joint([(p.prompts, p.winner_completions) for p in pairs])
        lose = self.score_joint([(p.prompts, p.loser_completions) for p in pairs])
        accuracy = sum(a > b for a, b in zip(w, lose, strict=True)) / len(pairs)
        return FitResult(sum(epoch_losses) / max(1, len(epoch_losses)), accuracy, steps)
