"""TextParallelEnv: the base of every comlrl text environment.

A :class:`pettingzoo.ParallelEnv` whose observations are prompts and whose actions are
completions. One ``step`` scores the *joint* action of all agents (one shared team
reward) and performs the *external transition* that builds each agent's next prompt.

Subclasses provide the task, the prompts and the reward through a few hooks::

    class MyEnv(TextParallelEnv):
        possible_agents = ["writer", "critic"]

        def _load_tasks(self) -> list[dict]: ...
        def _initial_prompt(self, task, agent) -> str: ...
        def _score_batch(self, items) -> list[tuple[float, dict]]: ...

Optional hooks: ``_transition`` (built-in next-turn modes, listed in
``_supported_modes``), ``_task_prompt`` (the ``prompt`` given to a custom transition),
``_shared_resources`` (attributes that ``clone`` shares instead of copying) and
``_scoring_key`` (which instances may be scored in one ``_score_batch`` call).

Constructor arguments common to every environment:

* ``num_turns`` (int, 1): turns per episode; the episode truncates after the last one.
* ``early_termination_threshold`` (float | None): terminate once the processed team
  reward reaches it.
* ``reward_processor``: ``None``, ``dict(scale=, shift=)``, a ``RewardProcessor`` or a
  callable; the raw reward stays in ``infos[agent]["raw_reward"]``.
* ``external_transition`` (str | callable, ``"plain"``): how the next prompt is built; a
  built-in mode name or a callable with the signature::

      custom(prompt: str, agent_completions: list[str], num_agents: int,
             prompt_history_per_agent: list[list[str]] | None = None,
             response_history_per_agent: list[list[str]] | None = None) -> list[str]

  called after each non-final turn; the histories include the turn just played.
* ``external_prompt_passthrough`` (bool, False): use transition prompts as they are
  instead of passing them through the agent's formatter.
* ``formatters`` (dict agent -> callable str -> str): applied to every prompt shown to
  that agent (turn 1 always; later turns unless passthrough).
* ``task_slice`` (str | slice | None): the split, e.g. ``"0:100"`` or ``":-20"``.
* ``render_mode`` (None | ``"ansi"``).

``infos[agent]`` after a step holds ``turn``, ``task_index``, ``raw_reward``, ``reward``,
``action_diagnostics`` (what was wrong with this agent's completion, if anything) and
the environment's scoring details.
"""

from __future__ import annotations

import copy
import string
from typing import Any, Callable, Hashable, Mapping, Sequence

import gymnasium
import numpy as np
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv

from envs.actions import sanitize_action
from envs.reward_processing import as_reward_processor

#: Characters the Text spaces sample from: printable ASCII (tab and newline included).
TEXT_CHARSET = "".join(sorted(set(string.printable) - set("\r\x0b\x0c")))

StepResult = tuple[dict[str, str], dict[str, float], dict[str, bool], dict[str, bool], dict[str, dict[str, Any]]]
CustomTransition = Callable[..., Sequence[str]]


def parse_task_slice(task_slice: str | slice | None) -> slice:
    """``"0:100"`` / ``":-20"`` / ``"::2"`` / ``slice`` / ``None`` -> ``slice``."""
    if task_slice is None:
        return slice(None)
    if isinstance(task_slice, slice):
        return task_slice
    if isinstance(task_slice, str):
        parts = task_slice.split(":")
        if 2 <= len(parts) <= 3:
            try:
                return slice(*(int(p) if p.strip() else None for p in parts))
            except ValueError:
                pass
    raise ValueError(f"task_slice must be a slice or a string like '0:100' or ':-20', got {task_slice!r}")


class TextParallelEnv(ParallelEnv):
    """Base class for cooperative text environments (see the module docstring)."""

    metadata: dict[str, Any] = {
        "name": "comlrl_text_v0",
        "render_modes": ["ansi"],
        "is_parallelizable": True,
    }
    possible_agents: list[str] = []
    _supported_modes: tuple[str, ...] = ("plain",)

    #: the Text spaces' bounds; actions longer than ``action_char_limit`` are cut there
    max_action_length: int = 4096
    max_observation_length: int = 1 << 20
    action_char_limit: int = 200_000

    #: the best raw reward; ``success_threshold`` defaults to it (raw scale)
    max_reward: float = 1.0

    def __init__(
        self,
        *,
        num_turns: int = 1,
        early_termination_threshold: float | None = None,
        reward_processor: Any = None,
        external_transition: str | CustomTransition = "plain",
        external_prompt_passthrough: bool = False,
        formatters: Mapping[str, Callable[[str], str]] | None = None,
        task_slice: str | slice | None = None,
        render_mode: str | None = None,
    ) -> None:
        if not self.possible_agents:
            raise TypeError(f"{type(self).__name__} must define possible_agents before TextParallelEnv.__init__")
        self.possible_agents = list(self.possible_agents)
        if isinstance(num_turns, bool) or not isinstance(num_turns, int) or num_turns < 1:
            raise ValueError(f"num_turns must be an int >= 1, got {num_turns!r}")
        if early_termination_threshold is not None:
            early_termination_threshold = float(early_termination_threshold)
        if isinstance(external_transition, str):
            if external_transition not in self._supported_modes:
                raise ValueError(
                    f"external_transition {external_transition!r} is not a mode of {type(self).__name__}; "
                    f"choose one of {list(self._supported_modes)} or pass a callable"
                )
        elif not callable(external_transition):
            raise TypeError(
                f"external_transition must be a mode name or a callable, got {type(external_transition).__name__}"
            )
        formatters = dict(formatters or {})
        unknown = set(formatters) - set(self.possible_agents)
        if unknown:
            raise ValueError(f"formatters name unknown agents {sorted(unknown)}; agents are {self.possible_agents}")
        for agent, fmt in formatters.items():
            if not callable(fmt):
                raise TypeError(f"formatters[{agent!r}] must be a callable str -> str")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}, got {render_mode!r}")

        self.num_turns = num_turns
        self.early_termination_threshold = early_termination_threshold
        self.reward_processor = as_reward_processor(reward_processor)
        self.external_transition = external_transition
        self.external_prompt_passthrough = bool(external_prompt_passthrough)
        self.formatters: dict[str, Callable[[str], str]] = formatters
        self.task_slice = parse_task_slice(task_slice)
        self.render_mode = render_mode

        self.agents: list[str] = []
        self.prompt_history: dict[str, list[str]] = {a: [] for a in self.possible_agents}
        self.response_history: dict[str, list[str]] = {a: [] for a in self.possible_agents}
        self.turn = 0  # turns played in the current episode
        self._task: dict[str, Any] | None = None
        self._task_index: int | None = None
        self._observations: dict[str, str] = {}
        self._np_random, _ = seeding.np_random(None)
        self._split: list[dict[str, Any]] | None = None  # loaded lazily, shared by clones
        self._observation_spaces: dict[str, gymnasium.spaces.Text] = {}
        self._action_spaces: dict[str, gymnasium.spaces.Text] = {}

    # ---- hooks for subclasses ---------------------------------------------------------
    def _load_tasks(self) -> list[dict[str, Any]]:
        """All task items, before ``task_slice`` is applied."""
        raise NotImplementedError

    def _initial_prompt(self, task: dict[str, Any], agent: str) -> str:
        """The turn-1 prompt of ``agent`` (before its formatter)."""
        raise NotImplementedError

    def _score_batch(self, items: list[tuple[dict[str, Any], dict[str, str]]]) -> list[tuple[float, dict[str, Any]]]:
        """Raw team reward and details for each ``(task, joint action)``.

        Actions are clean ``str``. Details are copied into every agent's info; a
        ``"per_agent"`` entry ``{agent: {...}}`` is merged into that agent's info only.
        """
        raise NotImplementedError

    def _task_prompt(self, task: dict[str, Any]) -> str:
        """The ``prompt`` argument of a custom transition callable."""
        return str(task.get("prompt", ""))

    def _transition(
        self, task: dict[str, Any], actions: dict[str, str], details: dict[str, Any], mode: str
    ) -> dict[str, str]:
        """Next-turn prompt text per agent for a built-in mode (before formatters)."""
        if mode == "plain":
            return {agent: self._plain_prompt(task, agent, actions) for agent in self.possible_agents}
        raise ValueError(f"{type(self).__name__} has no external transition mode {mode!r}")

    def _plain_prompt(self, task: dict[str, Any], agent: str, actions: dict[str, str]) -> str:
        """``plain`` mode: the original prompt, this agent's past responses, the teammates'
        latest responses, and an instruction to revise."""
        parts = [self._initial_prompt(task, agent)]
        for t, response in enumerate(self.response_history[agent], start=1):
            parts.append(f"Your response in turn {t}:\n{response}")
        for other in self.possible_agents:
            if other != agent:
                parts.append(f"Latest response of {other}:\n{actions.get(other, '')}")
        parts.append("Revise your response.")
        return "\n\n".join(parts)

    def _shared_resources(self) -> tuple[str, ...]:
        """Attribute names that ``clone`` shares by identity (sandbox pools, clients...)."""
        return ()

    def _scoring_key(self) -> Hashable:
        """Instances with equal keys may be scored together by one ``_score_batch`` call
        (made on the first of them). Clones share their resources, hence their key."""
        return (type(self), tuple(id(getattr(self, name, None)) for name in self._shared_resources()))

    # ---- spaces -------------------------------------------------------------------------
    def observation_space(self, agent: str) -> gymnasium.spaces.Text:
        space = self._observation_spaces.get(agent)
        if space is None:
            self._check_agent(agent)
            space = gymnasium.spaces.Text(self.max_observation_length, min_length=0, charset=TEXT_CHARSET)
            self._observation_spaces[agent] = space
        return space

    def action_space(self, agent: str) -> gymnasium.spaces.Text:
        space = self._action_spaces.get(agent)
        if space is None:
            self._check_agent(agent)
            space = gymnasium.spaces.Text(self.max_action_length, min_length=0, charset=TEXT_CHARSET)
            self._action_spaces[agent] = space
        return space

    def _check_agent(self, agent: str) -> None:
        if agent not in self.possible_agents:
            raise KeyError(f"unknown agent {agent!r}; agents are {self.possible_agents}")

    # ---- tasks --------------------------------------------------------------------------
    def _tasks(self) -> list[dict[str, Any]]:
        if self._split is None:
            self._split = list(self._load_tasks())[self.task_slice]
            if not self._split:
                raise ValueError(f"{type(self).__name__}: task_slice {self.task_slice} selects no task")
        return self._split

    @property
    def num_tasks(self) -> int:
        return len(self._tasks())

    def task(self, index: int) -> dict[str, Any]:
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
            raise TypeError(
                f"a task index must be an int, got {type(index).__name__} {index!r}; "
                "pass options={'task': <int index>} or {'task': <task dict>}"
            )
        tasks = self._tasks()
        if not -len(tasks) <= index < len(tasks):
            raise IndexError(f"task index {index!r} out of range for {len(tasks)} tasks")
        return tasks[int(index)]

    @property
    def success_threshold(self) -> float:
        """Raw reward at or above which a joint answer counts as a success (pass@k)."""
        return float(self.max_reward)

    # ---- episode ------------------------------------------------------------------------
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        if seed is not None:
            self._np_random, _ = seeding.np_random(int(seed))
        choice = (options or {}).get("task")
        index: int | None
        if choice is None:
            drawn = int(self._np_random.integers(self.num_tasks))
            task, index = self.task(drawn), drawn
        elif isinstance(choice, Mapping):
            index, task = None, dict(choice)
        else:
            task = self.task(choice)  # bounds-checked; negative indices count from the end
            index = int(choice) % self.num_tasks
        self._task, self._task_index = task, index
        self.agents = list(self.possible_agents)
        self.turn = 0
        self.prompt_history = {a: [] for a in self.possible_agents}
        self.response_history = {a: [] for a in self.possible_agents}
        obs = {a: self._format(a, self._initial_prompt(task, a)) for a in self.agents}
        self._set_observations(obs)
        infos = {a: {"turn": 0, "task_index": index} for a in self.agents}
        return dict(obs), infos

    def step(self, actions: Mapping[str, Any]) -> StepResult:
        return type(self).step_many([self], [actions])[0]

    @classmethod
    def step_many(
        cls, envs: Sequence["TextParallelEnv"], actions_list: Sequence[Mapping[str, Any]]
    ) -> list[StepResult]:
        """Step many envs; all joint actions of envs with the same ``_scoring_key`` are
        scored by ONE ``_score_batch`` call (e.g. one sandbox batch)."""
        if len(envs) != len(actions_list):
            raise ValueError(f"step_many got {len(envs)} envs but {len(actions_list)} joint actions")
        prepared = [env._prepare_step(actions) for env, actions in zip(envs, actions_list, strict=True)]
        groups: dict[Hashable, list[int]] = {}
        for i, env in enumerate(envs):
            groups.setdefault(env._scoring_key(), []).append(i)
        scores: dict[int, tuple[float, dict[str, Any]]] = {}  # env index -> (reward, details)
        for members in groups.values():
            items = [(envs[i]._active_task(), prepared[i][0]) for i in members]
            results = envs[members[0]]._score_batch(items)
            if len(results) != len(items):
                raise RuntimeError(f"_score_batch returned {len(results)} results for {len(items)} items")
            for i, result in zip(members, results, strict=True):
                scores[i] = result
        return [
            env._finish_step(clean, diags, *scores[i])
            for i, (env, (clean, diags)) in enumerate(zip(envs, prepared, strict=True))
        ]

    def _active_task(self) -> dict[str, Any]:
        if self._task is None:
            raise RuntimeError("no task: call reset() before step()")
        return self._task

    def _prepare_step(self, actions: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, list[str]]]:
        if not self.agents:
            raise RuntimeError("the episode is over (or never started); call reset() before step()")
        if not isinstance(actions, Mapping):
            raise TypeError(f"actions must be a dict agent -> completion, got {type(actions).__name__}")
        unknown = set(actions) - set(self.possible_agents)
        if unknown:
            raise ValueError(
                f"actions name unknown agents {sorted(map(str, unknown))}; agents are {self.possible_agents}"
            )
        clean: dict[str, str] = {}
        diags: dict[str, list[str]] = {}
        for agent in self.agents:
            clean[agent], diags[agent] = sanitize_action(actions.get(agent), self.action_char_limit)
        return clean, diags

    def _finish_step(
        self, clean: dict[str, str], diags: dict[str, list[str]], raw: float, details: dict[str, Any]
    ) -> StepResult:
        try:
            raw = float(raw)
        except (TypeError, ValueError):
            raw = float("nan")
        details = dict(details)
        if not np.isfinite(raw):
            details.setdefault("diagnostics", []).append(f"non-finite raw reward {raw!r} replaced by 0")
            raw = 0.0
        reward = float(self.reward_processor(raw))
        self.turn += 1
        for agent in self.agents:
            self.response_history[agent].append(clean[agent])

        terminated = self.early_termination_threshold is not None and reward >= self.early_termination_threshold
        truncated = not terminated and self.turn >= self.num_turns
        live = list(self.agents)
        if terminated or truncated:
            obs = {a: self._observations[a] for a in live}  # final observation: the last prompt
            self.agents = []
        else:
            obs = self._next_observations(clean, details)
            self._set_observations(obs)

        per_agent = details.pop("per_agent", {}) or {}
        infos: dict[str, dict[str, Any]] = {}
        for agent in live:
            info = copy.deepcopy(details)
            info.update(copy.deepcopy(per_agent.get(agent, {})))
            info.update(
                turn=self.turn,
                task_index=self._task_index,
                raw_reward=raw,
                reward=reward,
                action_diagnostics=list(diags[agent]),
            )
            infos[agent] = info
        rewards = {a: reward for a in live}
        terminations = {a: terminated for a in live}
        truncations = {a: truncated for a in live}
        return obs, rewards, terminations, truncations, infos

    def _next_observations(self, clean: dict[str, str], details: dict[str, Any]) -> dict[str, str]:
        assert self._task is not None
        mode = self.external_transition
        if callable(mode):
            agents = self.possible_agents
            prompts = mode(
                self._task_prompt(self._task),
                [clean[a] for a in agents],
                len(agents),
                prompt_history_per_agent=[list(self.prompt_history[a]) for a in agents],
                response_history_per_agent=[list(self.response_history[a]) for a in agents],
            )
            if (
                isinstance(prompts, str)
                or not isinstance(prompts, Sequence)
                or len(prompts) != len(agents)
                or not all(isinstance(p, str) for p in prompts)
            ):
                raise ValueError(
                    f"the external_transition callable must return a list of {len(agents)} str "
                    f"(one prompt per agent, in order {agents}), got {prompts!r:.200}"
                )
            raw_prompts = dict(zip(agents, prompts, strict=True))
        else:
            raw_prompts = self._transition(self._task, clean, details, mode)
        if self.external_prompt_passthrough:
            return {a: raw_prompts[a] for a in self.agents}
        return {a: self._format(a, raw_prompts[a]) for a in self.agents}

    def _format(self, agent: str, prompt: str) -> str:
        fmt = self.formatters.get(agent)
        return prompt if fmt is None else fmt(prompt)

    def _set_observations(self, obs: dict[str, str]) -> None:
        self._observations = dict(obs)
        for agent, prompt in obs.items():
            self.prompt_history[agent].append(prompt)

    # ---- copies and views ---------------------------------------------------------------
    def clone(self) -> "TextParallelEnv":
        """An independent copy at the same state; heavy resources are shared."""
        shared = ["_split", "formatters", "reward_processor", "external_transition", *self._shared_resources()]
        memo: dict[int, Any] = {}
        for name in shared:
            value = getattr(self, name, None)
            if value is not None:
                memo[id(value)] = value
        return copy.deepcopy(self, memo)

    def state(self) -> str:
        """Text view of the joint state: the task, then every agent's prompts and responses."""
        if self._task is None:
            return "(no episode: call reset())"
        lines = [f"# task {self._task_index}", self._task_prompt(self._task), f"# turn {self.turn} of {self.num_turns}"]
        for agent in self.possible_agents:
            prompts, responses = self.prompt_history[agent], self.response_history[agent]
            for t, prompt in enumerate(prompts, start=1):
                lines.append(f"## {agent} prompt {t}\n{prompt}")
                if t <= len(responses):
                    lines.append(f"## {agent} response {t}\n{responses[t - 1]}")
        return "\n".join(lines)

    def render(self) -> str | None:
        if self.render_mode is None:
            gymnasium.logger.warn("render() called without render_mode; pass render_mode='ansi'")
            return None
        return self.state()

    def close(self) -> None:
        """Nothing to release by default (subclasses free their own resources)."""
