"""Dataset-v0: any dataset plus a reward function, the way CoMLRL and TRL users train.

=================== =====================================================================
Id                  ``comlrl/Dataset-v0`` (``envs.make("comlrl/Dataset-v0", dataset=..., reward_func=...)``)
Agents              ``agent_0 .. agent_{n-1}`` (``agent_names`` renames them); ``n`` is the number
                    of formatters, or ``num_agents`` (default 2)
Action space        ``Text``: the agent's completion
Observation space   ``Text``: the agent's prompt
Reward              whatever ``reward_func`` returns (then ``reward_processor``), one team reward
Success threshold   raw reward ``>= success_threshold`` (default 1.0) counts as a pass (pass@k)
=================== =====================================================================

**Task.** An item is one row of ``dataset``: a list of dicts, a Hugging Face
``datasets.Dataset`` (anything sized that iterates over row dicts), or the path of a
``.json`` / ``.jsonl`` file. ``reset(options={"task": i})`` plays row ``i`` of the split.

**Observation.** Turn 1: ``formatters[i](item)``, agent ``i``'s prompt for the item (CoMLRL's
formatters; one callable for every agent, or none: the item's ``"prompt"`` field). Later
turns: the prompts of ``external_transition``, used as they are unless the agent's
formatter takes an ``external_prompts`` keyword, which then receives them
(``formatter(item, external_prompts=prompt)``), as in CoMLRL. Without an external
transition, ``"plain"``: the turn-1 prompt, the agent's earlier responses, the teammates'
latest responses and an instruction to revise.

**Reward.** ``reward_func`` in CoMLRL's signature: one list of completions per agent,
positionally, and ``batch_items=`` (the dataset items) when the function accepts it::

    def reward_func(completions1, completions2, batch_items=None) -> list[float]: ...

By default it is called as CoMLRL calls it: once per joint action, with one-element
lists and ``batch_items=[item]``, returning one value. ``batched_reward=True`` scores
every joint action of a batched step in ONE call (lists of length B and
``batch_items`` of length B, element ``j`` belonging to joint action ``j``); use it for
functions that gain from batches (a reward model) and treat the lists element-wise.
Non-finite rewards become 0 with a diagnostic; anything that is not a number is an error.
Each turn is scored on that turn's completions.

**Termination.** ``num_turns`` turns (default 1), then truncation; with
``early_termination_threshold`` the episode terminates once the processed reward reaches it.

**Arguments** (besides the base ones: ``num_turns``, ``early_termination_threshold``,
``reward_processor``, ``external_prompt_passthrough``, ``task_slice``, ``render_mode``):

* ``dataset`` (required): the rows (see Task).
* ``reward_func`` (required): a callable, or ``"package.module:function"`` text (for YAML).
* ``formatters``: ``None``, one callable, or one per agent (callables or import texts).
* ``num_agents``: the team size when ``formatters`` is not a list (default 2).
* ``agent_names``: the agents' names (default ``agent_0`` ...).
* ``external_transition``: ``None`` / ``"plain"``, or a callable with CoMLRL's signature
  ``(prompt, agent_completions, num_agents, prompt_history_per_agent=None,
  response_history_per_agent=None) -> list[str]``; the history keywords are passed only
  when the callable takes them, so CoMLRL's three-argument transitions work unchanged.
  ``prompt`` is the item's ``"prompt"`` field (``""`` when it has none).
* ``batched_reward`` (False): see Reward.
* ``success_threshold`` (1.0): see the table.

Note: unlike the other environments, ``formatters`` here map a dataset ITEM to a prompt
(CoMLRL's meaning), not a prompt to a prompt.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Sequence

from envs.base import TextParallelEnv
from envs.dataset.loading import accepts_keyword, check_dataset, load_rows, resolve_callable

Formatter = Callable[..., str]


class _TransitionCall:
    """Calls a CoMLRL external transition with only the history keywords it accepts."""

    def __init__(self, fn: Callable[..., Sequence[str]]) -> None:
        self.fn = fn
        self._history = accepts_keyword(fn, "prompt_history_per_agent")

    def __call__(
        self,
        prompt: str,
        agent_completions: list[str],
        num_agents: int,
        prompt_history_per_agent: list[list[str]] | None = None,
        response_history_per_agent: list[list[str]] | None = None,
    ) -> Sequence[str]:
        if self._history:
            return self.fn(
                prompt,
                agent_completions,
                num_agents,
                prompt_history_per_agent=prompt_history_per_agent,
                response_history_per_agent=response_history_per_agent,
            )
        return self.fn(prompt, agent_completions, num_agents)


def _default_formatter(item: dict[str, Any]) -> str:
    if "prompt" not in item:
        raise KeyError(
            f"dataset item has no 'prompt' field (fields: {sorted(item)}); pass formatters=[...] "
            "that build each agent's prompt from the item"
        )
    return str(item["prompt"])


def _agent_formatters(formatters: Any, num_agents: int | None) -> list[Formatter]:
    if isinstance(formatters, (list, tuple)):
        if not formatters:
            raise ValueError("formatters is an empty list; give one callable per agent")
        resolved = [resolve_callable(f, f"formatters[{i}]") for i, f in enumerate(formatters)]
        if num_agents is not None and num_agents != len(resolved):
            raise ValueError(
                f"num_agents={num_agents} but formatters names {len(resolved)} agents; "
                "give one formatter per agent (or leave num_agents unset)"
            )
        return resolved
    count = 2 if num_agents is None else num_agents
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"num_agents must be an int >= 1, got {num_agents!r}")
    single = _default_formatter if formatters is None else resolve_callable(formatters, "formatters")
    return [single] * count


def _as_reward(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        item = getattr(value, "item", None)  # numpy / torch scalars
        if callable(item) and getattr(value, "ndim", 0) == 0:
            return _as_reward(item(), where)
        raise TypeError(f"reward_func returned {value!r:.80} for {where}; it must return numbers (a list of floats)")
    return float(value)


class DatasetEnv(TextParallelEnv):
    """Rows of a dataset scored by a user reward function (see the module docstring)."""

    metadata = {"name": "comlrl_dataset_v0", "render_modes": ["ansi"], "is_parallelizable": True}
    possible_agents: list[str] = []  # set per instance from the formatters / num_agents
    max_reward = 1.0

    def __init__(
        self,
        *,
        dataset: Any,
        reward_func: Callable[..., Any] | str,
        formatters: Formatter | str | Sequence[Formatter | str] | None = None,
        num_agents: int | None = None,
        agent_names: Sequence[str] | None = None,
        external_transition: str | Callable[..., Sequence[str]] | None = None,
        batched_reward: bool = False,
        success_threshold: float = 1.0,
        **base_kwargs: Any,
    ) -> None:
        check_dataset(dataset)
        self._dataset = dataset
        self.reward_func = resolve_callable(reward_func, "reward_func")
        self._reward_takes_items = accepts_keyword(self.reward_func, "batch_items")
        self.item_formatters = _agent_formatters(formatters, num_agents)
        self._formatter_takes_prompts = [accepts_keyword(f, "external_prompts") for f in self.item_formatters]
        count = len(self.item_formatters)
        names = [f"agent_{i}" for i in range(count)] if agent_names is None else [str(a) for a in agent_names]
        if len(names) != count or len(set(names)) != count:
            raise ValueError(f"agent_names must be {count} distinct names (one per agent), got {list(names)}")
        self.possible_agents = names
        if external_transition is None:
            external_transition = "plain"
        elif callable(external_transition):
            external_transition = _TransitionCall(external_transition)
        if not isinstance(batched_reward, bool):
            raise TypeError(f"batched_reward must be a bool, got {batched_reward!r}")
        self.batched_reward = batched_reward
        threshold = float(success_threshold)
        if not math.isfinite(threshold):
            raise ValueError(f"success_threshold must be a finite number, got {success_threshold!r}")
        self._success_threshold = threshold
        super().__init__(external_transition=external_transition, **base_kwargs)

    @property
    def success_threshold(self) -> float:
        return self._success_threshold

    # ---- hooks --------------------------------------------------------------------------
    def _load_tasks(self) -> list[dict[str, Any]]:
        return load_rows(self._dataset)

    def _initial_prompt(self, task: dict[str, Any], agent: str) -> str:
        index = self.possible_agents.index(agent)
        prompt = self.item_formatters[index](task)
        if not isinstance(prompt, str):
            raise TypeError(f"formatters[{index}] returned a {type(prompt).__name__}; a formatter must return str")
        return prompt

    def _format(self, agent: str, prompt: str) -> str:
        # Turn 1 prompts come formatted from _initial_prompt; later ones are the external
        # transition's, handed to formatters that take them (CoMLRL's external_prompts).
        index = self.possible_agents.index(agent)
        if self.turn == 0 or not self._formatter_takes_prompts[index]:
            return prompt
        assert self._task is not None
        formatted = self.item_formatters[index](self._task, external_prompts=prompt)
        if not isinstance(formatted, str):
            raise TypeError(f"formatters[{index}] returned a {type(formatted).__name__}; a formatter must return str")
        return formatted

    def _score_batch(self, items: list[tuple[dict[str, Any], dict[str, str]]]) -> list[tuple[float, dict[str, Any]]]:
        agents = self.possible_agents
        if self.batched_reward:
            completions = [[actions[a] for _, actions in items] for a in agents]
            values = self._call_reward(completions, [task for task, _ in items])
        else:
            values = []
            for task, actions in items:
                values.extend(self._call_reward([[actions[a]] for a in agents], [task]))
        return [(value, {}) for value in values]

    def _call_reward(self, completions: list[list[str]], batch_items: list[dict[str, Any]]) -> list[float]:
        if self._reward_takes_items:
            out = self.reward_func(*completions, batch_items=batch_items)
        else:
            out = self.reward_func(*completions)
        expected = len(batch_items)
        if isinstance(out, numbers.Real) and not isinstance(out, bool) and expected == 1:
            out = [out]
        if isinstance(out, (str, bytes)) or not hasattr(out, "__len__"):
            raise TypeError(f"reward_func must return a list of {expected} float(s), got {type(out).__name__}")
        if len(out) != expected:
            raise ValueError(
                f"reward_func returned {len(out)} values for {expected} joint completion(s); "
                "it must return one float per joint completion"
            )
        return [_as_reward(v, f"joint completion {j}") for j, v in enumerate(out)]

    def _shared_resources(self) -> tuple[str, ...]:
        return ("_dataset", "reward_func", "item_formatters")
