"""Option groups shared by the learner configs (MAGRPO, actor-critic, preference).

Each group is a :class:`~comlrl_core.config.options.BaseConfig` dataclass with its own
``validate()`` (which calls ``super().validate()``), so a learner config is built by
inheriting the groups it reads::

    @dataclass
    class MAGRPOConfig(TeamOptions, GenerationOptions, RunOptions, OptimizerOptions):
        ...

A learner whose option has a different default or help text redefines that field in its
own class (a redefined dataclass field keeps its type, takes the new default and help).
``output_dir`` has no shared default: every learner names its own run folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from comlrl_core.config.options import BaseConfig, ConfigError, check_positive, check_range, option

__all__ = ["GenerationOptions", "OptimizerOptions", "RunOptions", "TeamOptions", "check_training_loop"]


@dataclass
class OptimizerOptions(BaseConfig):
    """AdamW settings of the agents and the log-prob micro-batch size."""

    agent_learning_rate: float = option(5e-6, help="AdamW learning rate of every agent")
    weight_decay: float = option(0.0, help="AdamW weight decay")
    max_grad_norm: float | None = option(None, help="clip each agent's gradient norm (None: no clipping)")
    logprob_micro_batch_size: int = option(16, help="sequences per log-prob forward pass (bounds memory)")

    def validate(self) -> None:
        super().validate()
        check_positive("agent_learning_rate", self.agent_learning_rate)
        check_positive("weight_decay", self.weight_decay, allow_zero=True)
        if self.max_grad_norm is not None:
            check_positive("max_grad_norm", self.max_grad_norm)
        check_positive("logprob_micro_batch_size", self.logprob_micro_batch_size)


@dataclass
class GenerationOptions(BaseConfig):
    """How every agent samples its responses during training."""

    max_new_tokens: int = option(256, help="new tokens per response")
    temperature: float = option(0.6, help="sampling temperature (0 = greedy)")
    top_p: float = option(0.6, help="nucleus sampling mass")
    top_k: int | None = option(50, help="top-k filter (None or 0: off)")

    def validate(self) -> None:
        super().validate()
        check_positive("max_new_tokens", self.max_new_tokens)
        check_positive("temperature", self.temperature, allow_zero=True)
        check_range("top_p", self.top_p, 0.0, 1.0, low_inclusive=False)
        if self.top_k is not None:
            check_positive("top_k", self.top_k, allow_zero=True)


@dataclass
class RunOptions(BaseConfig):
    """Evaluation, logging, run folder, seed and environment options.

    ``output_dir`` is declared here (so the group is complete) but every learner config
    redefines it with its own default run folder.
    """

    eval_interval: int = option(16, help="evaluate every this many steps (0: never)")
    eval_num_samples: int = option(4, help="evaluation tasks per evaluation")
    eval_temperature: float | None = option(None, help="sampling temperature for evaluation (None: temperature)")
    logging_steps: int = option(1, help="log training metrics every this many steps")
    output_dir: str = option("runs", help="run folder: metrics.jsonl, checkpoints, plots")
    seed: int = option(42, help="seed of every random draw")
    progress_bar: bool | None = option(None, help="show a progress bar (None: when stderr is a terminal)")
    env_kwargs: dict[str, Any] = option({}, help="extra keyword arguments for the environment")
    train_task_slice: str | None = option(None, help="task_slice of the training env, e.g. ':-20'")
    eval_task_slice: str | None = option(None, help="task_slice of the evaluation env, e.g. '-20:'")
    retain_freed_memory: bool = option(
        True,
        help="CPU runs on glibc: keep freed memory in the process heap instead of returning it to the OS, "
        "so large tensors do not page-fault again every step (faster updates; resident memory stays "
        "near its peak until the process exits)",
    )

    def validate(self) -> None:
        super().validate()
        check_positive("eval_interval", self.eval_interval, allow_zero=True)
        check_positive("eval_num_samples", self.eval_num_samples, allow_zero=True)
        if self.eval_temperature is not None:
            check_positive("eval_temperature", self.eval_temperature, allow_zero=True)
        check_positive("logging_steps", self.logging_steps)


@dataclass
class TeamOptions(BaseConfig):
    """The team the CLI builds (the trainers themselves receive a ready Team)."""

    agent_models: list[str] = option(["tiny-random"], help="one model per agent, or one for all")
    num_agents: int | None = option(None, help="team size when agent_models names one model (None: env's)")
    lora: bool = option(False, help="train one LoRA adapter per agent instead of full weights")
    lora_r: int = option(8, help="LoRA rank")
    lora_alpha: int = option(16, help="LoRA alpha")
    lora_dropout: float = option(0.0, help="LoRA dropout")
    dtype: str = option("fp32", help="weights dtype: fp32 or bf16 (bf16 suits a frozen LoRA base)")
    mixed_precision: str = option(
        "no",
        help="bf16: fp32 weights and optimizer state, forward passes under bf16 autocast "
        "(fast on GPUs and AMX CPUs); with lora the frozen base is stored in bf16",
    )
    device: str | None = option(None, help="device for every agent (None: CUDA when present)")

    def validate(self) -> None:
        super().validate()
        if not self.agent_models:
            raise ConfigError("option 'agent_models' is empty; name at least one model", "agent_models")
        if self.num_agents is not None:
            check_positive("num_agents", self.num_agents)
        check_positive("lora_r", self.lora_r)
        check_range("lora_dropout", self.lora_dropout, 0.0, 1.0, high_inclusive=False)
        if self.dtype not in ("fp32", "bf16"):
            raise ConfigError(f"option 'dtype' must be 'fp32' or 'bf16', got {self.dtype!r}", "dtype")
        if self.mixed_precision not in ("no", "bf16"):
            raise ConfigError(
                f"option 'mixed_precision' must be 'no' or 'bf16', got {self.mixed_precision!r}", "mixed_precision"
            )
        if self.mixed_precision != "no" and self.dtype != "fp32":
            raise ConfigError(
                "option 'mixed_precision' keeps fp32 master weights: set dtype=fp32, "
                "or mixed_precision=no to train bf16 weights",
                "mixed_precision",
            )


def check_training_loop(config: Any) -> None:
    """Checks of the rollout-buffer / epoch options that MAGRPO, actor-critic and MARLHF
    each declare with their own meaning and defaults (so they are no shared group)."""
    check_positive("rollout_buffer_size", config.rollout_buffer_size)
    if config.train_batch_size is not None:
        check_positive("train_batch_size", config.train_batch_size)
    check_positive("num_train_epochs", config.num_train_epochs)
    if config.max_steps is not None:
        check_positive("max_steps", config.max_steps)
