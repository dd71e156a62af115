"""Post-processing of generated completions: stop strings, and the counts trainers log.

Public API::

    cut_at_stop(tokenizer, ids, stops) -> (text, ids) | None
        Cut a completion at the first stop string: the text before it, the token ids up
        to (and including) the token that completed it. None: no stop string occurs.
    CompletionStats: count / tokens / clipped of the completions a policy generated;
        .record(completion), .add(other), .take() (the counts so far; starts again at zero)

The sampling loop itself does not know stop strings (it stops on EOS or max_new_tokens);
a completion is cut afterwards, so a stop string costs the tokens sampled after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from comlrl_core.policy import Completion

__all__ = ["CompletionStats", "cut_at_stop"]


@dataclass
class CompletionStats:
    """Counts of generated completions (what trainers log as ``completions/...``)."""

    count: int = 0
    tokens: int = 0
    clipped: int = 0  # stopped by max_new_tokens (finish_reason "length")

    def record(self, completion: Completion) -> None:
        self.count += 1
        self.tokens += len(completion.token_ids)
        self.clipped += completion.finish_reason == "length"

    def add(self, other: "CompletionStats") -> None:
        self.count += other.count
        self.tokens += other.tokens
        self.clipped += other.clipped

    def take(self) -> "CompletionStats":
        """The counts so far; the counter starts again from zero."""
        taken = CompletionStats(self.count, self.tokens, self.clipped)
        self.count = self.tokens = self.clipped = 0
        return taken


def _first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Index in ``text`` where the earliest stop string starts (None: none occurs)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def cut_at_stop(tokenizer: Any, ids: list[int], stops: Sequence[str]) -> tuple[str, list[int]] | None:
    """``(text before the first stop string, token ids up to the one that completed it)``,
    or None when the decoded ids hold no stop string."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    start = _first_stop(text, stops)
    if start is None:
        return None
    # the shortest prefix whose text holds a stop string (monotone in the prefix length)
    low, high = 1, len(ids)
    while low < high:
        mid = (low + high) // 2
        if _first_stop(tokenizer.decode(ids[:mid], skip_special_tokens=True), stops) is None:
            low = mid + 1
        else:
            high = mid
    return text[:start], ids[:low]
