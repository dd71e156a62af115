"""Turn scored candidates into :class:`PreferencePair` records, and give text-only pairs
token ids for training.

* :func:`pairs_within` -- base trainers: pairs among one task's own candidates;
  ``candidate_reward_mean`` is the mean reward of that task's candidates.
* :func:`pairs_against` -- iterative trainers: target candidate ``i`` against comparator
  candidate ``i``; ``candidate_reward_mean`` is the mean over both sides' candidates (as in
  CoMLRL), and the record adds ``raw_rewards`` (winner, loser), ``target_raw_reward`` and
  ``comparator_raw_reward``.

A completion that exists only as text (a comparator's, or a pair read from a file written
without token ids) is tokenised by the policy that trains on it, and ends with that
policy's EOS token, as a finished response would.
"""

from __future__ import annotations

import random
from typing import Sequence

from comlrl_core.policy import Policy
from learners.preference.candidates import JointCandidate, TaskCandidates
from learners.preference.pairs import select_comparisons, select_pairs
from learners.preference.records import PreferencePair


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def pairs_within(task: TaskCandidates, mode: str, limit: int | None, rng: random.Random) -> list[PreferencePair]:
    rewards = [c.reward if c is not None and c.reward is not None else float("nan") for c in task.candidates]
    mean = _mean(task.scored_rewards())
    out = []
    for winner, loser in select_pairs(rewards, mode, limit, rng):
        win, lose = _selected(task.candidates[winner]), _selected(task.candidates[loser])
        out.append(_pair(task, win, lose, mean))
    return out


def _selected(candidate: JointCandidate | None) -> JointCandidate:
    """A candidate a selection picked: the selections skip dropped (None) candidates."""
    if candidate is None:
        raise ValueError("a preference pair selected a dropped candidate")
    return candidate


def _number(value: float | None, what: str) -> float:
    """A reward of a selected candidate: the selections skip unscored ones."""
    if value is None:
        raise ValueError(f"a preference pair selected a candidate without a {what}")
    return float(value)


def _pair(task: TaskCandidates, win: JointCandidate, lose: JointCandidate, mean: float) -> PreferencePair:
    prompt_ids: list[list[int]] | None = None
    winner_ids: list[list[int]] | None = None
    loser_ids: list[list[int]] | None = None
    if task.prompt_ids is not None and win.token_ids is not None and lose.token_ids is not None:
        prompt_ids = [list(x) for x in task.prompt_ids]
        winner_ids = [list(x) for x in win.token_ids]
        loser_ids = [list(x) for x in lose.token_ids]
    return PreferencePair(
        prompts=list(task.prompts),
        winner_completions=list(win.completions),
        loser_completions=list(lose.completions),
        winner_reward=_number(win.reward, "reward"),
        loser_reward=_number(lose.reward, "reward"),
        candidate_reward_mean=float(mean),
        prompt_ids=prompt_ids,
        winner_ids=winner_ids,
        loser_ids=loser_ids,
    )


def completion_ids(policy: Policy, text: str) -> list[int]:
    """Token ids of ``text`` as ``policy``'s completion, EOS appended."""
    encode = getattr(policy, "encode_completion", None)
    if callable(encode):
        return list(encode(text))
    tokenizer = getattr(policy, "tokenizer", None)
    if tokenizer is None:
        raise TypeError(f"{type(policy).__name__} has no tokenizer: it cannot score a text completion")
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    eos = getattr(policy, "eos_token_ids", None) or [tokenizer.eos_token_id]
    return ids + [int(eos[0])]


def with_token_ids(pair: PreferencePair, policies: Sequence[Policy]) -> PreferencePair:
    """``pair`` with token ids for every agent (tokenising whatever has only text)."""
    if pair.has_token_ids:
        return pair
    pair.prompt_ids = [list(p.encode_prompt(text)) for p, text in zip(policies, pair.prompts, strict=True)]
    pair.winner_ids = [completion_ids(p, text) for p, text in zip(policies, pair.winner_completions, strict=True)]
    pair.loser_ids = [completion_ids(p, text) for p, text in zip(policies, pair.loser_completions, strict=True)]
    return pair


def pairs_against(
    target: TaskCandidates,
    comparator: TaskCandidates,
    mode: str,
    limit: int | None,
    rng: random.Random,
    policies: Sequence[Policy] | None = None,
) -> list[PreferencePair]:
    """Same-index comparisons of target and comparator candidates as pairs. With
    ``policies``, pairs carry token ids: the target side's generated ids, and the
    comparator side's text tokenised by the target policies."""

    def ids_of(cand: JointCandidate, own: bool, policies: Sequence[Policy]) -> list[list[int]]:
        if own and cand.token_ids is not None:
            return [list(x) for x in cand.token_ids]
        return [completion_ids(p, text) for p, text in zip(policies, cand.completions, strict=True)]

    prompt_ids = None
    if policies is not None:
        prompt_ids = target.prompt_ids or [
            list(p.encode_prompt(t)) for p, t in zip(policies, target.prompts, strict=True)
        ]
    mean = _mean(target.scored_rewards() + comparator.scored_rewards())
    out = []
    for comp in select_comparisons(target.rewards, comparator.rewards, mode, limit, rng):
        t, c = _selected(target.candidates[comp.index]), _selected(comparator.candidates[comp.index])
        (win, win_own), (lose, lose_own) = ((t, True), (c, False)) if comp.target_wins else ((c, False), (t, True))
        out.append(
            PreferencePair(
                prompts=list(target.prompts),
                winner_completions=list(win.completions),
                loser_completions=list(lose.completions),
                winner_reward=_number(win.reward, "reward"),
                loser_reward=_number(lose.reward, "reward"),
                candidate_reward_mean=float(mean),
                raw_rewards=[_number(win.raw_reward, "raw reward"), _number(lose.raw_reward, "raw reward")],
                target_raw_reward=_number(t.raw_reward, "raw reward"),
                comparator_raw_reward=_number(c.raw_reward, "raw reward"),
                prompt_ids=None if prompt_ids is None else [list(x) for x in prompt_ids],
                winner_ids=None if policies is None else ids_of(win, win_own, policies),
                loser_ids=None if policies is None else ids_of(lose, lose_own, policies),
            )
        )
    return out
