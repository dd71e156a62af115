"""The tiny random model's cache folder: one per recipe and transformers major version."""

from __future__ import annotations

import transformers

from comlrl_core.models import tiny


def test_cache_key_follows_the_transformers_major_version(monkeypatch) -> None:
    here = tiny._recipe_key()
    major = int(transformers.__version__.split(".")[0])
    monkeypatch.setattr(transformers, "__version__", f"{major + 1}.0.0")
    assert tiny._recipe_key() != here
    monkeypatch.setattr(transformers, "__version__", f"{major}.99.0")
    assert tiny._recipe_key() == here  # minor releases share the folder
