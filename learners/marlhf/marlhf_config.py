"""MARLHFConfig: preference pairs -> joint reward model -> any RL backend.

Option names follow CoMLRL's ``MARLHFConfig``. The preference options (candidates, pair
selection ...) are those of MADPO; the reward model options start with ``reward_``; the
RL backend (``rl_algorithm``) gets the policy-learning options below, and ``rl_kwargs``
passes any other option of the backend's own config (``MAGRPOConfig``, ``IACConfig`` or
``MAACConfig``) through unchanged. Differences from CoMLRL, on purpose:

* ``reward_model_device`` defaults to None (the first agent's device), not ``cuda:0``.
* ``reference_kl_coef`` (0: off; ``reference_kl_enabled=false`` turns it off too) is honoured
  by the MAGRPO family only, with the reference on ``reference_devices`` when given; with
  ``maac`` / ``iac`` a KL in force is a config error (their trainers have no reference term).
* ``num_train_epochs`` counts the backend's passes over the training tasks (default 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from comlrl_core.config.options import ConfigError, check_in, check_positive, check_range, option
from learners.common.options import check_training_loop
from learners.preference.pref_config import PreferenceConfig

MAGRPO_FAMILY = ("magrpo", "mareinforce", "marloo", "maremax")
ACTOR_CRITIC = ("maac", "iac")
RL_ALGORITHMS = MAGRPO_FAMILY + ACTOR_CRITIC


@dataclass
class MARLHFConfig(PreferenceConfig):
    uses_reference_kl: ClassVar[bool] = True  # the MAGRPO-family backends have a reference term

    # -- reward model -------------------------------------------------------------------
    reward_model_name: str | None = option(None, help="backbone model source (None: agent 0's model)")
    reward_model_device: str | None = option(None, help="device of the reward model (None: agent 0's device)")
    reward_learning_rate: float = option(1e-5, help="AdamW learning rate of the reward model")
    reward_num_train_epochs: int = option(1, help="Bradley-Terry epochs over the pairs")
    reward_train_batch_size: int = option(1, help="pairs per reward-model step")
    reward_max_length: int | None = option(
        None, help="truncate joint texts to their last this many tokens (the responses come last; None: no limit)"
    )
    reward_freeze_backbone: bool = option(False, help="train only the scalar head")
    # -- RL backend ---------------------------------------------------------------------
    rl_algorithm: str = option("magrpo", help="magrpo | mareinforce | marloo | maremax | maac | iac")
    num_generations: int = option(
        4, help="MAGRPO family: responses per agent per task; actor-critic: episodes per task"
    )
    num_train_epochs: int = option(1, help="RL passes over the training tasks")
    max_steps: int | None = option(None, help="RL: stop after this many task items (None: all epochs)")
    rollout_buffer_size: int = option(2, help="RL rollout buffer size (see the backend's config)")
    train_batch_size: int | None = option(None, help="RL mini-batch size (see the backend's config)")
    critic_type: Literal["v", "q"] = option("v", help="actor-critic: V(h) or Q(h, a)")
    critic_model: str | None = option(None, help="actor-critic: separate critic model source (None: agent 0's)")
    critic_learning_rate: float | None = option(
        None, help="actor-critic: critic learning rate (None: agent_learning_rate)"
    )
    use_separate_critic: bool = option(True, help="iac: separate critic models (False: value heads)")
    value_loss_coef: float = option(0.6, help="actor-critic: weight of the critic loss")
    value_clip_range: float | None = option(0.2, help="actor-critic: value clipping (None: off)")
    rl_kwargs: dict[str, Any] = option({}, help="any other option of the backend's config, passed unchanged")
    output_dir: str = option("runs/marlhf", help="run folder: metrics, reward model, backend run under rl/")

    def validate(self) -> None:
        super().validate()
        check_in("rl_algorithm", self.rl_algorithm, RL_ALGORITHMS)
        check_positive("reward_learning_rate", self.reward_learning_rate)
        check_positive("reward_num_train_epochs", self.reward_num_train_epochs)
        check_positive("reward_train_batch_size", self.reward_train_batch_size)
        if self.reward_max_length is not None:
            check_positive("reward_max_length", self.reward_max_length)
        check_training_loop(self)
        if self.rl_algorithm in MAGRPO_FAMILY and self.num_generations < 2:
            raise ConfigError(
                f"rl_algorithm={self.rl_algorithm!r} needs num_generations >= 2 (a group baseline), "
                f"got {self.num_generations}",
                "num_generations",
            )
        check_positive("num_generations", self.num_generations)
        if self.rl_algorithm in ACTOR_CRITIC and self.effective_reference_kl_coef > 0:
            raise ConfigError(
                f"reference_kl_coef is honoured by the MAGRPO family only; rl_algorithm="
                f"{self.rl_algorithm!r} has no reference term. Set reference_kl_coef=0",
                "reference_kl_coef",
            )
        check_positive("value_loss_coef", self.value_loss_coef)
        if self.value_clip_range is not None:
            check_positive("value_clip_range", self.value_clip_range)
        if self.critic_learning_rate is not None:
            check_positive("critic_learning_rate", self.critic_learning_rate)
        check_range("temperature", self.temperature, 0.0)
