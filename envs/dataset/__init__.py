"""Dataset-v0: rows of a dataset, per-agent formatters and a CoMLRL-style reward function
(see ``envs.dataset.env``)."""

from envs.dataset.env import DatasetEnv
from envs.dataset.loading import load_rows, resolve_callable

__all__ = ["DatasetEnv", "load_rows", "resolve_callable"]
