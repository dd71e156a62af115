"""Tiny random-weight models for tests, demos and benchmarks -- built offline.

Public API::

    tiny_model_path(cache_dir: str | None = None) -> str
        Folder of a tiny random-weight ``LlamaForCausalLM`` (hidden 64, 2 layers, 4 heads)
        with a real byte-level BPE tokenizer (trained offline on a generated corpus) that
        has ``<s>`` / ``<|im_end|>`` (EOS) / ``<pad>`` tokens and a ChatML-style chat
        template. Created once, deterministically, under ``~/.cache/comlrl`` (or
        ``cache_dir``, or ``$COMLRL_CACHE``), written atomically; later calls just
        return the path. Also reachable as the model alias ``"tiny-random"``.

    TINY_CONFIG: dict  -- the LlamaConfig fields used.

Why a real tokenizer: the code paths we test (chat templates, left padding, EOS
handling, decoding) are exactly the ones a fake tokenizer would hide.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

# Bump when the recipe changes: it is part of the cache folder name.
_RECIPE_VERSION = 1

TINY_CONFIG: dict = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.1,  # peakier than the default 0.02: greedy paths vary by prompt
    "tie_word_embeddings": True,
}
_VOCAB_SIZE = 512
_SEED = 1234
_SPECIAL_TOKENS = ["<pad>", "<s>", "<|im_start|>", "<|im_end|>"]
_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _default_cache_root() -> str:
    root = os.environ.get("COMLRL_CACHE")
    if root:
        return root
    return os.path.join(os.path.expanduser("~"), ".cache", "comlrl")


def _recipe_key(transformers_version: str | None = None) -> str:
    if transformers_version is None:
        import transformers

        transformers_version = transformers.__version__
    # a folder saved by one transformers major version may not load in another (tokenizer classes)
    transformers_major = transformers_version.split(".")[0]
    recipe = json.dumps(
        [_RECIPE_VERSION, TINY_CONFIG, _VOCAB_SIZE, _SEED, _SPECIAL_TOKENS, _CHAT_TEMPLATE, transformers_major],
        sort_keys=True,
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def _corpus() -> list[str]:
    """A small deterministic corpus of English-ish prose and Python code."""
    words = (
        "the a team of agents writes code that passes tests each agent helps the other "
        "function returns value list string number sum sort reverse count word line file "
        "cooperate reward learn policy model token prompt answer question story summary"
    ).split()
    code = [
        "def add(a, b):\n    return a + b\n",
        "def is_even(n: int) -> bool:\n    return n % 2 == 0\n",
        "for i in range(10):\n    print(i * i)\n",
        "class Counter:\n    def __init__(self):\n        self.count = 0\n",
        "assert candidate([1, 2, 3]) == 6\n",
        "import math\nresult = [math.sqrt(x) for x in values if x > 0]\n",
        "if __name__ == '__main__':\n    main()\n",
        "while left < right:\n    mid = (left + right) // 2\n",
    ]
    lines: list[str] = []
    # A fixed linear-congruential walk instead of `random`, so the corpus never depends
    # on the Python version's RNG implementation.
    state = 12345
    for i in range(600):
        state = (1103515245 * state + 12345) % (2**31)
        n = 4 + state % 12
        sentence = []
        for _ in range(n):
            state = (1103515245 * state + 12345) % (2**31)
            sentence.append(words[state % len(words)])
        lines.append(" ".join(sentence).capitalize() + ".")
        lines.append(code[i % len(code)])
    lines.append("0123456789 +-*/=<>()[]{}:;,.'\"!?#_\\n\\t")
    return lines


def _build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        special_tokens=_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",
    )
    tokenizer.chat_template = _CHAT_TEMPLATE
    return tokenizer


def _build_model(tokenizer):
    import torch
    from transformers import GenerationConfig as HFGenerationConfig
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TINY_CONFIG,
    )
    # fork_rng: deterministic weights without touching the caller's global RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        model = LlamaForCausalLM(config)
    model.generation_config = HFGenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def tiny_model_path(cache_dir: str | None = None) -> str:
    """Path of the tiny random-weight Llama + tokenizer folder, created on first use."""
    root = cache_dir if cache_dir is not None else _default_cache_root()
    target = os.path.join(root, f"tiny-random-llama-{_recipe_key()}")
    if os.path.isfile(os.path.join(target, "config.json")):
        return target
    os.makedirs(root, exist_ok=True)
    # Build in a private temp folder, then rename: concurrent callers (pytest-xdist, two
    # processes) never see a half-written folder; the loser of the race discards its copy.
    staging = tempfile.mkdtemp(prefix=".tiny-building-", dir=root)
    os.chmod(staging, 0o755)  # mkdtemp makes it private; the cache is shared
    try:
        tokenizer = _build_tokenizer()
        model = _build_model(tokenizer)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            os.rename(staging, target)
        except OSError:
            if not os.path.isfile(os.path.join(target, "config.json")):
                raise
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging, ignore_errors=True)
    return target
