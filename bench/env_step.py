"""Joint steps per second of CoopCode (level_feedback) over 64 joint actions.

The 64 joint actions are built from HumanEval's reference solutions: half are correct
aux / main pairs (the reference renamed to ``aux``, and a ``main`` that calls it and
post-processes nothing), half are broken (wrong value, exception, syntax error). They
are scored through ``CoopCodeEnv.step_many`` (one sandbox batch per round), and, for
comparison, one ``step`` at a time. Each available backend is measured (Docker when an
engine answers, and the process backend).

    .venv/bin/python bench/env_step.py [--rounds 3] [--pool-size N] [--backends docker,process]
"""

from __future__ import annotations

import argparse
import ast
import os
import time

from envs.code import CoopCodeEnv
from envs.code.program import reference_solution
from envs.code.tasks import load_tasks

NUM_JOINT_ACTIONS = 64


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_FunctionDef(self, node):  # noqa: N802
        if node.name == self.old:
            node.name = self.new
        self.generic_visit(node)
        return node

    def visit_Name(self, node):  # noqa: N802
        if node.id == self.old:
            node.id = self.new
        return node


def joint_actions(tasks: list[dict]) -> list[dict[str, str]]:
    actions = []
    for i, task in enumerate(tasks):
        entry = task["entry_point"]
        tree = ast.parse(reference_solution(task))
        aux = ast.unparse(_Rename(entry, "aux").visit(tree))
        good_main = f"def {entry}(*args):\n    result = aux(*args)\n    return result\n"
        kind = i % 4
        if kind in (0, 1):
            actions.append({"aux": aux, "main": good_main})
        elif kind == 2:
            actions.append({"aux": aux, "main": f"def {entry}(*args):\n    aux(*args)\n    return None\n"})
        else:
            actions.append({"aux": "def aux(x:\n    return", "main": f"def {entry}(*args):\n    raise ValueError()\n"})
    return actions


def available_backends(requested: list[str]) -> list[str]:
    import sandbox

    out = []
    for name in requested:
        try:
            box = sandbox.Sandbox(backend=name, pool_size=1)
            box.close()
            out.append(name)
        except sandbox.SandboxUnavailable as err:
            print(f"[{name}] unavailable: {err}")
    return out


def measure(backend: str, rounds: int, pool_size: int) -> None:
    import sandbox

    tasks = load_tasks("humaneval")[:NUM_JOINT_ACTIONS]
    acts = joint_actions(tasks)
    box = sandbox.Sandbox(backend=backend, pool_size=pool_size)
    env = CoopCodeEnv(
        dataset="humaneval", sandbox=box, num_turns=2, external_transition="level_feedback", sandbox_slice=1
    )
    try:

        def fresh():
            clones = []
            for i in range(NUM_JOINT_ACTIONS):
                clone = env.clone()
                clone.reset(options={"task": i})
                clones.append(clone)
            return clones

        CoopCodeEnv.step_many(fresh()[:pool_size], acts[:pool_size])  # warm the workers
        batched = []
        for _ in range(rounds):
            clones = fresh()
            start = time.perf_counter()
            steps = CoopCodeEnv.step_many(clones, acts)
            batched.append(time.perf_counter() - start)
        rewards = [s[1]["main"] for s in steps]
        passed = sum(s[4]["main"]["passed"] for s in steps)
        clones = fresh()
        start = time.perf_counter()
        for clone, a in zip(clones, acts, strict=True):
            clone.step(a)
        one_by_one = time.perf_counter() - start
        best = min(batched)
        print(
            f"[{backend}] pool_size={pool_size}: step_many {NUM_JOINT_ACTIONS} joint actions: "
            f"{NUM_JOINT_ACTIONS / best:.1f} joint steps/s (best of {rounds}: {best:.2f} s; "
            f"mean {sum(batched) / len(batched):.2f} s); one step() at a time: "
            f"{NUM_JOINT_ACTIONS / one_by_one:.1f} joint steps/s; "
            f"passed {passed}/{NUM_JOINT_ACTIONS}, mean reward {sum(rewards) / len(rewards):.2f}"
        )
    finally:
        env.close()
        box.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pool-size", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--backends", default="docker,process")
    args = parser.parse_args()
    for backend in available_backends(args.backends.split(",")):
        measure(backend, args.rounds, args.pool_size)


if __name__ == "__main__":
    main()
