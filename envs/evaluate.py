"""Evaluate a team with an environment alone: ``envs.evaluate(env_id, team, n_samples, k)``.

The evaluation lives in :mod:`comlrl_core.episodes.evaluation` (on the library's one
episode engine, :mod:`comlrl_core.episodes.engine`) because learners evaluate with it too
(and learners may not import ``envs``); this module is its public home on the
environment side. See ``docs/evaluation.md`` for the seeding rule, the metrics and the
team forms accepted.
"""

from comlrl_core.episodes.evaluation import (
    EvalResult,
    TaskResult,
    as_policies,
    evaluate,
    evaluate_episodes,
    pass_at_k,
    run_evaluation,
)

__all__ = ["EvalResult", "TaskResult", "as_policies", "evaluate", "evaluate_episodes", "pass_at_k", "run_evaluation"]
