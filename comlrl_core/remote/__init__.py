"""A client for remote LLM APIs (OpenAI chat / Responses, Anthropic, or a generic JSON API).

``client`` holds :class:`RemoteModelClient` and its config, ``formats`` one backend per API
format, ``types`` the shared value and error types.
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
