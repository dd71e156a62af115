"""A decoding step compiled by torch's inductor, against the same step run op by op.

Issue 15's batch-16 target (decode at 2x transformers' ``generate``) asks for a step
that the eager lean step (``comlrl_core.models.lean_decode``) has not reached. Its profile
leaves ~30 ms of a ~100 ms step outside the matrix products and the attention: ~1,550
small ops and the Python between them. A compiled step is what would remove those, so
this script measures what it gains, in ONE process, on the same weights and cache:

- ``sampler``: our sampler's own decoding step (``policy.generate``, timed from inside
  the call as ``bench/generate.py`` does), for reference;
- ``eager``: one function per layer (RMSNorm, rotary, the in-place cache write,
  grouped-query attention over the token-contiguous keys, SiLU-gated MLP), each product
  on a oneDNN-packed weight (q/k/v stacked and gate/up stacked, as the sampler packs them);
- ``compiled``: the same function through ``torch.compile(dynamic=True)``: inductor fuses
  the small ops into C++ kernels; the products stay oneDNN's (an opaque custom op), the
  attention's two batched products stay ``baddbmm``/``bmm``;
- ``compiled, attention fused``: the attention written as reductions, so inductor
  generates it too (no batched products);
- the floors: the step's products alone (``products``), its attention alone
  (``attention``), on the same shapes.

Eager and compiled steps take turns in each repeat. Compiled and eager logits after the
warm-up steps are compared (they differ only by summation order). Needs a C++ compiler
(inductor builds its kernels with it)::

    .venv/bin/python bench/compiled_step.py --batch 16 --repeats 4
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/generate.py
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import generate as gen_bench  # noqa: E402

from comlrl_core.models.cpu import fp32_layout  # noqa: E402

# per layer, the packed products of one step: [qkv, o, gate_up, down] (set by Step)
_PRODUCTS: list[list[Callable[[torch.Tensor], torch.Tensor]]] = []


@torch.library.custom_op("comlrl_bench::packed_product", mutates_args=())
def packed_product(x: torch.Tensor, layer: torch.Tensor, which: int, out_features: int) -> torch.Tensor:
    """Layer ``layer``'s product ``which`` on ``x`` (opaque to the compiler; ``layer`` is a
    tensor so that every layer shares one compiled graph)."""
    return _PRODUCTS[int(layer)][which](x)


@packed_product.register_fake
def _(x: torch.Tensor, layer: torch.Tensor, which: int, out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)


class Step:
    """One decoding step over raw weights, a preallocated cache and packed products."""

    def __init__(self, model: Any, rows: int) -> None:
        inner = model.model
        config = model.config
        self.inner = inner
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.hidden_size // self.heads
        self.hidden, self.intermediate = config.hidden_size, config.intermediate_size
        self.eps = inner.layers[0].input_layernorm.variance_epsilon
        self.scaling = inner.layers[0].self_attn.scaling
        _PRODUCTS.clear()
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            weights = (
                torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
                attn.o_proj.weight,
                torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
                mlp.down_proj.weight,
            )
            packed = [fp32_layout.onednn_pack(w.detach(), rows) for w in weights]
            _PRODUCTS.append([lambda x, p=p: fp32_layout.onednn_linear(x, p, None) for p in packed])
        self.head = fp32_layout.onednn_pack(model.get_output_embeddings().weight.detach(), rows)
        self.layer_ids = [torch.tensor(i) for i in range(len(_PRODUCTS))]
        self.norms = [
            (lay.input_layernorm.weight.detach(), lay.post_attention_layernorm.weight.detach()) for lay in inner.layers
        ]
        self.fused_attention = False

    def rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def layer(self, hidden, layer_id, norms, cos, signed_sin, bias, key_store, value_store, product):
        """One layer; ``key_store [B, Hkv, D, T]`` and ``value_store [B, Hkv, T, D]`` gain
        this token at column ``bias.shape[-1] - 1`` (the cache length, from the mask)."""
        rows, heads, kv_heads, dim = hidden.shape[0], self.heads, self.kv_heads, self.head_dim
        length = bias.shape[-1]
        half = dim // 2
        qkv = product(self.rms(hidden, norms[0]), layer_id, 0, (heads + 2 * kv_heads) * dim)
        q = qkv[:, : heads * dim].view(rows, heads, dim)
        k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(rows, kv_heads, dim)
        v = qkv[:, (heads + kv_heads) * dim :].view(rows, kv_heads, dim)
        q = q * cos + q.roll(half, dims=-1) * signed_sin
        k = k * cos + k.roll(half, dims=-1) * signed_sin
        # narrow(), not indexing: a symbolic index would make the compiler specialise on it
        key_store.narrow(3, length - 1, 1).copy_(k[..., None])
        value_store.narrow(2, length - 1, 1).copy_(v[:, :, None])
        attended = self.attend(q.reshape(rows * kv_heads, heads // kv_heads, dim), key_store, value_store, bias)
        hidden = hidden + product(attended.reshape(rows, heads * dim), layer_id, 1, self.hidden)
        gate_up = product(self.rms(hidden, norms[1]), layer_id, 2, 2 * self.intermediate)
        gated = F.silu(gate_up[:, : self.intermediate]) * gate_up[:, self.intermediate :]
        return hidden + product(gated, layer_id, 3, self.hidden)

    def attend(self, grouped, key_store, value_store, bias) -> torch.Tensor:
        """Grouped-query attention of ``grouped [B * Hkv, groups, D]`` over the cache's first
        ``bias.shape[-1]`` tokens: ``[B * Hkv, groups, D]``."""
        rows_heads, dim, length = grouped.shape[0], self.head_dim, bias.shape[-1]
        keys = key_store[..., :length].reshape(rows_heads, dim, length)  # views of the stores
        values = value_store[:, :, :length].reshape(rows_heads, length, dim)
        if self.fused_attention:
            scores = (grouped[..., None] * keys[:, None]).sum(2) * self.scaling + bias
            return (scores.softmax(-1)[..., None] * values[:, None]).sum(2)
        scores = torch.baddbmm(bias, grouped, keys, alpha=self.scaling)
        return torch.bmm(scores.softmax(-1), values)

    def run(
        self, layer_fn, product, cache, start: int, steps: int, ids: torch.Tensor | None = None
    ) -> tuple[list[float], torch.Tensor]:
        """``steps`` greedy steps from cache length ``start`` (every row's tokens so far, no
        padding), the first feeding ``ids`` (default: fixed tokens): seconds per step, last logits."""
        keys, values = cache
        rows = keys[0].shape[0]
        if ids is None:
            ids = (torch.arange(rows) * 37 + 100) % self.inner.embed_tokens.num_embeddings
        times, logits = [], torch.empty(0)
        for step in range(steps):
            began = time.perf_counter()
            position = start + step
            hidden = self.inner.embed_tokens(ids)
            cos, sin = self.inner.rotary_emb(hidden[:, None], torch.full((rows, 1), position))
            half = cos.shape[-1] // 2
            signed_sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
            bias = torch.zeros(rows * self.kv_heads, 1, position + 1)
            for index, layer_id in enumerate(self.layer_ids):
                hidden = layer_fn(
                    hidden, layer_id, self.norms[index], cos, signed_sin, bias, keys[index], values[index], product
                )
            logits = fp32_layout.onednn_linear(self.rms(hidden, self.inner.norm.weight.detach()), self.head, None)
            ids = logits.argmax(-1)
            times.append(time.perf_counter() - began)
        return times, logits

    def cache(self, rows: int, filled: int, room: int, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        generator = torch.Generator().manual_seed(seed)
        shape = (rows, self.kv_heads, filled + room, self.head_dim)
        keys = [torch.randn(shape, generator=generator).transpose(-1, -2).contiguous() for _ in _PRODUCTS]
        values = [torch.randn(shape, generator=generator) for _ in _PRODUCTS]
        return keys, values

    def floors(self, rows: int, filled: int, repeats: int) -> tuple[float, float]:
        """Milliseconds of the step's products alone and of its attention alone (best of repeats)."""
        narrow, wide = torch.randn(rows, self.hidden), torch.randn(rows, self.intermediate)
        keys, values = self.cache(rows, filled, 1)
        bias = torch.zeros(rows * self.kv_heads, 1, filled)
        grouped = torch.randn(rows * self.kv_heads, self.heads // self.kv_heads, self.head_dim)

        def products() -> None:
            for qkv, o, gate_up, down in _PRODUCTS:
                qkv(narrow), o(narrow), gate_up(narrow), down(wide)
            fp32_layout.onednn_linear(narrow, self.head, None)

        def attention() -> None:
            for key_store, value_store in zip(keys, values, strict=True):
                self.attend(grouped, key_store, value_store, bias)

        best = []
        for fn in (products, attention):
            times = []
            for _ in range(repeats):
                began = time.perf_counter()
                fn()
                times.append(time.perf_counter() - began)
            best.append(min(times) * 1e3)
        return best[0], best[1]


def eager_product(x: torch.Tensor, layer: torch.Tensor, which: int, out_features: int) -> torch.Tensor:
    """``packed_product`` called directly (no custom-op dispatch), for the eager step."""
    return _PRODUCTS[int(layer)][which](x)


def sampler_step_ms(args: argparse.Namespace) -> list[float]:
    """Our sampler's decoding step (ms) at the same batch, distinct prompts, per repeat."""
    policy = gen_bench.build_policy("full", args.model)
    prompts = gen_bench.make_prompts(policy, args.batch, args.prompt_tokens)
    samplers = gen_bench.Samplers(policy, prompts, 1.0, 50, 0.95)
    clock = gen_bench.ForwardClock(policy)
    out = []
    for _ in range(args.repeats):
        _, decode_s, per_row = clock.measure(lambda: samplers.ours(args.batch, args.steps))
        out.append(decode_s / (per_row - 1) * 1e3)
    return out


def _span(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=280, help="cache length the steps start from")
    parser.add_argument("--steps", type=int, default=48, help="decoding steps per timed call")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if compiler is None:
        print("no C++ compiler found (inductor needs one to build its CPU kernels)")
        return 2
    torch.set_num_threads(args.threads)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# compiled decoding step, {now}")
    print(f"CPU: {gen_bench.cpu_model()}; torch {torch.__version__}; threads {args.threads}; C++ compiler {compiler}")
    print(f"batch {args.batch}, cache from {args.prompt_tokens} tokens, {args.steps} steps a call", end="")
    print(f", {args.repeats} repeats\n")
    sampler = sampler_step_ms(args)

    from comlrl_core.models.model_source import load_causal_lm, resolve_model_source

    model = load_causal_lm(resolve_model_source(args.model), dtype=torch.float32).eval()
    step = Step(model, args.batch)
    compiled = torch.compile(step.layer, dynamic=True)
    room = args.steps + 8

    def fresh():
        return step.cache(args.batch, args.prompt_tokens, room)

    results: dict[str, list[float]] = {"eager": [], "compiled": [], "compiled, attention fused": []}
    with torch.inference_mode():
        began = time.perf_counter()
        _, compiled_logits = step.run(compiled, packed_product, fresh(), args.prompt_tokens, 3)
        compile_s = time.perf_counter() - began
        _, eager_logits = step.run(step.layer, eager_product, fresh(), args.prompt_tokens, 3)
        gap = float((compiled_logits - eager_logits).abs().max() / eager_logits.abs().max())
        for repeat in range(args.repeats):
            order = ["eager", "compiled"] if repeat % 2 == 0 else ["compiled", "eager"]
            for name in order:
                fn, product = (step.layer, eager_product) if name == "eager" else (compiled, packed_product)
                times, _ = step.run(fn, product, fresh(), args.prompt_tokens, args.steps)
                results[name].append(statistics.median(times) * 1e3)
        products_ms, attention_ms = step.floors(args.batch, args.prompt_tokens + args.steps // 2, max(args.repeats, 5))
        step.fused_attention = True
        fused = torch.compile(step.layer, dynamic=True)
        step.run(fused, packed_product, fresh(), args.prompt_tokens, 3)
        for _ in range(args.repeats):
            times, _ = step.run(fused, packed_product, fresh(), args.prompt_tokens, args.steps)
            results["compiled, attention fused"].append(statistics.median(times) * 1e3)

    print("| step | ms a step, median (range over repeats) |")
    print("|---|---|")
    print(f"| our sampler (`policy.generate`) | {_span(sampler)} |")
    for name, values in results.items():
        print(f"| {name} | {_span(values)} |")
    print(f"| floor: products alone (best) | {products_ms:.1f} |")
    print(f"| floor: attention alone (best, {args.prompt_tokens + args.steps // 2} tokens) | {attention_ms:.1f} |")
    print(
        f"\nfirst compile and 3 steps: {compile_s:.1f} s; compiled vs eager logits after 3 steps: {gap:.1e} (relative)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
