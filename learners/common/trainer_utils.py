"""Pieces every trainer shares: logging, sampling settings, evaluation, reward plots,
task order and checkpoint look-up.

:class:`TrainerCommon` is a mixin for the trainer classes (MAGRPO, actor-critic,
preference). It expects the attributes those trainers set up: ``config``, ``env``,
``_eval_env``, ``_make_env``, ``policies``, ``agent_names``, ``logger``, ``history``,
``run_dir``, ``global_step`` and ``algorithm_name``. The free functions cover the
checkpoint helpers, which take their inputs explicitly.
"""

from __future__ import annotations

import dataclasses
import pathlib
import random
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, Sequence

from comlrl_core.models.cpu.memory_stats import end_of_phase
from comlrl_core.policy import GenerationConfig, Policy
from comlrl_core.run.checkpoint import (
    CHECKPOINT_PREFIX,
    NoCheckpointError,
    load_checkpoint,
    verify_checkpoint,
)
from comlrl_core.run.checkpoint_recovery import find_resume_checkpoint, recover_leftovers
from comlrl_core.run.metrics import plot_metric, rewind_metrics
from comlrl_core.run.progress import progress, set_postfix
from learners.common.evaluation import trainer_evaluation
from learners.common.nonfinite import NonFiniteGuard
from learners.common.optim import LearningRateSchedule, drain_optimizer_stats
from learners.common.seeding import derive_seed
from learners.common.setup import host_memory_managed, num_tasks

if TYPE_CHECKING:
    from comlrl_core.run.metrics import MetricsLogger

__all__ = [
    "TaskItemTraining",
    "TrainerCommon",
    "add_rank_files",
    "agent_entries",
    "checkpoint_keep_last",
    "load_own_checkpoint",
    "planned_items",
    "rank_file_to_read",
    "shuffled_task",
]


class _CommonHost(Protocol):
    """What :class:`TrainerCommon` needs of the trainer it is mixed into (for the type checker)."""

    # Each trainer's own config class; the mixin reads the options all of them share.
    @property
    def config(self) -> Any: ...
    @property
    def env(self) -> Any: ...
    @property
    def policies(self) -> Sequence[Policy]: ...
    @property
    def agent_names(self) -> Sequence[str]: ...
    @property
    def logger(self) -> MetricsLogger: ...
    @property
    def history(self) -> list[dict[str, float]]: ...
    @property
    def run_dir(self) -> pathlib.Path: ...
    @property
    def global_step(self) -> int: ...
    @property
    def algorithm_name(self) -> str: ...
    @property
    def _env_spec(self) -> Any: ...

    _eval_env: Any

    def _make_env(self, task_slice: str | None) -> Any: ...
    def _log(self, metrics: dict[str, float]) -> None: ...
    def generation_config(self, temperature: float | None = None) -> GenerationConfig: ...
    def _eval_generation_config(self) -> GenerationConfig: ...


class _TaskItemHost(Protocol):
    """What :class:`TaskItemTraining` needs of the trainer it is mixed into (for the type checker)."""

    @property
    def config(self) -> Any: ...
    @property
    def total_steps(self) -> int: ...
    @property
    def global_step(self) -> int: ...
    @property
    def algorithm_name(self) -> str: ...
    @property
    def optimizers(self) -> Sequence[Any]: ...
    @property
    def run_dir(self) -> pathlib.Path: ...

    def train_step(self) -> dict[str, float]: ...
    def evaluate(self) -> dict[str, float]: ...
    def save_checkpoint(self) -> Any: ...
    def _finish(self) -> Any: ...
    def _halt_if_nonfinite(self) -> None: ...
    def _apply_lr_schedule(self, total_steps: int | None = None) -> None: ...


def _optimizer_entries(trainer: Any) -> dict[str, Any]:
    """Every optimizer of a trainer by checkpoint name (``agent_<i>``, ``critic_<i>``)."""
    objects = getattr(trainer, "_checkpoint_objects", None)
    if callable(objects):
        return dict(objects()[1])
    return agent_entries(getattr(trainer, "optimizers", None) or [])


def _take_completion_stats(policy: Any) -> Any:
    stats = getattr(policy, "completion_stats", None)
    return stats.take() if stats is not None else None


def _training_row_extras(trainer: Any) -> dict[str, float]:
    """Optimizer figures since the last training row, and the agents' completion figures
    (``agent_<i>/completions/mean_length`` / ``clipped_ratio``) of the generations since."""
    out = drain_optimizer_stats(_optimizer_entries(trainer))
    for i, policy in enumerate(getattr(trainer, "policies", None) or []):
        stats = _take_completion_stats(policy)
        if stats is not None and stats.count:
            out[f"agent_{i}/completions/mean_length"] = stats.tokens / stats.count
            out[f"agent_{i}/completions/clipped_ratio"] = stats.clipped / stats.count
    return out


def checkpoint_keep_last(config: Any, path: str | pathlib.Path) -> int | None:
    """``save_total_limit`` for a save into ``path`` when it is a numbered checkpoint
    (``checkpoint-<step>``: the ones rotated), else None (keep everything)."""
    limit = getattr(config, "save_total_limit", None)
    if limit is None or not pathlib.Path(path).name.startswith(CHECKPOINT_PREFIX):
        return None
    return int(limit)


class TrainerCommon:
    """Mixin: ``_log``, ``generation_config``, reward plot and the evaluation loop; the
    CoMLRL-style constructor ``from_components``; the logger and start-up checks."""

    #: whether the trainer shards its data over a launcher's processes (see
    #: :data:`learners.common.distributed.DATA_PARALLEL_LEARNERS`); the others refuse one
    data_parallel: bool = False

    @classmethod
    def from_components(
        cls,
        *,
        reward_func: Callable[..., Any] | str,
        train_dataset: Any,
        agents: Any = None,
        agent_model: str | None = None,
        num_agents: int | None = None,
        tokenizer: Any = None,
        formatters: Any = None,
        external_transition: Callable[..., Sequence[str]] | str | None = None,
        reward_processor: Any = None,
        eval_dataset: Any = None,
        args: Any = None,
        **trainer_kwargs: Any,
    ) -> Any:
        """Build the trainer the CoMLRL way: a dataset, per-agent formatters and a reward
        function become a ``comlrl/Dataset-v0`` env; see
        :func:`learners.common.components.build_from_components`."""
        from learners.common.components import build_from_components

        return build_from_components(
            cls,
            reward_func=reward_func,
            train_dataset=train_dataset,
            agents=agents,
            agent_model=agent_model,
            num_agents=num_agents,
            tokenizer=tokenizer,
            formatters=formatters,
            external_transition=external_transition,
            reward_processor=reward_processor,
            eval_dataset=eval_dataset,
            args=args,
            **trainer_kwargs,
        )

    def _check_run_setup(self) -> None:
        """Start-up checks of every trainer: the launcher guard and the logging backends."""
        from learners.common.distributed import refuse_launcher
        from learners.common.run_logging import check_logging_backends

        if not type(self).data_parallel:
            refuse_launcher(getattr(self, "algorithm_name", type(self).__name__))
        check_logging_backends(getattr(self, "config", None))

    def _new_logger(self: _CommonHost) -> Any:
        """The run's logger: ``report_to`` backends, written by the main process only."""
        from learners.common.run_logging import run_logger

        return run_logger(self.config, self.run_dir, getattr(self, "distributed", None))

    def _log(self: _CommonHost, metrics: dict[str, float]) -> None:
        """Log a row; a training row (no ``eval/`` key) also gets every optimizer's
        ``learning_rate`` and ``grad_norm`` and every agent's ``completions/...`` figures."""
        if not any(key.startswith("eval/") for key in metrics):
            metrics = {**metrics, **_training_row_extras(self)}
        self.logger.log(metrics, step=self.global_step)
        self.history.append({"step": float(self.global_step), **metrics})

    def _apply_lr_schedule(self, total_steps: int | None = None) -> None:
        """Set every optimizer's rate for the current ``global_step`` (``lr_scheduler_type``,
        warm-up); the schedule spans ``total_steps`` (default: the trainer's ``total_steps``)."""
        host: Any = self  # a trainer: config, global_step, optimizers (see _optimizer_entries)
        schedule = host.__dict__.get("_lr_schedule")
        if schedule is None:
            if total_steps is None:
                total_steps = getattr(host, "total_steps", None)
            optimizers = _optimizer_entries(host).values()
            schedule = host.__dict__["_lr_schedule"] = LearningRateSchedule(optimizers, host.config, total_steps)
        schedule.apply(host.global_step)

    def generation_config(self: _CommonHost, temperature: float | None = None) -> GenerationConfig:
        """Sampling settings from the config (``temperature`` overrides it, e.g. for evaluation)."""
        c = self.config
        return GenerationConfig(
            max_new_tokens=c.max_new_tokens,
            temperature=c.temperature if temperature is None else temperature,
            top_p=c.top_p,
            top_k=c.top_k or 0,
            stop=tuple(getattr(c, "stop", None) or ()),
            max_batch_tokens=getattr(c, "generation_token_budget", None),
        )

    def _eval_generation_config(self: _CommonHost) -> GenerationConfig:
        """Sampling settings of evaluation: ``eval_temperature`` / ``eval_max_new_tokens``
        when set, else the training ones."""
        c = self.config
        config = self.generation_config(c.eval_temperature)
        max_new_tokens = getattr(c, "eval_max_new_tokens", None)
        return dataclasses.replace(config, max_new_tokens=max_new_tokens) if max_new_tokens else config

    def _plot_reward_curve(self: _CommonHost, keys: Iterable[str]) -> pathlib.Path | None:
        """``reward_curve.png`` of the ``keys`` logged so far (None: none logged, or no matplotlib)."""
        keys = [k for k in keys if any(k in row for row in self.history)]
        if not keys or not self.logger.metrics_path.is_file():  # a process that is not rank 0 wrote none
            return None
        try:
            return plot_metric(
                self.logger.metrics_path, keys, self.run_dir / "reward_curve.png", title=f"{self.algorithm_name} reward"
            )
        except ImportError:
            return None

    def _evaluate_episodes(
        self: _CommonHost, num_turns: int, discount: float, prepare: Callable[[], None] | None = None
    ) -> dict[str, float]:
        """Play the evaluation (``eval_num_samples`` tasks, ``eval_episodes_per_task``
        episodes each, seeded by ``seed``) with the episode engine and log ``eval/...``.

        The evaluation env is built on first use (``eval_task_slice``; None: the training
        env). ``prepare`` runs just before the episodes when there is something to evaluate.
        The settings go to ``run_dir/evaluation.json`` (what ``comlrl eval --checkpoint``
        replays).
        """
        c = self.config
        if self._eval_env is None:
            self._eval_env = self._make_env(c.eval_task_slice) if c.eval_task_slice else self.env
        count = min(c.eval_num_samples, num_tasks(self._eval_env))
        if count == 0:
            return {}
        if prepare is not None:
            prepare()
        env_kwargs_of = getattr(self, "_env_kwargs", None)
        distributed = getattr(self, "distributed", None)
        writes = distributed is None or distributed.is_main  # [distributed] rank 0 writes
        held = [_take_completion_stats(p) for p in self.policies]  # training's, kept apart from eval's
        metrics = trainer_evaluation(
            self._eval_env,
            self.policies,
            num_tasks=count,
            episodes_per_task=getattr(c, "eval_episodes_per_task", 1),
            num_turns=num_turns,
            discount=discount,
            k=getattr(c, "eval_k", (1,)),
            generation_config=self._eval_generation_config(),
            seed=c.seed,
            env_spec=self._env_spec,
            env_kwargs=env_kwargs_of(c.eval_task_slice or c.train_task_slice) if callable(env_kwargs_of) else None,
            run_dir=self.run_dir if writes else None,
        )
        for policy, stats in zip(self.policies, held, strict=True):
            _take_completion_stats(policy)  # the evaluation's: not training figures
            if stats is not None:
                policy.completion_stats.add(stats)  # type: ignore[attr-defined]
        end_of_phase()
        self._log(metrics)
        return metrics


class TaskItemTraining:
    """Mixin: the ``train`` loop of trainers whose step is one task item (MAGRPO, actor-critic).

    It expects ``config``, ``total_steps``, ``global_step``, ``algorithm_name`` and the
    methods ``train_step``, ``evaluate``, ``save_checkpoint`` and ``_finish``.
    """

    @host_memory_managed
    def train(self: _TaskItemHost, stop_after: int | None = None) -> dict[str, float]:
        """Train until ``total_steps`` (or pause after global step ``stop_after``).

        A paused run can be checkpointed and resumed; only a finished run calls
        ``_finish`` (final flush, evaluation, checkpoint and plot).
        """
        c = self.config
        end = self.total_steps if stop_after is None else min(stop_after, self.total_steps)
        last: dict[str, float] = {}
        bar = progress(
            total=self.total_steps,
            initial=self.global_step,
            desc=self.algorithm_name,
            disable=None if c.progress_bar is None else not c.progress_bar,
            unit="task",
        )
        try:
            while self.global_step < end:
                if c.eval_interval and self.global_step % c.eval_interval == 0:
                    self.evaluate()
                self._apply_lr_schedule()
                last = self.train_step()
                self._halt_if_nonfinite()
                bar.update(1)
                set_postfix(bar, {k: v for k, v in last.items() if k.endswith("reward_mean")})
                if c.save_steps and self.global_step % c.save_steps == 0:
                    self.save_checkpoint()
        finally:
            bar.close()
        if self.global_step >= self.total_steps:
            self._finish()
        return last

    def _halt_if_nonfinite(self: _TaskItemHost) -> None:
        """Stop before a NaN/Inf update is checkpointed (see :mod:`learners.common.nonfinite`)."""
        objects = getattr(self, "_checkpoint_objects", None)
        optimizers = objects()[1] if callable(objects) else agent_entries(self.optimizers)
        guard = self.__dict__.setdefault("_nonfinite_guard", NonFiniteGuard())
        guard.check(optimizers, self.global_step, self.run_dir / "checkpoints")


def planned_items(num_train_epochs: int, num_tasks: int, max_steps: int | None) -> int:
    """Task items of a whole run: every epoch over every task, capped by ``max_steps``."""
    full = num_train_epochs * num_tasks
    return min(full, max_steps) if max_steps else full


def shuffled_task(step: int, num_tasks: int, shuffle: bool, seed: int, tag: int) -> int:
    """The task of item ``step``: in order, or in a seeded shuffle redrawn every epoch."""
    epoch, pos = divmod(step, num_tasks)
    if not shuffle:
        return pos
    order = list(range(num_tasks))
    random.Random(derive_seed(seed, tag, epoch)).shuffle(order)
    return order[pos]


def agent_entries(items: Sequence[Any]) -> dict[str, Any]:
    """``{"agent_0": items[0], ...}``: the names checkpoints store agents' parts under."""
    return {f"agent_{i}": item for i, item in enumerate(items)}


def load_own_checkpoint(
    run_dir: pathlib.Path,
    directory: str | pathlib.Path | None,
    algorithm_name: str,
    *,
    policies: Mapping[str, Any],
    optimizers: Mapping[str, Any] | None = None,
) -> tuple[pathlib.Path, dict[str, Any]]:
    """Load ``directory`` (None: the newest checkpoint under ``run_dir/checkpoints``) into
    ``policies`` / ``optimizers``; return its path and cursor.

    Leftovers of a killed save are tidied first (an intact ``.old-*`` copy restored). With
    ``directory=None`` a damaged newest checkpoint stops the resume (CheckpointError naming
    it) rather than falling back to an older one; pass the older one explicitly to use it.
    Metrics rows logged after the checkpoint was saved are dropped, so the steps re-run
    from it replace them. Raises FileNotFoundError when there is no checkpoint, ValueError
    when another algorithm wrote it.
    """
    root = run_dir / "checkpoints"
    recover_leftovers(root)
    if directory:
        path = pathlib.Path(directory)
    else:
        try:
            path, _ = find_resume_checkpoint(root)
        except NoCheckpointError as err:
            raise FileNotFoundError(str(err)) from None
    manifest = verify_checkpoint(path)
    cursor = load_checkpoint(path, policies=policies, optimizers=optimizers, verify_hashes=False)
    if cursor.get("algorithm") != algorithm_name:
        raise ValueError(f"{path} was written by {cursor.get('algorithm')}, not {algorithm_name}")
    if isinstance(cursor.get("global_step"), int):
        rewind_metrics(run_dir, cursor["global_step"], saved_at=manifest.get("created"))
    return path, cursor


def _rank_name(name: str, rank: int) -> str:
    stem, dot, ext = name.rpartition(".")
    return f"{stem}_rank{rank}.{ext}" if dot else f"{name}_rank{rank}"


def add_rank_files(distributed: Any, cursor: dict[str, Any], extra: dict[str, bytes], name: str) -> bool:
    """[distributed] Every process calls this while saving: record the world size in
    ``cursor`` and gather each process's ``extra[name]`` into ``<stem>_rank<r>.<ext>``.

    Returns whether this process writes the checkpoint (rank 0, or any single process).
    """
    if not distributed.enabled:
        return True
    cursor["world_size"] = distributed.world_size
    per_rank = distributed.gather_objects(extra[name])
    extra.update({_rank_name(name, r): b for r, b in enumerate(per_rank)})
    return distributed.is_main


def rank_file_to_read(distributed: Any, cursor: dict[str, Any], path: pathlib.Path, name: str) -> str:
    """[distributed] The extra file this process restores its own part from: ``name``, or
    its rank's copy. The checkpoint must come from the same number of processes."""
    world = int(cursor.get("world_size", 1))
    if world != distributed.world_size:
        raise ValueError(
            f"{path} was written by {world} process(es); resume it with {world}, not {distributed.world_size}"
        )
    return _rank_name(name, distributed.rank) if distributed.enabled else name
