"""Stop strings seen while sampling, so a row stops as soon as it writes one.

:func:`comlrl_core.models.completion_post.cut_at_stop` cuts a finished completion at its
first stop string; without this watch the sampler would still run every row to EOS or
``max_new_tokens``, paying for tokens that are then thrown away. A :class:`StopWatch`
decodes only the newest tokens of the rows still running (a window long enough to hold
any stop string plus a token either side), every ``every`` steps, and reports which rows
now hold a stop string. Rows it stops keep their tokens up to the step where the watch saw
the string; the cut afterwards is the same as without the watch, because a completion is
cut at its FIRST stop string and the watch only ever stops a row after that point.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

__all__ = ["StopWatch"]


class StopWatch:
    """``watch(tokens, running) -> newly stopped rows`` (a bool tensor over the rows).

    ``tokens`` is the list of per-step token tensors sampled so far (each ``[rows]``);
    ``running`` marks the rows still sampling. Each call looks at the tokens of the last
    ``every`` steps plus a window before them, decoded with ``tokenizer``.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str], every: int = 4) -> None:
        self.stops = [s for s in stops if s]
        if not self.stops:
            raise ValueError("StopWatch needs at least one non-empty stop string")
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.tokenizer = tokenizer
        self.every = every
        # a token decodes to at least one character, so a stop string of n characters spans
        # at most n tokens; one more on the left covers a string that starts mid-token
        self.window = max(len(s) for s in self.stops) + 1

    def due(self, step: int) -> bool:
        """Whether to look after sampling step ``step`` (0-based)."""
        return (step + 1) % self.every == 0

    def watch(self, tokens: Sequence[torch.Tensor], running: torch.Tensor) -> torch.Tensor:
        stopped = torch.zeros_like(running, dtype=torch.bool)
        if not tokens:
            return stopped
        span = min(len(tokens), self.window + self.every)
        recent = torch.stack(list(tokens[-span:]), dim=1).tolist()  # [rows, span]
        for row in torch.nonzero(running).flatten().tolist():
            text = self.tokenizer.decode(recent[row], skip_special_tokens=True)
            if any(s in text for s in self.stops):
                stopped[row] = True
        return stopped
