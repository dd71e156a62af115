"""Preference-pair throughput and MADPO update time: comlrl-gym vs CoMLRL, side by side.

    .venv/bin/python bench/preference_step.py --tasks 4 --candidates 8 --max-new-tokens 16 \
        --comlrl-python /work/comlrl-venv/bin/python

Both sides use the tiny random model (``comlrl_core.models.tiny``), the same Writing-v0 prompts
and the same reward (Writing-v0's ``score_writing``), greedy-free sampling with the same
settings, and the same number of pairs per update. Figures:

* ``pairs/s``     -- preference pairs produced per second from task items (generation,
  scoring, selection), ``pair_selection=reward_gap``;
* ``update_s``    -- seconds per MADPO update on ``--batch`` pairs (both agents).

CoMLRL runs in its own interpreter (``--comlrl-python``, a venv with ``comlrl`` installed);
without it only comlrl-gym's figures are printed. Speed depends on the machine: compare
rows of one run, not runs on different machines.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def writing_items(num_tasks: int) -> tuple[list[dict], list[list[str]]]:
    from comlrl_core.registry import make

    env = make("comlrl/Writing-v0", expansion_ratio=1.5)
    items, prompts = [], []
    for t in range(num_tasks):
        obs, _ = env.reset(options={"task": t})
        items.append({"passage": env.task(t)["passage"], "index": t})
        prompts.append([obs[a] for a in env.possible_agents])
    return items, prompts


def run_ours(args: argparse.Namespace) -> dict:
    import torch

    from comlrl_core.models.agent_spec import AgentSpec
    from comlrl_core.models.team import Team
    from comlrl_core.models.tiny import tiny_model_path
    from learners.madpo import MADPOConfig, MADPOTrainer
    from learners.madpo.madpo_loss import madpo_update

    torch.manual_seed(0)
    team = Team.from_specs([AgentSpec(tiny_model_path(), device="cpu")] * 2)
    cfg = MADPOConfig(
        preference_num_candidates=args.candidates,
        preference_pairs_per_sample=args.pairs_per_task,
        preference_max_tasks=args.tasks,
        preference_task_batch_size=args.tasks,
        max_new_tokens=args.max_new_tokens,
        temperature=0.6,
        top_p=0.6,
        top_k=50,
        eval_interval=0,
        output_dir="/tmp/bench_preference",
        progress_bar=False,
        env_kwargs={"expansion_ratio": 1.5},
    )
    trainer = MADPOTrainer(cfg, team, "comlrl/Writing-v0")
    t0 = time.perf_counter()
    pairs, _ = trainer.collect_pairs()
    collect_s = time.perf_counter() - t0
    times = []
    for _ in range(args.repeats):
        batch = pairs[: args.batch]
        t0 = time.perf_counter()
        madpo_update(trainer.policies, trainer.optimizers, batch, 0.1, micro_batch_size=args.batch)
        times.append(time.perf_counter() - t0)
    return {
        "impl": "comlrl-gym",
        "pairs": len(pairs),
        "collect_s": collect_s,
        "pairs_per_s": len(pairs) / collect_s,
        "update_s": statistics.median(times),
    }


def run_comlrl(args: argparse.Namespace) -> dict:
    import torch
    from comlrl.trainers.preference import MADPOConfig, MADPOTrainer

    from comlrl_core.models.tiny import tiny_model_path
    from envs.writing.reward import WritingRewardConfig, score_writing

    torch.manual_seed(0)
    items, prompts = writing_items(args.tasks)
    by_passage = {it["passage"]: p for it, p in zip(items, prompts, strict=True)}
    reward_cfg = WritingRewardConfig(expansion_ratio=1.5)

    def reward(summaries, expansions, *, batch_items=None):
        passage = batch_items[0]["passage"]
        return [score_writing(passage, s, e, reward_cfg)[0] for s, e in zip(summaries, expansions, strict=True)]

    formatters = [lambda item, i=i: by_passage[item["passage"]][i] for i in range(2)]
    cfg = MADPOConfig(
        preference_num_candidates=args.candidates,
        preference_pairs_per_sample=args.pairs_per_task,
        max_new_tokens=args.max_new_tokens,
        temperature=0.6,
        top_p=0.6,
        top_k=50,
        eval_interval=0,
        num_agents=2,
        num_train_epochs=1,
        train_batch_size=args.batch,
        agent_devices="cpu",
    )
    path = tiny_model_path()
    from transformers import AutoTokenizer

    trainer = MADPOTrainer(
        agent_model=path,
        tokenizer=AutoTokenizer.from_pretrained(path),
        num_agents=2,
        train_dataset=items,
        reward_func=reward,
        formatters=formatters,
        args=cfg,
    )
    for agent in trainer.agents:
        agent.train()
    t0 = time.perf_counter()
    pairs = trainer._build_preference_dataset()
    collect_s = time.perf_counter() - t0
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        trainer._update_from_preference_batch(pairs[: args.batch])
        times.append(time.perf_counter() - t0)
    return {
        "impl": "CoMLRL",
        "pairs": len(pairs),
        "collect_s": collect_s,
        "pairs_per_s": len(pairs) / collect_s,
        "update_s": statistics.median(times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--pairs-per-task", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4, help="pairs per MADPO update")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--comlrl-python", default=None, help="python of a venv with comlrl installed")
    parser.add_argument("--side", choices=["ours", "comlrl"], default="ours", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "comlrl":
        print(json.dumps(run_comlrl(args)))
        return
    rows = [run_ours(args)]
    if args.comlrl_python:
        cmd = [args.comlrl_python, os.path.abspath(__file__), "--side", "comlrl"] + [
            f"--{k.replace('_', '-')}={v}"
            for k, v in vars(args).items()
            if k in ("tasks", "candidates", "pairs_per_task", "max_new_tokens", "batch", "repeats")
        ]
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode != 0:
            print(f"CoMLRL side failed:\n{out.stderr[-3000:]}", file=sys.stderr)
        else:
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"tasks={args.tasks} candidates={args.candidates} pairs/task<={args.pairs_per_task} "
        f"max_new_tokens={args.max_new_tokens} batch={args.batch}"
    )
    print(f"{'impl':<12}{'pairs':>7}{'collect_s':>11}{'pairs/s':>10}{'update_s':>10}")
    for r in rows:
        print(f"{r['impl']:<12}{r['pairs']:>7}{r['collect_s']:>11.2f}{r['pairs_per_s']:>10.2f}{r['update_s']:>10.3f}")


if __name__ == "__main__":
    main()
