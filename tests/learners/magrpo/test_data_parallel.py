"""The data-parallel seam of MAGRPO: the single-process no-op and the multi-process rules.

The collectives of a 2-process job are played by a context whose "other process" reports
scripted values, so the rules are checked without a process group (the real 2-process
runs are in tests/learners/test_distributed.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from comlrl_core.run.metrics import MetricsLogger
from learners.common.distributed import DistributedContext, NullLogger
from learners.magrpo.data_parallel import DataParallel, SingleProcess, parallel_seam
from learners.magrpo.groups import NodeGroup


@dataclass(frozen=True)
class ScriptedPeer(DistributedContext):
    """Rank ``rank`` of 2; each collective combines the local values with the next reply."""

    rank: int = 0
    world_size: int = 2
    replies: list[list[float]] = field(default_factory=list)

    def _all_reduce(self, values, op):
        other = self.replies.pop(0)
        combine = {"sum": lambda a, b: a + b, "max": max, "min": min}[op]
        return [float(combine(a, b)) for a, b in zip(values, other, strict=True)]


def _group(agent: int, turn: int = 1) -> NodeGroup:
    return NodeGroup(agent, turn, [[1]], [[2]], [0.0], 0.0, 0.0)


def test_one_process_flushes_each_buffer_as_soon_as_it_is_full():
    buffers: list[list[NodeGroup]] = [[], []]
    flushed: list[tuple[int, int]] = []

    def flush(agent):
        flushed.append((agent, len(buffers[agent])))
        buffers[agent] = []

    SingleProcess().add_groups(buffers, [[_group(0)] * 5, [_group(1)]], 2, flush)
    assert flushed == [(0, 2), (0, 2)] and [len(b) for b in buffers] == [1, 1]


def test_one_process_answers_locally():
    single = parallel_seam(DistributedContext())
    assert type(single) is SingleProcess and single.is_main
    assert [single.items_of_step(s) for s in range(3)] == [[0], [1], [2]] and single.num_steps(5) == 5
    assert single.batch_counts([2, 0]) == [2, 0] and single.global_count(3) == 3
    assert single.sync_gradients([], True) and not single.sync_gradients([], False)
    assert single.reduce_metrics({"a": 1.0}) == {"a": 1.0}
    p = torch.nn.Parameter(torch.ones(2))
    single.broadcast_parameters([p])
    assert torch.equal(p.data, torch.ones(2))


def test_several_tasks_per_step_take_consecutive_items():
    single = SingleProcess(DistributedContext(), tasks_per_step=3)
    assert [single.items_of_step(s) for s in range(2)] == [[0, 1, 2], [3, 4, 5]]
    assert single.items_per_step == 3 and single.num_steps(7) == 3 and single.num_steps(6) == 2
    # two processes, 2 tasks each: rank 1 takes items 2, 3 of round 0 and 6, 7 of round 1
    parallel = DataParallel(ScriptedPeer(rank=1), tasks_per_step=2)
    assert [parallel.items_of_step(s) for s in range(2)] == [[2, 3], [6, 7]]
    assert parallel.items_per_step == 4 and parallel.num_steps(9) == 3
    with pytest.raises(ValueError, match="tasks_per_step"):
        SingleProcess(tasks_per_step=0)


def test_data_parallel_needs_several_processes():
    with pytest.raises(ValueError, match="more than one process"):
        DataParallel(DistributedContext())


def test_processes_flush_together_when_any_buffer_is_full():
    # locally agent 0 holds 1 group and agent 1 holds 1; the other process holds 3 and 0
    peer = ScriptedPeer(replies=[[3, 0]])
    buffers: list[list[NodeGroup]] = [[], []]
    flushed: list[int] = []
    DataParallel(peer).add_groups(buffers, [[_group(0)], [_group(1)]], 2, flushed.append)
    assert flushed == [0]  # full on the other process: both flush agent 0 now, agent 1 waits
    assert [len(b) for b in buffers] == [1, 1]  # appended first, all at once (flush empties them)


def test_batch_counts_and_group_counts_are_global():
    parallel = DataParallel(ScriptedPeer(replies=[[1, 3], [2]]))
    assert parallel.batch_counts([2, 0]) == [2, 3]  # the most any process runs, per turn
    assert parallel.global_count(3) == 5  # the loss divisor: every process's groups
    assert [parallel.items_of_step(s) for s in range(3)] == [[0], [2], [4]] and parallel.num_steps(5) == 3


def test_only_rank_zero_writes(tmp_path):
    assert isinstance(DataParallel(ScriptedPeer(rank=0)).logger(tmp_path, None), MetricsLogger)
    other = DataParallel(ScriptedPeer(rank=1))
    assert not other.is_main and isinstance(other.logger(tmp_path, None), NullLogger)
