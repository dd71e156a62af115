"""Pieces every trainer shares: logging, sampling settings, evaluation, reward plots,
task order and checkpoint look-up.

:class:`TrainerCommon` is a mixin for the trainer classes (MAGRPO, actor-critic,
preference). It expects the attributes those trainers set up: ``config``, ``env``,
``_eval_env``, ``_make_env``, ``policies``, ``agent_names``, ``logger``, ``history``,
``run_dir``, ``global_step`` and ``algorithm_name``. The free functions cover the
checkpoint helpers, which take their inputs explicitly.
"""

from __future__ import annotations

import pathlib
import random
from typing import Any, Callable, Iterable, Mapping, Sequence

from comlrl_core.policy import GenerationConfig
from comlrl_core.run.checkpoint import latest_checkpoint, load_checkpoint
from comlrl_core.run.metrics import plot_metric
from comlrl_core.run.progress import progress, set_postfix
from learners.common.evaluation import episode_metrics, run_episodes
from learners.common.seeding import derive_seed
from learners.common.setup import num_tasks

__all__ = [
    "TaskItemTraining",
    "TrainerCommon",
    "add_rank_files",
    "agent_entries",
    "load_own_checkpoint",
    "planned_items",
    "rank_file_to_read",
    "shuffled_task",
]


class TrainerCommon:
    """Mixin: ``_log``, ``generation_config``, reward plot and the evaluation loop."""

    def _log(self, metrics: dict[str, float]) -> None:
        self.logger.log(metrics, step=self.global_step)
        self.history.append({"step": float(self.global_step), **metrics})

    def generation_config(self, temperature: float | None = None) -> GenerationConfig:
        """Sampling settings from the config (``temperature`` overrides it, e.g. for evaluation)."""
        c = self.config
        return GenerationConfig(
            max_new_tokens=c.max_new_tokens,
            temperature=c.temperature if temperature is None else temperature,
            top_p=c.top_p,
            top_k=c.top_k or 0,
        )

    def _plot_reward_curve(self, keys: Iterable[str]) -> pathlib.Path | None:
        """``reward_curve.png`` of the ``keys`` logged so far (None: none logged, or no matplotlib)."""
        keys = [k for k in keys if any(k in row for row in self.history)]
        if not keys:
            return None
        try:
            return plot_metric(
                self.logger.metrics_path, keys, self.run_dir / "reward_curve.png", title=f"{self.algorithm_name} reward"
            )
        except ImportError:
            return None

    def _evaluate_episodes(
        self, num_turns: int, discount: float, seed: int, prepare: Callable[[], None] | None = None
    ) -> dict[str, float]:
        """Play ``eval_num_samples`` evaluation tasks (one episode each) and log ``eval/...``.

        The evaluation env is built on first use (``eval_task_slice``; None: the training
        env). ``prepare`` runs just before the episodes when there is something to evaluate.
        """
        c = self.config
        if self._eval_env is None:
            self._eval_env = self._make_env(c.eval_task_slice) if c.eval_task_slice else self.env
        count = min(c.eval_num_samples, num_tasks(self._eval_env))
        if count == 0:
            return {}
        if prepare is not None:
            prepare()
        rewards = run_episodes(
            self._eval_env,
            list(range(count)),
            self.policies,
            self.agent_names,
            num_turns=num_turns,
            generation_config=self.generation_config(c.eval_temperature),
            seed=seed,
        )
        metrics = episode_metrics(rewards, num_turns, discount)
        self._log(metrics)
        return metrics


class TaskItemTraining:
    """Mixin: the ``train`` loop of trainers whose step is one task item (MAGRPO, actor-critic).

    It expects ``config``, ``total_steps``, ``global_step``, ``algorithm_name`` and the
    methods ``train_step``, ``evaluate``, ``save_checkpoint`` and ``_finish``.
    """

    def train(self, stop_after: int | None = None) -> dict[str, float]:
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
                last = self.train_step()
                bar.update(1)
                set_postfix(bar, {k: v for k, v in last.items() if k.endswith("reward_mean")})
                if c.save_steps and self.global_step % c.save_steps == 0:
                    self.save_checkpoint()
        finally:
            bar.close()
        if self.global_step >= self.total_steps:
            self._finish()
        return last


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
    """Load ``directory`` (None: the latest complete checkpoint under ``run_dir/checkpoints``)
    into ``policies`` / ``optimizers``; return its path and cursor.

    Raises FileNotFoundError when there is none, ValueError when another algorithm wrote it.
    """
    path = pathlib.Path(directory) if directory else latest_checkpoint(run_dir / "checkpoints")
    if path is None:
        raise FileNotFoundError(f"no complete checkpoint under {run_dir / 'checkpoints'}")
    cursor = load_checkpoint(path, policies=policies, optimizers=optimizers)
    if cursor.get("algorithm") != algorithm_name:
        raise ValueError(f"{path} was written by {cursor.get('algorithm')}, not {algorithm_name}")
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
