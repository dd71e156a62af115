"""Options of the iterative preference trainers (mixed into MADPOIterConfig / MARLHFIterConfig).

Names follow CoMLRL's iterative configs. Differences, on purpose:

* The API comparator goes through :mod:`comlrl_core.remote.client` (retries, bounded concurrency,
  one request per candidate where the API needs it); the key is read from the variable
  named by ``comparator_api_key_env`` only -- a literal key option does not exist, so
  configs can be logged and saved safely.
* ``comparator_devices`` is one device (a string or a one-item list) for every agent, or a list
  with one device per agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from comlrl_core.config.options import BaseConfig, ConfigError, check_in, check_positive, option
from comlrl_core.remote.config import FORMATS, canonical_format
from learners.preference.pairs import PAIR_SELECTIONS
from learners.preference.replay import check_replay_options

COMPARATOR_POLICIES = ("current", "current_copy", "model", "history", "api")
API_FORMATS = FORMATS  # generic, openai, anthropic, openai_responses


@dataclass
class IterativeOptions(BaseConfig):
    """The rounds, replay buffer and comparator options.

    Mixed in BEFORE the base trainer's config, so the iterative defaults of the candidate
    and pair options below replace the base ones (and ``comparator_reward`` is allowed).
    """

    allowed_pair_selections: ClassVar[tuple[str, ...]] = PAIR_SELECTIONS

    num_iterations: int = option(6, help="rounds of collect -> store -> select replay batch -> train")
    preference_num_candidates: int = option(20, help="responses each agent samples per task item and round")
    preference_pairs_per_sample: int | None = option(4, help="comparisons kept per task item (None: all)")
    pair_selection: str = option("comparator_reward", help="comparator_reward | reward_gap | random | all")
    # -- replay -----------------------------------------------------------------------
    preference_replay_mode: Literal["current", "nearest_k", "all_history", "lambda_decay"] = option(
        "current", help="which stored rounds a round trains on"
    )
    preference_replay_k: int | None = option(None, help="nearest_k: the latest k non-empty rounds")
    preference_replay_lambda: float | None = option(None, help="lambda_decay: a round of age a weighs lambda**a")
    preference_replay_sample_size: int | None = option(
        None, help="pairs drawn by the historical modes (None: this round's pair count)"
    )
    preference_replay_dir: str | None = option(None, help="round files folder (None: output_dir/preference_replay)")
    policy_checkpoint_dir: str | None = option(
        None, help="history comparator checkpoints (None: output_dir/policy_checkpoints)"
    )
    # -- comparator -------------------------------------------------------------------
    comparator_policy: str = option("current", help="current | current_copy | model | history | api")
    comparator_generation_mode: Literal["decentralized", "centralized"] = option(
        "decentralized", help="centralized: one comparator writes every role in one response"
    )
    comparator_centralized_agent_index: int = option(0, help="centralized: which agent's comparator writes")
    comparator_model_name: str | None = option(None, help="model: one model source for every comparator agent")
    comparator_agents: list[str] | None = option(None, help="model: one model source per agent")
    comparator_devices: list[str] | str | None = option(
        None, help="current_copy / model / history: one device (a string, as CoMLRL documents), or one per agent"
    )
    comparator_num_candidates: int | None = option(
        None, help="comparator candidates per task (None: preference_num_candidates)"
    )
    comparator_history_k: int | None = option(
        None, help="history: compare against the policy of k rounds back (None: 1)"
    )
    comparator_api_url: str | None = option(
        None, help="api: endpoint URL, e.g. https://api.openai.com/v1/responses (SDK formats: or the API root)"
    )
    comparator_api_format: str = option(
        "generic", help="api: generic | openai | anthropic | openai_responses (aliases: responses, codex)"
    )
    comparator_api_model: str | None = option(None, help="api: model name sent to the endpoint")
    comparator_api_key_env: str | None = option(None, help="api: NAME of the environment variable holding the key")
    comparator_api_timeout: float = option(120.0, help="api: seconds per request")
    comparator_api_response_field: str = option("completions", help="api generic: dotted path to the completions")
    comparator_api_headers: dict[str, str] | None = option(None, help="api: extra HTTP headers (never credentials)")

    def validate(self) -> None:
        super().validate()
        if isinstance(self.comparator_devices, str):  # comparator_devices=cuda:1 (CoMLRL's form)
            self.comparator_devices = [self.comparator_devices]
        check_positive("num_iterations", self.num_iterations)
        try:
            check_replay_options(
                self.preference_replay_mode,
                self.preference_replay_k,
                self.preference_replay_lambda,
                self.preference_replay_sample_size,
            )
        except ValueError as err:
            raise ConfigError(str(err)) from None
        check_in("comparator_policy", self.comparator_policy, COMPARATOR_POLICIES)
        policy = self.comparator_policy
        if policy != "history" and self.comparator_history_k is not None:
            raise ConfigError(
                "comparator_history_k is only used with comparator_policy='history'; remove it", "comparator_history_k"
            )
        if policy == "history" and self.comparator_history_k is not None:
            check_positive("comparator_history_k", self.comparator_history_k)
        if policy == "model":
            if self.comparator_model_name is None and not self.comparator_agents:
                raise ConfigError(
                    "comparator_policy='model' needs comparator_model_name (one model for all) or "
                    "comparator_agents (one per agent)",
                    "comparator_model_name",
                )
        elif self.comparator_model_name is not None or self.comparator_agents is not None:
            raise ConfigError(
                "comparator_model_name / comparator_agents are only used with comparator_policy='model'",
                "comparator_model_name",
            )
        if policy == "api":
            if not self.comparator_api_url or not self.comparator_api_model:
                raise ConfigError(
                    "comparator_policy='api' needs comparator_api_url and comparator_api_model", "comparator_api_url"
                )
            # CoMLRL's aliases (responses, codex -> openai_responses) are accepted and stored canonical
            self.comparator_api_format = canonical_format(self.comparator_api_format)
            check_in("comparator_api_format", self.comparator_api_format, API_FORMATS)
            check_positive("comparator_api_timeout", self.comparator_api_timeout)
        if self.comparator_num_candidates is not None:
            check_positive("comparator_num_candidates", self.comparator_num_candidates)
        if self.comparator_centralized_agent_index < 0:
            raise ConfigError("comparator_centralized_agent_index must be >= 0", "comparator_centralized_agent_index")

    @property
    def resolved_history_k(self) -> int:
        return self.comparator_history_k or 1
