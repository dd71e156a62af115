"""bench/compiled_step.py: its hand-written decoding step computes the model's own step, and
the script runs end to end on the tiny model (eager and compiled steps, their logits
compared). Only structure and agreement are asserted, never the speed."""

from __future__ import annotations

import re
import shutil

import pytest
import torch
from bench_loader import load_bench_script
from onednn_marks import needs_onednn

from comlrl_core.models.model_source import load_causal_lm, resolve_model_source


@pytest.fixture(scope="module")
def bench():
    yield from load_bench_script("compiled_step")


@needs_onednn
def test_the_eager_step_gives_the_models_next_token_logits(bench):
    model = load_causal_lm(resolve_model_source("tiny-random"), dtype=torch.float32).eval()
    rows, prompt_tokens, room = 3, 11, 4
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (rows, prompt_tokens), generator=torch.Generator().manual_seed(0))
    next_ids = torch.tensor([5, 17, 2])
    step = bench.Step(model, rows)
    with torch.inference_mode():
        cache = model(prompt, use_cache=True).past_key_values
        expected = model(torch.cat([prompt, next_ids[:, None]], dim=1)).logits[:, -1]
        keys, values = step.cache(rows, prompt_tokens, room)
        for index in range(len(keys)):
            layer_keys, layer_values = cache.layers[index].keys, cache.layers[index].values  # [B, Hkv, T, D]
            keys[index][..., :prompt_tokens] = layer_keys.transpose(-1, -2)
            values[index][:, :, :prompt_tokens] = layer_values
        _, logits = step.run(step.layer, bench.eager_product, (keys, values), prompt_tokens, 1, ids=next_ids)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    # the step wrote this token's keys into the stored layout, where the next step reads them
    assert keys[0][..., prompt_tokens].abs().sum() > 0


@needs_onednn
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor needs a C++ compiler")
def test_the_bench_times_every_step_and_the_compiled_logits_agree(bench, capsys):
    code = bench.main(
        ["--model", "tiny-random", "--batch", "2", "--prompt-tokens", "12", "--steps", "3", "--repeats", "1"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "CPU: " in out and "UTC" in out
    names = [
        line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ") and "ms a step" not in line
    ]
    assert names == [
        "our sampler (`policy.generate`)",
        "eager",
        "compiled",
        "compiled, attention fused",
        "floor: products alone (best)",
        "floor: attention alone (best, 13 tokens)",
    ]
    gap = float(re.search(r"logits after 3 steps: ([0-9.e+-]+)", out).group(1))
    assert gap < 1e-3
