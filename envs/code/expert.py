"""The ``expert_edits`` transition: an expert model proposes edits to aux and main.

The expert is either a remote model through :class:`comlrl_core.remote.client.RemoteModelClient`
(any of its formats; ``expert_model`` is a model name on the default OpenAI-compatible
DeepSeek endpoint, a dict of :class:`~comlrl_core.remote.client.RemoteModelConfig` fields, or a
config), or a local :class:`comlrl_core.policy.Policy` (``expert_policy``). The default is
``deepseek-coder`` at ``https://api.deepseek.com`` with the key in ``DEEPSEEK_API_KEY``.

An :class:`Expert` is a heavy shared resource: the client is built on first use and
shared by every clone of the environment. Any failure (missing key, HTTP error, a policy
that raises, an empty reply) raises :class:`ExpertError`; the environment turns that into
a prompt without edits and counts it, so a rollout never crashes because of the expert.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

DEFAULT_EXPERT_CONFIG: dict[str, Any] = {
    "format": "openai",
    "model": "deepseek-coder",
    "base_url": "https://api.deepseek.com",
    "api_key_env": "DEEPSEEK_API_KEY",
}
_SECTION_MARK = "###"


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
        self.model_spec = None if expert_policy is not None else (expert_model or "deepseek-coder")
        self._client: Any = None
        self._lock = threading.Lock()
        self.failures = 0  # over every env sharing this expert

    def __deepcopy__(self, memo: dict) -> "Expert":
        return self  # shared, never copied

    def _remote_config(self):
        from comlrl_core.remote.client import RemoteModelConfig  # noqa: PLC0415 -- only when a remote expert is used

        spec = self.model_spec
        if isinstance(spec, RemoteModelConfig):
            return spec
        if isinstance(spec, str):
            return RemoteModelConfig(**{**DEFAULT_EXPERT_CONFIG, "model": spec})
        if isinstance(spec, dict):
            return RemoteModelConfig(**{**DEFAULT_EXPERT_CONFIG, **spec})
        raise TypeError(
            "expert_model must be a model name, a dict of RemoteModelConfig fields or a RemoteModelConfig; "
            f"got {type(spec).__name__}"
        )

    def _get_client(self):
        with self._lock:
            if self._client is None:
                from comlrl_core.remote.client import RemoteModelClient  # noqa: PLC0415

                self._client = RemoteModelClient(self._remote_config())
            return self._client

    @property
    def name(self) -> str:
        if self.policy is not None:
            return str(getattr(self.policy, "name", type(self.policy).__name__))
        spec = self.model_spec
        return spec if isinstance(spec, str) else str(getattr(spec, "model", None) or dict(spec).get("model"))

    def ask(self, prompt: str) -> str:
        """The expert's reply to ``prompt``; :class:`ExpertError` on any failure."""
        try:
            if self.policy is not None:
                reply = self.policy.generate([prompt], num_samples=1, generation_config=self.generation_config)[0][0]
                text = reply.text if hasattr(reply, "text") else str(reply)
            else:
                text = self._get_client().complete(prompt, n=1)[0]
        except Exception as err:  # noqa: BLE001 -- any expert failure degrades, never crashes
            with self._lock:
                self.failures += 1
            raise ExpertError(f"expert {self.name!r} failed: {type(err).__name__}: {err}") from err
        if not isinstance(text, str) or not text.strip():
            with self._lock:
                self.failures += 1
            raise ExpertError(f"expert {self.name!r} returned an empty reply")
        return text

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


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
