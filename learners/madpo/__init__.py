"""MADPO: multi-agent DPO (the joint margin, each agent's gradient through its own margin)
and its iterative form with comparators and a replay buffer."""

from learners.catalog import TrainerTable
from learners.madpo.madpo_config import MADPOConfig
from learners.madpo.madpo_iter import MADPOIterConfig, MADPOIterTrainer
from learners.madpo.madpo_trainer import MADPOTrainer

TRAINERS: TrainerTable = {"madpo": (MADPOConfig, MADPOTrainer), "madpo_iter": (MADPOIterConfig, MADPOIterTrainer)}

__all__ = ["MADPOConfig", "MADPOIterConfig", "MADPOIterTrainer", "MADPOTrainer", "TRAINERS"]
