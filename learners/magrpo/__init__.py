"""MAGRPO (multi-agent GRPO on tree rollouts) and its baselines MAREINFORCE, MARLOO, MAReMax."""

from learners.magrpo.baselines import TRAINERS, MAREINFORCETrainer, MAReMaxTrainer, MARLOOTrainer
from learners.magrpo.magrpo_config import MAGRPOConfig
from learners.magrpo.magrpo_trainer import MAGRPOTrainer

__all__ = [
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCETrainer",
    "MARLOOTrainer",
    "MAReMaxTrainer",
    "TRAINERS",
]
