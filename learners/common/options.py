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

Every float option of a learner config must be finite: :class:`OptimizerOptions` (a group
every learner config inherits) checks them all, so a learning rate or coefficient of
``.inf`` / ``.nan`` fails at start-up instead of training NaN weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from comlrl_core.config.options import (
    BaseConfig,
    ConfigError,
    check_in,
    check_positive,
    check_range,
    field_types,
    option,
)
from comlrl_core.models.cpu.memory_stats import RELEASE_LEVELS

__all__ = [
    "GenerationOptions",
    "OptimizerOptions",
    "RunOptions",
    "SCHEDULER_TYPES",
    "TeamOptions",
    "check_finite_options",
    "check_training_loop",
    "report_to_backends",
]


def check_finite_options(config: Any) -> None:
    """Raise ConfigError naming the first float option (or float in a list/dict option) that is NaN/Inf."""
    for name in field_types(type(config)):
        value = getattr(config, name)
        for where, number in _floats_in(name, value):
            if not math.isfinite(number):
                raise ConfigError(
                    f"option '{where}' must be a finite number, got {number!r}; set it to a finite value", where
                )


def _floats_in(name: str, value: Any) -> list[tuple[str, float]]:
    if isinstance(value, float):
        return [(name, value)]
    if isinstance(value, (list, tuple)):
        return [pair for i, v in enumerate(value) for pair in _floats_in(f"{name}[{i}]", v)]
    if isinstance(value, dict):
        return [pair for k, v in value.items() for pair in _floats_in(f"{name}.{k}", v)]
    return []


#: learning-rate schedules ``transformers.get_scheduler`` builds from a step count alone
#: (reduce_lr_on_plateau needs a metric, warmup_stable_decay extra arguments)
SCHEDULER_TYPES = (
    "constant",
    "constant_with_warmup",
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "inverse_sqrt",
    "cosine_with_min_lr",
)


@dataclass
class OptimizerOptions(BaseConfig):
    """AdamW settings of the agents and the log-prob micro-batch size."""

    agent_learning_rate: float = option(5e-6, help="AdamW learning rate of every agent")
    weight_decay: float = option(0.0, help="AdamW weight decay")
    adam_beta1: float = option(0.9, help="AdamW beta1 (first-moment decay)")
    adam_beta2: float = option(0.999, help="AdamW beta2 (second-moment decay)")
    adam_epsilon: float = option(1e-8, help="AdamW epsilon")
    lr_scheduler_type: str = option(
        "constant",
        help="learning-rate schedule over the training steps (transformers.get_scheduler): constant, "
        "constant_with_warmup, linear, cosine, cosine_with_restarts, polynomial, inverse_sqrt, cosine_with_min_lr",
    )
    warmup_steps: int = option(0, help="steps of linear warm-up from 0 (> 0: overrides warmup_ratio)")
    warmup_ratio: float = option(0.0, help="warm-up as a fraction of the training steps (used when warmup_steps=0)")
    max_grad_norm: float | None = option(None, help="clip each agent's gradient norm (None: no clipping)")
    logprob_micro_batch_size: int = option(16, help="sequences per log-prob forward pass (bounds memory)")
    logprob_token_budget: int | None = option(
        4096,
        help="padded tokens per log-prob forward pass (bounds activation memory: about 1.25 MB a token for "
        "SmolLM2-135M with LoRA; one sequence or group alone may exceed it; None: no token limit)",
    )

    def validate(self) -> None:
        super().validate()
        check_finite_options(self)
        check_positive("agent_learning_rate", self.agent_learning_rate)
        check_positive("weight_decay", self.weight_decay, allow_zero=True)
        check_range("adam_beta1", self.adam_beta1, 0.0, 1.0, high_inclusive=False)
        check_range("adam_beta2", self.adam_beta2, 0.0, 1.0, high_inclusive=False)
        check_positive("adam_epsilon", self.adam_epsilon)
        check_positive("warmup_steps", self.warmup_steps, allow_zero=True)
        check_range("warmup_ratio", self.warmup_ratio, 0.0, 1.0)
        if self.lr_scheduler_type not in SCHEDULER_TYPES:
            raise ConfigError(
                f"option 'lr_scheduler_type' is {self.lr_scheduler_type!r}; choose one of {', '.join(SCHEDULER_TYPES)}",
                "lr_scheduler_type",
            )
        if self.max_grad_norm is not None:
            check_positive("max_grad_norm", self.max_grad_norm)
        check_positive("logprob_micro_batch_size", self.logprob_micro_batch_size)
        if self.logprob_token_budget is not None:
            check_positive("logprob_token_budget", self.logprob_token_budget)


@dataclass
class GenerationOptions(BaseConfig):
    """How every agent samples its responses during training."""

    max_new_tokens: int = option(256, help="new tokens per response")
    temperature: float = option(0.6, help="sampling temperature (0 = greedy)")
    top_p: float = option(0.6, help="nucleus sampling mass")
    top_k: int | None = option(50, help="top-k filter (None or 0: off)")
    stop: list[str] | None = option(
        None, help="stop strings: a completion ends before the first one (finish_reason stop); e.g. stop=['```']"
    )
    generation_token_budget: int | None = option(
        32768,
        help="tokens per batched sampling call, rows * (prompt + max_new_tokens): bounds the KV cache "
        "(about 46 KB a token for SmolLM2-135M in fp32); larger batches are split (None: no limit)",
    )

    def validate(self) -> None:
        super().validate()
        check_positive("max_new_tokens", self.max_new_tokens)
        check_positive("temperature", self.temperature, allow_zero=True)
        check_range("top_p", self.top_p, 0.0, 1.0, low_inclusive=False)
        if self.top_k is not None:
            check_positive("top_k", self.top_k, allow_zero=True)
        if self.generation_token_budget is not None:
            check_positive("generation_token_budget", self.generation_token_budget)
        if self.stop is not None:
            if isinstance(self.stop, str):
                self.stop = [self.stop]
            if not all(isinstance(s, str) and s for s in self.stop):
                raise ConfigError(f"option 'stop' needs a list of non-empty strings, got {self.stop!r}", "stop")


@dataclass
class RunOptions(BaseConfig):
    """Evaluation, logging, run folder, seed and environment options.

    ``output_dir`` is declared here (so the group is complete) but every learner config
    redefines it with its own default run folder.
    """

    eval_interval: int = option(16, help="evaluate every this many steps (0: never)")
    eval_num_samples: int = option(4, help="evaluation tasks per evaluation (the first ones of the evaluation split)")
    eval_episodes_per_task: int = option(1, help="evaluation episodes per task (n of pass@k)")
    eval_k: list[int] = option([1], help="k values of the evaluation's pass@k (k > eval_episodes_per_task: dropped)")
    eval_temperature: float | None = option(None, help="sampling temperature for evaluation (None: temperature)")
    eval_max_new_tokens: int | None = option(None, help="new tokens per response in evaluation (None: max_new_tokens)")
    logging_steps: int = option(1, help="log training metrics every this many steps")
    report_to: list[str] | str = option(
        ["jsonl"],
        help="logging backends: any of jsonl (always written), tensorboard, wandb; e.g. report_to=[tensorboard, wandb]",
    )
    run_name: str | None = option(
        None, help="run name: the W&B run's name and the TensorBoard sub-folder (None: W&B picks one)"
    )
    project: str | None = option(None, help="W&B project (None: $WANDB_PROJECT or W&B's default)")
    output_dir: str = option("runs", help="run folder: metrics.jsonl, checkpoints, plots")
    save_total_limit: int | None = option(
        None, help="keep only the newest N checkpoints under output_dir/checkpoints (None: keep all)"
    )
    seed: int = option(42, help="seed of every random draw")
    progress_bar: bool | None = option(None, help="show a progress bar (None: when stderr is a terminal)")
    env_kwargs: dict[str, Any] = option({}, help="extra keyword arguments for the environment")
    train_task_slice: str | None = option(None, help="task_slice of the training env, e.g. ':-20'")
    eval_task_slice: str | None = option(None, help="task_slice of the evaluation env, e.g. '-20:'")
    retain_freed_memory: bool = option(
        True,
        help="CPU runs on glibc: while train() runs, keep freed memory in the process heap instead of "
        "returning it to the OS, so large tensors do not page-fault again every step (SmolLM2-135M full "
        "fine-tuning: updates about 30% faster); on return the free memory is handed back (malloc_trim). "
        "false: glibc's defaults throughout (see docs/performance.md)",
    )
    release_freed_memory: str = option(
        "phase",
        help="CPU runs: when train() hands the memory the C allocator keeps free for reuse back to the OS "
        "(tcmalloc: ReleaseFreeMemory, glibc: malloc_trim), so the resident size does not climb with it: "
        "phase (after each sampling call, rollout, update and evaluation), micro_batch (also after each "
        "scored micro-batch: lowest peak; the main job's setting, 2.40 instead of 2.74 GiB for a fifth more time), "
        "never (see docs/performance.md)",
    )

    def validate(self) -> None:
        super().validate()
        check_in("release_freed_memory", self.release_freed_memory, RELEASE_LEVELS)
        check_positive("eval_interval", self.eval_interval, allow_zero=True)
        check_positive("eval_num_samples", self.eval_num_samples, allow_zero=True)
        check_positive("eval_episodes_per_task", self.eval_episodes_per_task)
        if self.eval_max_new_tokens is not None:
            check_positive("eval_max_new_tokens", self.eval_max_new_tokens)
        if not self.eval_k or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.eval_k):
            raise ConfigError(f"option 'eval_k' needs a list of k values >= 1, got {self.eval_k!r}", "eval_k")
        if self.eval_temperature is not None:
            check_positive("eval_temperature", self.eval_temperature, allow_zero=True)
        check_positive("logging_steps", self.logging_steps)
        if self.save_total_limit is not None:
            check_positive("save_total_limit", self.save_total_limit)
        report_to_backends(self.report_to)


def report_to_backends(report_to: list[str] | str) -> list[str]:
    """The logging backends ``report_to`` names (``"a,b"`` or a list; ``"none"``: JSONL only),
    ``jsonl`` first; a ConfigError naming the option for anything else."""
    from comlrl_core.run.metrics import BACKENDS

    names = report_to.split(",") if isinstance(report_to, str) else list(report_to)
    backends = ["jsonl"]
    for name in (str(n).strip().lower() for n in names):
        if name in ("", "none"):
            continue
        if name not in BACKENDS:
            raise ConfigError(
                f"option 'report_to' names {name!r}; choose any of {', '.join(BACKENDS)} "
                "(e.g. report_to=[jsonl, tensorboard])",
                "report_to",
            )
        if name not in backends:
            backends.append(name)
    return backends


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
    gradient_checkpointing: bool = option(
        False,
        help="recompute each layer's activations in the backward pass instead of keeping them: less "
        "training memory, slower updates (it also turns off MAGRPO's one-pass scoring of a group's shared prompt)",
    )

    def validate(self) -> None:
        super().validate()
        if not self.agent_models:
            raise ConfigError("option 'agent_models' is empty; name at least one model", "agent_models")
        if self.num_agents is not None:
            check_positive("num_agents", self.num_agents)
        check_positive("lora_r", self.lora_r)
        check_positive("lora_alpha", self.lora_alpha)
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
