"""The ``expert_edits`` transition: an expert model proposes edits to aux and main.

The expert is either a remote model through :class:`comlrl_core.remote.client.RemoteModelClient`
or a local :class:`comlrl_core.policy.Policy` (``expert_policy``). ``expert_model`` is

* a model name: the provider follows from it (:func:`provider_config`) -- a Claude model
  goes to Anthropic's Messages API with ``ANTHROPIC_API_KEY``, a GPT / o-series model to
  OpenAI's Responses API with ``OPENAI_API_KEY``, a DeepSeek model to DeepSeek's
  OpenAI-compatible endpoint with ``DEEPSEEK_API_KEY``;
* a dict of :class:`~comlrl_core.remote.client.RemoteModelConfig` fields, laid over the
  provider of its ``model`` (so ``{"model": "claude-...", "base_url": proxy}`` keeps the
  Anthropic format and key); a model of no known provider needs ``format`` and ``base_url``;
* or a config. The default is ``deepseek-coder``.

An :class:`Expert` is a heavy shared resource: the client is built on first use and
shared by every clone of the environment. Any failure (missing key, HTTP error, a policy
that raises, an empty reply) raises :class:`ExpertError`; the environment turns that into
a prompt without edits and counts it, so a rollout never crashes because of the expert.
A name of no known provider is refused when the expert is built, not degraded per turn.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Sequence

# Model-name prefix -> where that provider's models are served and where its key lives.
PROVIDERS: tuple[tuple[re.Pattern[str], dict[str, Any]], ...] = (
    (
        re.compile(r"claude", re.IGNORECASE),
        {
            "format": "anthropic",
            "base_url": "https://api.anthropic.com/v1/messages",
            "api_key_env": "ANTHROPIC_API_KEY",
        },
    ),
    (
        re.compile(r"(chatgpt-|gpt-|o\d)", re.IGNORECASE),
        {
            "format": "openai_responses",
            "base_url": "https://api.openai.com/v1/responses",
            "api_key_env": "OPENAI_API_KEY",
        },
    ),
    (
        re.compile(r"deepseek", re.IGNORECASE),
        {"format": "openai", "base_url": "https://api.deepseek.com", "api_key_env": "DEEPSEEK_API_KEY"},
    ),
)
DEFAULT_EXPERT_MODEL = "deepseek-coder"
_SECTION_MARK = "###"


def provider_config(model: str) -> dict[str, Any] | None:
    """The RemoteModelConfig fields of the provider serving ``model`` (by name), or None."""
    for pattern, fields in PROVIDERS:
        if pattern.match(model.strip()):
            return {**fields, "model": model}
    return None


class ExpertError(RuntimeError):
    """The expert could not propose edits."""


class Expert:
    """A remote model or a local policy that proposes code edits (shared by env clones)."""

    def __init__(self, expert_model: Any = None, expert_policy: Any = None, generation_config: Any = None) -> None:
        if expert_policy is not None and not callable(getattr(expert_policy, "generate", None)):
            raise TypeError(
                f"expert_policy must be a comlrl_core.Policy (with generate()), got {type(expert_policy).__name__}"
            )
        self.policy = expert_policy
        self.generation_config = generation_config
        self.model_spec = None if expert_policy is not None else (expert_model or DEFAULT_EXPERT_MODEL)
        # resolved now: a bad name or config is a setup error, not a per-turn degradation
        self.remote_config = None if expert_policy is not None else remote_config(self.model_spec)
        self._client: Any = None
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> "Expert":
        return self  # shared, never copied

    def _get_client(self):
        with self._lock:
            if self._client is None:
                from comlrl_core.remote.client import RemoteModelClient  # noqa: PLC0415

                if self.remote_config is None:
                    raise RuntimeError("this expert answers with its policy; it has no remote model to call")
                self._client = RemoteModelClient(self.remote_config)
            return self._client

    @property
    def name(self) -> str:
        if self.policy is not None:
            return str(getattr(self.policy, "name", type(self.policy).__name__))
        spec = self.model_spec
        return spec if isinstance(spec, str) else str(getattr(spec, "model", None) or dict(spec or {}).get("model"))

    def ask(self, prompt: str, task_item: Any = None) -> str:
        """The expert's reply to ``prompt``; :class:`ExpertError` on any failure.

        ``task_item`` (the task the prompt is about) reaches ``generic`` endpoints as
        ``batch_item``; the expert speaks for the whole team, so no agent index is sent."""
        try:
            if self.policy is not None:
                reply = self.policy.generate([prompt], num_samples=1, generation_config=self.generation_config)[0][0]
                text = reply.text if hasattr(reply, "text") else str(reply)
            else:
                text = self._get_client().complete(prompt, n=1, task_item=task_item)[0]
        except Exception as err:  # noqa: BLE001 -- any expert failure degrades, never crashes
            raise ExpertError(f"expert {self.name!r} failed: {type(err).__name__}: {err}") from err
        if not isinstance(text, str) or not text.strip():
            raise ExpertError(f"expert {self.name!r} returned an empty reply")
        return text

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


def remote_config(spec: Any):
    """The RemoteModelConfig of an ``expert_model`` spec (a name, a dict of fields, a config)."""
    from comlrl_core.remote.client import RemoteModelConfig  # noqa: PLC0415 -- only when a remote expert is used

    if isinstance(spec, RemoteModelConfig):
        return spec
    if isinstance(spec, str):
        fields = provider_config(spec)
        if fields is None:
            raise ValueError(
                f"expert_model {spec!r} names no known provider (claude-*: Anthropic, gpt-* / o<digit>*: OpenAI, "
                "deepseek-*: DeepSeek); for another endpoint give a dict of RemoteModelConfig fields "
                "with format, base_url and api_key_env"
            )
        return RemoteModelConfig(**fields)
    if isinstance(spec, dict):
        model = spec.get("model")
        fields = provider_config(model) if isinstance(model, str) else None
        if fields is None and "format" not in spec:
            raise ValueError(
                f"expert_model dict: model {model!r} names no known provider; add format, base_url and api_key_env"
            )
        return RemoteModelConfig(**{**(fields or {}), **spec})
    raise TypeError(
        "expert_model must be a model name, a dict of RemoteModelConfig fields or a RemoteModelConfig; "
        f"got {type(spec).__name__}"
    )


def expert_request(task: dict, code: dict[str, str], names: dict[str, str], failing: Sequence[str]) -> str:
    """The prompt sent to the expert: the problem, the team's code, and failing tests."""
    parts = [
        "You review the code of a team of programmers and propose small, concrete edits.",
        f"Problem:\n{task['prompt'].rstrip()}",
    ]
    for agent, text in code.items():
        parts.append(f"Code of {agent} (function `{names[agent]}`):\n```python\n{text.strip()}\n```")
    if failing:
        parts.append("Failing tests:\n" + "\n".join(f"- {t}" for t in failing))
    sections = "\n".join(f"{_SECTION_MARK} {agent}\n<edits for `{names[agent]}`>" for agent in code)
    parts.append(
        "Describe the edits each function needs (or 'no changes'), one section per agent, exactly:\n" + sections
    )
    return "\n\n".join(parts)


def parse_edits(reply: str, agents: Sequence[str]) -> dict[str, str]:
    """Split the expert's reply into per-agent edits; the whole reply when it has no sections."""
    edits: dict[str, list[str]] = {}
    current: str | None = None
    for line in reply.splitlines():
        stripped = line.strip()
        if stripped.startswith(_SECTION_MARK):
            heading = stripped.lstrip("#").strip().strip(":").strip("`").lower()
            current = next((a for a in agents if heading.startswith(a.lower())), None)
            if current is not None:
                edits.setdefault(current, [])
                continue
        if current is not None:
            edits[current].append(line)
    if not edits:
        return {a: reply.strip() for a in agents}
    return {a: "\n".join(edits.get(a, [])).strip() or "no changes" for a in agents}


def expert_edits_prompt(initial: str, history: str, target: str, edits: str | None, expert_name: str) -> str:
    parts = [initial.rstrip(), history]
    if edits is None:
        parts.append("No expert suggestions are available this turn.")
    else:
        parts.append(f"Suggested edits from an expert ({expert_name}):\n{edits.strip()}")
    parts.append(f"Revise your function `{target}` and reply with its complete code only.")
    return "\n\n".join(parts)
