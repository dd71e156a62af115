"""MAGRPO (multi-agent GRPO on tree rollouts) and its baselines MAREINFORCE, MARLOO, MAReMax."""

from learners.catalog import TrainerTable
from learners.magrpo.baselines import MAREINFORCETrainer, MAReMaxTrainer, MARLOOTrainer
from learners.magrpo.magrpo_config import MAGRPOConfig
from learners.magrpo.magrpo_trainer import MAGRPOTrainer

# name -> (config class, trainer class), the shape of every learner package's table
TRAINERS: TrainerTable = {
    "magrpo": (MAGRPOConfig, MAGRPOTrainer),
    "mareinforce": (MAGRPOConfig, MAREINFORCETrainer),
    "marloo": (MAGRPOConfig, MARLOOTrainer),
    "maremax": (MAGRPOConfig, MAReMaxTrainer),
}

__all__ = [
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCETrainer",
    "MARLOOTrainer",
    "MAReMaxTrainer",
    "TRAINERS",
]
