"""Worker for tests/learners/test_distributed.py: trains MAGRPO then MADPO on Writing-v0
with the tiny model and saves every agent's trainable parameters.

    accelerate launch --config_file CFG --multi_gpu --num_processes 2 distributed_worker.py OUT DATA
    torchrun --nproc_per_node 2 distributed_worker.py OUT DATA
    python distributed_worker.py OUT DATA        (or run_all() in-process)

Under a launcher each of the 2 processes takes half of the task items (per-process
budgets are halved); alone, one process takes the whole global batch in each update.
Both must end with the same parameters. Each process also records how it was launched
(the process group's backend, accelerate's view of the job) for the test to check.
"""

from __future__ import annotations

import os
import pathlib
import sys

import torch

NUM_ITEMS = 8  # MAGRPO: 4 tasks x 2 epochs; two updates per agent
GLOBAL_GROUPS = 4  # node groups per MAGRPO update over all processes
PREF_TASKS = 4  # MADPO: task items that give pairs
PREF_BATCH = 8  # MADPO: pairs per update over all processes (>= every pair of the run)


def _team(lora: bool, init_seed: int):
    from comlrl_core.models.agent_spec import AgentSpec
    from comlrl_core.models.team import Team

    torch.manual_seed(init_seed)  # LoRA adapters start random
    return Team.from_specs([AgentSpec("tiny-random", device="cpu", lora=lora) for _ in range(2)])


def _trainable(team) -> list[torch.Tensor]:
    return [p.detach().clone() for policy in team for p in policy.parameters() if p.requires_grad]


def run_magrpo(out: pathlib.Path, data_file: str, world: int, rank: int) -> dict:
    from learners.magrpo import MAGRPOConfig, MAGRPOTrainer

    config = MAGRPOConfig(
        num_generations=2,
        num_turns=1,
        max_new_tokens=8,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_steps=NUM_ITEMS,
        num_train_epochs=2,
        rollout_buffer_size=GLOBAL_GROUPS // world,
        agent_learning_rate=1e-2,
        eval_interval=0,
        save_final_checkpoint=False,
        progress_bar=False,
        seed=3,
        output_dir=str(out / f"magrpo_{world}"),
        env_kwargs={"data_file": data_file},
    )
    # Different LoRA init per rank on purpose: the trainer must broadcast rank 0's weights.
    team = _team(lora=True, init_seed=rank)
    start = _trainable(team)
    trainer = MAGRPOTrainer(config, team, "comlrl/Writing-v0")
    trainer.train()
    return {
        "start": start,
        "end": _trainable(team),
        "steps": trainer.global_step,
        "updates": list(trainer.update_counts),
    }


def run_madpo(out: pathlib.Path, data_file: str, world: int, rank: int) -> dict:
    from learners.madpo import MADPOConfig, MADPOTrainer

    config = MADPOConfig(
        preference_num_candidates=4,
        preference_pairs_per_sample=2,
        pair_selection="reward_gap",
        preference_max_tasks=PREF_TASKS,
        preference_task_batch_size=1,
        train_batch_size=PREF_BATCH // world,
        num_train_epochs=2,
        max_new_tokens=8,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        agent_learning_rate=1e-3,
        eval_interval=0,
        save_final_checkpoint=False,
        progress_bar=False,
        seed=5,
        output_dir=str(out / f"madpo_{world}"),
        env_kwargs={"data_file": data_file},
    )
    team = _team(lora=False, init_seed=0)
    start = _trainable(team)
    trainer = MADPOTrainer(config, team, "comlrl/Writing-v0")
    trainer.train()
    return {
        "start": start,
        "end": _trainable(team),
        "steps": trainer.global_step,
        "local_pairs": len(trainer.pairs or []),
    }


def _launch_info() -> dict:
    """How this process joined the job: backend, accelerate's state, the launcher's mark."""
    import torch.distributed as dist

    info = {
        "backend": None,
        "accelerate_type": None,
        "accelerate_world": None,
        "accelerate_mixed_precision_env": os.environ.get("ACCELERATE_MIXED_PRECISION"),
    }
    if dist.is_initialized():
        from accelerate import PartialState

        state = PartialState()  # the state DistributedContext.current() initialised
        info.update(
            backend=dist.get_backend(),
            accelerate_type=str(state.distributed_type.value),
            accelerate_world=(state.process_index, state.num_processes),
        )
    return info


def run_all(out: str | os.PathLike, data_file: str) -> None:
    from learners.common.distributed import DistributedContext

    ctx = DistributedContext.current()
    out = pathlib.Path(out)
    result = {
        "world": ctx.world_size,
        "rank": ctx.rank,
        "launch": _launch_info(),
        "magrpo": run_magrpo(out, data_file, ctx.world_size, ctx.rank),
        "madpo": run_madpo(out, data_file, ctx.world_size, ctx.rank),
    }
    torch.save(result, out / f"result_world{ctx.world_size}_rank{ctx.rank}.pt")


if __name__ == "__main__":
    run_all(sys.argv[1], sys.argv[2])
