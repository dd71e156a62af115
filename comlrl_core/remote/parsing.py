"""Pure helpers of the remote-model client's wire formats: reading completions out of JSON,
classifying failed statuses (with ``Retry-After``), and the generic format's request
templates. No I/O here; :mod:`comlrl_core.remote.formats` does the requests.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from typing import Any, Mapping

from comlrl_core.remote.types import BackendFailure

# Statuses worth retrying: rate limits, request timeouts, lock conflicts, server errors.
_TRANSIENT_STATUSES = frozenset({408, 409, 429})


# -- response parsing ------------------------------------------------------------------


def extract_field(data: Any, path: str) -> Any:
    """Follow a dotted ``path`` into decoded JSON.

    Integer segments index lists, ``*`` maps the rest of the path over every element of
    a list (results are flattened one level). A missing step raises a response failure
    that names the full path and the step that was missing.
    """
    segments = path.split(".")

    def walk(node: Any, depth: int) -> Any:
        if depth == len(segments):
            return node
        seg = segments[depth]
        where = ".".join(segments[: depth + 1])
        if seg == "*":
            if not isinstance(node, list):
                raise _missing(path, where, f"expected a list, got {type(node).__name__}")
            out: list[Any] = []
            for item in node:
                value = walk(item, depth + 1)
                out.extend(value if isinstance(value, list) else [value])
            return out
        if isinstance(node, list):
            if not (seg.lstrip("-").isdigit() and -len(node) <= int(seg) < len(node)):
                raise _missing(path, where, f"the list has {len(node)} item(s)")
            return walk(node[int(seg)], depth + 1)
        if isinstance(node, dict):
            if seg not in node:
                keys = ", ".join(sorted(map(str, node))[:10]) or "none"
                raise _missing(path, where, f"present keys: {keys}")
            return walk(node[seg], depth + 1)
        raise _missing(path, where, f"cannot index into {type(node).__name__}")

    return walk(data, 0)


def _missing(path: str, where: str, detail: str) -> BackendFailure:
    return BackendFailure("response", f"expected field {path!r} in the response body; missing at {where!r} ({detail})")


def texts_at(data: Any, path: str) -> list[str]:
    """The completion texts at ``path``: a string is one text, a list of strings is many."""
    value = extract_field(data, path)
    values = value if isinstance(value, list) else [value]
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise BackendFailure(
                "response", f"expected text at response field {path!r}, item {i} is {type(v).__name__}"
            )
    if not values:
        raise BackendFailure("response", f"response field {path!r} holds no completions")
    return values


def parse_json_body(raw: bytes | str, status: int) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        snippet = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw)[:200]
        raise BackendFailure(
            "response", f"response body is not valid JSON (status {status}): {snippet!r}", status=status
        ) from None


# -- errors ----------------------------------------------------------------------------


def error_message_from_body(body: Any) -> str:
    """The server's own error message, from the usual places, else a short body excerpt."""
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return body.strip()[:500]
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, str):
            return err[:500]
        if isinstance(err, dict):
            for key in ("message", "detail", "error"):
                if isinstance(err.get(key), str):
                    return err[key][:500]
        for key in ("message", "detail"):
            if isinstance(body.get(key), str):
                return body[key][:500]
    return json.dumps(body)[:500] if body is not None else ""


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date)."""
    if not headers:
        return None
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    if "retry-after-ms" in lowered:
        try:
            return max(0.0, float(lowered["retry-after-ms"]) / 1000.0)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def failure_from_status(status: int, body: Any, headers: Mapping[str, str] | None) -> BackendFailure:
    message = error_message_from_body(body)
    text = f"HTTP {status}" + (f": {message}" if message else "")
    if status in _TRANSIENT_STATUSES or status >= 500:
        return BackendFailure("transient", text, status=status, retry_after_s=parse_retry_after(headers))
    if 400 <= status < 500:
        return BackendFailure("request", text, status=status)
    return BackendFailure("response", f"unexpected status: {text}", status=status)


# -- request templates (generic format) ------------------------------------------------

_PLACEHOLDER = re.compile(r"\{(prompt|n|model|max_tokens|temperature|top_p|system_prompt|agent_idx|batch_item)\}")


def render_template(template: Any, values: Mapping[str, Any]) -> Any:
    """Substitute ``{prompt}``-style placeholders in a JSON-like template.

    A string that is exactly one placeholder takes the value with its type (``"{n}"`` -> 4);
    placeholders inside longer strings are formatted as text. Other braces are left alone.
    """
    if isinstance(template, dict):
        return {k: render_template(v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [render_template(v, values) for v in template]
    if isinstance(template, str):
        whole = _PLACEHOLDER.fullmatch(template)
        if whole:
            return values[whole.group(1)]
        return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)
    return template


def merge_body(base: dict[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``overlay`` into a copy of ``base``; a ``None`` value removes the key."""
    out = dict(base)
    for key, value in overlay.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge_body(out[key], value)
        else:
            out[key] = value
    return out
