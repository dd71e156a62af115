"""``comlrl/CoopCode-v0``: two LLM agents write one Python solution together.

Agents
    ``["aux", "main"]`` (default, ``agents="team"``): ``aux`` writes a helper function
    ``aux(...)``; ``main`` writes the task's entry point and may call ``aux``.
    ``["main"]`` (``agents="single"`` or ``num_agents=1``): one agent writes everything; the
    single-agent baseline.

Observations
    ``Text``: the agent's prompt. Turn 1: the problem (signature + docstring) and the
    agent's role; later turns: built by the external transition mode (below).

Actions
    ``Text``: the agent's completion. Python code, plain or in ```python fences. Only
    imports, function / class definitions and assignments are kept (top-level calls and
    example runs are dropped). Garbage (empty, huge, binary-looking, random text) is scored
    low with diagnostics; it never raises.

Rewards
    One team reward, identical for every agent, in ``[0, 4]`` by default:
    ``0.5 definitions + 0.5 syntax + 2.0 pass_rate + 1.0 cooperation`` (see
    :mod:`envs.code.reward`; ``[0, 3]`` in single-agent mode, which has no cooperation
    level). Every test of the task runs in the sandbox. ``infos[agent]`` holds ``levels``
    (the four levels), ``max_reward``, ``tests_passed``, ``tests_total``, ``pass_rate``,
    ``passed`` (all tests passed), ``found``, ``syntax_errors``, ``cooperation`` (the AST
    analysis), ``test_outcomes`` (per test: text, passed, exception), ``diagnostics`` and, in
    ``expert_edits`` mode, ``expert_failures`` / ``expert_error``.

Termination / truncation
    Truncates after ``num_turns`` turns; terminates early when the processed reward reaches
    ``early_termination_threshold`` (e.g. 4.0 = every test passed with real cooperation).

Arguments (besides the base ones: ``num_turns``, ``early_termination_threshold``,
``reward_processor``, ``external_transition``, ``external_prompt_passthrough``,
``formatters``, ``task_slice``, ``render_mode``)
    ``dataset`` ("easy" | "humaneval" | "coophumaneval" | "mbpp" | a file path; "easy" is
    the package's 72 short aux + main problems, read offline, with the fixed split
    ``task_slice="0:36"`` train and ``"36:"`` held out), ``data_path`` (local
    JSON / JSONL file), ``dataset_id`` / ``dataset_config`` / ``split`` (hub, through
    ``datasets``), ``tasks`` (records given directly); ``agents`` ("team" | "single") or
    ``num_agents`` (2 | 1); ``aux_name`` ("aux"); ``reward_weights`` (``RewardWeights`` or
    dict); ``sandbox`` (an existing ``sandbox.Sandbox`` to share; the env never closes it),
    ``sandbox_backend`` ("auto" | "docker" | "process"), ``sandbox_pool_size``,
    ``sandbox_timeout`` (seconds per program), ``sandbox_kwargs`` (more ``sandbox.Sandbox``
    options, e.g. ``memory_mb``); ``sandbox_slice`` (tests shown by
    ``level_feedback``); ``expert_model``, ``expert_policy``, ``expert_generation_config``.

External transition modes
    ``plain``: the agent's prompt, its past code and its teammate's latest code, plus a
    revise instruction; executes nothing. ``level_feedback``: the same plus static checks
    (functions found, syntax error line / column), the outcomes of the tests picked by
    ``sandbox_slice`` (from the reward run: ``1`` first test, ``N > 0`` first N, ``N < 0``
    last |N|, ``0`` / ``None`` / ``"all"`` every test) and notes on aux usage and thin
    wrappers. ``expert_edits``: an expert model proposes edits to aux and main (remote model,
    default ``deepseek-coder`` with ``DEEPSEEK_API_KEY``, or a local Policy); a failed call
    gives a prompt without edits and is counted. A callable with the docs/design.md signature
    is handled by the base.

The env creates its sandbox on the first scoring call and closes it in ``close()``;
clones share it (and the expert, and the task list). ``step_many`` scores every pending
joint action with ONE ``sandbox.run`` call. A sandbox that cannot run raises
:class:`CodeSandboxError`, which names the backend.
"""

from __future__ import annotations

import threading
from typing import Any, Hashable, Mapping

from envs.base import TextParallelEnv
from envs.code import expert as expert_mod
from envs.code import feedback, prompts
from envs.code.reward import RewardWeights, analyse, harness_for, score
from envs.code.tasks import load_tasks, normalise_record


class CodeSandboxError(RuntimeError):
    """The sandbox could not score the batch (unavailable, or died mid-run)."""


class _SandboxHandle:
    """A lazily created sandbox shared by an env and its clones."""

    def __init__(self, sandbox: Any, backend: str, pool_size: int | None, options: dict[str, Any]) -> None:
        self.sandbox = sandbox
        self.owned = sandbox is None  # we close only what we created
        self.backend = backend
        self.pool_size = pool_size
        self.options = options
        self._lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> "_SandboxHandle":
        return self

    @property
    def backend_name(self) -> str:
        box = self.sandbox
        return str(getattr(box, "backend_name", None) or getattr(box, "backend", None) or self.backend)

    def get(self) -> Any:
        with self._lock:
            if self.sandbox is None:
                import sandbox as sandbox_pkg  # noqa: PLC0415 -- heavy (docker), only when code runs

                kwargs: dict[str, Any] = {**self.options, "backend": self.backend}
                if self.pool_size is not None:
                    kwargs["pool_size"] = self.pool_size
                try:
                    self.sandbox = sandbox_pkg.Sandbox(**kwargs)
                except Exception as err:
                    raise CodeSandboxError(
                        f"CoopCode cannot start its sandbox (backend {self.backend!r}): {type(err).__name__}: {err}. "
                        "Choose another with sandbox_backend='process' or 'docker', or pass sandbox=..."
                    ) from err
            return self.sandbox

    def close(self) -> None:
        with self._lock:
            if self.owned and self.sandbox is not None:
                box, self.sandbox = self.sandbox, None
                box.close()


class CoopCodeEnv(TextParallelEnv):
    """Cooperative code generation; see the module docstring."""

    metadata = {"name": "coopcode_v0", "render_modes": ["ansi"], "is_parallelizable": True}
    possible_agents = ["aux", "main"]
    _supported_modes = ("plain", "level_feedback", "expert_edits")
    max_reward = 4.0

    def __init__(
        self,
        *,
        dataset: str = "humaneval",
        data_path: str | None = None,
        dataset_id: str | None = None,
        dataset_config: str | None = None,
        split: str | None = None,
        tasks: list[dict] | None = None,
        agents: str = "team",
        num_agents: int | None = None,
        aux_name: str = "aux",
        reward_weights: RewardWeights | Mapping[str, float] | None = None,
        sandbox: Any = None,
        sandbox_backend: str = "auto",
        sandbox_pool_size: int | None = None,
        sandbox_timeout: float = 10.0,
        sandbox_kwargs: Mapping[str, Any] | None = None,
        sandbox_slice: int | str | None = 1,
        expert_model: Any = None,
        expert_policy: Any = None,
        expert_generation_config: Any = None,
        **base_kwargs: Any,
    ) -> None:
        if num_agents is not None:
            if num_agents not in (1, 2):
                raise ValueError(f"num_agents must be 1 (single agent) or 2 (aux + main), got {num_agents!r}")
            agents = "single" if num_agents == 1 else "team"
        if agents not in ("team", "single"):
            raise ValueError(f"agents must be 'team' (aux + main) or 'single' (main alone), got {agents!r}")
        if not isinstance(aux_name, str) or not aux_name.isidentifier():
            raise ValueError(f"aux_name must be a Python identifier, got {aux_name!r}")
        if sandbox_backend not in ("auto", "docker", "process"):
            raise ValueError(f"sandbox_backend must be 'auto', 'docker' or 'process', got {sandbox_backend!r}")
        if isinstance(sandbox_timeout, bool) or not isinstance(sandbox_timeout, (int, float)) or sandbox_timeout <= 0:
            raise ValueError(f"sandbox_timeout must be a number of seconds > 0, got {sandbox_timeout!r}")
        if sandbox is not None and not callable(getattr(sandbox, "run", None)):
            raise TypeError(f"sandbox must be a sandbox.Sandbox (with run()), got {type(sandbox).__name__}")
        if isinstance(reward_weights, Mapping):
            reward_weights = RewardWeights(**reward_weights)
        elif reward_weights is None:
            reward_weights = RewardWeights()
        elif not isinstance(reward_weights, RewardWeights):
            raise TypeError("reward_weights must be a RewardWeights or a dict of its fields")

        self.single = agents == "single"
        self.possible_agents = ["main"] if self.single else ["aux", "main"]
        super().__init__(**base_kwargs)
        self.aux_name = aux_name
        self.reward_weights = reward_weights
        self.max_reward = reward_weights.maximum(self.single)
        self.sandbox_timeout = float(sandbox_timeout)
        self.sandbox_slice = feedback.validate_sandbox_slice(sandbox_slice)
        self._source: dict[str, Any] = dict(  # load_tasks' keyword arguments
            dataset=dataset, data_path=data_path, dataset_id=dataset_id, dataset_config=dataset_config, split=split
        )
        self._given_tasks = tasks
        self._sandbox = _SandboxHandle(sandbox, sandbox_backend, sandbox_pool_size, dict(sandbox_kwargs or {}))
        self._owns_resources = True
        self._expert: expert_mod.Expert | None = None
        if self.external_transition == "expert_edits" or expert_policy is not None or expert_model is not None:
            self._expert = expert_mod.Expert(expert_model, expert_policy, expert_generation_config)
        self.expert_failures = 0  # failed expert calls in this episode
        self._expert_error: str | None = None  # the failure of this step's expert call, if any

    # ---- base hooks -------------------------------------------------------------------
    def _load_tasks(self) -> list[dict]:
        if self._given_tasks is not None:
            return [normalise_record(r, "custom", i) for i, r in enumerate(self._given_tasks)]
        return load_tasks(**self._source)

    def _initial_prompt(self, task: dict, agent: str) -> str:
        return prompts.initial_prompt(task, agent, self.single, self.aux_name)

    def _shared_resources(self) -> tuple[str, ...]:
        return ("_sandbox", "_expert", "_given_tasks")

    def _scoring_key(self) -> Hashable:
        # envs that share a sandbox (clones, or envs given the same one) are scored together
        # when they agree on how to score
        handle = self._sandbox
        box_id = id(handle) if handle.owned else id(handle.sandbox)
        return (type(self), box_id, self.single, self.aux_name, self.reward_weights, self.sandbox_timeout)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        if options and isinstance(options.get("task"), Mapping):
            options = dict(options, task=normalise_record(dict(options["task"]), "custom"))
        self.expert_failures = 0
        return super().reset(seed=seed, options=options)

    def _score_batch(self, items: list[tuple[dict, dict[str, str]]]) -> list[tuple[float, dict]]:
        subs = [analyse(task, actions, self.single, self.aux_name) for task, actions in items]
        programs, owners = [], []
        for i, sub in enumerate(subs):
            harness = harness_for(sub)
            if harness is not None:
                programs.append(self._program(*harness))
                owners.append(i)
        results: list[Any] = [None] * len(subs)
        if programs:
            for i, result in zip(owners, self._run_sandbox(programs), strict=True):
                results[i] = result
        return [score(sub, result, self.reward_weights) for sub, result in zip(subs, results, strict=True)]

    def _program(self, source: str, tests: list[str]) -> Any:
        from sandbox.types import Program  # noqa: PLC0415 -- light; keeps docker out of env import

        return Program(source=source, tests=tests, timeout=self.sandbox_timeout, per_assert=True)

    def _run_sandbox(self, programs: list[Any]) -> list[Any]:
        box = self._sandbox.get()
        try:
            results = list(box.run(programs))
        except Exception as err:
            raise CodeSandboxError(
                f"CoopCode: the sandbox (backend {self._sandbox.backend_name!r}) failed while running "
                f"{len(programs)} program(s): {type(err).__name__}: {err}"
            ) from err
        if len(results) != len(programs):
            raise CodeSandboxError(
                f"CoopCode: the sandbox (backend {self._sandbox.backend_name!r}) returned {len(results)} "
                f"results for {len(programs)} programs"
            )
        lost = [r for r in results if getattr(r, "error_type", None) == "SandboxLost"]
        if lost:  # the sandbox already retried each once: a lost worker is not the agents' failure
            raise CodeSandboxError(
                f"CoopCode: {len(lost)} program(s) lost their sandbox worker twice "
                f"(backend {self._sandbox.backend_name!r}): {lost[0].error_message}"
            )
        return results

    @classmethod
    def step_many(cls, envs, actions_list):
        """The base's batched step; in ``expert_edits`` mode infos also carry
        ``expert_failures`` (failed expert calls this episode) and ``expert_error``."""
        for env in envs:
            env._expert_error = None
        results = super().step_many(envs, actions_list)
        for env, (_, _, _, _, infos) in zip(envs, results, strict=True):
            if env.external_transition == "expert_edits":
                for info in infos.values():
                    info["expert_failures"] = env.expert_failures
                    info["expert_error"] = env._expert_error
        return results

    # ---- transitions ------------------------------------------------------------------
    def _names(self, task: dict) -> dict[str, str]:
        return {a: prompts.target_name(task, a, self.aux_name) for a in self.possible_agents}

    def _transition(self, task: dict, actions: dict[str, str], details: dict, mode: str) -> dict[str, str]:
        names = self._names(task)
        out = {}
        if mode == "expert_edits":
            edits, self._expert_error = self._ask_expert(task, actions, details, names)
        for agent in self.possible_agents:
            initial = self._initial_prompt(task, agent)
            history = self.response_history[agent]
            mates = {o: actions.get(o, "") for o in self.possible_agents if o != agent}
            if mode == "plain":
                out[agent] = feedback.plain_prompt(initial, agent, history, mates, names[agent])
            elif mode == "level_feedback":
                out[agent] = feedback.level_feedback_prompt(
                    initial, agent, history, mates, names[agent], details, names, self.sandbox_slice, self.aux_name
                )
            elif mode == "expert_edits":
                section = feedback.history_section(agent, history, mates)
                assert self._expert is not None
                out[agent] = expert_mod.expert_edits_prompt(
                    initial, section, names[agent], None if edits is None else edits[agent], self._expert.name
                )
            else:
                raise ValueError(f"CoopCodeEnv has no external transition mode {mode!r}")
        return out

    def _ask_expert(self, task, actions, details, names) -> tuple[dict[str, str] | None, str | None]:
        assert self._expert is not None
        failing = [o["test"] for o in details.get("test_outcomes", []) if o["is_assert"] and not o["passed"]]
        request = expert_mod.expert_request(
            task,
            {a: actions.get(a, "") for a in self.possible_agents},
            names,
            feedback.select_tests(failing, self.sandbox_slice),
        )
        try:
            reply = self._expert.ask(request, task_item=task)
        except expert_mod.ExpertError as err:
            self.expert_failures += 1
            return None, str(err)
        return expert_mod.parse_edits(reply, self.possible_agents), None

    # ---- lifecycle --------------------------------------------------------------------
    def clone(self) -> "CoopCodeEnv":
        twin = super().clone()
        twin._owns_resources = False  # the original closes the shared sandbox and expert
        return twin

    def close(self) -> None:
        if self._owns_resources:
            self._sandbox.close()
            if self._expert is not None:
                self._expert.close()
        super().close()
