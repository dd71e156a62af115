"""Decoding with sibling projections stacked into one packed weight, against one weight each.

``comlrl_core.models.cpu.sibling_linears``: in oneDNN's fp32 layout a Llama-family layer's
q/k/v projections share one stacked packed weight, and so do its MLP's gate/up, so a
decoding step runs 4 products a layer instead of 7. This compares the two in ONE process on
the same model and prompts (``packed_linear.FUSE_SIBLINGS`` flipped between calls, the order
alternating each repeat, so a machine whose speed drifts weighs on both):

- the greedy tokens of both (they should be the same: the stacked product computes each
  output column as the separate one does);
- the decode rate of our sampler (``bench/generate.py``'s timing inside the call: tokens
  after the first over the time from the first decoding step to the end), median and range
  over the repeats.

The layout measurement (``fp32_layout``) decides per row-count class whether oneDNN is used at
all; its lines are printed at the end (stacked siblings are measured as stacked). Where it
picks plain MKL layers, both settings run the same code. Calls of 1-3 rows pack nothing
where the few-row kernel is on (``cpu/row_products.py``: both settings would run it), so
the default batches start at 4; ``COMLRL_ROW_PRODUCTS=off`` brings oneDNN back at 1-3::

    .venv/bin/python bench/sibling_fusion.py --kinds full,lora --batches 4,16 --repeats 6
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
from collections.abc import Sequence

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/generate.py
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import generate as gen_bench  # noqa: E402


def greedy_tokens(policy, prompts: Sequence[str], new_tokens: int) -> list[list[int]]:
    from comlrl_core.policy import GenerationConfig

    cfg = GenerationConfig(max_new_tokens=new_tokens, temperature=0.0)
    with gen_bench.eos_off(policy):
        out = policy.generate(list(prompts), 1, cfg, seed=0)
    return [group[0].token_ids for group in out]


def compare(policy, prompts: Sequence[str], batch: int, args: argparse.Namespace) -> str:
    """One table row: the greedy tokens' agreement and both settings' decode rates."""
    from comlrl_core.models.cpu import packed_linear

    def with_fusion(fused: bool):
        packed_linear.FUSE_SIBLINGS = fused
        return greedy_tokens(policy, prompts[:batch], args.greedy_tokens)

    same = with_fusion(False) == with_fusion(True)
    samplers = gen_bench.Samplers(policy, prompts, 1.0, 50, 0.95)
    clock = gen_bench.ForwardClock(policy)
    rates: dict[bool, list[float]] = {False: [], True: []}
    for repeat in range(args.repeats):
        for fused in (False, True) if repeat % 2 == 0 else (True, False):
            packed_linear.FUSE_SIBLINGS = fused
            _, decode_s, per_row = clock.measure(lambda: samplers.ours(batch, args.new_tokens))
            rates[fused].append((per_row - 1) * batch / decode_s)
    packed_linear.FUSE_SIBLINGS = True
    span = {k: f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})" for k, v in rates.items()}
    ratio = statistics.median(rates[True]) / statistics.median(rates[False])
    return f"| {batch} | {span[False]} | {span[True]} | {ratio:.2f}x | {'yes' if same else 'NO'} |"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--kinds", default="full,lora", help="full and/or lora (agent 0 of a 2-agent LoRA team)")
    parser.add_argument("--batches", default="4,16")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--greedy-tokens", type=int, default=24)
    parser.add_argument("--prompt-tokens", type=int, default=280)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# sibling fusion, {now}")
    print(f"CPU: {gen_bench.cpu_model()}; torch {torch.__version__}; threads {args.threads}")
    print(
        f"{args.prompt_tokens}-token distinct prompts, {args.new_tokens} new tokens, EOS off, temperature 1, "
        f"top_k 50, top_p 0.95; {args.repeats} repeats each, taking turns; decode tok/s median (range)"
    )
    for kind in args.kinds.split(","):
        policy = gen_bench.build_policy(kind, args.model)
        prompts = gen_bench.make_prompts(policy, max(batches), args.prompt_tokens)
        print(f"\n{kind}\n\n| batch | one weight each | siblings stacked | stacked / each | greedy tokens the same |")
        print("|---|---|---|---|---|")
        for batch in batches:
            print(compare(policy, prompts, batch, args), flush=True)
        del policy
    from comlrl_core.models.cpu import fp32_layout

    print("\nlayout measurements (stacked siblings are timed stacked):")
    for m in fp32_layout.measured():
        print(f"- {m.describe()} -> {m.verdict}")


if __name__ == "__main__":
    main()
