"""``comlrl eval``: evaluate a team of models on a registered environment.

Examples::

    comlrl eval --env comlrl/Writing-v0 --model tiny-random --n-samples 4 --k 1 4 \\
        --task-slice=-40: --num-tasks 20 --env-kwarg num_turns=2 --out results.json
    comlrl eval --checkpoint runs/magrpo            # replay the run's own evaluation

``--checkpoint RUN_DIR`` evaluates a trained run's team (its agent specs and the weights
of its latest checkpoint: LoRA adapters or full weights) with the run's saved evaluation
settings (``RUN_DIR/evaluation.json``: env, env arguments, held-out slice, number of
tasks and episodes, sampling, seed), so it prints the same ``eval/...`` values as the
run's last eval row in ``metrics.jsonl``. Any option given overrides the saved value
(and says so on stderr).

Without ``--checkpoint``, ``--env`` and ``--model`` are required. ``--model`` once means
every agent plays the same model (loaded once); repeat it to give each agent its own (in
the env's agent order). Model sources are those of ``comlrl_core.models.model_source``: an
alias (``tiny-random``, ``smollm2-135m-instruct``), a folder with ``config.json``, a
``.gguf`` file or a hub id.

``--task-slice`` selects the split the way trainers' ``eval_task_slice`` does (write a
slice that starts with ``-`` as ``--task-slice=-40:``); ``--num-tasks N`` takes its
first N tasks. The metrics (see ``docs/evaluation.md``) are printed as a Markdown table
and, with ``--out FILE``, written as flat JSON with the ``eval/`` keys.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any, Sequence

from comlrl_core.policy import GenerationConfig

#: option name -> (EvalSpec field or generation field, default without --checkpoint)
_SPEC_OPTIONS = {
    "env": ("env", None),
    "num_tasks": ("num_tasks", None),
    "n_samples": ("episodes_per_task", 1),
    "k": ("k", [1]),
    "num_turns": ("max_turns", None),
    "discount": ("discount", 1.0),
    "seed": ("seed", 0),
}
_GENERATION_OPTIONS = {"max_new_tokens": 128, "temperature": 1.0, "top_p": 1.0, "top_k": 0}


def parse_env_kwargs(pairs: Sequence[str]) -> dict[str, Any]:
    """``["num_turns=2", "task_slice=0:10", "x=true"]`` -> typed dict (JSON values, else str)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--env-kwarg expects key=value, got {pair!r}")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def build_team(models: Sequence[str], num_agents: int) -> Any:
    """One policy shared by all agents for a single model, else one per agent."""
    from comlrl_core.models.team import Team  # heavy (torch, transformers): only when evaluating

    if len(models) not in (1, num_agents):
        raise ValueError(f"give --model once (every agent) or {num_agents} times (one per agent), got {len(models)}")
    if len(set(models)) == 1:
        return Team.from_specs([models[0]])  # the evaluation maps a 1-member team onto every agent
    return Team.from_specs(list(models))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _spec_from_options(args: argparse.Namespace, saved: Any | None) -> tuple[Any, list[str]]:
    """The EvalSpec to run: the saved one (if any) with every given option applied, and
    one note per option that overrode a saved value."""
    from comlrl_core.episodes.spec import EvalSpec

    notes: list[str] = []
    fields: dict[str, Any] = saved.to_dict() if saved is not None else {}
    generation = dict(fields.get("generation") or {})
    env_kwargs = dict(fields.get("env_kwargs") or {})

    def put(target: dict[str, Any], key: str, value: Any, flag: str) -> None:
        if saved is not None and target.get(key) != value:
            notes.append(f"{flag} {value!r} overrides the run's {key}={target.get(key)!r}")
        target[key] = value

    for option, (key, default) in _SPEC_OPTIONS.items():
        value = getattr(args, option)
        if value is not None:
            put(fields, key, value, _flag(option))
        elif saved is None:
            fields[key] = default
    for option, default in _GENERATION_OPTIONS.items():
        value = getattr(args, option)
        if value is not None:
            put(generation, option, value, _flag(option))
        elif saved is None:
            generation[option] = default
    for key, value in parse_env_kwargs(args.env_kwarg).items():
        put(env_kwargs, key, value, f"--env-kwarg {key}=")
    if args.task_slice is not None:
        put(env_kwargs, "task_slice", args.task_slice, "--task-slice")
    if args.num_turns is not None:
        put(env_kwargs, "num_turns", args.num_turns, "--num-turns")
    if fields.get("env") is None:
        raise ValueError("--env is required (or --checkpoint RUN_DIR to take the run's settings)")
    fields["generation"] = GenerationConfig(**generation)
    fields["env_kwargs"] = env_kwargs
    return EvalSpec.from_dict(fields), notes


def _run_dir_of(path: str) -> tuple[pathlib.Path, pathlib.Path | None]:
    """``(run folder, checkpoint folder or None for the latest)`` of a ``--checkpoint`` path."""
    p = pathlib.Path(path)
    if (p / "manifest.json").is_file():  # a checkpoint folder: RUN_DIR/checkpoints/checkpoint-N
        return p.parent.parent, p
    return p, None


def _run(args: argparse.Namespace) -> int:
    from comlrl_core.episodes.evaluation import run_evaluation
    from comlrl_core.episodes.spec import read_run_evaluation

    prefix = "eval/"
    try:
        saved = checkpoint = None
        agents: list[dict[str, Any] | None] = []  # the run's agent specs (--checkpoint)
        if args.checkpoint:
            if args.model:
                raise ValueError("--checkpoint evaluates the run's own team; drop --model (or drop --checkpoint)")
            run_dir, checkpoint = _run_dir_of(args.checkpoint)
            saved, agents, prefix = read_run_evaluation(run_dir)
        elif not args.model:
            raise ValueError("--model is required (or --checkpoint RUN_DIR to evaluate a trained run)")
        spec, notes = _spec_from_options(args, saved)
        for note in notes:
            print(f"comlrl eval: {note}", file=sys.stderr)
        if args.checkpoint:
            from comlrl_core.episodes.run_team import load_run_team

            team, loaded = load_run_team(run_dir, agents, checkpoint)
            label = f"checkpoint {loaded}"
        else:
            import envs

            probe = envs.make(spec.env, **spec.env_kwargs)
            num_agents = len(probe.possible_agents)
            probe.close()
            team = build_team(args.model, num_agents)
            label = ", ".join(args.model)
    except (ValueError, KeyError, OSError) as err:
        print(f"comlrl eval: {err}", file=sys.stderr)
        return 2
    result = run_evaluation(spec, team, prefix=prefix)
    print(f"## {spec.env} ({label}; {spec.episodes_per_task} episode(s) per task)\n")
    print(result.markdown())
    if args.out:
        out = pathlib.Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result.metrics, indent=2) + "\n", encoding="utf-8")
        print(f"\nwrote {out}")
    return 0


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add ``comlrl eval`` (called by the ``comlrl`` CLI through its entry point)."""
    p = subparsers.add_parser(
        "eval",
        help="evaluate a team (or a trained run's checkpoint) on an environment",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--checkpoint", metavar="RUN_DIR", help="evaluate this run's team with its saved settings")
    p.add_argument("--env", default=None, help="registered environment id, e.g. comlrl/Writing-v0")
    p.add_argument("--model", action="append", help="model source; once for all agents or once per agent, in order")
    p.add_argument("--task-slice", default=None, help="the split, as eval_task_slice (e.g. --task-slice=-40:)")
    p.add_argument("--num-tasks", type=int, default=None, help="evaluate the first N tasks of the split")
    p.add_argument("--n-samples", type=int, default=None, help="episodes per task (n of pass@k; default 1)")
    p.add_argument("--k", type=int, nargs="+", default=None, help="k values of pass@k (default 1; k > n omitted)")
    p.add_argument("--num-turns", type=int, default=None, help="turns per episode (the env's num_turns)")
    p.add_argument("--discount", type=float, default=None, help="discount of return_mean (default 1.0)")
    p.add_argument(
        "--env-kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment argument (JSON value or plain string); repeatable",
    )
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 128")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy (default 1.0)")
    p.add_argument("--top-p", type=float, default=None, help="default 1.0")
    p.add_argument("--top-k", type=int, default=None, help="0 = off (default)")
    p.add_argument("--seed", type=int, default=None, help="evaluation seed (default 0)")
    p.add_argument("--out", default=None, help="write the metrics as flat JSON (eval/... keys) to this file")
    p.set_defaults(func=_run)
