"""Turn-1 prompts of the CoopCode agents.

``aux`` writes a helper ``aux(...)``; ``main`` writes the entry point and may call it. In
single-agent mode ``main`` writes everything. Prompts ask for plain code; fenced code is
accepted anyway (see :func:`envs.code.program.extract_code`).
"""

from __future__ import annotations

_RULES = (
    "Rules:\n"
    "- Reply with Python code only: no explanations, no examples, no tests.\n"
    "- Put any imports you need at the top of your code."
)


def aux_prompt(task: dict, aux_name: str = "aux") -> str:
    return (
        "You are the helper agent of a two-agent coding team.\n\n"
        f"Problem:\n{task['prompt'].rstrip()}\n\n"
        f"Write ONE helper function named `{aux_name}` that solves a useful part of this problem. "
        f"Your teammate will write `{task['entry_point']}` and call `{aux_name}`; do not write "
        f"`{task['entry_point']}` yourself.\n\n"
        f"{_RULES}\n\nFormat:\ndef {aux_name}(...):\n    ...\n"
    )


def main_prompt(task: dict, aux_name: str = "aux") -> str:
    entry = task["entry_point"]
    return (
        "You are the main agent of a two-agent coding team.\n\n"
        f"Problem:\n{task['prompt'].rstrip()}\n\n"
        f"Write the function `{entry}`. Your teammate writes a helper function `{aux_name}(...)` that "
        f"solves part of the problem; call it and use what it returns, and do the rest of the work "
        f"in `{entry}`. Do not define `{aux_name}` yourself.\n\n"
        f"{_RULES}\n\nFormat:\ndef {entry}(...):\n    ...\n"
    )


def single_prompt(task: dict) -> str:
    entry = task["entry_point"]
    return (
        f"Problem:\n{task['prompt'].rstrip()}\n\n"
        f"Write the complete function `{entry}` (with any helper functions it needs).\n\n"
        f"{_RULES}\n\nFormat:\ndef {entry}(...):\n    ...\n"
    )


def initial_prompt(task: dict, agent: str, single: bool, aux_name: str = "aux") -> str:
    if single:
        return single_prompt(task)
    if agent == "aux":
        return aux_prompt(task, aux_name)
    return main_prompt(task, aux_name)


def target_name(task: dict, agent: str, aux_name: str = "aux") -> str:
    """The function this agent is responsible for."""
    return aux_name if agent == "aux" else task["entry_point"]
