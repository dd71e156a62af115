"""Peak memory of a LoRA team: one shared base versus one base copy per agent.

Each configuration (number of agents x shared/separate) runs in a fresh subprocess, so
every figure is that process's own RSS high-water mark (``ru_maxrss``): loading, one
batched generate and one log-prob backward pass per agent included.

    .venv/bin/python bench/team_memory.py                  # tiny random model
    .venv/bin/python bench/team_memory.py --model smollm2  # SmolLM2-135M (packaged GGUF)
    .venv/bin/python bench/team_memory.py --model /path/to/model --agents 1 2 4 8

Target: 4 shared agents use at most 1.3x the memory of one agent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

MODELS = {"tiny": "tiny-random", "smollm2": "smollm2-135m-instruct"}
TARGET = 1.3


def _peak_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def child(model: str, agents: int, shared: bool, work: bool) -> None:
    """Build the team, exercise every agent, print one JSON line."""
    import peft  # noqa: F401  -- imported up front so the baseline counts the libraries
    import torch
    from transformers import AutoModelForCausalLM  # noqa: F401

    from comlrl_core.models.team import AgentSpec, Team
    from comlrl_core.policy import GenerationConfig

    after_import = _peak_mib()
    specs = [AgentSpec(model, lora=True, lora_r=8, device="cpu", share_base=shared) for _ in range(agents)]
    team = Team.from_specs(specs)
    after_load = _peak_mib()
    if work:
        for policy in team:
            out = policy.generate(
                ["Write a function that adds two numbers."], 2, GenerationConfig(max_new_tokens=8), seed=0
            )
            loss = -policy.sequence_logprobs([c.prompt_token_ids for c in out[0]], [c.token_ids for c in out[0]]).mean()
            loss.backward()
            torch.optim.SGD(list(policy.parameters()), lr=1e-3).step()
    print(
        json.dumps(
            {
                "agents": agents,
                "shared": shared,
                "after_import_mib": after_import,
                "after_load_mib": after_load,
                "peak_mib": _peak_mib(),
                "bases": len({id(p.shared_base) for p in team}),
            }
        )
    )


def measure(model: str, agents: int, shared: bool, work: bool) -> dict:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "--model",
        model,
        "--agents",
        str(agents),
        "--mode",
        "shared" if shared else "separate",
    ]
    if not work:
        cmd.append("--no-work")
    env = dict(os.environ, TQDM_DISABLE="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"child {cmd} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny | smollm2 | any model source")
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--no-work", action="store_true", help="only load; skip generate/backward")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=["shared", "separate"], default="shared", help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = MODELS.get(args.model, args.model)
    work = not args.no_work
    if args.child:
        child(model, args.agents[0], args.mode == "shared", work)
        return

    rows = {}
    for n in args.agents:
        for shared in (True, False):
            if n == 1 and not shared:
                rows[(n, False)] = rows[(n, True)]  # identical configuration
                continue
            rows[(n, shared)] = measure(model, n, shared, work)
            print(
                f"  measured {n} agent(s), {'shared' if shared else 'separate'}: "
                f"{rows[(n, shared)]['peak_mib']:.0f} MiB",
                file=sys.stderr,
            )

    one = rows[(min(args.agents), True)]
    imported = one["after_import_mib"]
    print(f"\nPeak RSS (MiB), model={model}, LoRA r=8, {'load + generate + backward' if work else 'load only'}")
    print(
        f"(process after imports, before any model: ~{imported:.0f} MiB; '(load)' = shared peak "
        "after building the team, before any generate/backward)\n"
    )
    print(
        f"{'agents':>6} | {'shared':>8} | {'(load)':>8} | {'separate':>8} | {'shared/1 agent':>14} | "
        f"{'separate/1 agent':>16} | {'bases (sh/sep)':>14}"
    )
    print("-" * 93)
    for n in args.agents:
        sh, sep = rows[(n, True)], rows[(n, False)]
        print(
            f"{n:>6} | {sh['peak_mib']:>8.0f} | {sh['after_load_mib']:>8.0f} | {sep['peak_mib']:>8.0f} | "
            f"{sh['peak_mib'] / one['peak_mib']:>13.2f}x | {sep['peak_mib'] / one['peak_mib']:>15.2f}x | "
            f"{sh['bases']:>6} / {sep['bases']:<6}"
        )
    largest = max(args.agents)
    ratio = rows[(largest, True)]["peak_mib"] / one["peak_mib"]
    model_only = (rows[(largest, True)]["peak_mib"] - imported) / max(one["peak_mib"] - imported, 1e-9)
    verdict = "OK" if ratio <= TARGET else "ABOVE TARGET"
    print(
        f"\n{largest} shared agents / 1 agent: {ratio:.2f}x total RSS "
        f"({model_only:.2f}x counting only memory above the post-import baseline); "
        f"target <= {TARGET}x: {verdict}"
    )


if __name__ == "__main__":
    main()
