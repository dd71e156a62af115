"""The metrics logger of a run, from the shared run options ``report_to``, ``run_name`` and
``project`` (:class:`learners.common.options.RunOptions`).

* ``report_to``: ``jsonl`` (always written: ``output_dir/metrics.jsonl``), ``tensorboard``
  (event files under ``output_dir/tensorboard[/run_name]``) and ``wandb`` (a W&B run named
  ``run_name`` in ``project``; ``WANDB_MODE=offline`` keeps it local).
* Only the main process writes (rank 0 of the data-parallel context and of the
  launcher's ``$RANK``); the other processes get a :class:`NullLogger`.
"""

from __future__ import annotations

import importlib.util
import pathlib
from typing import Any

from comlrl_core.run.metrics import MetricsLogger
from learners.common.distributed import DistributedContext, NullLogger, is_main_process
from learners.common.options import report_to_backends

__all__ = ["check_logging_backends", "run_logger"]

# backend -> (package it imports, the pip extra that installs it)
_PACKAGES = {"tensorboard": ("tensorboard", "tb"), "wandb": ("wandb", "wandb")}


def _backends(config: Any) -> list[str]:
    return report_to_backends(getattr(config, "report_to", None) or ["jsonl"])


def check_logging_backends(config: Any) -> None:
    """Fail at start-up, not at the first log line, when a backend's package is missing."""
    for backend in _backends(config):
        if backend in _PACKAGES:
            package, extra = _PACKAGES[backend]
            if importlib.util.find_spec(package) is None:
                raise ImportError(
                    f"option 'report_to' names {backend}, which needs the '{package}' package: "
                    f"pip install 'comlrl-gym[{extra}]', or drop {backend} from report_to"
                )


def run_logger(
    config: Any, run_dir: str | pathlib.Path, distributed: DistributedContext | None = None
) -> MetricsLogger | NullLogger:
    """The logger a trainer writes its metrics through (see the module docstring)."""
    run_dir = pathlib.Path(run_dir)
    if not is_main_process(distributed):
        return NullLogger(run_dir)
    run_name = getattr(config, "run_name", None)
    project = getattr(config, "project", None)
    wandb_kwargs = {key: value for key, value in (("name", run_name), ("project", project)) if value}
    return MetricsLogger(
        run_dir,
        backends=_backends(config),
        config=config,
        wandb_kwargs=wandb_kwargs,
        tensorboard_dir=run_dir / "tensorboard" / run_name if run_name else None,
    )
