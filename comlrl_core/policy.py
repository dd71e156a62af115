"""The policy contract: one agent's text policy, trainable or not.

Learners see agents only through :class:`Policy`. Implementations:

* ``comlrl_core.models.hf_policy.TransformersPolicy`` -- a transformers causal LM
  (optionally LoRA through peft), trainable, GPU-ready.
* ``comlrl_core.models.simple_policies.CallablePolicy`` / ``RemotePolicy`` -- plain Python
  callables or a remote model; generate only (for evaluation and experts).

``generate`` works on prompts x samples in one call; ``sequence_logprobs`` scores
completions token by token, counting every real completion token (EOS included)
and never a pad.
"""

from __future__ import annotations

import abc
import contextlib
import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Literal, Sequence

if TYPE_CHECKING:  # torch is heavy; the contract itself does not need it at import time
    import torch

FinishReason = Literal["eos", "length", "stop", "error"]


@dataclass(frozen=True)
class GenerationConfig:
    """Sampling settings. ``temperature == 0`` means greedy decoding.

    ``stop``: strings that end a completion: its text is cut before the first one and
    its ``token_ids`` after the token that completed it (``finish_reason == "stop"``).

    ``max_batch_tokens`` bounds the memory of one batched sampling call: a policy that
    batches splits its rows into calls of at most that many ``rows * (prompt + new)``
    tokens (the KV cache grows with it: about 46 KB a token for SmolLM2-135M in fp32). A
    resource hint, not a sampling setting: with per-completion seeds the samples are the
    same whatever the split. None: one call for all rows.

    ``prefill_token_budget`` bounds the prompt pass of a call: its prompts are prefilled in
    row chunks of at most that many padded tokens (attention scores and MLP activations of
    one chunk at a time), written into the call's KV cache as they come. Also a resource
    hint: the samples are the same. None: one prefill pass per call.
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k filtering
    stop: Sequence[str] = ()  # stored as a tuple
    max_batch_tokens: int | None = None
    prefill_token_budget: int | None = 2048

    def __post_init__(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)  # frozen: a list from JSON / YAML becomes a tuple
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1 or None (no limit), got {self.max_batch_tokens}")
        if self.prefill_token_budget is not None and self.prefill_token_budget < 1:
            raise ValueError(
                f"prefill_token_budget must be >= 1 or None (one prefill pass), got {self.prefill_token_budget}"
            )


@dataclass
class Completion:
    """One sampled response.

    ``token_ids`` are the completion tokens exactly as generated, EOS included when
    the model stopped on it, pads never. ``prompt_token_ids`` are the prompt tokens the
    model was conditioned on (after the chat template), so that log-probs can be
    recomputed without re-tokenising.
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason = "eos"
    prompt_token_ids: list[int] = field(default_factory=list)


class Policy(abc.ABC):
    """One agent's text policy."""

    #: a short human-readable name (model id or alias), used in logs
    name: str = "policy"
    #: whether ``sequence_logprobs`` / ``parameters`` are meaningful
    trainable: bool = False

    @abc.abstractmethod
    def generate(
        self,
        prompts: Sequence[str],
        num_samples: int = 1,
        generation_config: GenerationConfig | None = None,
        seed: int | Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """Sample ``num_samples`` completions for each prompt.

        Returns one list per prompt, each of length ``num_samples``.

        ``seed``: an int seeds the whole call; a sequence holds one seed per completion
        (``len(prompts) * num_samples`` of them, prompt-major: completion ``s`` of prompt
        ``p`` is ``seed[p * num_samples + s]``), and then each completion's randomness
        depends only on its prompt and its own seed, not on the other rows of the call
        (:func:`completion_seeds` checks the length). Policies whose sampling is not
        seeded (callables, remote models) accept both forms and ignore them.
        """

    # -- trainable policies -------------------------------------------------------
    def encode_prompt(self, prompt: str) -> list[int]:
        """Token ids the model is conditioned on for ``prompt`` (chat template applied)."""
        raise NotImplementedError(f"{type(self).__name__} has no tokenizer")

    def token_logprobs(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Per-token log-probs of each completion given its prompt.

        Returns ``(logprobs, mask)``, both ``[batch, max_completion_len]``; ``mask`` is 1
        on real completion tokens and 0 on padding. Differentiable.
        """
        raise NotImplementedError(f"{type(self).__name__} is not trainable")

    def sequence_logprobs(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        per_token: bool = False,
    ) -> "torch.Tensor | tuple[torch.Tensor, torch.Tensor]":
        """Summed log-prob of each completion (``[batch]``), or per token with its mask."""
        logprobs, mask = self.token_logprobs(prompt_ids, completion_ids)
        if per_token:
            return logprobs, mask
        return (logprobs * mask).sum(dim=-1)

    def parameters(self) -> Iterator["torch.nn.Parameter"]:
        """Trainable parameters of this agent only (its adapter when LoRA is shared)."""
        return iter(())

    def save(self, directory: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot be saved")

    def load(self, directory: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot be loaded")

    @property
    def device(self) -> "torch.device | str":
        return "cpu"

    def activate(self) -> None:
        """Make this agent's weights the ones its model's forward passes use.

        Agents that share one base model (LoRA) switch it to their own adapter; a policy
        that owns its weights has nothing to switch. ``generate`` and ``token_logprobs``
        call it themselves; learners that call ``policy.model`` directly call it first.
        """
        return None  # one set of weights: already active

    def compute_context(self) -> contextlib.AbstractContextManager:
        """Context every forward pass of this policy runs in (mixed-precision autocast for
        policies that use it; nothing by default). Learners that call ``policy.model``
        directly enter it too."""
        return contextlib.nullcontext()


def completion_seeds(seed: int | Sequence[int] | None, num_prompts: int, num_samples: int) -> list[int] | None:
    """The per-completion seeds of a ``generate`` call (None when ``seed`` is an int or None).

    Raises ValueError when a sequence does not hold exactly one seed per completion.
    """
    if seed is None or isinstance(seed, (int, numbers.Integral)):  # int too: narrows the type
        return None
    seeds = [int(s) for s in seed]
    if len(seeds) != num_prompts * num_samples:
        raise ValueError(
            f"generate got {len(seeds)} per-completion seeds for {num_prompts} prompt(s) x {num_samples} "
            f"sample(s); give one seed per completion ({num_prompts * num_samples}) or a single int"
        )
    return seeds
