"""IACConfig and MAACConfig: the options of the actor-critic learners.

Option names follow CoMLRL's ``IACConfig`` / ``MAACConfig``. Differences, on purpose:

* ``rollout_buffer_size`` counts whole episodes (CoMLRL: per-agent turn samples). After
  each task item, if the buffer holds at least that many episodes, all of them are used
  for one update round; the rest is flushed at the end of every epoch. The policy never
  changes between the turns of one episode.
* ``train_batch_size`` counts samples (one per agent per turn, per episode) per optimizer
  step within an update round, as in CoMLRL; None = all samples of a turn at once.
* ``value_clip_range`` applies to every critic kind (CoMLRL: only to a value head on the
  actor) and exists for MAAC too (default None there, as CoMLRL has no clipping).
* Every separate critic gets its own optimizer (CoMLRL's IAC builds only one).
* A Q critic's advantage is ``Q(h, a)`` minus the mean Q of its batch and turn (see
  :mod:`learners.actor_critic.targets`).
* ``early_termination_threshold`` defaults to None (never), not -0.2.

``external_prompt_passthrough`` may also come through ``env_kwargs`` (it is then read into
the option; the two disagreeing is an error), and a CoMLRL ``external:`` section in a YAML
config is read into ``env_kwargs`` (see :mod:`learners.common.external_options`).

The team options (``agent_models``, ``lora`` ...) are read by the CLI to build the Team;
the trainers receive a ready Team.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, TypeVar

from comlrl_core.config.options import ConfigError, check_in, check_positive, check_range, option
from learners.actor_critic.targets import CRITIC_TYPES
from learners.common.external_options import PASSTHROUGH, check_prompt_passthrough, fold_external_section
from learners.common.options import GenerationOptions, OptimizerOptions, RunOptions, TeamOptions, check_training_loop

AC = TypeVar("AC", bound="ActorCriticConfig")


@dataclass
class ActorCriticConfig(TeamOptions, GenerationOptions, RunOptions, OptimizerOptions):
    """Options shared by IAC and MAAC (use :class:`IACConfig` or :class:`MAACConfig`)."""

    # -- episodes ---------------------------------------------------------------------
    num_turns: int = option(2, help="turns per episode (one sample per agent per turn)")
    num_generations: int = option(1, help="episodes sampled per task item; must be 1 when num_turns > 1")
    discount: float = option(0.9, help="TD target r_t + discount * V(h_{t+1})")
    early_termination_threshold: float | None = option(
        None, help="the env ends an episode when the team reward reaches this (None: never)"
    )
    external_prompt_passthrough: bool | None = option(
        None, help="handed to the env: next-turn prompts skip the formatters (None: env_kwargs' value, else off)"
    )
    # -- critic -----------------------------------------------------------------------
    critic_type: Literal["v", "q"] = option("v", help="'v': V(h) on the history; 'q': Q(h, a) on history + action")
    critic_model: str | None = option(None, help="model source of a separate critic (None: agent 0's model)")
    critic_value_head_hidden_dim: int | None = option(
        None, help="hidden width of a separate critic's value head MLP (None: one linear layer)"
    )
    value_loss_coef: float = option(0.6, help="weight of the critic's squared error")
    value_clip_range: float | None = option(0.2, help="clip value moves to +-this around the old value (None: off)")
    advantage_normalization: bool = option(True, help="normalise advantages per agent and turn in each update")
    # -- optimisation -----------------------------------------------------------------
    agent_learning_rate: float = option(5e-6, help="AdamW learning rate of the actors")
    critic_learning_rate: float | None = option(
        5e-6, help="AdamW learning rate of critics / value heads (None: agent_learning_rate)"
    )
    max_grad_norm: float | None = option(None, help="clip each optimizer's gradient norm (None: off)")
    rollout_buffer_size: int = option(8, help="episodes collected before an update round")
    train_batch_size: int | None = option(None, help="samples per optimizer step (None: a whole turn group)")
    logprob_micro_batch_size: int = option(16, help="sequences per forward pass (bounds memory)")
    num_train_epochs: int = option(1, help="passes over the training tasks")
    max_steps: int | None = option(None, help="stop after this many task items (None: all epochs)")
    shuffle_tasks: bool = option(False, help="visit tasks in a seeded random order per epoch")
    # -- sampling, logging, checkpoints (the rest: learners.common.options) -------------
    top_k: int | None = option(None, help="top-k filter (None or 0: off)")
    save_steps: int = option(0, help="checkpoint every this many steps (0: only at the end)")
    output_dir: str = option("runs/actor_critic", help="run folder: metrics.jsonl, checkpoints, plots")
    # -- team (read by the CLI; the other team options: learners.common.options) ------
    lora: bool = option(False, help="train one LoRA adapter per agent (and critic) instead of full weights")
    device: str | None = option(None, help="device of every agent and critic (None: CUDA when present)")

    @classmethod
    def from_dict(cls: type[AC], data: Mapping[str, Any]) -> AC:
        """As the base's, reading a CoMLRL ``external:`` section into ``env_kwargs``."""
        return super().from_dict(fold_external_section(data, (PASSTHROUGH,)))

    @property
    def resolved_critic_learning_rate(self) -> float:
        return self.agent_learning_rate if self.critic_learning_rate is None else self.critic_learning_rate

    def validate(self) -> None:
        super().validate()
        check_positive("num_turns", self.num_turns)
        check_positive("num_generations", self.num_generations)
        if self.num_turns > 1 and self.num_generations != 1:
            raise ConfigError(
                f"option 'num_generations' must be 1 when num_turns > 1 (multi-turn actor-critic "
                f"samples one response per agent per turn); got num_generations={self.num_generations} "
                f"with num_turns={self.num_turns}. Set num_generations=1, or num_turns=1",
                "num_generations",
            )
        check_range("discount", self.discount, 0.0, 1.0)
        check_in("critic_type", self.critic_type, CRITIC_TYPES)
        if self.critic_type == "q" and self.rollout_buffer_size * self.num_generations < 2:
            raise ConfigError(
                "critic_type='q' compares Q values within an update, which needs at least two "
                "episodes per update; set rollout_buffer_size >= 2 (or num_generations >= 2)",
                "rollout_buffer_size",
            )
        if self.critic_value_head_hidden_dim is not None:
            check_positive("critic_value_head_hidden_dim", self.critic_value_head_hidden_dim)
        check_positive("value_loss_coef", self.value_loss_coef, allow_zero=True)
        if self.value_clip_range is not None:
            check_positive("value_clip_range", self.value_clip_range)
        if self.critic_learning_rate is not None:
            check_positive("critic_learning_rate", self.critic_learning_rate)
        check_training_loop(self)
        check_positive("save_steps", self.save_steps, allow_zero=True)
        check_prompt_passthrough(self.external_prompt_passthrough, self.env_kwargs)
        if PASSTHROUGH in self.env_kwargs:  # one place: the trainer hands the option to the env
            self.external_prompt_passthrough = bool(self.env_kwargs[PASSTHROUGH])
            self.env_kwargs = {k: v for k, v in self.env_kwargs.items() if k != PASSTHROUGH}


@dataclass
class IACConfig(ActorCriticConfig):
    """Independent actor-critic: each agent has its own critic on its own history.

    ``use_separate_critic=True``: a separate critic model per agent (``critic_model``);
    False: a value head on the agent's own model, trained with the actor's loss
    (``actor + value_loss_coef * critic``) through the shared trunk, the head at
    ``critic_learning_rate``.
    """

    use_separate_critic: bool = option(
        True, help="a separate critic model per agent (False: a value head on the actor)"
    )
    value_head_hidden_dim: int | None = option(
        None, help="hidden width of the value head on the actor (None: one linear layer)"
    )
    output_dir: str = option("runs/iac", help="run folder: metrics.jsonl, checkpoints, plots")

    def validate(self) -> None:
        super().validate()
        if self.value_head_hidden_dim is not None:
            check_positive("value_head_hidden_dim", self.value_head_hidden_dim)


@dataclass
class MAACConfig(ActorCriticConfig):
    """Multi-agent actor-critic: one centralized critic on the joint history (``env.state()``,
    or every agent's prompt joined when the env has no ``state``), shared by all agents."""

    discount: float = option(1.0, help="TD target r_t + discount * V(h_{t+1})")
    value_clip_range: float | None = option(None, help="clip value moves to +-this around the old value (None: off)")
    output_dir: str = option("runs/maac", help="run folder: metrics.jsonl, checkpoints, plots")
