"""MADPOConfig: multi-agent DPO on pairs collected from task items.

Option names follow CoMLRL's ``MADPOConfig``. Differences, on purpose:

* The margins count every real completion token, EOS included; ``exclude_last_token=True``
  reproduces CoMLRL's scoring, which leaves each completion's last token out.
* A non-finite loss skips that update (counted in ``skipped_nonfinite``) instead of
  stepping on a constant stand-in loss.
* ``pair_selection='comparator_reward'`` needs a comparator: use MADPOIterConfig.
* ``train_batch_size`` (pairs per optimizer step) defaults to 2 directly (CoMLRL: via
  ``rollout_buffer_size``, which MADPO has no other use for).
"""

from __future__ import annotations

from dataclasses import dataclass

from comlrl_core.config.options import check_positive, option
from learners.preference.pref_config import PreferenceConfig


@dataclass
class MADPOConfig(PreferenceConfig):
    dpo_beta: float = option(0.1, help="eta in the loss -log sigmoid(eta * sum_i margin_i)")
    exclude_last_token: bool = option(
        False, help="leave each completion's last token out of the margins (CoMLRL parity)"
    )
    num_train_epochs: int = option(20, help="passes over the collected pairs")
    train_batch_size: int = option(2, help="pairs per optimizer step")
    save_steps: int = option(0, help="checkpoint every this many updates (0: only at the end)")
    output_dir: str = option("runs/madpo", help="run folder: metrics.jsonl, checkpoints, plots")

    def validate(self) -> None:
        super().validate()
        check_positive("dpo_beta", self.dpo_beta)
        check_positive("num_train_epochs", self.num_train_epochs)
        check_positive("train_batch_size", self.train_batch_size)
        check_positive("save_steps", self.save_steps, allow_zero=True)
