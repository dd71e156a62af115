"""The one seam between MAGRPO's training loop and data parallelism.

:class:`MAGRPOTrainer <learners.magrpo.magrpo_trainer.MAGRPOTrainer>` asks a
:class:`SingleProcess` (one process: every answer is the local one) or a
:class:`DataParallel` (several processes under a launcher) everything that depends on
how many processes share the run:

* which task items a step handles (``tasks_per_step`` consecutive items starting at
  ``(step * world + rank) * tasks_per_step``; ``step`` alone with the defaults);
* when node-group buffers are flushed: a single process flushes an agent's buffer as
  soon as it is full; data-parallel processes flush together at the end of a step when
  any process's buffer is full, so they run the same number of updates;
* how many mini-batches a flush runs and each mini-batch's global group count (the
  loss divisor), gradient sums, metric means, the initial weight broadcast;
* who writes logs and checkpoints (rank 0) and which checkpoint file holds a process's
  own buffers.

:func:`parallel_seam` picks the implementation from the running job.
"""

from __future__ import annotations

import math
import pathlib
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from comlrl_core.run.metrics import MetricsLogger
from learners.common.distributed import DistributedContext
from learners.common.run_logging import run_logger
from learners.common.trainer_utils import add_rank_files, rank_file_to_read
from learners.magrpo.groups import NodeGroup


class SingleProcess:
    """One process holds the whole run: nothing is shared, summed or sharded."""

    def __init__(self, context: DistributedContext | None = None, tasks_per_step: int = 1) -> None:
        if tasks_per_step < 1:
            raise ValueError(f"tasks_per_step must be >= 1, got {tasks_per_step}")
        self.context = context or DistributedContext()
        self.tasks_per_step = tasks_per_step

    @property
    def is_main(self) -> bool:
        """Whether this process writes logs, plots and checkpoints."""
        return True

    def logger(self, run_dir: pathlib.Path, config: Any) -> MetricsLogger:
        """The ``report_to`` backends (no files when a launcher's ``$RANK`` is not 0)."""
        return run_logger(config, run_dir)  # type: ignore[return-value]  # NullLogger: same interface

    # -- task items -----------------------------------------------------------------
    @property
    def items_per_step(self) -> int:
        """Task items all processes together handle in one step."""
        return self.context.world_size * self.tasks_per_step

    def items_of_step(self, step: int) -> list[int]:
        """The global task items this process handles in step ``step``."""
        first = self.context.item_of_round(step) * self.tasks_per_step
        return list(range(first, first + self.tasks_per_step))

    def num_steps(self, num_items: int) -> int:
        """Steps for all processes together to cover ``num_items`` items."""
        return math.ceil(num_items / self.items_per_step)

    # -- buffers and updates ----------------------------------------------------------
    def add_groups(
        self,
        buffers: list[list[NodeGroup]],
        groups_by_agent: Sequence[Sequence[NodeGroup]],
        buffer_size: int,
        flush: Callable[[int], None],
    ) -> None:
        """Append each agent's new groups, flushing its buffer as soon as it is full."""
        for agent, groups in enumerate(groups_by_agent):
            for group in groups:
                buffers[agent].append(group)
                if len(buffers[agent]) >= buffer_size:
                    flush(agent)

    def batch_counts(self, local_counts: Sequence[int]) -> list[int]:
        """How many mini-batches each turn of a flush runs (here: this process's own)."""
        return [int(n) for n in local_counts]

    def global_count(self, count: int) -> int:
        """The number of groups in an update over all processes (the loss divisor)."""
        return count

    def sync_gradients(self, params: Sequence[torch.Tensor], finite: bool) -> bool:
        """Whether to step: sum gradients over processes unless any loss was non-finite."""
        return finite

    def broadcast_parameters(self, params: Iterable[torch.Tensor]) -> None:
        """Start every replica from the same weights (one replica: nothing to do)."""

    def reduce_metrics(self, metrics: Mapping[str, float]) -> dict[str, float]:
        return dict(metrics)

    # -- checkpoints ------------------------------------------------------------------
    def share_file(self, cursor: dict[str, Any], extra: dict[str, bytes], name: str) -> bool:
        """Add every process's copy of ``extra[name]``; True on the process that writes."""
        return add_rank_files(self.context, cursor, extra, name)

    def file_to_read(self, cursor: dict[str, Any], path: pathlib.Path, name: str) -> str:
        """The extra file this process restores its own part from."""
        return rank_file_to_read(self.context, cursor, path, name)


class DataParallel(SingleProcess):
    """One of ``world_size`` processes (see :mod:`learners.common.distributed`)."""

    def __init__(self, context: DistributedContext, tasks_per_step: int = 1) -> None:
        if not context.enabled:
            raise ValueError("DataParallel needs a job of more than one process; use SingleProcess")
        super().__init__(context, tasks_per_step)

    @property
    def is_main(self) -> bool:
        return self.context.is_main

    def logger(self, run_dir: pathlib.Path, config: Any) -> MetricsLogger:
        # rank 0 writes; the others get a NullLogger (the same interface, writing nothing)
        return run_logger(config, run_dir, self.context)  # type: ignore[return-value]

    def add_groups(
        self,
        buffers: list[list[NodeGroup]],
        groups_by_agent: Sequence[Sequence[NodeGroup]],
        buffer_size: int,
        flush: Callable[[int], None],
    ) -> None:
        """Append, then flush together every agent whose buffer is full on any process."""
        for agent, groups in enumerate(groups_by_agent):
            buffers[agent].extend(groups)
        sizes = self.context.max([len(b) for b in buffers])
        for agent, size in enumerate(sizes):
            if size >= buffer_size:
                flush(agent)

    def batch_counts(self, local_counts: Sequence[int]) -> list[int]:
        """The most any process has: a process with fewer joins with an empty batch."""
        return [int(n) for n in self.context.max(local_counts)]

    def global_count(self, count: int) -> int:
        return int(self.context.sum([count])[0])

    def sync_gradients(self, params: Sequence[torch.Tensor], finite: bool) -> bool:
        return self.context.sync_gradients(params, finite)

    def broadcast_parameters(self, params: Iterable[torch.Tensor]) -> None:
        self.context.broadcast_parameters(params)

    def reduce_metrics(self, metrics: Mapping[str, float]) -> dict[str, float]:
        return self.context.reduce_metrics(metrics)


def parallel_seam(context: DistributedContext | None = None, tasks_per_step: int = 1) -> SingleProcess:
    """The seam for the running job (default: :meth:`DistributedContext.current`)."""
    context = context or DistributedContext.current()
    return DataParallel(context, tasks_per_step) if context.enabled else SingleProcess(context, tasks_per_step)
