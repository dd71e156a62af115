"""Pluggable preference oracles: what scores the joint responses of a task.

CoMLRL's oracle may follow rules or call an LLM judge. Every preference trainer takes
``oracle=``: a callable ``oracle(prompts, joint_responses) -> scores`` where ``prompts`` are
the task's prompts (one per agent, agent order), ``joint_responses`` the task's joint
responses (each one completion per agent, agent order), and ``scores`` one finite number per
joint response (higher is better). Without one, the environment's reward scores them
(:class:`learners.preference.candidates.TaskRewardOracle`).

* :class:`CallableOracle` adapts such a callable to the trainers' batched ``score`` method
  (one call per task, the answer checked).
* :class:`LLMJudgeOracle` is a ready callable that asks a remote model
  (:mod:`comlrl_core.remote`) to grade every joint response against a rubric.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Sequence

from comlrl_core.remote.client import RemoteModelClient, RemoteModelConfig
from learners.preference.candidates import JointCandidate, Score, TaskCandidates

JointOracle = Callable[[list[str], list[list[str]]], Sequence[float]]

DEFAULT_RUBRIC = (
    "You grade the joint work of a team of cooperating agents on one task. Each agent answered "
    "its own prompt. Judge how well the responses together solve the task: correctness first, "
    "then how well the parts fit together, then clarity."
)


class OracleError(ValueError):
    """An oracle answered something other than one finite score per joint response."""


class CallableOracle:
    """An :class:`~learners.preference.candidates.Oracle` over a ``JointOracle`` callable.

    The callable's score decides preferences and is recorded as the raw reward too.
    """

    def __init__(self, fn: JointOracle) -> None:
        if not callable(fn):
            raise TypeError(f"oracle must be a callable (prompts, joint_responses) -> scores, got {type(fn).__name__}")
        self.fn = fn

    def score(self, requests: Sequence[tuple[TaskCandidates, JointCandidate]]) -> list[Score]:
        by_task: dict[int, list[int]] = {}  # id(task) -> request positions, in order
        tasks: dict[int, TaskCandidates] = {}
        for k, (task, _) in enumerate(requests):
            by_task.setdefault(id(task), []).append(k)
            tasks[id(task)] = task
        out: list[Score] = [(0.0, 0.0)] * len(requests)
        for key, positions in by_task.items():
            task = tasks[key]
            joint = [list(requests[k][1].completions) for k in positions]
            scores = list(self.fn(list(task.prompts), joint))
            if len(scores) != len(joint):
                raise OracleError(
                    f"the oracle returned {len(scores)} scores for {len(joint)} joint responses of task "
                    f"{task.task}; it must return one score per joint response"
                )
            for k, value in zip(positions, scores, strict=True):
                number = _finite(value, task.task)
                out[k] = (number, number)
        return out


def _finite(value: Any, task: int) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise OracleError(f"the oracle returned {value!r} for task {task}; scores must be numbers") from None
    if not math.isfinite(number):
        raise OracleError(f"the oracle returned {number} for task {task}; scores must be finite")
    return number


class JudgeParseError(OracleError):
    """The judge's replies held no readable score, even after the retries."""


_SCORE_PATTERNS = (
    re.compile(r"<\s*score\s*>\s*(-?\d+(?:\.\d+)?)\s*<\s*/\s*score\s*>", re.IGNORECASE),
    re.compile(r"\bscore\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE),
)


def parse_score(text: str, low: float, high: float) -> float | None:
    """The score in a judge's reply (``<score>7</score>`` or ``Score: 7``; the last one
    wins), or None when there is none or it lies outside ``[low, high]``."""
    for pattern in _SCORE_PATTERNS:
        found = pattern.findall(str(text))
        if found:
            value = float(found[-1])
            return value if low <= value <= high else None
    return None


class LLMJudgeOracle:
    """Grades joint responses with a remote LLM: ``oracle=LLMJudgeOracle(RemoteModelConfig(...))``.

    Each joint response becomes one judge prompt: the rubric, every agent's prompt and
    response (in ``<agent_i>`` sections, the tags of the centralized comparator), and the
    request to answer ``Score: <number from low to high>``. The replies of a task are
    requested together (the client bounds the concurrency and retries transport failures).
    A reply without a readable score is asked again, up to ``parse_retries`` times; then
    :class:`JudgeParseError` says which reply could not be read.
    """

    def __init__(
        self,
        remote: RemoteModelConfig | RemoteModelClient,
        *,
        rubric: str = DEFAULT_RUBRIC,
        agent_names: Sequence[str] | None = None,
        low: float = 0.0,
        high: float = 10.0,
        parse_retries: int = 2,
    ) -> None:
        if not low < high:
            raise ValueError(f"the judge's score range needs low < high, got [{low}, {high}]")
        if parse_retries < 0:
            raise ValueError(f"parse_retries must be >= 0, got {parse_retries}")
        self.client = remote if isinstance(remote, RemoteModelClient) else RemoteModelClient(remote)
        self.rubric = rubric
        self.agent_names = None if agent_names is None else list(agent_names)
        self.low, self.high = float(low), float(high)
        self.parse_retries = int(parse_retries)

    def judge_prompt(self, prompts: Sequence[str], responses: Sequence[str]) -> str:
        names = self.agent_names or [f"agent {i}" for i in range(len(prompts))]
        parts = [
            f"<agent_{i}>\nRole: {name}\nPrompt:\n{prompt}\nResponse:\n{response}\n</agent_{i}>"
            for i, (name, prompt, response) in enumerate(zip(names, prompts, responses, strict=True))
        ]
        return (
            f"{self.rubric}\n\n" + "\n\n".join(parts) + f"\n\nGive a short justification, then end with one line "
            f"'Score: <number from {self.low:g} to {self.high:g}>'."
        )

    def __call__(self, prompts: list[str], joint_responses: list[list[str]]) -> list[float]:
        pending = list(range(len(joint_responses)))
        asks = {k: self.judge_prompt(prompts, joint_responses[k]) for k in pending}
        scores: dict[int, float] = {}
        last_reply: dict[int, str] = {}
        for _attempt in range(self.parse_retries + 1):
            replies = self.client.complete_batch([asks[k] for k in pending], n=1)
            still = []
            for k, row in zip(pending, replies, strict=True):
                last_reply[k] = row[0] if row else ""
                value = parse_score(last_reply[k], self.low, self.high)
                if value is None:
                    still.append(k)
                else:
                    scores[k] = value
            pending = still
            if not pending:
                return [scores[k] for k in range(len(joint_responses))]
        k = pending[0]
        excerpt = last_reply[k][:200].replace("\n", " ")
        raise JudgeParseError(
            f"the judge gave no readable score for joint response {k} after {self.parse_retries + 1} "
            f"replies ({len(pending)} joint responses unscored); expected 'Score: <{self.low:g}..{self.high:g}>' "
            f"or '<score>..</score>', last reply: {excerpt!r}"
        )

    def close(self) -> None:
        self.client.close()
