"""A client for remote LLM APIs (OpenAI chat / Responses, Anthropic, or a generic JSON API).

``client`` holds :class:`RemoteModelClient` (retries, concurrency, key handling), ``config``
:class:`RemoteModelConfig` and the format names, ``formats`` one back end per API format,
``parsing`` their pure helpers, ``transport`` the one HTTP path every format uses (deadline
per attempt, response size cap, credentials kept to the configured origin), ``types`` the
shared value and error types. Imports run one way: config/types <- parsing <- formats <- client.
"""

from comlrl_core.remote.client import RemoteModelClient, RemoteModelConfig
from comlrl_core.remote.types import (
    RemoteAuthError,
    RemoteCompletion,
    RemoteModelError,
    RemoteRequestError,
    RemoteResponseError,
    RemoteUnavailableError,
)

__all__ = [
    "RemoteAuthError",
    "RemoteCompletion",
    "RemoteModelClient",
    "RemoteModelConfig",
    "RemoteModelError",
    "RemoteRequestError",
    "RemoteResponseError",
    "RemoteUnavailableError",
]
