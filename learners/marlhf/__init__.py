"""MARLHF: preference pairs -> JointRewardModel (Bradley-Terry) -> any RL backend
(MAGRPO family or actor-critic), and its iterative form."""

from learners.catalog import TrainerTable
from learners.marlhf.marlhf_config import MARLHFConfig
from learners.marlhf.marlhf_iter import MARLHFIterConfig, MARLHFIterTrainer
from learners.marlhf.marlhf_trainer import MARLHFTrainer
from learners.marlhf.reward_env import RewardModelEnv, RewardModelOracle, RewardSwitch, reward_model_env_factory
from learners.marlhf.reward_model import JointRewardModel, bradley_terry_loss, joint_text

TRAINERS: TrainerTable = {"marlhf": (MARLHFConfig, MARLHFTrainer), "marlhf_iter": (MARLHFIterConfig, MARLHFIterTrainer)}

__all__ = [
    "JointRewardModel",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "MARLHFIterTrainer",
    "MARLHFTrainer",
    "RewardModelEnv",
    "RewardModelOracle",
    "RewardSwitch",
    "TRAINERS",
    "bradley_terry_loss",
    "joint_text",
    "reward_model_env_factory",
]
