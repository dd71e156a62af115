"""What per-episode seeding costs: ``generate`` with one seed per call (the training
path) against one seed per completion (the evaluation engine's path, which makes every
episode independent of its batch), side by side on the same prompts.

    .venv/bin/python bench/eval_seeding.py [--model smollm2-135m-instruct] [--prompts 16]
        [--samples 2] [--tokens 32] [--repeats 3]

Prints the CPU model, then each form's median milliseconds per decoding step (prefill
included, spread over the steps) and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch

from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.policy import GenerationConfig


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown (no lscpu)"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def _median_ms_per_step(fn, repeats: int) -> float:
    """Median milliseconds per decoding step (the draws decide how many steps a call
    takes, so whole-call times of the two seed forms are not comparable)."""
    per_step = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - start
        steps = max(len(c.token_ids) for row in out for c in row)
        per_step.append(1000 * seconds / steps)
    return statistics.median(per_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"CPU: {_cpu_model()}; torch threads: {torch.get_num_threads()}")
    policy = TransformersPolicy.from_source(args.model, device="cpu")
    prompts = [f"Write one sentence about the number {i} and why it is interesting." for i in range(args.prompts)]
    # min_new_tokens is not an option: a high temperature keeps rows from stopping early
    config = GenerationConfig(max_new_tokens=args.tokens, temperature=1.0, top_p=0.95, top_k=0)
    rows = args.prompts * args.samples
    per_completion = list(range(1000, 1000 + rows))
    policy.generate(prompts[:2], 1, config, 0)  # warm-up
    one = _median_ms_per_step(lambda: policy.generate(prompts, args.samples, config, 7), args.repeats)
    many = _median_ms_per_step(lambda: policy.generate(prompts, args.samples, config, per_completion), args.repeats)
    print(f"{args.model}: {args.prompts} prompts x {args.samples} samples, up to {args.tokens} new tokens")
    print(f"{'seed form':<28}{'ms / decoding step':>20}")
    print(f"{'one seed per call':<28}{one:>20.2f}")
    print(f"{'one seed per completion':<28}{many:>20.2f}")
    print(f"per-completion / per-call: {many / one:.3f}")


if __name__ == "__main__":
    main()
