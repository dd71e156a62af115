"""A stand-in for ``sandbox.Sandbox`` with the same interface, for fast unit tests.

It runs trusted, hand-written test programs in-process (never model output) with the
per-assert semantics of the real sandbox: the source first, then each test statement on
its own, every outcome recorded. The real process backend is used by the integration tests.
"""

from __future__ import annotations

import contextlib
import io

from sandbox.types import AssertOutcome, Program, Result, SandboxUnavailable, Status


class FakeSandbox:
    backend = "fake"

    def __init__(self, fail_with: Exception | None = None) -> None:
        self.calls: list[list[Program]] = []
        self.closed = False
        self.fail_with = fail_with

    def run(self, programs: list[Program]) -> list[Result]:
        if self.fail_with is not None:
            raise self.fail_with
        self.calls.append(list(programs))
        return [self._run_one(p) for p in programs]

    def _run_one(self, program: Program) -> Result:
        ns: dict = {"__name__": "__main__"}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                exec(compile(program.source, "<program>", "exec"), ns)
            except Exception as err:  # noqa: BLE001
                return Result(Status.ERROR, type(err).__name__, str(err), None, out.getvalue(), backend="fake")
            outcomes = []
            for i, test in enumerate(program.tests or []):
                try:
                    exec(compile(test, f"<test {i}>", "exec"), ns)
                    outcomes.append(AssertOutcome(i, test, True))
                except Exception as err:  # noqa: BLE001
                    outcomes.append(AssertOutcome(i, test, False, type(err).__name__, str(err)))
        if all(o.passed for o in outcomes):
            status = Status.PASSED
        elif all(o.passed or o.error_type == "AssertionError" for o in outcomes):
            status = Status.FAILED
        else:
            status = Status.ERROR
        return Result(status, asserts=outcomes, stdout=out.getvalue(), backend="fake")

    def close(self) -> None:
        self.closed = True


class DownSandbox(FakeSandbox):
    """A sandbox whose engine is gone."""

    backend = "docker"

    def __init__(self) -> None:
        super().__init__(SandboxUnavailable("no Docker engine answers at unix:///var/run/docker.sock"))
