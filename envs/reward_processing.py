"""Reward post-processing shared by every text environment.

An environment's task reward (the *raw* reward) can be rescaled before learners see it,
e.g. to put two environments on a common scale. The raw value always stays available in
``infos[agent]["raw_reward"]``.

``reward_processor`` accepts:

* ``None`` -- identity;
* a mapping ``{"scale": s, "shift": b}`` -- ``reward = s * raw + b``;
* a :class:`RewardProcessor`;
* any callable ``f(raw: float) -> float``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

RewardFn = Callable[[float], float]


@dataclass(frozen=True)
class RewardProcessor:
    """Affine reward transform: ``scale * raw + shift``."""

    scale: float = 1.0
    shift: float = 0.0

    def __post_init__(self) -> None:
        for name in ("scale", "shift"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"reward_processor {name} must be a finite number, got {value!r}")

    def __call__(self, raw: float) -> float:
        return float(self.scale * raw + self.shift)


def as_reward_processor(spec: None | Mapping[str, Any] | RewardFn) -> RewardFn:
    """Turn the ``reward_processor`` constructor argument into a callable."""
    if spec is None:
        return RewardProcessor()
    if isinstance(spec, RewardProcessor):
        return spec
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"scale", "shift"}
        if unknown:
            raise ValueError(f"reward_processor mapping accepts only 'scale' and 'shift', got {sorted(unknown)}")
        return RewardProcessor(**{k: float(v) for k, v in spec.items()})
    if callable(spec):
        return spec
    raise TypeError(
        "reward_processor must be None, a dict(scale=..., shift=...), a RewardProcessor or a "
        f"callable float -> float; got {type(spec).__name__}"
    )
