"""MAGRPOConfig: every option of MAGRPO and its baselines (MAREINFORCE, MARLOO, MAReMax).

Option names follow CoMLRL's vocabulary. Differences from CoMLRL, on purpose:

* ``discount`` defaults to 1.0 and is always honoured.
* ``early_termination_threshold`` (CoMLRL: ``termination_threshold``) is handed to the
  environment, which ends a branch when that joint action's reward reaches it.
* In ``cross`` mode a response's credit is the *mean* return of the joint actions that
  contain it (CoMLRL sums them).
* The loss counts every real completion token, EOS included, and never a pad.

Buffering as in CoMLRL: each tree node yields one group per agent (its G responses and
their returns). Groups go into that agent's rollout buffer; when the buffer holds
``rollout_buffer_size`` groups it is split by turn, shuffled, and consumed in
mini-batches of ``train_batch_size`` groups, one optimizer step per mini-batch. The
buffer is also flushed at the end of every epoch and of training.

``tasks_per_step`` (default 1, CoMLRL's one item per step) builds the rollout trees of that
many consecutive task items together: every level of every tree shares the same sampling
calls and sandbox batch, which is what makes small-batch CPU decoding pay. All of a step's
trees are sampled from the same weights; their groups then enter the buffers in item order
(with 1, a buffer can update between items). ``max_steps`` still counts task items.

``external_prompt_passthrough`` is a learner option as in CoMLRL (handed to the env through
``env_kwargs``; the env's own ``env_kwargs`` entry still works, and the two disagreeing is an
error). A CoMLRL ``external:`` section in a YAML config (``external: {mode: level_feedback}``)
is read into ``env_kwargs`` (``mode`` -> ``external_transition``); see
:mod:`learners.common.external_options`.

The team options (``agent_models``, ``lora`` ...) are read by the CLI to build the
Team; the trainer itself receives a ready Team.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence, TypeVar

from comlrl_core.config.options import ConfigError, check_in, check_positive, check_range, option, parse_overrides
from learners.common.external_options import PASSTHROUGH, check_prompt_passthrough, fold_external_section
from learners.common.options import GenerationOptions, OptimizerOptions, RunOptions, TeamOptions, check_training_loop

ADVANTAGE_MODES = ("mean", "raw", "rloo", "max")
C = TypeVar("C", bound="MAGRPOConfig")


@dataclass
class MAGRPOConfig(TeamOptions, GenerationOptions, RunOptions, OptimizerOptions):
    # -- tree rollout ---------------------------------------------------------------
    num_generations: int = option(4, help="responses sampled per agent at every tree node (G)")
    num_turns: int = option(2, help="turns per episode (tree depth T)")
    joint_mode: Literal["aligned", "cross"] = option(
        "aligned", help="aligned: G joint actions per node (same index); cross: G**N (Cartesian product)"
    )
    early_termination_threshold: float | None = option(
        None, help="a branch ends when its joint action's reward reaches this (None: never)"
    )
    discount: float = option(1.0, help="return = r_t + discount * mean(child returns)")
    external_prompt_passthrough: bool | None = option(
        None, help="next-turn prompts skip the formatters (handed to the env; None: env_kwargs' value or the env's)"
    )
    # -- advantages and loss --------------------------------------------------------
    advantage_mode: Literal["mean", "raw", "rloo", "max"] | None = option(
        None, help="group baseline; None = the trainer's own (MAGRPO mean, MAREINFORCE raw, MARLOO rloo, MAReMax max)"
    )
    normalize_advantage: bool = option(False, help="divide advantages by the group return std")
    reference_kl_coef: float = option(0.0, help="k3 KL to a frozen reference, subtracted from the reward (0: off)")
    skip_nonfinite: bool = option(False, help="skip (and count) NaN/Inf updates instead of raising")
    # -- optimisation ---------------------------------------------------------------
    rollout_buffer_size: int = option(2, help="node groups an agent buffers before updating")
    train_batch_size: int | None = option(None, help="node groups per optimizer step (None: rollout_buffer_size)")
    num_train_epochs: int = option(1, help="passes over the training tasks")
    max_steps: int | None = option(None, help="stop after this many task items (None: all epochs)")
    tasks_per_step: int = option(
        1,
        help="task items whose rollout trees are built together in one step (shared sampling calls and "
        "sandbox batches; buffers fill from all of them, then update)",
    )
    shuffle_tasks: bool = option(False, help="visit the training tasks in a seeded random order per epoch")
    # -- logging, checkpoints (evaluation, sampling, environment, team: learners.common.options)
    save_steps: int = option(0, help="checkpoint every this many steps (0: only at the end)")
    save_final_checkpoint: bool = option(True, help="checkpoint when training finishes")
    output_dir: str = option("runs/magrpo", help="run folder: metrics.jsonl, checkpoints, plots")
    seed: int = option(42, help="seed of every random draw (generation, shuffles, task order)")

    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
        """As the base's, reading a CoMLRL ``external:`` section into ``env_kwargs``."""
        return super().from_dict(fold_external_section(data, (PASSTHROUGH,)))

    def with_overrides(self: C, overrides: Sequence[str]) -> C:
        """As the base's; an override of ``external_prompt_passthrough`` also replaces the
        value this config handed to ``env_kwargs`` (so overriding it is no conflict)."""
        names = {path[0] for path, _ in parse_overrides(overrides)}
        if PASSTHROUGH in names and self.env_kwargs.get(PASSTHROUGH) == self.external_prompt_passthrough:
            handed_on = copy.copy(self)
            handed_on.env_kwargs = {k: v for k, v in self.env_kwargs.items() if k != PASSTHROUGH}
            return super(MAGRPOConfig, handed_on).with_overrides(overrides)
        return super().with_overrides(overrides)

    @property
    def groups_per_update(self) -> int:
        """``train_batch_size``, defaulting to ``rollout_buffer_size`` (kept unresolved so
        that overriding ``rollout_buffer_size`` later still moves it)."""
        return self.train_batch_size or self.rollout_buffer_size

    def validate(self) -> None:
        super().validate()
        if self.num_generations < 2:
            raise ConfigError(
                f"option 'num_generations' must be >= 2 (a group baseline needs several samples), "
                f"got {self.num_generations}; set num_generations=4 for example",
                "num_generations",
            )
        check_positive("num_turns", self.num_turns)
        check_positive("tasks_per_step", self.tasks_per_step)
        check_range("discount", self.discount, 0.0, 1.0)
        if self.advantage_mode is not None:
            check_in("advantage_mode", self.advantage_mode, ADVANTAGE_MODES)
        check_positive("reference_kl_coef", self.reference_kl_coef, allow_zero=True)
        check_training_loop(self)
        check_positive("save_steps", self.save_steps, allow_zero=True)
        check_prompt_passthrough(self.external_prompt_passthrough, self.env_kwargs)
        if self.external_prompt_passthrough and PASSTHROUGH not in self.env_kwargs:
            # the trainer builds its env from env_kwargs; False is every env's default, so only
            # True is handed on (an env without the argument keeps working)
            self.env_kwargs = {**self.env_kwargs, PASSTHROUGH: True}
