"""Data-parallel MAGRPO and MADPO: 2 CPU processes (torchrun, gloo) against one process.

One torchrun launch of ``distributed_worker.py`` trains MAGRPO (LoRA; each rank starts
from a different adapter init) and MADPO (full weights) with half the task items per
rank; the same worker, run in this process, trains with the whole global batch. After
training, both ranks hold exactly the same parameters, and those equal the single
process's up to float summation order.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest
import torch

from learners.common.distributed import DistributedContext, NullLogger

HERE = pathlib.Path(__file__).parent
WORKER = HERE / "distributed_worker.py"
PASSAGES = [
    "The old mill stands by the river and grinds wheat for the town every autumn.",
    "A small fox lives near the farm and hunts mice in the tall grass at night.",
    "The library opens at nine and lends books, maps and records to every visitor.",
    "Rain fell on the hills for three days and the streams rose over the stones.",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("distributed")
    data = out / "passages.json"
    data.write_text(json.dumps([{"passage": p} for p in PASSAGES]))
    torchrun = pathlib.Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(
        [str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
         str(WORKER), str(out), str(data)],
        env=env, capture_output=True, text=True, timeout=600, cwd=str(out),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    sys.path.insert(0, str(HERE))
    try:
        import distributed_worker
    finally:
        sys.path.remove(str(HERE))
    distributed_worker.run_all(out, str(data))  # the single process, here
    load = lambda name: torch.load(out / name, weights_only=False)  # noqa: E731
    return out, load("result_world2_rank0.pt"), load("result_world2_rank1.pt"), load("result_world1_rank0.pt")


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b) and len(a) > 0
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


@pytest.mark.parametrize("algo", ["magrpo", "madpo"])
def test_ranks_identical_and_equal_to_single_process(results, algo):
    _, rank0, rank1, single = results
    assert (rank0["world"], rank0["rank"], rank1["rank"], single["world"]) == (2, 0, 1, 1)
    a, b, s = rank0[algo], rank1[algo], single[algo]
    # Every rank ends with bit-identical parameters.
    for x, y in zip(a["end"], b["end"]):
        assert torch.equal(x, y)
    moved = _max_diff(s["end"], s["start"])
    diff = _max_diff(a["end"], s["end"])
    assert moved > 1e-4  # training really changed the parameters
    assert diff < 1e-3 * moved + 1e-6, (diff, moved)  # same update as one process, up to float order


def test_magrpo_shards_items_and_broadcasts_rank0_init(results):
    out, rank0, rank1, single = results
    # Rank 1 built a different LoRA init; the trainer replaced it by rank 0's.
    assert _max_diff(rank0["magrpo"]["start"], rank1["magrpo"]["start"]) > 0
    assert _max_diff(rank0["magrpo"]["start"], single["magrpo"]["start"]) == 0
    # 8 items: 4 rounds of 2 per process versus 8 steps alone; the same 2 updates per agent.
    assert rank0["magrpo"]["steps"] == rank1["magrpo"]["steps"] == 4 and single["magrpo"]["steps"] == 8
    assert rank0["magrpo"]["updates"] == single["magrpo"]["updates"] == [2, 2]
    # Only rank 0 wrote metrics: one line per round, not two.
    lines = (out / "magrpo_2" / "metrics.jsonl").read_text().splitlines()
    assert sum('"turn_1/reward_mean"' in line for line in lines) == 4


def test_madpo_shards_task_batches(results):
    _, rank0, rank1, single = results
    # Each rank collected the pairs of its own task batches: together, the single run's.
    assert rank0["madpo"]["local_pairs"] + rank1["madpo"]["local_pairs"] == single["madpo"]["local_pairs"] > 0
    assert rank0["madpo"]["steps"] == single["madpo"]["steps"] == 2  # 2 epochs of one update


def test_single_process_context_is_inert():
    ctx = DistributedContext()
    assert not ctx.enabled and ctx.is_main
    assert ctx.shard(list(range(5))) == [0, 1, 2, 3, 4]
    assert ctx.sum([1.0, 2.0]) == [1.0, 2.0] and ctx.all_true(True) and not ctx.all_true(False)
    assert ctx.reduce_metrics({"a": 1.0}) == {"a": 1.0}
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.full((2,), 3.0)
    assert ctx.sync_gradients([p]) and torch.equal(p.grad, torch.full((2,), 3.0))


def test_sharding_arithmetic():
    ranks = [DistributedContext(r, 3) for r in range(3)]
    items = list(range(10))
    shards = [c.shard(items) for c in ranks]
    assert sorted(i for s in shards for i in s) == items
    assert [c.item_of_round(2) for c in ranks] == [6, 7, 8]
    assert ranks[0].num_rounds(10) == 4 and ranks[0].num_rounds(9) == 3
    assert [c.owns(4) for c in ranks] == [False, True, False]
    with pytest.raises(ValueError, match="rank"):
        DistributedContext(3, 3)
    NullLogger("x").log({"a": 1.0}, step=0)  # accepts and drops
