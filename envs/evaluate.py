"""Evaluate a team with an environment alone: ``envs.evaluate(env_id, team, n_samples, k)``.

The engine lives in :mod:`comlrl_core.episodes.evaluation` because learners evaluate with it too
(and learners may not import ``envs``); this module is its public home on the
environment side. See that module for the pass@k estimator and the team forms accepted.
"""

from comlrl_core.episodes.evaluation import EvalResult, TaskResult, as_policies, evaluate, pass_at_k

__all__ = ["EvalResult", "TaskResult", "as_policies", "evaluate", "pass_at_k"]
