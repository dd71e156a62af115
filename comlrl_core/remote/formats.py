"""Wire formats of the remote-model client: one back end per API family.

A back end turns ``(prompt, n, sampling, context)`` into ONE HTTP attempt and its answer
into :class:`~comlrl_core.remote.types.RemoteCompletion` objects. It never retries and never
sleeps: every failed attempt is raised as a classified
:class:`~comlrl_core.remote.types.BackendFailure`, and the client owns the retry policy,
the concurrency bound and the public errors (why the SDKs do not retry: see
:mod:`comlrl_core.remote.client`). Every format sends through the same
:class:`~comlrl_core.remote.transport.GuardedTransport` (deadline per attempt, response
size cap, no credentials to another origin).

* ``generic``          -- a JSON POST (httpx2) with CoMLRL's body; completions are read from
  a dotted ``response_field`` (``"completions"``, ``"choices.0.text"``, ``"choices.*.text"``).
* ``openai``           -- chat completions with ``n`` (OpenAI SDK), also for compatible
  endpoints (DeepSeek, vLLM, ...) through ``base_url``.
* ``anthropic``        -- the Messages API (Anthropic SDK), one candidate per request.
* ``openai_responses`` -- the Responses API (OpenAI SDK), one candidate per request.
"""

from __future__ import annotations

import importlib
import json
from typing import TYPE_CHECKING, Any

from comlrl_core.remote.config import RemoteModelConfig
from comlrl_core.remote.parsing import (
    extract_field,
    failure_from_status,
    merge_body,
    parse_json_body,
    render_template,
    texts_at,
)
from comlrl_core.remote.types import (
    BackendFailure,
    RemoteCompletion,
    RemoteFinishReason,
    RequestContext,
    SamplingParams,
)

if TYPE_CHECKING:
    import httpx2

    from comlrl_core.remote.transport import GuardedTransport

# The SDKs need some key string; local endpoints that need none ignore it.
_NO_KEY_PLACEHOLDER = "no-key"


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


def _guarded_http_client(config: RemoteModelConfig, api_key: str | None) -> tuple[httpx2.Client, GuardedTransport]:
    """An httpx2 client on a fresh :class:`GuardedTransport` (imported here: importing the
    client package must not load the HTTP stack)."""
    import httpx2

    from comlrl_core.remote.transport import GuardedTransport

    transport = GuardedTransport(
        timeout_s=config.timeout_s,
        max_response_bytes=config.max_response_bytes,
        api_key=api_key,
        max_connections=max(10, config.max_concurrency),
    )
    # same-origin redirects (http -> https, a trailing slash) are followed; the transport
    # strips credentials from any hop to another origin
    http = httpx2.Client(transport=transport, follow_redirects=True, max_redirects=5, timeout=config.timeout_s)
    return http, transport


class FormatBackend:
    """One request in, classified failures out. Subclasses set ``one_candidate_per_request``."""

    #: True when the API has no ``n``: the client sends one request per candidate
    one_candidate_per_request: bool = True

    def __init__(self, config: RemoteModelConfig, api_key: str | None) -> None:
        self.config = config
        self._api_key = api_key

    def request(self, prompt: str, n: int, sampling: SamplingParams, context: RequestContext) -> list[RemoteCompletion]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class GenericBackend(FormatBackend):
    """A JSON POST to ``base_url`` (the full endpoint URL), with CoMLRL's request body.

    Default body: ``{"prompt", "agent_idx", "num_return_sequences", "max_new_tokens",
    "temperature"?, "top_p"?, "batch_item", "model", "system"?}`` (``agent_idx`` and
    ``batch_item`` are ``null`` when the caller gave none); ``request_template`` is rendered
    (placeholders) and deep-merged on top, where a ``None`` value removes a default key.
    """

    one_candidate_per_request = False

    def __init__(self, config: RemoteModelConfig, api_key: str | None) -> None:
        super().__init__(config, api_key)
        self.http, self.transport = _guarded_http_client(config, api_key)
        self.transport.set_origin(config.base_url or "")

    def build_body(self, prompt: str, n: int, sampling: SamplingParams, context: RequestContext) -> dict[str, Any]:
        cfg = self.config
        body: dict[str, Any] = {
            "prompt": prompt,
            "agent_idx": context.agent_index,
            "num_return_sequences": n,
            "max_new_tokens": sampling.max_tokens,
            **_sampling_fields(sampling),
            "batch_item": context.task_item,
            "model": cfg.model,
        }
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
                "agent_idx": context.agent_index,
                "batch_item": context.task_item,
            }
            body = merge_body(body, render_template(cfg.request_template, values))
        return body

    def request(self, prompt: str, n: int, sampling: SamplingParams, context: RequestContext) -> list[RemoteCompletion]:
        import httpx2

        cfg = self.config
        headers = {"Accept": "application/json", **(cfg.extra_headers or {})}
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key}"
        body = self.build_body(prompt, n, sampling, context)
        try:
            with self.transport.attempt():
                response = self.http.post(cfg.base_url or "", json=body, headers=headers)
        except httpx2.TimeoutException:
            raise _timeout_failure(cfg.timeout_s) from None
        except httpx2.TooManyRedirects as e:
            raise BackendFailure("request", f"too many redirects: {e}") from None
        except httpx2.TransportError as e:  # refused, reset, disconnected, malformed HTTP
            raise BackendFailure("transient", f"connection error: {type(e).__name__}: {e}") from None
        if not response.is_success:
            raise failure_from_status(response.status_code, response.content, response.headers)
        payload = parse_json_body(response.content, response.status_code)
        return [RemoteCompletion(t) for t in texts_at(payload, cfg.response_field)]

    def close(self) -> None:
        self.http.close()


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


def _backend_failure_in(error: BaseException) -> BackendFailure | None:
    """A BackendFailure raised by our transport that an SDK wrapped (as the cause)."""
    seen: set[int] = set()
    node: BaseException | None = error
    while node is not None and id(node) not in seen:
        if isinstance(node, BackendFailure):
            return node
        seen.add(id(node))
        node = node.__cause__ or node.__context__
    return None


class _SDKBackend(FormatBackend):
    """Shared SDK plumbing: the SDK client on our transport, no SDK retries, error mapping."""

    sdk_module = ""

    def __init__(self, config: RemoteModelConfig, api_key: str | None) -> None:
        super().__init__(config, api_key)
        self.sdk = import_sdk(self.sdk_module, config.format)
        client_cls = self.sdk.OpenAI if self.sdk_module == "openai" else self.sdk.Anthropic
        http, self.transport = _guarded_http_client(config, api_key)
        self.client = client_cls(
            api_key=api_key if api_key is not None else _NO_KEY_PLACEHOLDER,
            base_url=config.api_root,
            timeout=config.timeout_s,
            max_retries=0,  # the client's retry loop is the only one (see client.py)
            default_headers=dict(config.extra_headers or {}) or None,
            http_client=http,
        )
        self.transport.set_origin(self.client.base_url)  # also right when the SDK chose the default

    def call(self, method: Any, **kwargs: Any) -> dict[str, Any]:
        """Run one SDK call; return the decoded body as a dict, or raise a BackendFailure."""
        sdk = self.sdk
        if self.config.request_template:
            kwargs["extra_body"] = {**kwargs.get("extra_body", {}), **self.config.request_template}
        try:
            with self.transport.attempt():
                result = method(**kwargs)
        except BackendFailure:  # from our transport (size cap), passed through by the SDK
            raise
        except sdk.APIResponseValidationError as e:
            raise BackendFailure("response", f"response failed validation: {e.message}", status=e.status_code) from None
        except sdk.APIStatusError as e:
            raise failure_from_status(e.status_code, e.body, dict(e.response.headers)) from None
        except sdk.APITimeoutError:
            raise _timeout_failure(self.config.timeout_s) from None
        except sdk.APIConnectionError as e:
            inner = _backend_failure_in(e)  # our transport's refusal, wrapped by the SDK
            if inner is not None:
                raise BackendFailure(inner.kind, inner.message, status=inner.status) from None
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

    def request(self, prompt: str, n: int, sampling: SamplingParams, context: RequestContext) -> list[RemoteCompletion]:
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
            reason: RemoteFinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
            out.append(RemoteCompletion(text, reason))
        return out


class AnthropicBackend(_SDKBackend):
    """The Messages API: one candidate per request; text = the text blocks joined."""

    sdk_module = "anthropic"

    def request(self, prompt: str, n: int, sampling: SamplingParams, context: RequestContext) -> list[RemoteCompletion]:
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
        reason: RemoteFinishReason = "length" if data.get("stop_reason") == "max_tokens" else "stop"
        return [RemoteCompletion("".join(texts), reason)]


class OpenAIResponsesBackend(_SDKBackend):
    """The Responses API: one candidate per request; text = the output_text parts joined."""

    sdk_module = "openai"

    def request(self, prompt: str, n: int, sampling: SamplingParams, context: RequestContext) -> list[RemoteCompletion]:
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
