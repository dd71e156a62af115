"""Comparators: who the target policies are compared against in an iterative round.

``comparator_policy``:

* ``current``      -- the live policies themselves, sampled on a separate seed stream.
* ``current_copy`` -- a frozen copy of the live policies made at the start of each round and
  placed on ``comparator_devices`` (frees the training devices from comparator sampling).
* ``model``        -- fixed models: ``comparator_agents`` (one source per agent) or
  ``comparator_model_name`` (one for every agent), loaded once per run.
* ``history``      -- the policies of ``comparator_history_k`` rounds back, from the policy
  checkpoints the iterative trainer saves after every round (the initial policies until
  such a checkpoint exists). Loaded once per round, not once per task.
* ``api``          -- a remote model through :mod:`comlrl_core.remote.client`, format ``generic``,
  ``openai``, ``anthropic`` or ``openai_responses``.

``comparator_generation_mode="centralized"``: one comparator (``comparator_centralized_agent_index``)
writes every role in one response, built by :func:`centralized_prompt` and split by
:func:`parse_centralized` (sections ``<agent_0>...</agent_0>``, ``<agent_1>`` ...). An
unparseable response drops that candidate index (counted in ``dropped``); it never raises.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Sequence

from comlrl_core.policy import GenerationConfig, Policy
from learners.preference.candidates import JointCandidate, TaskCandidates, sample_candidates


def centralized_prompt(prompts: Sequence[str], agent_names: Sequence[str]) -> str:
    """One prompt asking for every role's response, each in its own tagged section."""
    roles = "\n\n".join(
        f"Role {i} ({name}) prompt:\n{p}" for i, (name, p) in enumerate(zip(agent_names, prompts, strict=True))
    )
    sections = "\n".join(f"<agent_{i}>\n...\n</agent_{i}>" for i in range(len(prompts)))
    return (
        f"You write the responses of {len(prompts)} cooperating roles. Answer each role's prompt "
        f"separately.\n\n{roles}\n\nReply with exactly one section per role:\n{sections}\n"
    )


def parse_centralized(text: str, num_agents: int) -> list[str] | None:
    """Every role's section of a centralized response, or None when a section is missing."""
    out = []
    for i in range(num_agents):
        match = re.search(rf"<\s*agent_{i}\s*>(.*?)<\s*/\s*agent_{i}\s*>", str(text), flags=re.IGNORECASE | re.DOTALL)
        if match is None:
            return None
        out.append(match.group(1).strip())
    return out


class Comparator:
    """Samples comparator candidates with ``policies`` (one per agent)."""

    def __init__(
        self,
        policies: Sequence[Policy],
        agent_names: Sequence[str],
        *,
        centralized_index: int | None = None,
        kind: str = "current",
    ) -> None:
        self.policies = list(policies)
        self.agent_names = list(agent_names)
        self.centralized_index = centralized_index
        self.kind = kind
        if centralized_index is not None and not 0 <= centralized_index < len(self.policies):
            raise ValueError(
                f"comparator_centralized_agent_index={centralized_index} but there are {len(self.policies)} agents"
            )

    def sample(
        self,
        tasks: Sequence[TaskCandidates],
        num_candidates: int,
        generation_config: GenerationConfig,
        seeds: Sequence[int],
    ) -> int:
        """Fill ``tasks[*].candidates`` (text only); returns how many candidates were dropped."""
        if self.centralized_index is None:
            if self.kind == "api":
                self._sample_api(tasks, num_candidates, generation_config, seeds)
            else:
                sample_candidates(tasks, self.policies, num_candidates, generation_config, seeds)
            for task in tasks:  # ids of the comparator's own tokenizer are of no use to the target
                task.prompt_ids = None
                for cand in task.candidates:
                    if cand is not None:  # None: a dropped candidate
                        cand.token_ids = None
            return 0
        policy = self.policies[self.centralized_index]
        prompts = [centralized_prompt(t.prompts, self.agent_names) for t in tasks]
        context = self._api_context(self.centralized_index, tasks) if self.kind == "api" else {}
        outs = policy.generate(
            prompts,
            num_samples=num_candidates,
            generation_config=generation_config,
            seed=int(seeds[self.centralized_index]),
            **context,
        )
        dropped = 0
        for task, group in zip(tasks, outs, strict=True):
            task.prompt_ids = None
            task.candidates = []
            for completion in group:
                parts = parse_centralized(completion.text, len(self.agent_names))
                dropped += parts is None
                task.candidates.append(None if parts is None else JointCandidate(completions=parts))
        return dropped

    @staticmethod
    def _api_context(agent_index: int, tasks: Sequence[TaskCandidates]) -> dict[str, Any]:
        """What an API comparator's requests are for, as CoMLRL sends it to a generic endpoint:
        the agent index and each task item (the env's ``task(i)`` when it has one)."""
        items = []
        for t in tasks:
            lookup = getattr(t.env, "task", None)
            items.append(lookup(t.task) if callable(lookup) else {"task_index": t.task})
        return {"agent_index": agent_index, "task_items": items}

    def _sample_api(
        self,
        tasks: Sequence[TaskCandidates],
        num_candidates: int,
        generation_config: GenerationConfig,
        seeds: Sequence[int],
    ) -> None:
        """Like ``sample_candidates``, telling the remote model which agent and task each
        prompt is for (RemotePolicy.generate takes ``agent_index`` / ``task_items``)."""
        per_agent = [
            policy.generate(
                [t.prompts[i] for t in tasks],
                num_samples=num_candidates,
                generation_config=generation_config,
                seed=int(seeds[i]),
                **self._api_context(i, tasks),
            )
            for i, policy in enumerate(self.policies)
        ]
        for k, task in enumerate(tasks):
            task.candidates = [
                JointCandidate(completions=[per_agent[i][k][c].text for i in range(len(self.policies))])
                for c in range(num_candidates)
            ]

    def close(self) -> None:
        for p in {id(p): p for p in self.policies}.values():
            close = getattr(p, "close", None)
            if callable(close) and self.kind == "api":
                close()


def frozen_copies(policies: Sequence[Policy], devices: Sequence[str] | None = None) -> list[Policy]:
    """Deep copies of ``policies`` (one copy of any shared base), frozen, moved to ``devices``."""
    copies = copy.deepcopy(list(policies))  # one memo: agents sharing a base keep sharing one copy
    for i, p in enumerate(copies):
        for param in p.parameters():
            param.requires_grad_(False)
        if devices:
            model = getattr(p, "model", None)
            if model is not None:
                model.to(devices[i] if len(devices) > 1 else devices[0])
    return copies


def check_devices(devices: Sequence[str] | None, num_agents: int) -> None:
    if devices is not None and len(devices) not in (1, num_agents):
        raise ValueError(
            f"comparator_devices names {len(devices)} devices for {num_agents} agents; give one or one per agent"
        )


def load_model_policies(sources: Sequence[str], devices: Sequence[str] | None) -> list[Policy]:
    """Frozen comparator policies from model sources (one per agent)."""
    from comlrl_core.models.hf_policy import TransformersPolicy

    out: list[Policy] = []
    for i, src in enumerate(sources):
        device = (devices[i] if len(devices) > 1 else devices[0]) if devices else "auto"
        policy = TransformersPolicy.from_source(src, device=device)
        for param in policy.parameters():
            param.requires_grad_(False)
        out.append(policy)
    return out


def api_policy(config: Any, max_new_tokens: int) -> Policy:
    """A RemotePolicy from the ``comparator_api_*`` options of an iterative config."""
    from comlrl_core.models.simple_policies import RemotePolicy
    from comlrl_core.remote.client import RemoteModelConfig

    remote = RemoteModelConfig(
        format=config.comparator_api_format,
        model=config.comparator_api_model,
        base_url=config.comparator_api_url,
        api_key_env=config.comparator_api_key_env,
        timeout_s=config.comparator_api_timeout,
        response_field=config.comparator_api_response_field,
        extra_headers=config.comparator_api_headers,
        max_tokens=max_new_tokens,
    )
    return RemotePolicy(remote, name=f"comparator:{config.comparator_api_model}")
