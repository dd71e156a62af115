"""Step time and peak memory of IAC / MAAC, side by side with CoMLRL's trainers.

Configurations (two agents on comlrl/Writing-v0, critic_type "v", num_generations 1):
``iac-head`` (value head on each actor), ``iac-separate`` (a critic model per agent),
``maac`` (one centralized critic). One step = one task item: the episode's rollout
(``T`` turns) plus any update round it triggers (``rollout_buffer_size`` episodes, and
the end-of-run flush on the last item). The first item is a warm-up and is left out of
the mean.

Every configuration runs in a fresh subprocess, so the peak RSS (``ru_maxrss``, the
process's high-water mark, model loading included) belongs to that configuration alone.
With ``--comlrl-python`` (a venv with ``comlrl`` installed, e.g. /work/comlrl-venv) the
same configurations also run through CoMLRL's IACTrainer / MAACTrainer
(bench/_comlrl_ac_worker.py) on the same weights and reward.

    .venv/bin/python bench/actor_critic_step.py [--algos iac-head,iac-separate,maac]
        [--steps 5] [--T 2] [--max-new-tokens 32] [--rollout-buffer-size 2]
        [--comlrl-python /work/comlrl-venv/bin/python] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ALGOS = ("iac-head", "iac-separate", "maac")


def worker(spec: dict) -> dict:
    import torch

    from comlrl_core.models.agent_spec import AgentSpec
    from comlrl_core.models.team import Team
    from learners.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer

    torch.set_num_threads(spec["threads"])
    t0 = time.perf_counter()
    team = Team.from_specs([AgentSpec(model=spec["model"], device="cpu") for _ in range(2)])
    common = dict(
        agent_learning_rate=5e-6,
        critic_learning_rate=5e-6,
        rollout_buffer_size=spec["rollout_buffer_size"],
        max_new_tokens=spec["max_new_tokens"],
        temperature=0.6,
        top_p=0.6,
        num_train_epochs=1,
        num_generations=1,
        num_turns=spec["T"],
        discount=0.9,
        critic_type="v",
        eval_interval=0,
        max_steps=spec["steps"],
        output_dir=tempfile.mkdtemp(prefix="ac-bench-"),
        device="cpu",
        logprob_micro_batch_size=spec["micro_batch"],
        progress_bar=False,
    )
    if spec["algo"] == "maac":
        trainer = MAACTrainer(MAACConfig(**common), team, "comlrl/Writing-v0")
    else:
        trainer = IACTrainer(
            IACConfig(use_separate_critic=spec["algo"] == "iac-separate", **common), team, "comlrl/Writing-v0"
        )
    load_s = time.perf_counter() - t0
    steps = []
    for _ in range(spec["steps"]):
        m = trainer.train_step()
        steps.append((m["time/step_s"], m["time/rollout_s"], m["time/update_s"]))
    return {
        "load_s": load_s,
        "step_s": [s[0] for s in steps],
        "rollout_s": [s[1] for s in steps],
        "update_s": [s[2] for s in steps],
        "update_rounds": trainer.update_rounds,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def run_subprocess(python: str, script: str, spec: dict, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [python, script, "--worker", json.dumps(spec)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    return {"error": (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]}


def summarize(result: dict) -> str:
    if "error" in result:
        return f"not measured: {result['error']}"
    timed = result["step_s"][1:] or result["step_s"]
    text = (
        f"step {statistics.mean(timed):7.2f} s (median {statistics.median(timed):.2f}, {len(timed)} timed)"
        f"  peak RSS {result['peak_rss_gib']:.2f} GiB  load {result['load_s']:.1f} s"
    )
    if "rollout_s" in result:
        text += (
            f"  [rollout {statistics.mean(result['rollout_s'][1:] or result['rollout_s']):.2f} s,"
            f" update {statistics.mean(result['update_s'][1:] or result['update_s']):.2f} s]"
        )
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--algos", default=",".join(ALGOS), help="comma list of: " + ", ".join(ALGOS))
    ap.add_argument("--model", default="tiny-random", help="model source for agents and critics")
    ap.add_argument("--steps", type=int, default=5, help="task items per configuration (first = warm-up)")
    ap.add_argument("--T", type=int, default=2, help="num_turns")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--rollout-buffer-size", type=int, default=2)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--comlrl-python", help="python of a venv with CoMLRL installed (side-by-side run)")
    ap.add_argument("--json", help="also write all results to this file")
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    results = []
    for algo in [a.strip() for a in args.algos.split(",") if a.strip()]:
        if algo not in ALGOS:
            ap.error(f"unknown algo {algo!r}; choose from {', '.join(ALGOS)}")
        spec = {
            "algo": algo,
            "model": args.model,
            "steps": args.steps,
            "T": args.T,
            "max_new_tokens": args.max_new_tokens,
            "rollout_buffer_size": args.rollout_buffer_size,
            "micro_batch": args.micro_batch,
            "threads": args.threads,
        }
        ours = run_subprocess(sys.executable, os.path.abspath(__file__), spec, args.timeout)
        print(f"{algo:13s} comlrl-gym  {summarize(ours)}", flush=True)
        row = {"spec": spec, "comlrl_gym": ours}
        if args.comlrl_python:
            theirs = run_subprocess(args.comlrl_python, os.path.join(HERE, "_comlrl_ac_worker.py"), spec, args.timeout)
            print(f"{algo:13s} CoMLRL      {summarize(theirs)}", flush=True)
            row["comlrl"] = theirs
        else:
            print(f"{algo:13s} CoMLRL      not measured: pass --comlrl-python", flush=True)
        results.append(row)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
