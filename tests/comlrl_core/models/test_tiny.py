"""The tiny random model's cache folder: one per recipe and transformers major version."""

from __future__ import annotations

import transformers

from comlrl_core.models import tiny


def test_cache_key_follows_the_transformers_major_version() -> None:
    major = int(transformers.__version__.split(".")[0])
    here = tiny._recipe_key()
    assert tiny._recipe_key(transformers.__version__) == here
    assert tiny._recipe_key(f"{major + 1}.0.0") != here
    assert tiny._recipe_key(f"{major}.99.0") == here  # minor releases share the folder
