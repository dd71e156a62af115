"""Generation speed: our sampler against transformers' ``generate``, and the hardware's ceiling.

For every batch size and model kind, side by side in one process on the SAME model object
and the same distinct prompts:

- ``ours``: ``TransformersPolicy.generate`` (the real call path: chat template, sampling,
  detokenisation);
- ``HF``: transformers' ``model.generate`` on the same prompt token ids (left-padded),
  ``do_sample=True`` with the same temperature / top-k / top-p.

EOS is off in both, so both decode exactly ``--new-tokens`` tokens per row: transformers by
``min_new_tokens == max_new_tokens``, ours by giving the policy an EOS id no token has. The
tokens actually produced per row are printed too (a sampler change that brings EOS back
shows up there, and the rates count the tokens really produced).

Prefill and decoding are told apart inside each call by a hook on the model's input
embeddings, where every forward pass starts: passes of more than one position are the
prefill, one-position passes are decoding steps. Prefill time: from the call's start to
the first decoding step (so it holds the first token, and each sampler's per-call setup:
ours tokenises the prompts and packs the weights there). Decode rate: the tokens after
the first, ``(T - 1) * B``, over the time from the first decoding step to the call's end.
(Two calls, one for a single token and one for T, subtracted, drown in noise on a busy
machine; one call timed inside does not.) With ``--repeats N`` the two samplers take turns
N times (ours first, then transformers' first, ...), so a machine whose speed drifts
weighs on both; the table shows each one's best, the target lines the repeat-by-repeat
spread. A prefill is short at small batches, so each batch size also gets extra
prefill-only calls (two new tokens) of both samplers in turn, within ``--prefill-budget-s``
(at most 16 pairs): with 6 pairs or more the prefill target reads the median of the paired
ratios (ours over transformers', call by call) with its distribution-free 95% interval:
met at a median of at most 1, "within noise" when the interval reaches 1, else not met.
With fewer pairs (the larger batches), a prefill whose repeats overlap transformers' reads
"within noise".

Hardware limits, measured in the same process: memory copy bandwidth (a large fp32 tensor
copy; bytes read + bytes written per second), the matrix read rate (a matrix-vector product
over the same bytes: what a batch-1 decoding step does) and the fp32 GEMM rate (a large
square matmul). The copied and read buffer is at least twice the CPU's last-level cache
(sysfs), so both rates are the memory's, as for a model whose weights do not fit in that
cache (a 256 MB buffer inside a 300 MB L3 read at 51 GB/s where memory gives ~32). The
decode ceiling at batch B: a step reads every weight once and each row's cached keys and
values (at the call's mean length, prompt plus half the new tokens), at the better of the
two bandwidths, and does ``2 * params * B`` flops (``/ GEMM rate``); with both overlapped
the step takes the larger of the two, without overlap their sum (attention's arithmetic
is left out, so both ceilings are optimistic). The same matmul in bf16 is timed too, next
to whether the CPU has bf16 hardware: where it is slower than fp32, so is
``mixed_precision: bf16`` (docs/performance.md, "Mixed precision on CPU").

    .venv/bin/python bench/generate.py                      # SmolLM2-135M, batches 1,4,16,64
    .venv/bin/python bench/generate.py --batches 1,16 --new-tokens 48
    .venv/bin/python bench/generate.py --quick              # tiny random model, seconds

Targets (issue 15, a 2-core CPU): decode at batch 16 >= 2x transformers' generate, at
batch 1 >= 1.5x; prefill no slower than transformers'. Figures only, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import random
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

MODELS = {"tiny": "tiny-random", "smollm2": "smollm2-135m-instruct"}
KINDS = ("full", "lora")
T = TypeVar("T")
NO_EOS = -1  # an EOS id no sampled token can equal
# targets of issue 15: our rate / transformers' rate
DECODE_TARGETS = {16: 2.0, 1: 1.5}
# extra prefill-only pairs per batch size (--prefill-budget-s bounds their time)
MAX_PREFILL_PAIRS = 16

_WORDS = (
    "agent team code test value list string number function return result error input output "
    "reward model token prompt batch cache layer weight matrix vector sample policy update "
    "gradient step loss train write read file line check parse format sort merge split count "
    "table column row index key map set queue stack tree node edge graph path search score "
    "river mountain city market garden window letter story answer question reason plan task"
).split()


@dataclass
class Hardware:
    copy_gb_s: float  # bytes read + bytes written per second, in 1e9
    gemv_read_gb_s: float  # matrix bytes read per second by a matrix-vector product
    gemm_gflop_s: float
    gemm_bf16_gflop_s: float  # the same matmul in bf16: what bf16 mixed precision could gain
    copy_mb: int  # the copied / read buffer
    gemm_n: int
    cache_mb: int | None = None  # the CPU's last-level cache (None: unknown)

    @property
    def bandwidth_gb_s(self) -> float:
        """The weight-read rate the ceilings use: the better of copy and matrix-vector."""
        return max(self.copy_gb_s, self.gemv_read_gb_s)


@dataclass
class Row:
    """One model kind at one batch size: both samplers side by side."""

    kind: str
    batch: int
    prefill_ours_s: float
    prefill_hf_s: float
    decode_ours_tok_s: float
    decode_hf_tok_s: float
    tokens_ours: float  # new tokens per row actually produced
    tokens_hf: float
    ceiling_tok_s: float  # bandwidth and compute overlapped
    ceiling_serial_tok_s: float  # no overlap
    # every repeat's figures (the fields above are the best of them), in the order run
    prefill_ours_runs: tuple[float, ...] = ()
    prefill_hf_runs: tuple[float, ...] = ()
    decode_ours_runs: tuple[float, ...] = ()
    decode_hf_runs: tuple[float, ...] = ()


def _best_time(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    """The fastest of ``repeats`` calls (at least one) and the last call's result."""
    best = math.inf
    for _ in range(max(repeats, 1) - 1):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    start = time.perf_counter()
    result = fn()
    return min(best, time.perf_counter() - start), result


def last_level_cache_mb(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The size of the CPU's largest (highest-level) cache in MB, from sysfs; None if unknown."""
    best: tuple[int, int] | None = None  # (level, KiB)
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return None
    for entry in entries:
        if not entry.startswith("index"):
            continue
        try:
            with open(os.path.join(root, entry, "level")) as f:
                level = int(f.read().strip())
            with open(os.path.join(root, entry, "size")) as f:
                size = f.read().strip().upper()
        except (OSError, ValueError):
            continue
        units = {"K": 1, "M": 1024, "G": 1024 * 1024}
        if not size or size[-1] not in units or not size[:-1].isdigit():
            continue
        kib = int(size[:-1]) * units[size[-1]]
        if best is None or (level, kib) > best:
            best = (level, kib)
    return None if best is None else math.ceil(best[1] / 1024)


def measure_hardware(copy_mb: int, gemm_n: int, repeats: int = 5, cache_mb: int | None = None) -> Hardware:
    """Copy bandwidth, matrix read rate and fp32 GEMM rate of this process's threads (best
    of ``repeats``). The buffer is ``copy_mb`` or twice ``cache_mb`` (the last-level cache),
    whichever is larger: a buffer the cache holds would measure the cache, not the memory."""
    if cache_mb:
        copy_mb = max(copy_mb, 2 * cache_mb)
    src = torch.rand(copy_mb * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in before timing
    copy_s, _ = _best_time(lambda: dst.copy_(src), repeats)
    # a batch-1 decoding step is a chain of matrix-vector products: each reads its weights once
    side = int(math.isqrt(src.numel()))
    matrix, vector = src[: side * side].view(side, side), torch.rand(side)
    torch.mv(matrix, vector)
    gemv_s, _ = _best_time(lambda: torch.mv(matrix, vector), repeats)
    a, b = torch.rand(gemm_n, gemm_n), torch.rand(gemm_n, gemm_n)
    a @ b  # warm-up: thread pool, GEMM library dispatch
    gemm_s, _ = _best_time(lambda: a @ b, max(2, repeats // 2))
    a16, b16 = a.bfloat16(), b.bfloat16()
    a16 @ b16
    gemm_bf16_s, _ = _best_time(lambda: a16 @ b16, max(2, repeats // 2))
    return Hardware(
        copy_gb_s=2 * src.numel() * 4 / copy_s / 1e9,
        gemv_read_gb_s=side * side * 4 / gemv_s / 1e9,
        gemm_gflop_s=2 * gemm_n**3 / gemm_s / 1e9,
        gemm_bf16_gflop_s=2 * gemm_n**3 / gemm_bf16_s / 1e9,
        copy_mb=copy_mb,
        gemm_n=gemm_n,
        cache_mb=cache_mb,
    )


def ceilings(params: int, weight_bytes: int, batch: int, hw: Hardware, cache_bytes: float = 0.0) -> tuple[float, float]:
    """Decode tok/s bounds at ``batch``: (overlapped, serial) memory traffic and arithmetic.
    A step reads the weights once and ``cache_bytes`` of cached keys and values (all rows),
    at the better of the two measured rates (a bound must not be low)."""
    read_s = (weight_bytes + cache_bytes) / (hw.bandwidth_gb_s * 1e9)
    compute_s = 2 * params * batch / (hw.gemm_gflop_s * 1e9)
    return batch / max(read_s, compute_s), batch / (read_s + compute_s)


def weight_footprint(policy) -> tuple[int, int]:
    """(parameters, bytes) one decoding step of ``policy`` reads: every weight once (tied
    ones once), a LoRA policy's own adapter but not the other agents' adapters."""
    params = nbytes = 0
    mine = f".{policy.adapter_name}." if policy.adapter_name else None
    for name, p in policy.model.named_parameters():  # tied weights are listed once
        if mine is not None and "lora_" in name and mine not in name:
            continue
        params += p.numel()
        nbytes += p.numel() * p.element_size()
    return params, nbytes


def cache_bytes_per_token(policy) -> int:
    """Bytes of keys and values one token keeps in the cache, over all layers."""
    model = policy.model
    config = (model.get_base_model() if hasattr(model, "get_base_model") else model).config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element = next(model.parameters()).element_size()
    return config.num_hidden_layers * 2 * kv_heads * head_dim * element


def make_prompts(policy, count: int, tokens: int, seed: int = 0) -> list[str]:
    """``count`` distinct prompts of about ``tokens`` tokens each after the chat template."""
    tokenizer = policy.tokenizer
    prompts = []
    for i in range(count):
        rng = random.Random(seed * 100_003 + i)
        head = f"Request {i}: read these notes and write a short summary.\n"
        overhead = len(policy.encode_prompt(head))
        body_ids = tokenizer(" ".join(rng.choice(_WORDS) for _ in range(2 * tokens)), add_special_tokens=False)
        body = tokenizer.decode(body_ids["input_ids"][: max(tokens - overhead, 1)])
        prompts.append(head + body)
    return prompts


@contextlib.contextmanager
def eos_off(policy) -> Iterator[None]:
    """Our sampler without EOS for the duration: every row decodes the full budget."""
    saved = policy.eos_token_ids
    policy.eos_token_ids = [NO_EOS]
    try:
        yield
    finally:
        policy.eos_token_ids = saved


def _left_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = torch.tensor(list(row))
        mask[b, width - len(row) :] = 1
    return ids, mask


class Samplers:
    """Both samplers of one policy, each returning the new tokens it produced per row."""

    def __init__(self, policy, prompts: Sequence[str], temperature: float, top_k: int, top_p: float) -> None:
        self.policy = policy
        self.prompts = list(prompts)
        self.encoded = [policy.encode_prompt(p) for p in prompts]
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p

    def ours(self, batch: int, new_tokens: int) -> float:
        from comlrl_core.policy import GenerationConfig

        cfg = GenerationConfig(
            max_new_tokens=new_tokens, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p
        )
        with eos_off(self.policy):
            out = self.policy.generate(self.prompts[:batch], 1, cfg, seed=0)
        return sum(len(group[0].token_ids) for group in out) / batch

    def hf(self, batch: int, new_tokens: int) -> float:
        policy = self.policy
        ids, mask = _left_pad(self.encoded[:batch], policy.pad_token_id)
        sampling: dict[str, object] = {"do_sample": False}  # temperature 0: greedy, as ours
        if self.temperature > 0:
            sampling = {"do_sample": True, "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}
        policy.activate()  # LoRA: this agent's adapter
        torch.manual_seed(0)
        out = policy.model.generate(
            input_ids=ids.to(policy.device),
            attention_mask=mask.to(policy.device),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,  # suppresses EOS until the budget is spent
            pad_token_id=policy.pad_token_id,
            eos_token_id=policy.eos_token_ids,
            **sampling,
        )
        return float(out.shape[1] - ids.shape[1])


class ForwardClock:
    """Times the model's forward passes from inside a sampler's call: a pre-hook on the
    input embeddings (every forward starts there) records when each pass starts and how
    many positions it feeds. Passes of more than one position are the prefill; each
    one-position pass is a decoding step."""

    def __init__(self, policy) -> None:
        model = policy.model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: the transformers model
        self.embeddings: torch.nn.Module = base.get_input_embeddings()
        self.starts: list[tuple[float, int]] = []  # (time, positions fed) per forward pass

    def _record(self, module: torch.nn.Module, inputs: tuple) -> None:
        self.starts.append((time.perf_counter(), int(inputs[0].shape[-1])))

    def measure(self, call: Callable[[], float]) -> tuple[float, float, float]:
        """(prefill seconds, decode seconds, new tokens per row) of one call: the prefill runs
        from the call's start to the first decoding step, decoding from there to the end."""
        self.starts.clear()
        handle = self.embeddings.register_forward_pre_hook(self._record)
        try:
            start = time.perf_counter()
            per_row = call()
            end = time.perf_counter()
        finally:
            handle.remove()
        steps = [t for t, positions in self.starts if positions == 1]
        first_step = steps[0] if steps else end
        return first_step - start, end - first_step, per_row


@dataclass
class Runs:
    """One sampler's repeats at one batch size: prefill seconds and decode tok/s per call."""

    prefill_s: list[float]
    decode_tok_s: list[float]
    per_row: float = 0.0

    @property
    def best_prefill(self) -> float:
        return min(self.prefill_s) if self.prefill_s else math.nan

    @property
    def best_rate(self) -> float:
        rates = [r for r in self.decode_tok_s if not math.isnan(r)]
        return max(rates) if rates else math.nan  # NaN: nothing decoded after the first token


def one_call(
    clock: ForwardClock, sampler: Callable[[int, int], float], batch: int, new_tokens: int, into: Runs
) -> None:
    """Time one call of ``sampler`` and add its prefill time and decode rate to ``into``.
    The decode rate counts the tokens after the first."""
    prefill_s, decode_s, per_row = clock.measure(lambda: sampler(batch, new_tokens))
    after_first = (per_row - 1) * batch
    into.prefill_s.append(prefill_s)
    into.decode_tok_s.append(after_first / decode_s if decode_s > 0 and after_first > 0 else math.nan)
    into.per_row = per_row


def side_by_side(
    clock: ForwardClock,
    ours: Callable[[int, int], float],
    hf: Callable[[int, int], float],
    batch: int,
    new_tokens: int,
    repeats: int,
) -> tuple[Runs, Runs]:
    """Both samplers ``repeats`` times at ``batch``, alternating (ours first in even rounds,
    transformers' first in odd ones), so a machine whose speed drifts during the run
    weighs on both alike."""
    mine, theirs = Runs([], []), Runs([], [])
    for sampler, into in in_turns(max(repeats, 1), (ours, mine), (hf, theirs)):
        one_call(clock, sampler, batch, new_tokens, into)
    return mine, theirs


def in_turns(rounds: int, *sides: tuple[Callable[[int, int], float], Runs]) -> Iterator[tuple[Callable, Runs]]:
    """``rounds`` rounds of the ``sides`` (sampler, its runs), in their order in even rounds
    and reversed in odd ones."""
    for round_ in range(rounds):
        yield from sides if round_ % 2 == 0 else reversed(sides)


def prefill_pairs_within(budget_s: float, mine: Runs, theirs: Runs) -> int:
    """How many extra prefill-only pairs fit in ``budget_s`` at one batch size, from the
    repeats' best prefill of each side (at most ``MAX_PREFILL_PAIRS``)."""
    pair_s = mine.best_prefill + theirs.best_prefill
    if budget_s <= 0 or not pair_s > 0:
        return 0
    return min(MAX_PREFILL_PAIRS, int(budget_s // pair_s))


def more_prefill_pairs(
    clock: ForwardClock,
    ours: Callable[[int, int], float],
    hf: Callable[[int, int], float],
    batch: int,
    pairs: int,
    mine: Runs,
    theirs: Runs,
) -> None:
    """``pairs`` more calls of each sampler for two new tokens (the prefill and one decoding
    step, which ends the prefill's clock), taking turns as :func:`side_by_side` does; only
    their prefill times are kept, appended to ``mine`` and ``theirs``. One prefill is short
    at small batches, and a machine whose speed drifts by 10-30% makes a best of two or
    three a coin toss: the verdict reads the median of the paired ratios instead."""
    for sampler, into in in_turns(pairs, (ours, mine), (hf, theirs)):
        prefill_s, _, _ = clock.measure(lambda s=sampler: s(batch, 2))
        into.prefill_s.append(prefill_s)


def bench_policy(kind: str, policy, args: argparse.Namespace, hw: Hardware, log: Callable[[str], None]) -> list[Row]:
    policy.eval()
    samplers = Samplers(policy, make_prompts(policy, max(args.batches), args.prompt_tokens), *args.sampling)
    widths = [len(e) for e in samplers.encoded]
    log(f"  {kind}: prompts {min(widths)}-{max(widths)} tokens; warming up both samplers")
    samplers.ours(min(args.batches), 2)
    samplers.hf(min(args.batches), 2)
    params, weight_bytes = weight_footprint(policy)
    per_token = cache_bytes_per_token(policy)
    clock = ForwardClock(policy)
    rows = []
    for batch in args.batches:
        mine, theirs = side_by_side(clock, samplers.ours, samplers.hf, batch, args.new_tokens, args.repeats)
        pairs = prefill_pairs_within(args.prefill_budget_s, mine, theirs)
        more_prefill_pairs(clock, samplers.ours, samplers.hf, batch, pairs, mine, theirs)
        # every row reads its cached keys and values once a step; mean length over the call
        mean_length = sum(widths[:batch]) / batch + args.new_tokens / 2
        ceiling, serial = ceilings(params, weight_bytes, batch, hw, batch * mean_length * per_token)
        rows.append(
            Row(
                kind,
                batch,
                mine.best_prefill,
                theirs.best_prefill,
                mine.best_rate,
                theirs.best_rate,
                mine.per_row,
                theirs.per_row,
                ceiling,
                serial,
                tuple(mine.prefill_s),
                tuple(theirs.prefill_s),
                tuple(mine.decode_tok_s),
                tuple(theirs.decode_tok_s),
            )
        )
        log(f"  {kind} batch {batch}: decode ours {mine.best_rate:.1f} tok/s, HF {theirs.best_rate:.1f} tok/s")
    return rows


def build_policy(kind: str, model: str):
    """``full``: one fully trainable agent; ``lora``: a team of two LoRA agents on one
    shared base, of which agent 0 generates."""
    from comlrl_core.models.team import AgentSpec, Team

    if kind == "full":
        return Team.from_specs([AgentSpec(model, device="cpu")])[0]
    team = Team.from_specs([AgentSpec(model, lora=True, device="cpu") for _ in range(2)])
    assert team.shared_groups == [[0, 1]], "the two LoRA agents should share one base"
    return team[0]


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs > 0 else math.nan


def format_table(rows: Sequence[Row]) -> list[str]:
    head = (
        "| model | batch | prefill ours s | prefill HF s | prefill ours/HF | decode ours tok/s | "
        "decode HF tok/s | decode ours/HF | ceiling tok/s (overlap / serial) | ours % of ceiling | "
        "new tokens/row ours/HF |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        lines.append(
            f"| {r.kind} | {r.batch} | {r.prefill_ours_s:.2f} | {r.prefill_hf_s:.2f} | "
            f"{_ratio(r.prefill_ours_s, r.prefill_hf_s):.2f}x | {r.decode_ours_tok_s:.1f} | {r.decode_hf_tok_s:.1f} | "
            f"{_ratio(r.decode_ours_tok_s, r.decode_hf_tok_s):.2f}x | "
            f"{r.ceiling_tok_s:.0f} / {r.ceiling_serial_tok_s:.0f} | "
            f"{100 * _ratio(r.decode_ours_tok_s, r.ceiling_tok_s):.1f}% | {r.tokens_ours:g}/{r.tokens_hf:g} |"
        )
    return lines


def _span(values: Sequence[float], unit: str, digits: int = 2) -> str:
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}{unit}"


def median_interval(values: Sequence[float], coverage: float = 0.95) -> tuple[float, float, float] | None:
    """(median, low, high): the median of ``values`` and a distribution-free interval for
    it (order statistics k and n + 1 - k, k the largest with a binomial(n, 1/2) tail of at
    most (1 - coverage) / 2 below it); None when ``values`` are too few for that coverage
    (fewer than 6 at 95%)."""
    ordered = sorted(values)
    n = len(ordered)
    tail, k = 0.0, 0
    while True:  # P(Binomial(n, 1/2) <= k): the chance that the median lies below value k + 1
        tail += math.comb(n, k) / 2**n
        if tail > (1 - coverage) / 2:
            break
        k += 1
    if k == 0:
        return None
    middle = n // 2
    median = ordered[middle] if n % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return median, ordered[k - 1], ordered[n - k]


def paired_prefill_ratios(row: Row) -> list[float]:
    """Ours' prefill over transformers' call by call (the two take turns, so the i-th calls
    of each ran side by side)."""
    return [a / b for a, b in zip(row.prefill_ours_runs, row.prefill_hf_runs, strict=False) if b > 0]


def prefill_verdict(row: Row) -> str:
    """With at least 6 paired calls: ``met`` when the median of the paired ratios (ours'
    prefill over transformers') is at most 1, ``within noise`` when it is above 1 but its
    95% interval reaches 1, else ``not met``. With fewer: ``met`` when ours' best prefill is
    no slower than transformers' best; ``within noise`` when it is slower but the two sets
    of repeats overlap (ours' best no slower than transformers' slowest); else ``not met``."""
    paired = median_interval(paired_prefill_ratios(row))
    if paired is not None:
        median, low, _ = paired
        return "met" if median <= 1.0 else "within noise" if low <= 1.0 else "not met"
    if row.prefill_ours_s <= row.prefill_hf_s:
        return "met"
    if len(row.prefill_hf_runs) > 1 and row.prefill_ours_s <= max(row.prefill_hf_runs):
        return "within noise"
    return "not met"


def _prefill_figure(row: Row) -> float:
    """What the prefill verdict reads: the median paired ratio, or best over best."""
    paired = median_interval(paired_prefill_ratios(row))
    return paired[0] if paired is not None else _ratio(row.prefill_ours_s, row.prefill_hf_s)


def target_lines(rows: Sequence[Row]) -> list[str]:
    """The issue's targets per model kind, each marked met / not met / not measured, with
    the spread of the repeats where there were several."""
    lines = []
    for kind in dict.fromkeys(r.kind for r in rows):
        mine = {r.batch: r for r in rows if r.kind == kind}
        for batch, need in DECODE_TARGETS.items():
            label = f"{kind}: decode at batch {batch} >= {need:g}x transformers' generate"
            if batch not in mine:
                lines.append(f"- {label}: not measured (add {batch} to --batches)")
                continue
            row = mine[batch]
            got = _ratio(row.decode_ours_tok_s, row.decode_hf_tok_s)
            pairs = [_ratio(a, b) for a, b in zip(row.decode_ours_runs, row.decode_hf_runs, strict=True)]
            pairs = [p for p in pairs if not math.isnan(p)]
            spread = f" (best vs best; repeat by repeat {_span(pairs, 'x')})" if len(pairs) > 1 else ""
            lines.append(f"- {label}: {got:.2f}x{spread} -> {'met' if got >= need else 'not met'}")
        worst = max(mine.values(), key=_prefill_figure)
        got = _ratio(worst.prefill_ours_s, worst.prefill_hf_s)
        runs = ""
        if len(worst.prefill_ours_runs) > 1 and len(worst.prefill_hf_runs) > 1:
            runs = f"; repeats {_span(worst.prefill_ours_runs, ' s')} vs {_span(worst.prefill_hf_runs, ' s')}"
        ratios = paired_prefill_ratios(worst)
        paired = median_interval(ratios)
        if paired is not None:
            median, low, high = paired
            runs += f"; median of {len(ratios)} paired ratios {median:.2f}x, 95% interval {low:.2f}-{high:.2f}x"
        verdicts = {prefill_verdict(r) for r in mine.values()}  # every batch counts, not just the worst ratio
        verdict = next(v for v in ("not met", "within noise", "met") if v in verdicts)
        lines.append(
            f"- {kind}: prefill no slower than transformers' (every batch): worst {got:.2f}x its time "
            f"(batch {worst.batch}: {worst.prefill_ours_s:.2f} s vs {worst.prefill_hf_s:.2f} s{runs}) -> {verdict}"
        )
    return lines


def layout_lines() -> list[str]:
    """How our sampler's fp32 weight layout was chosen in this process (the environment's
    setting where one is given, and what was measured: the default measures), and whether
    its decoding attention and its 1-3-row products ran in the compiled kernels."""
    from comlrl_core.models.cpu import decode_attention, fp32_layout, row_products

    kernels = []
    for name, status in (
        ("decoding attention kernel", decode_attention.kernel_status()),
        (f"few-row product kernel (1-{row_products.MAX_ROWS} rows)", row_products.kernel_status()),
    ):
        kernels.append(f"our {name}: " + (status if status == "on" else f"off ({status})"))
    return [*("our fp32 " + line for line in fp32_layout.decision_lines()), *kernels]


def cpu_model() -> str:
    """``lscpu``'s model name (the figure docs quote), else /proc/cpuinfo's."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    from comlrl_core.models.precision import cpu_model_name

    return cpu_model_name()


def _bf16_hardware() -> str:
    from comlrl_core.models.precision import cpu_bf16_hardware

    return {True: "yes", False: "no", None: "unknown"}[cpu_bf16_hardware()]


def _batches(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--batches takes positive integers such as 1,4,16,64, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="tiny | smollm2 | any model source (default smollm2)")
    parser.add_argument("--kinds", default="full,lora", help="full, lora or both (comma-separated)")
    parser.add_argument("--batches", type=_batches, default=None, help="batch sizes (default 1,4,16,64)")
    parser.add_argument("--new-tokens", type=int, default=None, help="new tokens per row (default 96)")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="tokens per prompt (default 280)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="time each sampler this many times, alternating with the other; the table keeps the best, "
        "the target lines show the spread",
    )
    parser.add_argument(
        "--prefill-budget-s",
        type=float,
        default=None,
        help="seconds per batch size for extra prefill-only calls of both samplers, taking turns "
        f"(at most {MAX_PREFILL_PAIRS} pairs); with 6 or more pairs the prefill target reads the median "
        "of the paired ratios and its 95%% interval (default 20, --quick 0; 0: none)",
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0: off")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--quick", action="store_true", help="tiny random model, small sizes (a smoke run)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.model = MODELS.get(args.model or ("tiny" if quick else "smollm2"), args.model)
    args.batches = args.batches or ([1, 2] if quick else [1, 4, 16, 64])
    args.new_tokens = args.new_tokens or (6 if quick else 96)
    args.prompt_tokens = args.prompt_tokens or (40 if quick else 280)
    args.copy_mb, args.gemm_n = (16, 256) if quick else (256, 2048)
    if args.prefill_budget_s is None:
        args.prefill_budget_s = 0.0 if quick else 20.0
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not args.kinds or not set(args.kinds) <= set(KINDS):
        parser.error(f"--kinds takes full, lora or both, got {args.kinds}")
    if args.new_tokens < 2:
        parser.error("--new-tokens must be >= 2 (the first token belongs to the prefill)")
    args.sampling = (args.temperature, args.top_k, args.top_p)
    return args


def main(argv: Sequence[str] | None = None, log: Callable[[str], None] | None = None) -> list[Row]:
    args = parse_args(argv)
    log = log or (lambda line: print(line, flush=True))
    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    log("measuring the hardware ...")
    hw = measure_hardware(args.copy_mb, args.gemm_n, cache_mb=None if args.quick else last_level_cache_mb())
    rows: list[Row] = []
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # generation-flag notices, not results
    try:
        for kind in args.kinds:
            log(f"loading {args.model} ({kind}) ...")
            rows += bench_policy(kind, build_policy(kind, args.model), args, hw, log)
    finally:
        transformers.logging.set_verbosity(verbosity)
    load_after = os.getloadavg()

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    temperature, top_k, top_p = args.sampling
    busy = max(load_before[0], load_after[0]) > (os.cpu_count() or 1)
    cache_note = f"at least 2x the last-level cache of {hw.cache_mb} MB" if hw.cache_mb else "cache size not used"
    contention = " (other processes were competing for the CPU)" if busy else ""
    out = [
        "",
        f"# generate benchmark, {now}",
        f"CPU: {cpu_model()} (lscpu model name), {os.cpu_count()} logical CPUs; torch {torch.__version__}, "
        f"transformers {transformers.__version__}; threads {torch.get_num_threads()}",
        f"load average before / after: {load_before[0]:.1f} / {load_after[0]:.1f}{contention}",
        f"model {args.model}; full = one fully trainable agent, "
        "lora = agent 0 of a 2-agent LoRA team on one shared base",
        f"{max(args.batches)} distinct prompts of ~{args.prompt_tokens} tokens (batch B takes the first B); "
        f"{args.new_tokens} new tokens per row, EOS off in both; temperature {temperature:g}, top_k {top_k}, "
        f"top_p {top_p:g}; each sampler {args.repeats} time(s), taking turns; the table keeps the best",
        f"prefill: besides those calls, up to {MAX_PREFILL_PAIRS} more pairs of 2-token calls per batch within "
        f"{args.prefill_budget_s:g} s, taking turns; the prefill target reads the median of the paired ratios "
        "(with its 95% interval) where there are 6 pairs or more, else best vs best",
        f"hardware: copy bandwidth {hw.copy_gb_s:.1f} GB/s ({hw.copy_mb} MB fp32 copy, read + write; "
        f"{cache_note}), "
        f"matrix read {hw.gemv_read_gb_s:.1f} GB/s (fp32 matrix-vector product of the same bytes), "
        f"fp32 GEMM {hw.gemm_gflop_s:.1f} GFLOP/s ({hw.gemm_n}^3); the same in bf16 {hw.gemm_bf16_gflop_s:.1f} "
        f"GFLOP/s ({hw.gemm_bf16_gflop_s / hw.gemm_gflop_s:.2f}x; bf16 hardware: {_bf16_hardware()})",
        f"ceiling at batch B: B / max((weight bytes + B rows' cached keys and values) / bandwidth, "
        f"2 * params * B / GEMM rate); serial: the sum; "
        f"bandwidth = the better of copy and matrix read ({hw.bandwidth_gb_s:.1f} GB/s)",
        *layout_lines(),
        "",
        *format_table(rows),
        "",
        "Targets (issue 15):",
        *target_lines(rows),
    ]
    for line in out:
        log(line)
    return rows


if __name__ == "__main__":
    main()
