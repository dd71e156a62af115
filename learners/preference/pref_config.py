"""Options shared by every preference learner (MADPO, MARLHF and their iterative forms).

Names follow CoMLRL's vocabulary. These learners are single-turn, aligned-joint only:
``num_turns`` must be 1 and ``joint_mode`` must be ``aligned`` (candidate ``i`` of every
agent forms joint response ``i``); anything else is a config error.

The reference-KL options (``reference_kl_enabled``, ``reference_kl_coef``,
``reference_devices``) are CoMLRL's: MARLHF hands them to its RL backend (the MAGRPO family
has a reference term); MADPO accepts them and ignores them, as in CoMLRL, whose MADPO
inherits them without a reference term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping, TypeVar

from comlrl_core.config.options import ConfigError, check_in, check_positive, option
from learners.common.external_options import fold_external_section
from learners.common.options import GenerationOptions, OptimizerOptions, RunOptions, TeamOptions
from learners.preference.pairs import BASE_PAIR_SELECTIONS

P = TypeVar("P", bound="PreferenceConfig")


@dataclass
class PreferenceConfig(TeamOptions, GenerationOptions, RunOptions, OptimizerOptions):
    """Base of the preference configs (use MADPOConfig, MARLHFConfig or their Iter forms)."""

    allowed_pair_selections: ClassVar[tuple[str, ...]] = BASE_PAIR_SELECTIONS
    uses_reference_kl: ClassVar[bool] = False  # MADPO has no reference term: the options are accepted, unused

    # -- episodes ---------------------------------------------------------------------
    num_turns: int = option(1, help="must be 1: preference learners are single-turn")
    joint_mode: Literal["aligned", "cross"] = option(
        "aligned", help="must be 'aligned': candidate i of every agent is joint response i"
    )
    # -- preference pairs -------------------------------------------------------------
    preference_num_candidates: int = option(
        80, help="responses each agent samples per task item (joint responses per task)"
    )
    preference_pairs_per_sample: int | None = option(
        16, help="pairs kept per task item (None: all; required with pair_selection='all')"
    )
    pair_selection: str = option(
        "reward_gap", help="reward_gap | random | all (iterative trainers add comparator_reward)"
    )
    preference_max_tasks: int | None = option(None, help="collect pairs on the first N training tasks only (None: all)")
    preference_task_batch_size: int = option(8, help="task items whose candidates are generated and scored together")
    # -- reference KL (CoMLRL's names; MARLHF's RL backend uses them, MADPO ignores them) --
    reference_kl_enabled: bool | None = option(
        None, help="KL to a frozen reference (None: on when reference_kl_coef > 0); MADPO: ignored"
    )
    reference_kl_coef: float = option(0.0, help="weight of the k3 KL to the reference (0: off); MADPO: ignored")
    reference_devices: list[str] | str | None = option(
        None, help="device of the reference: one (a string) or one per agent (None: the agent's own); MADPO: ignored"
    )
    # -- optimisation, sampling, logging, checkpoints (the rest: learners.common.options)
    logprob_micro_batch_size: int = option(8, help="pairs (or sequences) per forward pass; bounds memory")
    eval_interval: int = option(16, help="evaluate every this many updates (0: never)")
    logging_steps: int = option(1, help="log training metrics every this many updates")
    save_final_checkpoint: bool = option(True, help="checkpoint when training finishes")
    output_dir: str = option("runs/preference", help="run folder: metrics.jsonl, checkpoints, replay files")

    @classmethod
    def from_dict(cls: type[P], data: Mapping[str, Any]) -> P:
        """As the base's, reading a CoMLRL ``external:`` section into ``env_kwargs``."""
        return super().from_dict(fold_external_section(data))

    def validate(self) -> None:
        super().validate()
        if self.num_turns != 1:
            raise ConfigError(
                f"option 'num_turns' must be 1 for {type(self).__name__} (preference learners are "
                f"single-turn), got {self.num_turns}; set num_turns=1",
                "num_turns",
            )
        if self.joint_mode != "aligned":
            raise ConfigError(
                f"option 'joint_mode' must be 'aligned' for {type(self).__name__} (candidate i of every "
                f"agent forms joint response i), got {self.joint_mode!r}; set joint_mode=aligned",
                "joint_mode",
            )
        if self.preference_num_candidates < 2:
            raise ConfigError(
                f"option 'preference_num_candidates' must be >= 2 (a pair needs two candidates), got "
                f"{self.preference_num_candidates}",
                "preference_num_candidates",
            )
        check_in("pair_selection", self.pair_selection, self.allowed_pair_selections)
        if self.pair_selection == "all" and self.preference_pairs_per_sample is not None:
            raise ConfigError(
                "pair_selection='all' keeps every pair: set preference_pairs_per_sample=None (null in YAML)",
                "preference_pairs_per_sample",
            )
        if self.preference_pairs_per_sample is not None:
            check_positive("preference_pairs_per_sample", self.preference_pairs_per_sample)
        if self.preference_max_tasks is not None:
            check_positive("preference_max_tasks", self.preference_max_tasks)
        check_positive("preference_task_batch_size", self.preference_task_batch_size)
        check_positive("reference_kl_coef", self.reference_kl_coef, allow_zero=True)
        if isinstance(self.reference_devices, str):  # reference_devices=cuda:1 (CoMLRL's form)
            self.reference_devices = [self.reference_devices]
        if self.reference_kl_enabled and self.reference_kl_coef <= 0 and self.uses_reference_kl:
            raise ConfigError(
                "reference_kl_enabled=true needs reference_kl_coef > 0 (the weight of the KL term); "
                "set e.g. reference_kl_coef=0.05, or reference_kl_enabled=false",
                "reference_kl_coef",
            )

    @property
    def effective_reference_kl_coef(self) -> float:
        """The KL weight in force: 0 when ``reference_kl_enabled`` is false or this learner has no reference term."""
        if not self.uses_reference_kl or self.reference_kl_enabled is False:
            return 0.0
        return self.reference_kl_coef
