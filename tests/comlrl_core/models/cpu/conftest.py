"""Shared helpers of the CPU packing and kernel tests."""

from __future__ import annotations

from typing import Callable

import pytest

from comlrl_core.models.cpu import decode_attention, fp32_layout, packed_linear, row_products


@pytest.fixture(autouse=True)
def fresh_layout_state(monkeypatch):
    """Each test starts without layout measurements (as a fresh process does) and leaves
    oneDNN switched on for the next one, whatever it broke."""
    monkeypatch.setattr(fp32_layout, "_measured", {})
    yield
    packed_linear._broken.discard(packed_linear.FP32_ONEDNN)


@pytest.fixture
def record_onednn_rows(monkeypatch) -> Callable[[], list[int]]:
    """Call it to start recording: returns the list that gets the row count of every oneDNN
    product (``fp32_layout.onednn_linear``) from then on."""

    def start() -> list[int]:
        rows: list[int] = []
        real = fp32_layout.onednn_linear

        def recording(x, packed, bias):
            rows.append(x.numel() // x.shape[-1])
            return real(x, packed, bias)

        monkeypatch.setattr(fp32_layout, "onednn_linear", recording)
        return rows

    return start


@pytest.fixture
def fresh_kernel(monkeypatch, tmp_path):
    """A process that has not looked for the compiled kernels yet, compiling into an empty
    cache (``tmp_path``); the real (cached) kernels come back afterwards."""
    monkeypatch.setenv("COMLRL_CACHE", str(tmp_path))
    kernels = (decode_attention._kernel, row_products._kernel)
    for kernel in kernels:
        kernel.cache_clear()
    yield tmp_path
    for kernel in kernels:
        kernel.cache_clear()
