"""Writing-v0: two agents write complementary texts about a passage.

The fast environment of comlrl-gym: no sandbox, no model in the loop, a reward made of
cheap deterministic text statistics that a tiny model can move within minutes on CPU.

=================== =====================================================================
Id                  ``comlrl/Writing-v0`` (``envs.make("comlrl/Writing-v0", **kwargs)``)
Agents              ``["summarizer", "expander"]``
Action space        ``Text`` (printable charset incl. newline): the agent's completion
Observation space   ``Text``: the agent's prompt
Reward              shared team reward in ``[0, 3]`` (before ``reward_processor``)
Success threshold   raw reward ``>= success_threshold`` (default 2.4) counts as a pass
=================== =====================================================================

**Task.** An item is a short fictional passage (320 ship with the package, see
:mod:`envs.writing.passages`). The *summarizer* writes a concise summary of about
``summary_fraction`` of the passage's length; the *expander* writes a detailed expansion
about ``expansion_ratio`` times as long as the summary.

**Observation.** Turn 1: the passage, the agent's role, its length target and the
teammate's role. Later turns: built by ``external_transition`` -- ``"plain"`` (the
original prompt, the agent's previous responses, the teammate's latest response and an
instruction to revise), ``"level_feedback"`` (plain plus the reward levels and the length
targets in characters) or a custom callable (see :mod:`envs.base`).

**Reward.** Three levels in ``[0, 1]`` summed (details in :mod:`envs.writing.reward`):
``length`` (summary near its target, expansion near ``expansion_ratio`` x the summary),
``overlap`` (both texts use the passage's or common words; the expansion repeats the
summary's content words) and ``diversity`` (distinct grounded words, so repetition and
gibberish score low). ``infos[agent]`` holds ``levels``, ``stats`` (characters, targets,
word counts), ``passed`` (raw reward >= success threshold), ``raw_reward`` and ``reward``.

**Termination.** Single-turn by default (``num_turns=1``): the episode truncates after
the last turn; with ``early_termination_threshold`` it terminates once the processed
reward reaches it.

**Arguments** (besides the base ones: ``num_turns``, ``early_termination_threshold``,
``reward_processor``, ``external_transition``, ``external_prompt_passthrough``,
``formatters``, ``task_slice``, ``render_mode``):

* ``summary_fraction`` (0.3): summary length target as a fraction of the passage.
* ``expansion_ratio`` (3.0): expansion length / summary length target.
* ``length_tolerance`` (1.0): the log2 factor at which a length scores 1/2.
* ``success_threshold`` (2.4): raw reward counted as a pass by ``envs.evaluate``.
* ``data_file`` (None): a JSON list of ``{"passage": ...}`` items replacing the shipped ones.

Passages have 200-290 characters, so the summary target is about 75 characters and the
expansion target about 220. For demos with very short generations (a tiny model with
``max_new_tokens=32`` writes roughly 70 characters) lower ``expansion_ratio`` (e.g. 1.5) so
that the targets lie within reach; the reward is smooth either way.
"""

from __future__ import annotations

from typing import Any, Hashable

from envs.base import TextParallelEnv
from envs.writing.passages import load_passages
from envs.writing.reward import MAX_REWARD, WritingRewardConfig, score_writing

SUMMARIZER, EXPANDER = "summarizer", "expander"


class WritingEnv(TextParallelEnv):
    """Summarizer + expander writing about a passage (see the module docstring)."""

    metadata = {"name": "comlrl_writing_v0", "render_modes": ["ansi"], "is_parallelizable": True}
    possible_agents = [SUMMARIZER, EXPANDER]
    _supported_modes = ("plain", "level_feedback")
    max_reward = MAX_REWARD

    def __init__(
        self,
        *,
        summary_fraction: float = 0.3,
        expansion_ratio: float = 3.0,
        length_tolerance: float = 1.0,
        success_threshold: float = 2.4,
        data_file: str | None = None,
        **base_kwargs: Any,
    ) -> None:
        self.reward_config = WritingRewardConfig(summary_fraction, expansion_ratio, length_tolerance)
        if not 0 <= float(success_threshold) <= MAX_REWARD:
            raise ValueError(f"success_threshold must be in [0, {MAX_REWARD}], got {success_threshold}")
        self._success_threshold = float(success_threshold)
        self.data_file = data_file
        super().__init__(**base_kwargs)

    @property
    def success_threshold(self) -> float:
        return self._success_threshold

    # ---- hooks --------------------------------------------------------------------------
    def _load_tasks(self) -> list[dict[str, Any]]:
        return load_passages(self.data_file)

    def _task_prompt(self, task: dict[str, Any]) -> str:
        return task["passage"]

    def _initial_prompt(self, task: dict[str, Any], agent: str) -> str:
        passage = task["passage"]
        target_s = self.reward_config.summary_target(passage)
        ratio = self.reward_config.expansion_ratio
        if agent == SUMMARIZER:
            role = (
                f"You are the summarizer in a team of two writers. Write a concise summary of the "
                f"passage in about {target_s} characters. Your teammate writes a detailed expansion "
                f"about {ratio:g} times as long as your summary."
            )
        else:
            role = (
                f"You are the expander in a team of two writers. Write a detailed expansion of the "
                f"passage that explains it further, about {ratio:g} times as long as your teammate's "
                f"summary (about {round(ratio * target_s)} characters). Reuse the passage's key words."
            )
        return f"Passage:\n{passage}\n\n{role}"

    def _score_batch(self, items: list[tuple[dict[str, Any], dict[str, str]]]) -> list[tuple[float, dict[str, Any]]]:
        results = []
        for task, actions in items:
            raw, details = score_writing(task["passage"], actions[SUMMARIZER], actions[EXPANDER], self.reward_config)
            details["passed"] = raw >= self._success_threshold
            results.append((raw, details))
        return results

    def _transition(
        self, task: dict[str, Any], actions: dict[str, str], details: dict[str, Any], mode: str
    ) -> dict[str, str]:
        if mode == "level_feedback":
            levels = ", ".join(f"{k} {v:.2f}" for k, v in details["levels"].items())
            stats = details["stats"]
            feedback = (
                f"Team scores (each out of 1): {levels}. Summary: {stats['summary_chars']} characters "
                f"(target {stats['summary_target_chars']}); expansion: {stats['expansion_chars']} "
                f"characters (target {stats['expansion_target_chars']})."
            )
            return {
                agent: self._plain_prompt(task, agent, actions).replace(
                    "Revise your response.", f"{feedback}\n\nRevise your response."
                )
                for agent in self.possible_agents
            }
        return super()._transition(task, actions, details, mode)

    def _scoring_key(self) -> Hashable:
        # instances with the same reward settings can be scored by any one of them
        return (type(self), self.reward_config, self._success_threshold)
