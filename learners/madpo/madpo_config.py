"""MADPOConfig: multi-agent DPO on pairs collected from task items.

Option names follow CoMLRL's ``MADPOConfig``. Differences, on purpose:

* The margins count every real completion token, EOS included; ``exclude_last_token=True``
  reproduces CoMLRL's scoring, which leaves each completion's last token out.
* A non-finite loss skips that update (counted in ``skipped_nonfinite``) instead of
  stepping on a constant stand-in loss.
* ``pair_selection='comparator_reward'`` needs a comparator: use MADPOIterConfig.
* ``train_batch_size`` (pairs per optimizer step) defaults to 2 directly (CoMLRL: via
  ``rollout_buffer_size``, which MADPO has no other use for).

``generation_mode='centralized'`` is CoMLRL's centralized MADPO: one actor (the team member
``centralized_agent_index``; a team of one model works too) reads every role's prompt and
writes every role in one response, in the tag format of the centralized comparator
(``<agent_0>...</agent_0>`` ...). The task's oracle scores the parsed roles (a missing
section reads as ""; a response with no section is dropped and counted), and the DPO margin
is the actor's log-probability of the whole response. MADPOIterConfig keeps the target
decentralized (its comparator may be centralized).

As in CoMLRL, ``reference_kl_enabled`` / ``reference_kl_coef`` / ``reference_devices`` are
accepted and ignored: the MADPO loss has no reference term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from comlrl_core.config.options import ConfigError, check_positive, option
from learners.preference.pref_config import PreferenceConfig


@dataclass
class MADPOConfig(PreferenceConfig):
    dpo_beta: float = option(0.1, help="eta in the loss -log sigmoid(eta * sum_i margin_i)")
    exclude_last_token: bool = option(
        False, help="leave each completion's last token out of the margins (CoMLRL parity)"
    )
    generation_mode: Literal["decentralized", "centralized"] = option(
        "decentralized", help="centralized: one actor writes every role in one tagged response (CoMLRL's)"
    )
    centralized_agent_index: int = option(0, help="centralized: which team member is the actor")
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
        if self.centralized_agent_index < 0:
            raise ConfigError(
                f"option 'centralized_agent_index' must be >= 0, got {self.centralized_agent_index}",
                "centralized_agent_index",
            )
