"""Suite-wide set-up.

Tests run with ``--import-mode=importlib`` so that test files in different folders may
share a basename (``tests/learners/magrpo/test_losses.py`` and
``tests/learners/actor_critic/test_losses.py``). In that mode pytest does not put test
folders on ``sys.path``; the folders are added here so each folder's helper module
(``fake_llm_server``, ``code_fakes``, ``magrpo_fakes``, ...) stays importable by name.
Helper module names must therefore be unique across the suite. Only folders that hold
such a helper are added: a bare ``tests/sandbox`` on the path would shadow the real
``sandbox`` package.
"""

import os
import sys

_TESTS = os.path.dirname(os.path.abspath(__file__))
for _dirpath, _dirnames, _filenames in os.walk(_TESTS):
    _dirnames[:] = [d for d in _dirnames if not d.startswith((".", "__"))]
    _helpers = [f for f in _filenames if f.endswith(".py") and not f.startswith(("test_", "conftest"))]
    if _helpers and _dirpath not in sys.path:
        sys.path.append(_dirpath)

import pytest  # noqa: E402 - after the path set-up above


@pytest.fixture(autouse=True)
def _no_fp32_layout_record(monkeypatch):
    """Tests measure for themselves: no layout measurement read from or written to the
    user's cache (comlrl_core.models.cpu.layout_record); its own tests point it at a file."""
    monkeypatch.setenv("COMLRL_FP32_LAYOUT_RECORD", "off")
