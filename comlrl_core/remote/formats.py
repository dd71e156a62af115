"""Wire formats of the remote-model client: one back end per API family.

A back end turns ``(prompt, n, sampling)`` into ONE HTTP request and its answer into
:class:`~comlrl_core.remote.types.RemoteCompletion` objects. It never retries and never
sleeps: every failed attempt is raised as a classified
:class:`~comlrl_core.remote.types.BackendFailure`, and the client owns the retry policy,
the concurrency bound and the public errors. That is also why the SDK clients are built
with ``max_retries=0``.

* ``generic``          -- a JSON POST with the stdlib (urllib); completions are read from a
  dotted ``response_field`` (``"outputs"``, ``"choices.0.text"``, ``"choices.*.text"``).
* ``openai``           -- chat completions with ``n`` (OpenAI SDK), also for compatible
  endpoints (DeepSeek, vLLM, ...) through ``base_url``.
* ``anthropic``        -- the Messages API (Anthropic SDK), one candidate per request.
* ``openai_responses`` -- the Responses API (OpenAI SDK), one candidate per request.
"""

from __future__ import annotations

import email.utils
import http.client
import importlib
import json
import re
import socket
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any, Mapping

from comlrl_core.remote.types import BackendFailure, RemoteCompletion, SamplingParams

if TYPE_CHECKING:
    from comlrl_core.remote.client import RemoteModelConfig

# Statuses worth retrying: rate limits, request timeouts, lock conflicts, server errors.
_TRANSIENT_STATUSES = frozenset({408, 409, 429})
# The SDKs need some key string; local endpoints that need none ignore it.
_NO_KEY_PLACEHOLDER = "no-key"


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

_PLACEHOLDER = re.compile(r"\{(prompt|n|model|max_tokens|temperature|top_p|system_prompt)\}")


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


def _sampling_fields(sampling: SamplingParams) -> dict[str, Any]:
    """Optional sampling fields. top_p=1.0 is the no-op value and is not sent, because some
    APIs refuse top_p together with temperature."""
    fields: dict[str, Any] = {}
    if sampling.temperature is not None:
        fields["temperature"] = sampling.temperature
    if sampling.top_p is not None and sampling.top_p < 1.0:
        fields["top_p"] = sampling.top_p
    return fields


# -- back ends -------------------------------------------------------------------------


class FormatBackend:
    """One request in, classified failures out. Subclasses set ``one_candidate_per_request``."""

    #: True when the API has no ``n``: the client sends one request per candidate
    one_candidate_per_request: bool = True

    def __init__(self, config: "RemoteModelConfig", api_key: str | None) -> None:
        self.config = config
        self._api_key = api_key

    def request(self, prompt: str, n: int, sampling: SamplingParams) -> list[RemoteCompletion]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class GenericBackend(FormatBackend):
    """A JSON POST to ``base_url`` (the full endpoint URL), stdlib only.

    Default body: ``{"model", "prompt", "n", "max_tokens", "temperature"?, "top_p"?,
    "system"?}``; ``request_template`` is rendered (placeholders) and deep-merged on top,
    where a ``None`` value removes a default key.
    """

    one_candidate_per_request = False

    def __init__(self, config: "RemoteModelConfig", api_key: str | None) -> None:
        super().__init__(config, api_key)
        self._opener = urllib.request.build_opener()

    def build_body(self, prompt: str, n: int, sampling: SamplingParams) -> dict[str, Any]:
        cfg = self.config
        body: dict[str, Any] = {"model": cfg.model, "prompt": prompt, "n": n, "max_tokens": sampling.max_tokens}
        body.update(_sampling_fields(sampling))
        if cfg.system_prompt:
            body["system"] = cfg.system_prompt
        if cfg.request_template:
            values = {
                "prompt": prompt,
                "n": n,
                "model": cfg.model,
                "max_tokens": sampling.max_tokens,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "system_prompt": cfg.system_prompt,
            }
            body = merge_body(body, render_template(cfg.request_template, values))
        return body

    def request(self, prompt: str, n: int, sampling: SamplingParams) -> list[RemoteCompletion]:
        cfg = self.config
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key}"
        headers.update(cfg.extra_headers or {})
        data = json.dumps(self.build_body(prompt, n, sampling)).encode("utf-8")
        req = urllib.request.Request(cfg.base_url or "", data=data, headers=headers, method="POST")
        try:
            with self._opener.open(req, timeout=cfg.timeout_s) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:  # 4xx / 5xx with a body
            raw = _read_quietly(e)
            raise failure_from_status(e.code, raw, dict(e.headers or {})) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, (TimeoutError, socket.timeout)):
                raise _timeout_failure(cfg.timeout_s) from None
            raise BackendFailure("transient", f"connection error: {e.reason}") from None
        except (TimeoutError, socket.timeout):
            raise _timeout_failure(cfg.timeout_s) from None
        except (http.client.HTTPException, OSError) as e:  # reset, disconnected, incomplete read
            raise BackendFailure("transient", f"connection error: {type(e).__name__}: {e}") from None
        payload = parse_json_body(raw, status)
        return [RemoteCompletion(t) for t in texts_at(payload, cfg.response_field)]


def _read_quietly(error: urllib.error.HTTPError) -> bytes:
    try:
        return error.read()
    except (OSError, http.client.HTTPException):
        return b""


def _timeout_failure(timeout_s: float) -> BackendFailure:
    return BackendFailure("transient", f"request timed out after {timeout_s:g}s")


def import_sdk(module: str, fmt: str) -> Any:
    """Import an optional SDK, with an install hint naming the extra when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"RemoteModelConfig(format={fmt!r}) needs the {module!r} package, which is not installed; "
            f"install the API extra: pip install 'comlrl-gym[api]'"
        ) from e


class _SDKBackend(FormatBackend):
    """Shared SDK plumbing: client construction (no SDK retries) and error mapping."""

    sdk_module = ""

    def __init__(self, config: "RemoteModelConfig", api_key: str | None) -> None:
        super().__init__(config, api_key)
        self.sdk = import_sdk(self.sdk_module, config.format)
        client_cls = self.sdk.OpenAI if self.sdk_module == "openai" else self.sdk.Anthropic
        self.client = client_cls(
            api_key=api_key if api_key is not None else _NO_KEY_PLACEHOLDER,
            base_url=config.base_url,
            timeout=config.timeout_s,
            max_retries=0,  # the client's retry policy is the only one
            default_headers=dict(config.extra_headers or {}) or None,
        )

    def call(self, method: Any, **kwargs: Any) -> dict[str, Any]:
        """Run one SDK call; return the decoded body as a dict, or raise a BackendFailure."""
        sdk = self.sdk
        if self.config.request_template:
            kwargs["extra_body"] = {**kwargs.get("extra_body", {}), **self.config.request_template}
        try:
            result = method(**kwargs)
        except sdk.APIResponseValidationError as e:
            raise BackendFailure("response", f"response failed validation: {e.message}", status=e.status_code) from None
        except sdk.APIStatusError as e:
            raise failure_from_status(e.status_code, e.body, dict(e.response.headers)) from None
        except sdk.APITimeoutError:
            raise _timeout_failure(self.config.timeout_s) from None
        except sdk.APIConnectionError as e:
            cause = e.__cause__ or e.__context__
            raise BackendFailure("transient", f"connection error: {cause or e.message}") from None
        except json.JSONDecodeError as e:  # the SDKs let it through on a bad 200 body
            raise BackendFailure("response", f"response body is not valid JSON: {e}", status=200) from None
        if hasattr(result, "to_dict"):
            return result.to_dict()
        if isinstance(result, dict):
            return result
        raise BackendFailure("response", f"response body is not a JSON object (got {type(result).__name__})")

    def close(self) -> None:
        self.client.close()


class OpenAIChatBackend(_SDKBackend):
    """Chat completions; ``n`` candidates per request (sent only when > 1)."""

    sdk_module = "openai"
    one_candidate_per_request = False

    def request(self, prompt: str, n: int, sampling: SamplingParams) -> list[RemoteCompletion]:
        messages = [{"role": "user", "content": prompt}]
        if self.config.system_prompt:
            messages.insert(0, {"role": "system", "content": self.config.system_prompt})
        kwargs: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "max_tokens": sampling.max_tokens,
            **_sampling_fields(sampling),
        }
        if n > 1:
            kwargs["n"] = n
        data = self.call(self.client.chat.completions.create, **kwargs)
        choices = extract_field(data, "choices")
        if not isinstance(choices, list) or not choices:
            raise BackendFailure("response", "expected a non-empty list at response field 'choices'")
        out = []
        for i, choice in enumerate(choices):
            field = f"choices.{i}.message.content"
            text = extract_field(data, field)
            if not isinstance(text, str):  # e.g. null content on a refusal or a tool call
                raise BackendFailure(
                    "response", f"expected text at response field {field!r}, got {type(text).__name__}"
                )
            reason = "length" if choice.get("finish_reason") == "length" else "stop"
            out.append(RemoteCompletion(text, reason))
        return out


class AnthropicBackend(_SDKBackend):
    """The Messages API: one candidate per request; text = the text blocks joined."""

    sdk_module = "anthropic"

    def request(self, prompt: str, n: int, sampling: SamplingParams) -> list[RemoteCompletion]:
        kwargs: dict[str, Any] = {
            "model": self.config.model,
            "max_tokens": sampling.max_tokens,
            "messages": [{"role": "user", "content": prompt}],
        }
        if self.config.system_prompt:
            kwargs["system"] = self.config.system_prompt
        sampling_fields = _sampling_fields(sampling)
        if sampling_fields:  # through extra_body: recent SDKs have no sampling keywords
            kwargs["extra_body"] = sampling_fields
        data = self.call(self.client.messages.create, **kwargs)
        blocks = extract_field(data, "content")
        if not isinstance(blocks, list):
            raise BackendFailure("response", "expected a list of blocks at response field 'content'")
        texts = [
            b["text"]
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        ]
        if not texts:
            raise BackendFailure("response", "expected a text block in response field 'content' (type 'text')")
        reason = "length" if data.get("stop_reason") == "max_tokens" else "stop"
        return [RemoteCompletion("".join(texts), reason)]


class OpenAIResponsesBackend(_SDKBackend):
    """The Responses API: one candidate per request; text = the output_text parts joined."""

    sdk_module = "openai"

    def request(self, prompt: str, n: int, sampling: SamplingParams) -> list[RemoteCompletion]:
        kwargs: dict[str, Any] = {
            "model": self.config.model,
            "input": prompt,
            "max_output_tokens": sampling.max_tokens,
            **_sampling_fields(sampling),
        }
        if self.config.system_prompt:
            kwargs["instructions"] = self.config.system_prompt
        data = self.call(self.client.responses.create, **kwargs)
        items = extract_field(data, "output")
        if not isinstance(items, list):
            raise BackendFailure("response", "expected a list at response field 'output'")
        texts = [
            part["text"]
            for item in items
            if isinstance(item, dict) and item.get("type") == "message"
            for part in item.get("content") or []
            if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str)
        ]
        if not texts:
            raise BackendFailure(
                "response", "expected an 'output_text' part in response field 'output.*.content' (type 'message')"
            )
        details = data.get("incomplete_details") or {}
        cut = data.get("status") == "incomplete" and details.get("reason") == "max_output_tokens"
        return [RemoteCompletion("".join(texts), "length" if cut else "stop")]


BACKENDS: dict[str, type[FormatBackend]] = {
    "generic": GenericBackend,
    "openai": OpenAIChatBackend,
    "anthropic": AnthropicBackend,
    "openai_responses": OpenAIResponsesBackend,
}
