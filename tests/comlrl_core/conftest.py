"""Shared fixtures for comlrl_core tests: the tiny offline model and read-only policies."""

from __future__ import annotations

import pytest

from comlrl_core.models.tiny import tiny_model_path


@pytest.fixture(scope="session")
def tiny_path() -> str:
    """The tiny random Llama folder (built once, cached under ~/.cache/comlrl)."""
    return tiny_model_path()


@pytest.fixture(scope="session")
def tiny_policy(tiny_path):
    """A full-weight tiny policy on CPU. Read-only: tests that train build their own."""
    from comlrl_core.models.hf_policy import TransformersPolicy

    return TransformersPolicy.from_source(tiny_path, device="cpu")
