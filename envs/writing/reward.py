"""The Writing-v0 team reward: cheap, deterministic text statistics.

A *summarizer* writes a short summary ``S`` of a passage ``P``; an *expander* writes a
detailed expansion ``E``. The raw team reward is the sum of three levels, each in
``[0, 1]``, so it lies in ``[0, 3]``:

``length`` -- coordinated lengths (characters of the stripped texts)
    ``0.5 * closeness(|S|, T_s) + 0.5 * closeness(|E|, R * max(|S|, T_s / 2))`` with the
    summary target ``T_s = summary_fraction * |P|`` and the expansion ratio ``R``. The
    expansion's target follows the summary actually written (that is the coordination);
    the floor ``T_s / 2`` stops an empty summary from making a tiny expansion "right".

``overlap`` -- grounding and agreement
    mean of: the fraction of S's uncommon words (not in a list of common English words)
    that occur in the passage; the same fraction for E; and the fraction of S's content
    words (uncommon, >= 4 letters, in the passage) that reappear in E. A text with no
    uncommon word grounds nothing (0).

``diversity`` -- vocabulary diversity of known words
    mean over S and E of ``distinct grounded words / max(words, 8)``, where grounded words
    are the passage's words and the common words; the expansion's term is multiplied by
    ``1 - copied``, the fraction of its word 4-grams found verbatim in the passage (an
    expansion should add something). Repetition ("the the the"), very short texts,
    gibberish and copying all score low.

``closeness(x, target) = 1 / (1 + (log2((x + 1) / (target + 1)) / width) ** 2)`` is 1 on
target, 1/2 at a factor ``2 ** width`` off either way, and never exactly 0: every change
of length in the right direction raises the reward (no cliff), which is what lets a tiny
model learn it quickly.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")

COMMON_WORDS = frozenset(
    """
    a about above after again all also an and any are around as at be because been before
    being below between both but by can could did do does doing down during each even every
    few first for from further had has have having he her here hers him his how however i if
    in into is it its itself just later like made make many may more most much must my new
    no nor not now of off often on once one only or other our out over own people same she
    should since so some still such than that the their them then there these they this
    those through to too two under until up upon us very was way we well were what when
    where which while who whom why will with within without would year years you your
    example instance particular especially including important main known used using well
    result therefore thus while although another several part place time long small large
    local first second third began became become began later early today recent number
    """.split()
)
_MIN_WORDS_FOR_DIVERSITY = 8


def words(text: str) -> list[str]:
    """Lower-case alphabetic words (apostrophes inside words kept)."""
    return _WORD.findall(text.lower())


def closeness(value: float, target: float, width: float = 1.0) -> float:
    """Smooth score in (0, 1]: 1 at ``target``, 1/2 at a factor ``2**width`` away."""
    deviation = math.log2((max(value, 0.0) + 1.0) / (max(target, 0.0) + 1.0)) / width
    return 1.0 / (1.0 + deviation * deviation)


def _grounding(tokens: list[str], passage_vocabulary: frozenset[str]) -> float:
    # common words are neutral: they neither help nor hurt ("the the the" grounds nothing)
    uncommon = [w for w in tokens if w not in COMMON_WORDS]
    if not uncommon:
        return 0.0
    return sum(1 for w in uncommon if w in passage_vocabulary) / len(uncommon)


def _diversity(tokens: list[str], known: set[str] | frozenset[str]) -> float:
    distinct_known = {w for w in tokens if w in known}
    return len(distinct_known) / max(len(tokens), _MIN_WORDS_FOR_DIVERSITY)


def _copied_fraction(tokens: list[str], source: list[str], n: int = 4) -> float:
    """Fraction of the word n-grams of ``tokens`` that occur verbatim in ``source``."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return 0.0
    source_grams = {tuple(source[i : i + n]) for i in range(len(source) - n + 1)}
    return sum(1 for g in grams if g in source_grams) / len(grams)


def _content(tokens: list[str]) -> set[str]:
    return {w for w in tokens if len(w) >= 4 and w not in COMMON_WORDS}


@dataclass(frozen=True)
class WritingRewardConfig:
    """Targets of the Writing-v0 reward (see the module docstring)."""

    summary_fraction: float = 0.3
    expansion_ratio: float = 3.0
    width: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.summary_fraction <= 10:
            raise ValueError(f"summary_fraction must be in (0, 10], got {self.summary_fraction}")
        if not 0 < self.expansion_ratio <= 100:
            raise ValueError(f"expansion_ratio must be in (0, 100], got {self.expansion_ratio}")
        if not self.width > 0:
            raise ValueError(f"width (log2 tolerance of the length targets) must be > 0, got {self.width}")

    def summary_target(self, passage: str) -> int:
        return max(1, round(self.summary_fraction * len(passage.strip())))


MAX_REWARD = 3.0


def score_writing(
    passage: str, summary: str, expansion: str, config: WritingRewardConfig
) -> tuple[float, dict[str, Any]]:
    """Raw team reward in ``[0, 3]`` and its details (levels and the statistics behind them)."""
    s_text, e_text = summary.strip(), expansion.strip()
    s_chars, e_chars = len(s_text), len(e_text)
    target_s = config.summary_target(passage)
    target_e = round(config.expansion_ratio * max(s_chars, target_s / 2))
    length = 0.5 * closeness(s_chars, target_s, config.width) + 0.5 * closeness(e_chars, target_e, config.width)

    p_words, s_words, e_words = words(passage), words(s_text), words(e_text)
    passage_vocabulary = frozenset(p_words)
    grounded = passage_vocabulary | COMMON_WORDS
    s_grounding = _grounding(s_words, passage_vocabulary)
    e_grounding = _grounding(e_words, passage_vocabulary)
    s_content = _content(s_words) & grounded
    agreement = len(s_content & set(e_words)) / len(s_content) if s_content else 0.0
    overlap = (s_grounding + e_grounding + agreement) / 3.0

    s_diversity = _diversity(s_words, grounded)
    copied = _copied_fraction(e_words, p_words)
    e_diversity = _diversity(e_words, grounded) * (1.0 - copied)  # an expansion says something new
    diversity = (s_diversity + e_diversity) / 2.0

    levels = {"length": length, "overlap": overlap, "diversity": diversity}
    reward = sum(levels.values())
    details = {
        "levels": {k: round(v, 6) for k, v in levels.items()},
        "stats": {
            "summary_chars": s_chars,
            "expansion_chars": e_chars,
            "summary_target_chars": target_s,
            "expansion_target_chars": target_e,
            "summary_words": len(s_words),
            "expansion_words": len(e_words),
            "summary_grounding": round(s_grounding, 6),
            "expansion_grounding": round(e_grounding, 6),
            "agreement": round(agreement, 6),
            "summary_diversity": round(s_diversity, 6),
            "expansion_diversity": round(e_diversity, 6),
            "expansion_copied": round(copied, 6),
        },
    }
    return float(min(MAX_REWARD, max(0.0, reward))), details
