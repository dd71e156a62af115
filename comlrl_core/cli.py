"""The ``comlrl`` command line.

Subcommands are contributed by the packages through the ``comlrl.commands`` entry-point
group: each entry names a function ``add_commands(subparsers)`` that adds its parsers and
sets ``func`` on them. This keeps ``comlrl_core`` free of imports of the other packages.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from typing import Sequence

_GROUP = "comlrl.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="comlrl",
        description="comlrl-gym: train teams of LLM agents to cooperate.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for ep in sorted(importlib.metadata.entry_points(group=_GROUP), key=lambda e: e.name):
        try:
            add_commands = ep.load()
        except ImportError as err:  # a broken optional plugin must not break the CLI
            print(f"comlrl: skipping commands from {ep.value}: {err}", file=sys.stderr)
            continue
        add_commands(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 0 if args.command is None else 2
    result = func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
