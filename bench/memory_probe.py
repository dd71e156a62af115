"""Peak memory of the main job's two big moments, above the built team.

Every case runs in a fresh subprocess that builds the team (two LoRA adapters on one
shared base, as the main job), resets the process's RSS high-water mark
(``/proc/self/clear_refs``), runs the case once and reads ``VmHWM``: the figure is the
case's own peak above the team, not mixed with loading or another case.

Cases:

- ``sample``: one joint sampling call (both adapters in one batch, the path of
  ``generate_together``) of ``--rows`` rows (``--num-samples`` per prompt) of
  ``--prompt-tokens`` prompt tokens and ``--new-tokens`` new tokens, EOS off so that every
  row decodes the whole budget (the whole KV cache is written), with chunked prefill
  (one case per ``--prefill-budget``) and without;
- ``update``: ``--update-repeats`` LoRA forward + backward passes (a real update runs many
  micro-batches; the allocator's drift shows from the second on) of ``--update-tokens``
  padded tokens (rows of ``--update-seq`` tokens), with and without ``gradient_checkpointing``.

``--allocators`` runs every case under each C allocator (``glibc``: the default malloc;
``tcmalloc`` / ``jemalloc``: preloaded, :mod:`comlrl_core.models.cpu.allocator`).

    .venv/bin/python bench/memory_probe.py                       # SmolLM2-135M, defaults
    .venv/bin/python bench/memory_probe.py --rows 24 --prompt-tokens 471 --new-tokens 16
    .venv/bin/python bench/memory_probe.py --model tiny-random --rows 4 --prompt-tokens 20
    .venv/bin/python bench/memory_probe.py --cases update --update-tokens 1024 --allocators glibc tcmalloc jemalloc

Timings are printed for orientation only (they depend on the machine's load).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Callable, Sequence

MODELS = {"smollm2": "smollm2-135m-instruct"}
GIB = 2**30


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny-random, or any model source")
    parser.add_argument("--rows", type=int, default=48, help="rows of the sampling call (prompts x samples)")
    parser.add_argument("--num-samples", type=int, default=2, help="samples per prompt (the prefill fans out)")
    parser.add_argument("--prompt-tokens", type=int, default=470)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument(
        "--prefill-budget",
        type=int,
        nargs="+",
        default=[2048],
        help="prefill_token_budget of the chunked sampling cases (one case each)",
    )
    parser.add_argument("--update-tokens", type=int, nargs="+", default=[1024, 4096], help="token budgets")
    parser.add_argument("--update-seq", type=int, default=512, help="tokens per row of the update (prompt + 96)")
    parser.add_argument("--update-repeats", type=int, default=3, help="forward + backward passes per update case")
    parser.add_argument(
        "--allocators",
        nargs="+",
        choices=["glibc", "tcmalloc", "jemalloc"],
        default=["glibc"],
        help="run every case under each C allocator (tcmalloc / jemalloc preloaded)",
    )
    parser.add_argument("--cases", nargs="+", choices=["sample", "update"], default=["sample", "update"])
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a case, as JSON: run it in this process
    args = parser.parse_args(argv)
    for name in ("rows", "num_samples", "prompt_tokens", "new_tokens", "update_seq", "update_repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.rows % args.num_samples:
        parser.error(f"--rows ({args.rows}) must be a multiple of --num-samples ({args.num_samples})")
    if any(b < 1 for b in args.prefill_budget):
        parser.error(f"--prefill-budget must all be >= 1, got {args.prefill_budget}")
    if any(t < 1 for t in args.update_tokens):
        parser.error(f"--update-tokens must all be >= 1, got {args.update_tokens}")
    return args


def cases(args: argparse.Namespace) -> list[dict]:
    """One dict per subprocess: what it builds and runs."""
    out: list[dict] = []
    for allocator in args.allocators:
        if "sample" in args.cases:
            for budget in (None, *args.prefill_budget):
                out.append(
                    {
                        "kind": "sample",
                        "prefill_budget": budget,
                        "gradient_checkpointing": False,
                        "allocator": allocator,
                    }
                )
        if "update" in args.cases:
            for tokens in args.update_tokens:
                for checkpointing in (False, True):
                    out.append(
                        {
                            "kind": "update",
                            "tokens": tokens,
                            "gradient_checkpointing": checkpointing,
                            "allocator": allocator,
                        }
                    )
    return out


def _status_gib(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / GIB
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is refused."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


def _token_ids(policy, count: int, salt: int) -> list[int]:
    """``count`` ids of real text (a repeated sentence), shifted per prompt by ``salt``."""
    base = policy.tokenizer("Write a python function that returns the sum of squares of a list. ")["input_ids"]
    return [base[(i + salt) % len(base)] for i in range(count)]


def child(args: argparse.Namespace, case: dict) -> dict:
    import gc

    import torch

    from comlrl_core.models.agent_spec import AgentSpec
    from comlrl_core.models.hf_policy import TransformersPolicy
    from comlrl_core.models.team import Team
    from comlrl_core.policy import GenerationConfig

    torch.manual_seed(0)
    model = MODELS.get(args.model, args.model)
    specs = [
        AgentSpec(model=model, lora=True, device="cpu", gradient_checkpointing=case["gradient_checkpointing"])
        for _ in range(2)
    ]
    team = Team.from_specs(specs)
    agents = [policy for policy in team if isinstance(policy, TransformersPolicy)]
    if len(agents) != 2:
        raise RuntimeError(f"{model} did not build two transformers agents")
    lead = agents[0]
    gc.collect()
    team_gib = _status_gib("VmRSS")
    reset = _reset_peak()
    start = time.perf_counter()
    if case["kind"] == "sample":
        prompts = args.rows // args.num_samples
        encoded = [_token_ids(lead, args.prompt_tokens, p) for p in range(prompts)]
        adapters = [str(agents[p * 2 // prompts].adapter_name) for p in range(prompts)]  # half each, contiguous
        generators = [torch.Generator().manual_seed(r) for r in range(args.rows)]
        cfg = GenerationConfig(
            max_new_tokens=args.new_tokens,
            temperature=0.8,
            top_p=0.95,
            top_k=50,
            max_batch_tokens=None,  # one call: the case measures one call's peak
            prefill_token_budget=case["prefill_budget"],
        )
        lead.eos_token_ids = []  # every row decodes the whole budget: the worst case
        lead.sample_encoded(encoded, args.num_samples, cfg, generators, row_adapters=adapters)
    else:
        rows = max(1, case["tokens"] // args.update_seq)
        completion = min(96, args.update_seq - 1)
        prompt_ids = [_token_ids(lead, args.update_seq - completion, r) for r in range(rows)]
        completion_ids = [_token_ids(lead, completion, r + 7) for r in range(rows)]
        lead.model.train()
        last_pass = 0.0
        for _ in range(args.update_repeats):
            pass_start = time.perf_counter()
            logprobs, mask = lead.token_logprobs(prompt_ids, completion_ids)
            (-(logprobs * mask).sum() / mask.sum()).backward()
            last_pass = time.perf_counter() - pass_start
    from comlrl_core.models.cpu.allocator import loaded_allocator

    serving = loaded_allocator()
    if serving != case["allocator"]:  # a preload that did not take would mislabel the row
        raise RuntimeError(f"case asked for {case['allocator']} but {serving} serves the process")
    return {
        **case,
        "last_pass_seconds": last_pass if case["kind"] == "update" else None,
        "team_gib": team_gib,
        "peak_above_team_gib": _status_gib("VmHWM") - team_gib if reset else None,
        "peak_gib": _status_gib("VmHWM"),
        "seconds": time.perf_counter() - start,
    }


def _forwarded(args: argparse.Namespace) -> list[str]:
    """The command-line options of ``args`` again, for a child."""
    out = ["--model", args.model, "--rows", str(args.rows), "--num-samples", str(args.num_samples)]
    out += ["--prompt-tokens", str(args.prompt_tokens), "--new-tokens", str(args.new_tokens)]
    out += ["--update-seq", str(args.update_seq), "--update-repeats", str(args.update_repeats)]
    return out


def run_case(args: argparse.Namespace, case: dict) -> dict:
    from comlrl_core.models.cpu.allocator import preload_env

    cmd = [sys.executable, os.path.abspath(__file__), *_forwarded(args), "--child", json.dumps(case)]
    env = preload_env(case["allocator"])
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"case {case} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown (no lscpu)"
    names = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")]
    return names[0] if names else "unknown"


def _label(result: dict, args: argparse.Namespace) -> str:
    if result["kind"] == "sample":
        shape = f"{args.rows} rows x {args.prompt_tokens} prompt + {args.new_tokens} new"
        chunks = result["prefill_budget"]
        return f"sampling {shape}, prefill {'unchunked' if chunks is None else f'chunks of {chunks} tokens'}"
    checkpointing = "on" if result["gradient_checkpointing"] else "off"
    return (
        f"update {result['tokens']} tokens x {args.update_repeats} passes, gradient checkpointing {checkpointing}, "
        f"last pass {result['last_pass_seconds']:.1f} s"
    )


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def main(argv: Sequence[str] | None = None, log: Callable[[str], None] = print) -> list[dict]:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args, json.loads(args.child))))
        return []
    log(f"CPU: {cpu_model()}")
    log(f"model: {MODELS.get(args.model, args.model)}, two LoRA adapters on one shared base; one case per process")
    log("| allocator | case | team GiB | peak above team GiB | peak GiB | seconds (load-dependent) |")
    log("|---|---|---|---|---|---|")
    results = []
    for case in cases(args):
        result = run_case(args, case)
        results.append(result)
        log(
            f"| {result['allocator']} | {_label(result, args)} | {result['team_gib']:.2f} "
            f"| {_gib(result['peak_above_team_gib'])} | {result['peak_gib']:.2f} | {result['seconds']:.1f} |"
        )
    return results


if __name__ == "__main__":
    main()
