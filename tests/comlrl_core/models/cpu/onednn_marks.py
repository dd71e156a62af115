"""The skip mark of tests that need oneDNN's fp32 linear (model, packing and bench tests)."""

from __future__ import annotations

import pytest

from comlrl_core.models.cpu import packed_linear

needs_onednn = pytest.mark.skipif(
    not packed_linear._available(packed_linear.FP32_ONEDNN), reason="no oneDNN fp32 linear in this torch build"
)
