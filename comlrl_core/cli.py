"""The ``comlrl`` command line.

Subcommands are contributed by the packages through the ``comlrl.commands`` entry-point
group: each entry names a function ``add_commands(subparsers)`` that adds its parsers and
sets ``func`` on them. This keeps ``comlrl_core`` free of imports of the other packages.

Exit codes: 0 done; 2 bad input found before any work started (a :class:`UsageError`,
or a config error): options, paths, ids, checkpoints; 1 a failure while working;
130 interrupted. Errors print as one or two lines; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from typing import Sequence

__all__ = ["EXIT_FAILURE", "EXIT_USAGE", "UsageError", "add_debug_flag", "build_parser", "main"]

_GROUP = "comlrl.commands"
EXIT_FAILURE = 1
EXIT_USAGE = 2
_DEBUG_HELP = "show the full traceback of an error"


class UsageError(Exception):
    """Bad input found by a command before it started working (exit code 2)."""


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    """Accept ``--debug`` after a subcommand too (``comlrl train magrpo --debug ...``).

    The default is suppressed so that a subcommand parser does not reset a ``--debug``
    given before the subcommand.
    """
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="comlrl",
        description="comlrl-gym: train teams of LLM agents to cooperate.",
    )
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for ep in sorted(importlib.metadata.entry_points(group=_GROUP), key=lambda e: e.name):
        try:
            add_commands = ep.load()
        except ImportError as err:  # a broken optional plugin must not break the CLI
            print(f"comlrl: skipping commands from {ep.value}: {err}", file=sys.stderr)
            continue
        add_commands(subparsers)
    return parser


def _is_usage_error(err: BaseException) -> bool:
    from comlrl_core.config.coercion import ConfigError

    return isinstance(err, (UsageError, ConfigError))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0 if args.command is None else EXIT_USAGE
    debug = bool(getattr(args, "debug", False))
    where = " ".join(["comlrl", *(str(getattr(args, k)) for k in ("command", "algorithm") if getattr(args, k, None))])
    try:
        result = func(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{where}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if debug:
            raise
        if _is_usage_error(err):
            print(f"{where}: {err}", file=sys.stderr)
            return EXIT_USAGE
        print(f"{where}: error: {type(err).__name__}: {err}", file=sys.stderr)
        print(f"{where}: (add --debug for the traceback)", file=sys.stderr)
        return EXIT_FAILURE
    return int(result or 0)


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy: commands raise the
    # importable comlrl_core.cli.UsageError, which a __main__ copy would not recognise.
    from comlrl_core.cli import main as _main

    sys.exit(_main())
