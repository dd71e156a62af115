"""``comlrl eval``: evaluate a team of models on a registered environment.

Example::

    comlrl eval --env comlrl/Writing-v0 --model tiny-random --n-samples 4 --k 1 4 \\
        --num-tasks 20 --env-kwarg num_turns=2 --out results.json

``--model`` once means every agent plays the same model (loaded once); repeat it to give
each agent its own (in the env's agent order). Model sources are those of
``comlrl_core.models.model_source``: an alias (``tiny-random``, ``smollm2-135m-instruct``), a
folder with ``config.json``, a ``.gguf`` file or a hub id. The result is printed as a
Markdown table and, with ``--out``, written as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from comlrl_core.policy import GenerationConfig


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
        return Team.from_specs([models[0]])  # evaluate() maps a 1-member team onto every agent
    return Team.from_specs(list(models))


def _run(args: argparse.Namespace) -> int:
    import envs
    from envs.evaluate import evaluate

    try:
        env_kwargs = parse_env_kwargs(args.env_kwarg)
        agents = envs.make(args.env, **env_kwargs).possible_agents
        generation_config = GenerationConfig(
            max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p
        )
        team = build_team(args.model, len(agents))
    except (ValueError, KeyError, OSError) as err:
        print(f"comlrl eval: {err}", file=sys.stderr)
        return 2
    result = evaluate(
        args.env,
        team,
        n_samples=args.n_samples,
        k=args.k,
        num_tasks=args.num_tasks,
        env_kwargs=env_kwargs,
        generation_config=generation_config,
        seed=args.seed,
    )
    print(f"## {args.env} ({', '.join(args.model)}; n={args.n_samples})\n")
    print(result.markdown())
    if args.out:
        payload = result.to_dict()
        payload["config"] = {
            "env": args.env,
            "models": list(args.model),
            "n_samples": args.n_samples,
            "k": list(args.k),
            "num_tasks": args.num_tasks,
            "env_kwargs": env_kwargs,
            "generation_config": vars(generation_config)
            if hasattr(generation_config, "__dict__")
            else str(generation_config),
            "seed": args.seed,
        }
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
        print(f"\nwrote {args.out}")
    return 0


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add ``comlrl eval`` (called by the ``comlrl`` CLI through its entry point)."""
    p = subparsers.add_parser(
        "eval",
        help="evaluate a team on an environment (pass@k, reward per turn)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--env", required=True, help="registered environment id, e.g. comlrl/Writing-v0")
    p.add_argument(
        "--model",
        action="append",
        required=True,
        help="model source; once for all agents or once per agent, in agent order",
    )
    p.add_argument("--n-samples", type=int, default=1, help="joint samples per task (n of pass@k)")
    p.add_argument("--k", type=int, nargs="+", default=[1], help="k values of pass@k (k > n is omitted)")
    p.add_argument("--num-tasks", type=int, default=None, help="evaluate the first N tasks of the split")
    p.add_argument(
        "--env-kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment argument (JSON value or plain string); repeatable",
    )
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the results as JSON to this file")
    p.set_defaults(func=_run)
