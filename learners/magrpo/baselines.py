"""MAGRPO's baselines: the same tree rollout and loss, another group baseline.

* :class:`MAREINFORCETrainer` -- ``raw``: the return itself, no baseline.
* :class:`MARLOOTrainer` -- ``rloo``: leave-one-out mean of the other G-1 returns.
* :class:`MAReMaxTrainer` -- ``max``: the group's maximum return.

Normalisation by the group std (``normalize_advantage``) is off by default, so the four
trainers really differ; see :mod:`learners.magrpo.advantages` for when they coincide.
"""

from __future__ import annotations

from learners.magrpo.magrpo_trainer import MAGRPOTrainer


class MAREINFORCETrainer(MAGRPOTrainer):
    algorithm_name = "MAREINFORCE"
    default_advantage_mode = "raw"


class MARLOOTrainer(MAGRPOTrainer):
    algorithm_name = "MARLOO"
    default_advantage_mode = "rloo"


class MAReMaxTrainer(MAGRPOTrainer):
    algorithm_name = "MAReMax"
    default_advantage_mode = "max"
