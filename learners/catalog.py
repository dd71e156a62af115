"""Every algorithm the learners train, and the package that trains it.

Each learner package exports ``TRAINERS``: algorithm name -> ``(config class, trainer
class)``. :func:`learner_classes` looks a name up in its package's table, importing only
that package, so the command line and MARLHF's RL backends resolve names the same way.
"""

from __future__ import annotations

import importlib

from comlrl_core.config.options import BaseConfig

# The one shape of every learner package's ``TRAINERS`` table. Annotating a table with it
# makes the type check reject an entry of another shape (e.g. a bare trainer class).
TrainerTable = dict[str, tuple[type[BaseConfig], type]]

# name -> (package whose TRAINERS holds it, one-line description)
ALGORITHMS: dict[str, tuple[str, str]] = {
    "magrpo": ("learners.magrpo", "MAGRPO: group-relative advantages on tree rollouts"),
    "mareinforce": ("learners.magrpo", "MAREINFORCE: MAGRPO's tree with no baseline"),
    "marloo": ("learners.magrpo", "MARLOO: leave-one-out baseline"),
    "maremax": ("learners.magrpo", "MAReMax: the group maximum as baseline"),
    "iac": ("learners.actor_critic", "IAC: independent critics (separate models or value heads)"),
    "maac": ("learners.actor_critic", "MAAC: one centralized critic on the joint history"),
    "madpo": ("learners.madpo", "MADPO: multi-agent DPO on pairs collected from task items"),
    "madpo_iter": ("learners.madpo", "iterative MADPO: comparator rounds and a preference replay buffer"),
    "marlhf": ("learners.marlhf", "MARLHF: joint reward model (Bradley-Terry), then an RL backend (rl_algorithm)"),
    "marlhf_iter": ("learners.marlhf", "iterative MARLHF: comparator rounds, a fresh reward model every round"),
}


def learner_classes(algorithm: str) -> tuple[type[BaseConfig], type]:
    """``(config class, trainer class)`` of an algorithm name (imports only its package)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose from {', '.join(ALGORITHMS)}")
    package = importlib.import_module(ALGORITHMS[algorithm][0])
    config_cls, trainer_cls = package.TRAINERS[algorithm]
    return config_cls, trainer_cls
