r"""Data-parallel training across processes (MAGRPO and MADPO).

Launch any training command under a multi-process launcher and the trainers pick it up::

    # N GPUs, one process each (NCCL)
    accelerate launch --multi_gpu --num_processes N --num_machines 1 --mixed_precision no \
        --dynamo_backend no -m comlrl_core.cli train magrpo --env ... --config ...
    # 2 CPU processes (gloo): the same command; --multi_gpu only picks accelerate's
    # torchrun launcher, and the processes choose gloo because no GPU is present
    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \
        --dynamo_backend no -m comlrl_core.cli train madpo --env ... --config ...
    # or torchrun directly, the same on CPU and GPUs
    torchrun --nproc_per_node 2 -m comlrl_core.cli train madpo --env ... --config ...

Do not use ``accelerate launch --cpu --num_processes 2``: without an MPI hostfile it
starts a single process. A default config written by ``accelerate config``
(``~/.cache/huggingface/accelerate``) fills in every option the command leaves out and
can break the launch (e.g. ``gpu_ids: '0'``); ``--config_file FILE`` replaces it
(docs/distributed.md has a complete one).

What data parallelism means here:

* Every process holds the whole team (same model sources; the trainable parameters are
  broadcast from rank 0 at start, so the replicas begin identical even when LoRA adapters
  were initialised from different seeds).
* Each process takes a shard of the task items (MAGRPO: task item ``round * world + rank``
  in every round; MADPO: every ``world``-th task batch). Every random draw stays keyed by
  the *global* item, so a process samples exactly what a single process would for it.
* Before each agent's optimizer step the processes **sum** that agent's gradients. The
  local loss is divided by the *global* number of groups (MAGRPO) or pairs (MADPO) in the
  update, so the summed gradient is the gradient of the mean over the global batch: two
  processes with ``B`` items each compute the same update as one process with the ``2B``
  items, even when the processes hold different numbers of groups or pairs.
* Processes agree on how many updates to run (a process with nothing left joins with
  zero gradients), and skip an update together when any of them saw a non-finite loss.
* Only rank 0 writes metrics, plots and checkpoints (see :class:`NullLogger`).

Without a launcher (or with one process) :meth:`DistributedContext.current` returns the
single-process context, whose methods do nothing, so the trainers behave as before.
"""

from __future__ import annotations

import math
import os
import pathlib
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence, TypeVar

import torch

T = TypeVar("T")


@dataclass(frozen=True)
class DistributedContext:
    """This process's place in a data-parallel job (``rank`` of ``world_size``)."""

    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={self.rank} world_size={self.world_size}")

    # -- discovery ------------------------------------------------------------------
    @classmethod
    def current(cls) -> "DistributedContext":
        """The running job: ``torch.distributed`` when initialised; else, when a launcher
        set ``WORLD_SIZE > 1``, initialise it through ``accelerate.PartialState`` (gloo on
        CPU, NCCL on GPUs); else a single process."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import PartialState

            # cpu=True makes accelerate choose MULTI_CPU; without it, a CPU-only machine
            # gets a process group whose rank bookkeeping accelerate misreports. gloo by
            # name: on CPU accelerate would pick MPI when torch has it, which needs mpirun.
            if torch.cuda.is_available():
                state = PartialState()
            else:
                state = PartialState(cpu=True, backend="gloo")
            if dist.is_initialized():
                return cls(dist.get_rank(), dist.get_world_size())
            return cls(state.process_index, state.num_processes)
        return cls()

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes logs, plots and checkpoints."""
        return self.rank == 0

    def default_device(self) -> str:
        """``cuda:<local rank>`` when CUDA is present, else ``cpu`` (one GPU per process)."""
        if torch.cuda.is_available():
            return f"cuda:{int(os.environ.get('LOCAL_RANK', self.rank)) % torch.cuda.device_count()}"
        return "cpu"

    # -- sharding -------------------------------------------------------------------
    def shard(self, items: Sequence[T]) -> list[T]:
        """This process's share: ``items[rank::world_size]``."""
        return list(items[self.rank :: self.world_size])

    def owns(self, index: int) -> bool:
        """Whether item ``index`` of a round-robin split belongs to this process."""
        return index % self.world_size == self.rank

    def item_of_round(self, round_index: int) -> int:
        """The global item position this process handles in round ``round_index``."""
        return round_index * self.world_size + self.rank

    def num_rounds(self, num_items: int) -> int:
        """Rounds needed for every process together to cover ``num_items`` items."""
        return math.ceil(num_items / self.world_size)

    # -- collectives ----------------------------------------------------------------
    def _all_reduce(self, values: Sequence[float], op: str) -> list[float]:
        if not self.enabled:
            return [float(v) for v in values]
        import torch.distributed as dist

        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(tensor, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
        return tensor.cpu().tolist()

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over processes."""
        return self._all_reduce(values, "sum")

    def max(self, values: Sequence[float]) -> list[float]:
        """Element-wise maximum over processes."""
        return self._all_reduce(values, "max")

    def all_true(self, flag: bool) -> bool:
        """True when ``flag`` holds on every process."""
        return bool(self._all_reduce([1.0 if flag else 0.0], "min")[0])

    def _comm_device(self) -> torch.device:
        import torch.distributed as dist

        # NCCL moves CUDA tensors only; gloo moves CPU tensors.
        if dist.get_backend() == "nccl":
            return torch.device(self.default_device())
        return torch.device("cpu")

    def broadcast_parameters(self, params: Iterable[torch.Tensor]) -> None:
        """Copy rank 0's values into ``params`` on every process (identical replicas)."""
        if not self.enabled:
            return
        import torch.distributed as dist

        device = self._comm_device()
        with torch.no_grad():
            for p in params:
                buf = p.data.detach().to(device).contiguous()
                dist.broadcast(buf, src=0)
                p.data.copy_(buf.to(p.device))

    def sync_gradients(self, params: Sequence[torch.Tensor], finite: bool = True) -> bool:
        """Sum ``params``' gradients over processes (a missing gradient counts as zero).

        Returns False, with every gradient cleared, when any process reports
        ``finite=False``: then every process skips the update together.
        """
        if not self.enabled:
            return finite
        if not self.all_true(finite):
            for p in params:
                p.grad = None
            return False
        import torch.distributed as dist

        device = self._comm_device()
        # One flat buffer per dtype: one collective instead of one per tensor.
        grads_by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads_by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in grads_by_dtype.values():
            flat = torch.cat([g.detach().reshape(-1).to(device) for g in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for g in grads:
                n = g.numel()
                g.copy_(flat[offset : offset + n].view_as(g).to(g.device))
                offset += n
        return True

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every process's ``obj`` (picklable), in rank order."""
        if not self.enabled:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def reduce_metrics(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """The mean of each metric over the processes that report it."""
        if not self.enabled:
            return dict(metrics)
        rows = self.gather_objects(dict(metrics))
        keys = list(dict.fromkeys(k for row in rows for k in row))
        out: dict[str, float] = {}
        for key in keys:
            values = [float(row[key]) for row in rows if key in row]
            out[key] = sum(values) / len(values)
        return out

    def barrier(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            dist.barrier()


def trainable_parameters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters an optimizer steps (what :meth:`DistributedContext.sync_gradients` needs)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


class NullLogger:
    """A metrics logger that writes nothing: what ranks other than 0 log to."""

    def __init__(self, run_dir: str | os.PathLike = ".") -> None:
        self.run_dir = pathlib.Path(run_dir)

    @property
    def metrics_path(self) -> pathlib.Path:
        return self.run_dir / "metrics.jsonl"

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        pass

    def log_text(self, key: str, text: str, step: int) -> None:
        pass

    def log_table(self, key: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], step: int) -> None:
        pass

    def close(self) -> None:
        pass


#: The algorithms (``comlrl train`` names) whose trainers are data-parallel: they shard the
#: data over the processes of a launcher. Every other learner refuses to run under one.
DATA_PARALLEL_LEARNERS = ("magrpo", "mareinforce", "marloo", "maremax", "madpo", "madpo_iter")


def launcher_world_size() -> int:
    """Processes of the job: ``torch.distributed``'s world when initialised, else ``$WORLD_SIZE``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    except ValueError:
        return 1


def refuse_launcher(learner: str) -> None:
    """Raise when a learner that is not data-parallel runs under a multi-process launcher:
    every process would train the same team on the same data and write the same folder."""
    world = launcher_world_size()
    if world > 1:
        raise RuntimeError(
            f"{learner} is not data-parallel, but it was started by a launcher with WORLD_SIZE={world}: "
            "every process would train the same team and write to the same output folder. Run it as one "
            "process (without accelerate launch / torchrun), or use a data-parallel learner: "
            f"{', '.join(DATA_PARALLEL_LEARNERS)}"
        )


def is_main_process(distributed: DistributedContext | None = None) -> bool:
    """Whether this process writes logs: rank 0 of ``distributed`` and of the launcher's ``$RANK``."""
    if distributed is not None and not distributed.is_main:
        return False
    try:
        return int(os.environ.get("RANK", "0") or 0) == 0
    except ValueError:
        return True
