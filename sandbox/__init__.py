"""Run untrusted code: a warm pool of locked-down Docker containers, or local processes.

    from sandbox import Program, Sandbox

    with Sandbox() as box:  # backend="auto": Docker when an engine answers
        [result] = box.run([Program("def f(x): return x + 1", tests=["assert f(1) == 2"],
                                    per_assert=True)])
        result.status, result.asserts

The verdict (passed / failed / error / timeout / memory / killed) is decided by our
harness, never by the program's exit code. See docs/sandbox.md for the threat model.
This package imports nothing of comlrl_core, envs or learners: it is usable alone.
"""

from .config import SandboxConfig
from .sandbox import Sandbox
from .types import AssertOutcome, Program, Result, SandboxUnavailable, Status

__all__ = ["AssertOutcome", "Program", "Result", "Sandbox", "SandboxConfig", "SandboxUnavailable", "Status"]
