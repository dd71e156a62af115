"""Non-trainable policies: plain Python callables and remote models.

They implement only :meth:`Policy.generate`, so they can sit in a team for evaluation,
act as an expert or a fixed partner, or stand in for a model in tests. Their completions
carry no token ids (``token_ids == []``): there is no tokenizer, and nothing to train.

* :class:`CallablePolicy` wraps ``fn(prompt) -> str`` (called once per sample) or
  ``fn(prompt, num_samples) -> list[str]`` (one call per prompt).
* :class:`RemotePolicy` wraps a :class:`~comlrl_core.remote.client.RemoteModelClient`.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Literal, Sequence

from comlrl_core.policy import Completion, GenerationConfig, Policy
from comlrl_core.remote.client import RemoteModelClient, RemoteModelConfig
from comlrl_core.remote.types import RemoteModelError

__all__ = ["CallablePolicy", "RemotePolicy"]

logger = logging.getLogger(__name__)


def _check_request(prompts: Sequence[str], num_samples: int) -> None:
    if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
        raise TypeError("prompts must be a sequence of strings, e.g. [prompt] for a single prompt")
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
        raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}")


def _takes_num_samples(fn: Callable[..., Any]) -> bool:
    """True for ``fn(prompt, num_samples)``, False for ``fn(prompt)``, judged by the number
    of REQUIRED positional parameters; anything else asks for an explicit ``batched``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        raise TypeError(
            f"cannot read the signature of {fn!r}; pass batched=False for fn(prompt) -> str "
            f"or batched=True for fn(prompt, num_samples) -> list[str]"
        ) from None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in positional and p.default is inspect.Parameter.empty]
    has_var_args = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    if len(required) == 1 and not has_var_args:
        return False
    if len(required) == 2 and not has_var_args:
        return True
    raise TypeError(
        f"cannot tell how to call {fn!r} ({len(required)} required positional parameter(s)"
        f"{', plus *args' if has_var_args else ''}); pass batched=False for fn(prompt) -> str "
        f"or batched=True for fn(prompt, num_samples) -> list[str]"
    )


class CallablePolicy(Policy):
    """A policy backed by a Python function.

    Args:
        fn: ``fn(prompt: str) -> str``, called ``num_samples`` times per prompt, or
            ``fn(prompt: str, num_samples: int) -> list[str]`` returning exactly
            ``num_samples`` texts. Which one is detected from the number of required
            positional parameters (1 or 2); ``batched`` overrides the detection.
        name: shown in logs; defaults to the function's name.
        batched: ``True`` / ``False`` to say which signature ``fn`` has.

    ``generation_config`` and ``seed`` are not passed to ``fn`` (close over them if it needs
    them). Every completion has ``finish_reason="stop"``; errors raised by ``fn`` propagate.
    """

    trainable = False

    def __init__(self, fn: Callable[..., Any], name: str | None = None, batched: bool | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"CallablePolicy needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self.batched = _takes_num_samples(fn) if batched is None else bool(batched)
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__

    def generate(
        self,
        prompts: Sequence[str],
        num_samples: int = 1,
        generation_config: GenerationConfig | None = None,
        seed: int | Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        _check_request(prompts, num_samples)
        out = []
        for prompt in prompts:
            if self.batched:
                texts = self.fn(prompt, num_samples)
                if not isinstance(texts, (list, tuple)) or len(texts) != num_samples:
                    got = f"{len(texts)} item(s)" if isinstance(texts, (list, tuple)) else type(texts).__name__
                    raise TypeError(
                        f"{self.name}(prompt, num_samples) must return a list of {num_samples} strings, got {got}"
                    )
            else:
                texts = [self.fn(prompt) for _ in range(num_samples)]
            for text in texts:
                if not isinstance(text, str):
                    listed = isinstance(text, (list, tuple)) and not self.batched
                    hint = " (a list? pass batched=True)" if listed else ""
                    raise TypeError(f"{self.name} must return str completions, got {type(text).__name__}{hint}")
            out.append([Completion(text=t, token_ids=[], finish_reason="stop") for t in texts])
        return out

    def __repr__(self) -> str:
        return f"CallablePolicy(name={self.name!r}, batched={self.batched})"


class RemotePolicy(Policy):
    """A policy backed by a remote model.

    Args:
        client_or_config: a shared :class:`RemoteModelClient`, or a
            :class:`RemoteModelConfig` to build one that this policy owns (and closes).
        name: shown in logs; defaults to the model name.
        forward_sampling: send ``generation_config``'s ``max_new_tokens``, ``temperature``
            and ``top_p`` with each call (when a config is given). Turn it off for APIs that
            refuse sampling settings (some reasoning models); the client config then applies.
        on_error: ``"raise"`` (default) lets a :class:`RemoteModelError` propagate, so an
            outage is never mistaken for bad answers. ``"error_completion"`` degrades: each
            prompt whose request failed gets ``num_samples`` empty completions with
            ``finish_reason="error"`` (logged as a warning), and the other prompts still
            get their answers.

    Completions have ``finish_reason`` ``"stop"``, or ``"length"`` when the server reports
    that ``max_new_tokens`` cut the text. ``top_k`` and ``seed`` are not forwarded: the
    APIs do not share them, and remote sampling is not reproducible by seed anyway.
    """

    trainable = False

    def __init__(
        self,
        client_or_config: RemoteModelClient | RemoteModelConfig,
        *,
        name: str | None = None,
        forward_sampling: bool = True,
        on_error: Literal["raise", "error_completion"] = "raise",
    ) -> None:
        if on_error not in ("raise", "error_completion"):
            raise ValueError(f"on_error must be 'raise' or 'error_completion', got {on_error!r}")
        if isinstance(client_or_config, RemoteModelConfig):
            self.client, self._owns_client = RemoteModelClient(client_or_config), True
        elif isinstance(client_or_config, RemoteModelClient):
            self.client, self._owns_client = client_or_config, False
        else:
            raise TypeError(
                f"RemotePolicy needs a RemoteModelClient or RemoteModelConfig, got {type(client_or_config).__name__}"
            )
        self.on_error = on_error
        self.forward_sampling = forward_sampling
        self.name = name or self.client.config.model

    def generate(
        self,
        prompts: Sequence[str],
        num_samples: int = 1,
        generation_config: GenerationConfig | None = None,
        seed: int | Sequence[int] | None = None,
        *,
        agent_index: int | None = None,
        task_items: Sequence[Any] | None = None,
    ) -> list[list[Completion]]:
        """``agent_index`` and ``task_items`` (one per prompt) say what the prompts are for;
        the client sends them to ``generic`` endpoints (CoMLRL's ``agent_idx`` / ``batch_item``)."""
        _check_request(prompts, num_samples)
        overrides: dict[str, Any] = {}
        if generation_config is not None and self.forward_sampling:
            overrides = {
                "max_tokens": generation_config.max_new_tokens,
                "temperature": generation_config.temperature,
                "top_p": generation_config.top_p,
            }
        rows = self.client.complete_batch_detailed(
            list(prompts),
            num_samples,
            return_exceptions=self.on_error != "raise",
            agent_index=agent_index,
            task_items=task_items,
            **overrides,
        )
        out = []
        for prompt_index, row in enumerate(rows):
            if isinstance(row, RemoteModelError):  # only with on_error="error_completion"
                logger.warning("%s: prompt %d failed, returning error completions: %s", self.name, prompt_index, row)
                out.append([Completion(text="", token_ids=[], finish_reason="error") for _ in range(num_samples)])
            else:
                out.append([Completion(text=c.text, token_ids=[], finish_reason=c.finish_reason) for c in row])
        return out

    def close(self) -> None:
        """Close the client if this policy built it (a shared client stays open)."""
        if self._owns_client:
            self.client.close()

    def __repr__(self) -> str:
        return f"RemotePolicy(name={self.name!r}, client={self.client!r}, on_error={self.on_error!r})"
