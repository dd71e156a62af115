"""What handing the heap back before an update costs: one MAGRPO-style update, heap kept or released.

``release_freed_memory: phase`` hands the allocator's free memory back after each rollout,
so the update that follows page-faults its memory in again. This times that update both
ways, in turn, in one process: the heap kept from the previous update, or just released
(``release_free_memory()``, what ``phase`` does). It prints seconds and minor page faults
per update, and the cost per fault the pairs imply. The update is the trainer's own
(``learners.magrpo.update.update_agent`` with the learners' AdamW): one agent, one node
group (a prompt of ``--prompt-tokens`` and ``--samples`` completions of
``--completion-tokens``, random token ids and returns), inside ``retained_heap`` as
``train()`` runs it::

    .venv/bin/python bench/update_heap.py                    # SmolLM2-135M, full fine-tuning
    .venv/bin/python bench/update_heap.py --model tiny-random --rounds 2

Timed with a profiler, an update looks much slower: the profiler's own allocations make it
page-fault (docs/performance.md). Nothing here runs under one.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompt-tokens", type=int, default=428)
    ap.add_argument("--completion-tokens", type=int, default=48)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    import torch

    from comlrl_core.models.agent_spec import AgentSpec
    from comlrl_core.models.cpu.heap import retained_heap
    from comlrl_core.models.cpu.memory_stats import release_free_memory
    from comlrl_core.models.precision import cpu_model_name
    from comlrl_core.models.team import Team
    from learners.common.optim import adamw
    from learners.magrpo.groups import NodeGroup
    from learners.magrpo.update import update_agent

    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_model_name()}; {args.threads} thread(s); torch {torch.__version__}")
    policy = Team.from_specs([AgentSpec(args.model, lora=False, device="cpu")]).policies[0]
    optimizer = adamw([p for p in policy.model.parameters() if p.requires_grad], lr=1e-6)
    vocab = policy.model.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (args.prompt_tokens,), generator=gen).tolist()
    completions = [
        torch.randint(0, vocab, (args.completion_tokens,), generator=gen).tolist() for _ in range(args.samples)
    ]
    returns = torch.linspace(0.0, 1.0, args.samples).tolist()  # distinct: non-zero advantages
    mean = sum(returns) / len(returns)
    group = NodeGroup(0, 1, [prompt] * args.samples, completions, returns, mean, mean)
    policy.model.train()

    def update() -> tuple[float, int]:
        faults, start = minor_faults(), time.perf_counter()
        update_agent(
            policy,
            optimizer,
            [group],
            advantage_mode="mean",
            normalize_advantage=False,
            micro_batch_size=args.samples,
            step=0,
            agent=0,
        )
        return time.perf_counter() - start, minor_faults() - faults

    kept: list[tuple[float, int]] = []
    released: list[tuple[float, int]] = []
    with retained_heap(True):
        for _ in range(args.warmup):
            update()
        for _ in range(args.rounds):
            kept.append(update())
            release_free_memory()
            released.append(update())
    print("| heap before the update | s | page faults |\n|---|---|---|")
    for label, runs in (("kept", kept), ("just released", released)):
        print(f"| {label} | {' / '.join(f'{s:.2f}' for s, _ in runs)} | {' / '.join(f'{f:,}' for _, f in runs)} |")
    extra_s = sum(s for s, _ in released) - sum(s for s, _ in kept)
    extra_faults = sum(f for _, f in released) - sum(f for _, f in kept)
    if extra_faults > 0:
        print(
            f"about {extra_s / extra_faults * 1e6:.2f} us per extra page fault "
            f"({extra_faults:,} over {args.rounds} pairs)"
        )
    else:
        print("releasing the heap added no page faults here")
    return 0


if __name__ == "__main__":
    sys.exit(main())
