"""Actor-critic learners: IAC (independent critics or value heads) and MAAC (one
centralized critic). Option names follow CoMLRL's IACConfig / MAACConfig."""

from learners.actor_critic.ac_config import ActorCriticConfig, IACConfig, MAACConfig
from learners.actor_critic.critics import Critic, ModelCritic, ValueHead, ValueHeadCritic
from learners.actor_critic.iac_trainer import IACTrainer
from learners.actor_critic.maac_trainer import MAACTrainer
from learners.catalog import TrainerTable

TRAINERS: TrainerTable = {"iac": (IACConfig, IACTrainer), "maac": (MAACConfig, MAACTrainer)}

__all__ = [
    "ActorCriticConfig",
    "Critic",
    "IACConfig",
    "IACTrainer",
    "MAACConfig",
    "MAACTrainer",
    "ModelCritic",
    "TRAINERS",
    "ValueHead",
    "ValueHeadCritic",
]
