"""Shared helpers of the CPU packing tests."""

from __future__ import annotations

from typing import Callable

import pytest

from comlrl_core.models.cpu import fp32_layout, packed_linear


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
