"""Preference pairs and their on-disk records (the format CoMLRL users know).

A :class:`PreferencePair` is one comparison of two joint responses to the same task item:
every agent's prompt, the winning and the losing joint response (one completion per
agent, agent order) and the rewards that decided it. Its record (``to_record``) is a
plain JSON object with the keys

    prompts, winner_completions, loser_completions, winner_reward, loser_reward,
    candidate_reward_mean

and, for pairs made by an iterative round (target policy against a comparator),

    raw_rewards (winner's then loser's raw reward), target_raw_reward, comparator_raw_reward.

Token ids are not part of the CoMLRL record. When a pair came from our own policies'
generation we keep them under an extra key ``token_ids`` (``prompt`` / ``winner`` /
``loser``, one id list per agent), so a resumed run trains on exactly the tokens an
uninterrupted run would; readers that do not know the key ignore it.

A round of an iterative run is one file ``iteration_0001.json`` holding
``{"iteration", "num_pairs", "pairs"}``, written atomically (:func:`write_round`).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import tempfile
from dataclasses import dataclass, field
from typing import Any, Sequence

ROUND_FILE = "iteration_{:04d}.json"


@dataclass
class PreferencePair:
    """One preferred and one dispreferred joint response to the same prompts."""

    prompts: list[str]
    winner_completions: list[str]
    loser_completions: list[str]
    winner_reward: float
    loser_reward: float
    candidate_reward_mean: float
    raw_rewards: list[float] | None = None
    target_raw_reward: float | None = None
    comparator_raw_reward: float | None = None
    # per agent: prompt ids and the winner's / loser's completion ids (None: tokenise the texts);
    # centralized MADPO: one entry each, the actor's centralized prompt and whole response
    prompt_ids: list[list[int]] | None = field(default=None, repr=False)
    winner_ids: list[list[int]] | None = field(default=None, repr=False)
    loser_ids: list[list[int]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        n = len(self.prompts)
        if len(self.winner_completions) != n or len(self.loser_completions) != n:
            raise ValueError(
                f"a preference pair needs one prompt, winner and loser completion per agent; got "
                f"{n} prompts, {len(self.winner_completions)} winners, {len(self.loser_completions)} losers"
            )
        ids = (self.prompt_ids, self.winner_ids, self.loser_ids)
        if any(x is not None for x in ids):
            # one sequence per agent, or one in all: a centralized actor's whole response
            sizes = {len(x) if x is not None else -1 for x in ids}
            if len(sizes) != 1 or sizes.pop() not in (n, 1):
                raise ValueError(
                    "token ids must be given for prompt, winner and loser of every agent (or, centralized, "
                    "one sequence each), or not at all"
                )

    @property
    def num_agents(self) -> int:
        return len(self.prompts)

    @property
    def has_token_ids(self) -> bool:
        return self.prompt_ids is not None

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "prompts": list(self.prompts),
            "winner_completions": list(self.winner_completions),
            "loser_completions": list(self.loser_completions),
            "winner_reward": float(self.winner_reward),
            "loser_reward": float(self.loser_reward),
            "candidate_reward_mean": float(self.candidate_reward_mean),
        }
        if self.raw_rewards is not None or self.target_raw_reward is not None or self.comparator_raw_reward is not None:
            record["raw_rewards"] = [float(v) for v in (self.raw_rewards or [])]
            record["target_raw_reward"] = _float_or_none(self.target_raw_reward)
            record["comparator_raw_reward"] = _float_or_none(self.comparator_raw_reward)
        if self.has_token_ids:
            record["token_ids"] = {"prompt": self.prompt_ids, "winner": self.winner_ids, "loser": self.loser_ids}
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "PreferencePair":
        """Read a record (ours or CoMLRL's); missing optional keys stay None."""
        if not isinstance(record, dict):
            raise ValueError(f"a preference record must be a JSON object, got {type(record).__name__}")
        missing = [k for k in ("prompts", "winner_completions", "loser_completions") if k not in record]
        if missing:
            raise ValueError(f"preference record lacks {', '.join(missing)}")
        ids = record.get("token_ids") or {}
        raw = record.get("raw_rewards")
        return cls(
            prompts=[str(p) for p in record["prompts"]],
            winner_completions=[str(c) for c in record["winner_completions"]],
            loser_completions=[str(c) for c in record["loser_completions"]],
            winner_reward=float(record.get("winner_reward", 0.0)),
            loser_reward=float(record.get("loser_reward", 0.0)),
            candidate_reward_mean=float(record.get("candidate_reward_mean", 0.0)),
            raw_rewards=[float(v) for v in raw] if isinstance(raw, list) else None,
            target_raw_reward=_float_or_none(record.get("target_raw_reward")),
            comparator_raw_reward=_float_or_none(record.get("comparator_raw_reward")),
            prompt_ids=ids.get("prompt"),
            winner_ids=ids.get("winner"),
            loser_ids=ids.get("loser"),
        )


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def round_path(directory: str | os.PathLike, iteration: int) -> pathlib.Path:
    """``directory/iteration_0001.json`` for iteration 1 (1-based)."""
    if iteration < 1:
        raise ValueError(f"iterations are numbered from 1, got {iteration}")
    return pathlib.Path(directory) / ROUND_FILE.format(iteration)


def round_payload(iteration: int, pairs: Sequence[PreferencePair]) -> dict[str, Any]:
    return {"iteration": int(iteration), "num_pairs": len(pairs), "pairs": [p.to_record() for p in pairs]}


def write_json_atomic(path: str | os.PathLike, payload: Any) -> pathlib.Path:
    """Write JSON to a temporary sibling, fsync it, then rename it over ``path``: a reader
    sees the old file or the new one, never half of one."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, default=_reject)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _reject(value: Any) -> Any:
    raise TypeError(f"cannot write {type(value).__name__} into a preference record")


def write_round(directory: str | os.PathLike, iteration: int, pairs: Sequence[PreferencePair]) -> pathlib.Path:
    """Write one round's pairs atomically; returns the file's path."""
    for p in pairs:
        for value in (p.winner_reward, p.loser_reward, p.candidate_reward_mean):
            if not math.isfinite(value):
                raise ValueError(f"a preference pair has a non-finite reward ({value}); it cannot be stored")
    return write_json_atomic(round_path(directory, iteration), round_payload(iteration, pairs))


def read_round(path: str | os.PathLike) -> list[PreferencePair]:
    """The pairs of one round file (also accepts a bare JSON list of records)."""
    with open(path, "r", encoding="utf-8") as handle:
        payload = json.load(handle)
    records = payload.get("pairs", []) if isinstance(payload, dict) else payload
    if not isinstance(records, list):
        raise ValueError(f"{path}: 'pairs' must be a list of records")
    return [PreferencePair.from_record(r) for r in records]
