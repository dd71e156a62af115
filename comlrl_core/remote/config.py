"""Settings of the remote-model client: :class:`RemoteModelConfig`, the format names, and
where each format's requests go.

Kept apart from the client and the format back ends so that both import it and neither
imports the other.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any
from urllib.parse import urlsplit, urlunsplit

FORMATS = ("generic", "openai", "anthropic", "openai_responses")
FORMAT_ALIASES = {"responses": "openai_responses", "codex": "openai_responses"}
# Where the key lives when api_key_env is not given (generic endpoints: no key).
DEFAULT_API_KEY_ENV = {
    "openai": "OPENAI_API_KEY",
    "openai_responses": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}
# Header names that carry credentials: never in a config, never sent to another origin.
CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "proxy-authorization", "x-goog-api-key"})
# The path each SDK format appends to its API root. A base_url ending in it is the full
# endpoint URL (how CoMLRL documents it) and is cut back to the root.
ENDPOINT_PATHS = {
    "openai": "/chat/completions",
    "openai_responses": "/responses",
    "anthropic": "/v1/messages",
}
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def canonical_format(name: str) -> str:
    """``name`` lower-cased with aliases resolved (``codex`` -> ``openai_responses``)."""
    fmt = str(name).strip().lower()
    return FORMAT_ALIASES.get(fmt, fmt)


@dataclass(frozen=True)
class RemoteModelConfig:
    """Settings of a :class:`~comlrl_core.remote.client.RemoteModelClient`. Holds no secret,
    so it is safe to log and save.

    Args:
        format: ``generic``, ``openai``, ``anthropic`` or ``openai_responses``
            (aliases ``responses``, ``codex``).
        model: the model name sent to the endpoint.
        base_url: the endpoint. The full endpoint URL works in every format
            (``https://api.openai.com/v1/chat/completions``, ``.../v1/responses``,
            ``https://api.anthropic.com/v1/messages``); the SDK formats also take the API
            root (``https://api.deepseek.com``, ``http://localhost:8000/v1``,
            ``https://api.anthropic.com``). ``None``: the SDK's default. ``generic``: the
            full URL, required.
        api_key_env: NAME of the environment variable that holds the key. ``None`` uses
            ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY`` (``generic``: no key); ``""`` means
            the endpoint needs no key.
        max_tokens: completion token budget per candidate.
        temperature, top_p: sampling; ``None`` is not sent (the server's default applies).
        timeout_s: deadline of one HTTP attempt, from connecting to the last body byte
            (redirects included), whatever the server's pace.
        max_retries: retries after the first attempt on transient failures.
        backoff_base_s, backoff_max_s: retry ``k`` waits ``min(max, base * 2**(k-1))``
            scaled by a random factor in [0.5, 1] (jitter, so that clients spread out).
        retry_after_max_s: cap on a server-requested ``Retry-After`` wait.
        max_concurrency: requests in flight at once, per client.
        max_response_bytes: largest response body accepted (decoded); a larger one is a
            :class:`~comlrl_core.remote.types.RemoteResponseError`, read no further.
        response_field: ``generic`` only: dotted path to the completions in the response
            (``"completions"``, ``"choices.0.text"``, ``"choices.*.text"``).
        request_template: dict deep-merged into the request body. ``generic``: string values
            may use ``{prompt}``, ``{n}``, ``{model}``, ``{max_tokens}``, ``{temperature}``,
            ``{top_p}``, ``{system_prompt}``, ``{agent_idx}``, ``{batch_item}``, and a
            ``None`` value removes a default key. SDK formats: sent as extra body fields.
        extra_headers: additional HTTP headers (never credentials: use ``api_key_env``).
        system_prompt: a system instruction sent with every prompt.
    """

    format: str
    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    max_tokens: int = 1024
    temperature: float | None = None
    top_p: float | None = None
    timeout_s: float = 60.0
    max_retries: int = 4
    backoff_base_s: float = 0.5
    backoff_max_s: float = 16.0
    retry_after_max_s: float = 60.0
    max_concurrency: int = 4
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    response_field: str = "choices.*.text"
    request_template: dict[str, Any] | None = None
    extra_headers: dict[str, str] | None = None
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        fmt = canonical_format(self.format)
        if fmt not in FORMATS:
            raise ValueError(
                f"RemoteModelConfig.format must be one of {', '.join(FORMATS)} "
                f"(aliases: {', '.join(FORMAT_ALIASES)}); got {self.format!r}"
            )
        object.__setattr__(self, "format", fmt)  # store the canonical name
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError("RemoteModelConfig.model must be a non-empty model name, e.g. 'deepseek-coder'")
        self._check_base_url(fmt)
        if self.api_key_env not in (None, "") and not (
            isinstance(self.api_key_env, str) and _ENV_NAME.fullmatch(self.api_key_env)
        ):
            # never echo the value: a user may have pasted the key itself here
            raise ValueError(
                "RemoteModelConfig.api_key_env must NAME the environment variable that holds the key "
                "(letters, digits, underscores, e.g. 'DEEPSEEK_API_KEY'), not contain the key itself"
            )
        _check_int(self.max_tokens, "max_tokens", 1)
        _check_int(self.max_retries, "max_retries", 0)
        _check_int(self.max_concurrency, "max_concurrency", 1)
        _check_int(self.max_response_bytes, "max_response_bytes", 1024)
        if self.temperature is not None:
            _check_number(self.temperature, "temperature", 0.0, "(0 = greedy; None = server default)")
        if self.top_p is not None and not (is_number(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"RemoteModelConfig.top_p must be in (0, 1] or None, got {self.top_p!r}")
        if not (is_number(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"RemoteModelConfig.timeout_s must be > 0 seconds, got {self.timeout_s!r}")
        _check_number(self.backoff_base_s, "backoff_base_s", 0.0, "seconds")
        _check_number(self.backoff_max_s, "backoff_max_s", 0.0, "seconds")
        _check_number(self.retry_after_max_s, "retry_after_max_s", 0.0, "seconds")
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError(
                f"RemoteModelConfig.backoff_max_s ({self.backoff_max_s}) must be >= "
                f"backoff_base_s ({self.backoff_base_s})"
            )
        if not isinstance(self.response_field, str) or not all(self.response_field.split(".")):
            raise ValueError(
                f"RemoteModelConfig.response_field must be a dotted path like 'choices.0.text' or 'outputs', "
                f"got {self.response_field!r}"
            )
        if self.request_template is not None and not isinstance(self.request_template, dict):
            raise ValueError(
                f"RemoteModelConfig.request_template must be a dict merged into the request body, "
                f"got {type(self.request_template).__name__}"
            )
        if self.extra_headers is not None:
            if not isinstance(self.extra_headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.extra_headers.items()
            ):
                raise ValueError("RemoteModelConfig.extra_headers must be a dict of header name -> string value")
            secret = sorted(k for k in self.extra_headers if k.lower() in CREDENTIAL_HEADERS)
            if secret:
                raise ValueError(
                    f"RemoteModelConfig.extra_headers must not carry credentials ({', '.join(secret)}): "
                    "configs are logged and saved; put the key in an environment variable "
                    "and name it with api_key_env"
                )
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ValueError("RemoteModelConfig.system_prompt must be a string or None")

    def _check_base_url(self, fmt: str) -> None:
        if self.base_url is None:
            if fmt == "generic":
                raise ValueError(
                    "RemoteModelConfig.base_url is required for format 'generic': "
                    "the full URL of the JSON endpoint, e.g. 'http://localhost:8000/generate'"
                )
            return
        if not isinstance(self.base_url, str) or not re.match(r"https?://[^/\s]+", self.base_url):
            raise ValueError(f"RemoteModelConfig.base_url must be an http(s) URL, got {self.base_url!r}")
        if fmt == "generic":
            return
        path = urlsplit(self.base_url).path.rstrip("/")
        for other, suffix in ENDPOINT_PATHS.items():
            if other != fmt and path.endswith(suffix) and not path.endswith(ENDPOINT_PATHS[fmt]):
                raise ValueError(
                    f"RemoteModelConfig.base_url {self.base_url!r} is the {other!r} endpoint ({suffix}) but "
                    f"format is {fmt!r}: set format={other!r}, or give the {fmt!r} endpoint "
                    f"(.../{ENDPOINT_PATHS[fmt].lstrip('/')}) or the API root"
                )

    @property
    def api_root(self) -> str | None:
        """What the SDK formats are given as ``base_url``: the API root, with a full endpoint
        path cut off (``.../v1/responses`` -> ``.../v1``; Anthropic ``.../v1/messages`` and
        ``.../v1`` -> the host root, since its SDK appends ``/v1/messages``). ``generic``:
        the URL as given. ``None``: the SDK's default."""
        if self.base_url is None or self.format == "generic":
            return self.base_url
        parts = urlsplit(self.base_url)
        path = parts.path.rstrip("/")
        suffix = ENDPOINT_PATHS[self.format]
        if path.endswith(suffix):
            path = path[: -len(suffix)]
        elif self.format == "anthropic" and path.endswith("/v1"):
            path = path[: -len("/v1")]
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))

    @property
    def resolved_api_key_env(self) -> str | None:
        """The variable the key is read from, or ``None`` when no key is sent."""
        if self.api_key_env == "":
            return None
        return self.api_key_env or DEFAULT_API_KEY_ENV.get(self.format)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict for logs and checkpoints (the config never holds the key)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RemoteModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"unknown RemoteModelConfig option(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**data)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(value: Any, name: str, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"RemoteModelConfig.{name} must be an integer >= {minimum}, got {value!r}")


def _check_number(value: Any, name: str, minimum: float, unit: str) -> None:
    if not is_number(value) or value < minimum:
        raise ValueError(f"RemoteModelConfig.{name} must be a number >= {minimum} {unit}, got {value!r}")
