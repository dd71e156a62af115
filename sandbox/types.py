"""Data types of the sandbox: what goes in (Program) and what comes out (Result)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Sequence


class Status(str, enum.Enum):
    """Verdict of one program, decided by our harness (never by the exit code)."""

    PASSED = "passed"  # every test ran and none raised
    FAILED = "failed"  # a test assertion failed
    ERROR = "error"  # the program or a test raised something other than AssertionError
    TIMEOUT = "timeout"  # wall-clock limit hit; the process was killed
    MEMORY = "memory"  # MemoryError or the memory limit killed it
    KILLED = "killed"  # died without a verdict: signal, early exit, tampering, lost container


@dataclass
class Program:
    """One untrusted program with optional tests.

    ``tests`` may be one block of code or a list of statements. With
    ``per_assert=True`` each test statement is run on its own and its outcome recorded
    (a string block is split into its top-level statements).
    """

    source: str
    tests: str | Sequence[str] | None = None
    timeout: float | None = None  # seconds; None = the sandbox default
    per_assert: bool = False


@dataclass
class AssertOutcome:
    index: int
    text: str
    passed: bool
    error_type: str | None = None
    error_message: str | None = None


@dataclass
class Result:
    status: Status
    error_type: str | None = None
    error_message: str | None = None
    asserts: list[AssertOutcome] | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration: float = 0.0
    backend: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == Status.PASSED

    @property
    def pass_rate(self) -> float:
        """Fraction of asserts passed when per-assert outcomes exist, else 1.0 or 0.0."""
        if self.asserts:
            return sum(a.passed for a in self.asserts) / len(self.asserts)
        return 1.0 if self.passed else 0.0


class SandboxUnavailable(RuntimeError):
    """The selected backend cannot run programs (e.g. no Docker engine answers)."""
