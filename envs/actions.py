"""Turning whatever a policy produced into a clean completion string.

Garbage in is normal for text environments: models emit empty strings, runaway
megabyte outputs, lone UTF-16 surrogates or bytes, and callers pass ``None`` or a
``Completion`` object. :func:`sanitize_action` never raises; it returns usable text plus
short diagnostics that the environment reports in ``infos[agent]["action_diagnostics"]``.
"""

from __future__ import annotations

from typing import Any

# Control characters other than tab/newline/carriage return make text "binary-looking".
_ALLOWED_CONTROLS = frozenset("\t\n\r")
_BINARY_FRACTION = 0.1


def _count_controls(text: str, limit: int = 100_000) -> int:
    sample = text[:limit]
    return sum(1 for ch in sample if (ord(ch) < 32 or ord(ch) == 127) and ch not in _ALLOWED_CONTROLS)


def sanitize_action(value: Any, char_limit: int) -> tuple[str, list[str]]:
    """Return ``(text, diagnostics)`` for one agent's action.

    * ``str`` -- kept; lone surrogates (invalid UTF-8) are replaced with ``"?"``.
    * objects with a ``str`` attribute ``text`` (e.g. ``comlrl_core.Completion``) -- their text.
    * ``bytes`` / ``bytearray`` -- decoded as UTF-8 with replacement characters.
    * ``None`` or anything else -- scored as the empty string.

    Text longer than ``char_limit`` characters is cut to ``char_limit``.
    """
    diagnostics: list[str] = []
    if isinstance(value, str):
        text = str(value)  # drops str subclasses such as numpy.str_
    elif isinstance(getattr(value, "text", None), str):
        text = value.text
    elif isinstance(value, (bytes, bytearray)):
        text = bytes(value).decode("utf-8", errors="replace")
        diagnostics.append("bytes_decoded: the action was bytes, decoded as UTF-8 with replacement")
    elif value is None:
        text = ""
        diagnostics.append("missing_action: no completion was given; scored as empty")
    else:
        text = ""
        diagnostics.append(f"non_str_action: got {type(value).__name__}, not str; scored as empty")

    if len(text) > char_limit:
        diagnostics.append(f"truncated: {len(text)} characters cut to {char_limit}")
        text = text[:char_limit]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", errors="replace").decode("utf-8")
        diagnostics.append("invalid_utf8: lone surrogates replaced with '?'")
    if not text.strip():
        if "missing_action" not in " ".join(diagnostics):
            diagnostics.append("empty_action: the completion is empty or whitespace only")
    else:
        controls = _count_controls(text)
        if controls > _BINARY_FRACTION * min(len(text), 100_000):
            diagnostics.append(f"binary_looking: {controls} control characters")
    return text, diagnostics
