"""Data-parallel MAGRPO and MADPO: 2 CPU processes (gloo) against one process.

``distributed_worker.py`` trains MAGRPO (LoRA; each rank starts from a different adapter
init) and MADPO (full weights) with half the task items per rank. It is started twice,
once by ``accelerate launch`` (the documented command, with an explicit config file so a
user's default accelerate config cannot change it) and once by ``torchrun``; the same
worker, run in this process, trains with the whole global batch. After training, both
ranks hold exactly the same parameters, and those equal the single process's up to
float summation order.
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
BIN = pathlib.Path(sys.executable).parent
PASSAGES = [
    "The old mill stands by the river and grinds wheat for the town every autumn.",
    "A small fox lives near the farm and hunts mice in the tall grass at night.",
    "The library opens at nine and lends books, maps and records to every visitor.",
    "Rain fell on the hills for three days and the streams rose over the stones.",
]
# Every launch setting spelled out: with --config_file, accelerate never reads the user's
# ~/.cache/huggingface/accelerate/default_config.yaml (whose gpu_ids, debug or cpu affinity
# would otherwise change or break the launch).
ACCELERATE_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
num_processes: 2
num_machines: 1
machine_rank: 0
gpu_ids: all
mixed_precision: 'no'
use_cpu: false
debug: false
enable_cpu_affinity: false
"""
# Set by a launcher (or by a parent job); the subprocess must see only its own launcher's.
LAUNCH_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_command(launcher: str, out: pathlib.Path, data: pathlib.Path) -> list[str]:
    script = [str(WORKER), str(out), str(data)]
    if launcher == "accelerate":
        config = out / "accelerate_config.yaml"
        config.write_text(ACCELERATE_CONFIG)
        # --multi_gpu selects accelerate's torchrun launcher, which also starts CPU
        # processes (`--cpu` would start one process, or go through mpirun); the
        # processes then pick gloo because no GPU is present. Port 0: a free one.
        return [
            str(BIN / "accelerate"),
            "launch",
            "--config_file",
            str(config),
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            "0",
            *script,
        ]
    return [
        str(BIN / "torchrun"),
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        *script,
    ]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> pathlib.Path:
    data = tmp_path_factory.mktemp("distributed_data") / "passages.json"
    data.write_text(json.dumps([{"passage": p} for p in PASSAGES]))
    return data


@pytest.fixture(scope="module")
def single(tmp_path_factory, data_file) -> dict:
    """The worker run in this process: one process, the whole global batch."""
    out = tmp_path_factory.mktemp("distributed_single")
    sys.path.insert(0, str(HERE))
    try:
        import distributed_worker
    finally:
        sys.path.remove(str(HERE))
    distributed_worker.run_all(out, str(data_file))
    return torch.load(out / "result_world1_rank0.pt", weights_only=False)


@pytest.fixture(scope="module", params=["accelerate", "torchrun"])
def launched(request, tmp_path_factory, data_file) -> tuple[str, pathlib.Path, dict, dict]:
    """The worker started on 2 CPU processes by ``request.param``: (launcher, dir, rank 0, rank 1)."""
    launcher = request.param
    out = tmp_path_factory.mktemp(f"distributed_{launcher}")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV and not k.startswith("ACCELERATE_")}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        _launch_command(launcher, out, data_file), env=env, capture_output=True, text=True, timeout=600, cwd=str(out)
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    load = lambda rank: torch.load(out / f"result_world2_rank{rank}.pt", weights_only=False)  # noqa: E731
    return launcher, out, load(0), load(1)


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    assert len(tensors) > 0
    return torch.cat([t.detach().reshape(-1).double() for t in tensors])


def test_launcher_started_two_gloo_processes(launched, single):
    launcher, _, rank0, rank1 = launched
    assert (rank0["world"], rank0["rank"], rank1["world"], rank1["rank"]) == (2, 0, 2, 1)
    for rank, result in enumerate([rank0, rank1]):
        info = result["launch"]
        assert info["backend"] == "gloo"
        # accelerate's own view of the job inside the process: a 2-process CPU job.
        assert info["accelerate_type"] == "MULTI_CPU" and info["accelerate_world"] == (rank, 2)
        # Only `accelerate launch` exports its settings to the processes.
        assert info["accelerate_mixed_precision_env"] == ("no" if launcher == "accelerate" else None)
    assert single["world"] == 1 and single["launch"]["backend"] is None


@pytest.mark.parametrize("algo", ["magrpo", "madpo"])
def test_ranks_identical_and_equal_to_single_process(launched, single, algo):
    _, _, rank0, rank1 = launched
    a, b, s = rank0[algo], rank1[algo], single[algo]
    # Every rank ends with bit-identical parameters.
    assert len(a["end"]) == len(b["end"]) == len(s["end"])
    for x, y in zip(a["end"], b["end"], strict=True):
        assert torch.equal(x, y)
    moved = _flat(s["end"]) - _flat(s["start"])
    gap = (_flat(a["end"]) - _flat(s["end"])).abs()
    assert moved.abs().max() > 1e-4  # training really changed the parameters
    # Same update as one process, up to float summation order. AdamW divides each element's
    # step by that element's own gradient scale, so where a gradient is ~0 (e.g. LoRA A in
    # the step after B leaves zero) summation noise moves a few single elements visibly:
    # bound the whole update by norm, and almost every element tightly. A wrong shard or a
    # missing gradient sum changes most elements by about the learning rate.
    assert gap.norm() < 1e-2 * moved.norm(), (float(gap.norm()), float(moved.norm()))
    off = int((gap > 1e-4 * moved.abs().max()).sum())
    assert off <= 0.01 * gap.numel(), (off, gap.numel())


def test_magrpo_shards_items_and_broadcasts_rank0_init(launched, single):
    _, out, rank0, rank1 = launched
    # Rank 1 built a different LoRA init; the trainer replaced it by rank 0's.
    assert (_flat(rank0["magrpo"]["start"]) - _flat(rank1["magrpo"]["start"])).abs().max() > 0
    assert torch.equal(_flat(rank0["magrpo"]["start"]), _flat(single["magrpo"]["start"]))
    # 8 items: 4 rounds of 2 per process versus 8 steps alone; the same 2 updates per agent.
    assert rank0["magrpo"]["steps"] == rank1["magrpo"]["steps"] == 4 and single["magrpo"]["steps"] == 8
    assert rank0["magrpo"]["updates"] == single["magrpo"]["updates"] == [2, 2]
    # Only rank 0 wrote metrics: one line per round, not two.
    lines = (out / "magrpo_2" / "metrics.jsonl").read_text().splitlines()
    assert sum('"turn_1/reward_mean"' in line for line in lines) == 4


def test_madpo_shards_task_batches(launched, single):
    _, _, rank0, rank1 = launched
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
