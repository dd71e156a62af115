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
:func:`parse_centralized` (sections ``<agent_0>...</agent_0>``, ``<agent_1>`` ...). As in
CoMLRL, a missing role section reads as an empty response (a *partial* parse, counted in
``iter/comparator_partial``). A response with no section at all drops that candidate index
(counted in ``iter/comparator_dropped``) where CoMLRL raises: one unreadable sample of a
comparator should not end a training run.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
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


def parse_centralized(text: str, num_agents: int) -> tuple[list[str] | None, int]:
    """``(every role's section, how many sections were missing)``. A missing section reads as
    ``""`` (CoMLRL's rule); the sections are None only when none is found at all."""
    out, missing = [], 0
    for i in range(num_agents):
        match = re.search(rf"<\s*agent_{i}\s*>(.*?)<\s*/\s*agent_{i}\s*>", str(text), flags=re.IGNORECASE | re.DOTALL)
        missing += match is None
        out.append("" if match is None else match.group(1).strip())
    return (None if missing == num_agents else out), missing


@dataclass
class ParseCounts:
    """Centralized responses of one sampling call: dropped (no section) and partial (some missing)."""

    dropped: int = 0
    partial: int = 0


def render_centralized(parts: Sequence[str]) -> str:
    """Role texts as one centralized response, in the tag format :func:`parse_centralized` reads."""
    return "\n".join(f"<agent_{i}>\n{text}\n</agent_{i}>" for i, text in enumerate(parts))


def sample_centralized(
    tasks: Sequence[TaskCandidates],
    actor: Policy,
    agent_names: Sequence[str],
    num_candidates: int,
    generation_config: GenerationConfig,
    seed: int,
    *,
    keep_token_ids: bool,
    **generate_kwargs: Any,
) -> ParseCounts:
    """Fill ``tasks[*].candidates`` with ``actor``'s centralized responses (one call for every task).

    Each response is split into role texts (the candidate's ``completions``); a response with
    no section at all becomes a dropped (None) candidate. With ``keep_token_ids`` the task
    keeps ``prompt_ids = [centralized prompt ids]`` and each candidate ``token_ids = [ids of
    the whole response]``: one sequence, the actor's, scored over the whole joint completion.
    """
    prompts = [centralized_prompt(t.prompts, agent_names) for t in tasks]
    outs = actor.generate(
        prompts, num_samples=num_candidates, generation_config=generation_config, seed=seed, **generate_kwargs
    )
    counts = ParseCounts()
    for task, group in zip(tasks, outs, strict=True):
        task.prompt_ids = [list(group[0].prompt_token_ids)] if keep_token_ids and group else None
        task.candidates = []
        for completion in group:
            parts, missing = parse_centralized(completion.text, len(agent_names))
            counts.dropped += parts is None
            counts.partial += parts is not None and missing > 0
            ids = [list(completion.token_ids)] if keep_token_ids else None
            task.candidates.append(None if parts is None else JointCandidate(completions=parts, token_ids=ids))
    return counts


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
        self.last_partial = 0  # centralized: responses of the last sample() missing some role's section
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
        """Fill ``tasks[*].candidates`` (text only); returns how many candidates were dropped
        (``last_partial``: how many kept ones missed a role's section, filled with "")."""
        self.last_partial = 0
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
        context = self._api_context(self.centralized_index, tasks) if self.kind == "api" else {}
        counts = sample_centralized(
            tasks,
            self.policies[self.centralized_index],
            self.agent_names,
            num_candidates,
            generation_config,
            int(seeds[self.centralized_index]),
            keep_token_ids=False,  # ids of the comparator's own tokenizer are of no use to the target
            **context,
        )
        self.last_partial = counts.partial
        return counts.dropped

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
