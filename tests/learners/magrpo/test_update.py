"""One agent's optimizer step: groups without signal are not scored, and nothing else changes."""

from __future__ import annotations

import pytest
import torch
from magrpo_fakes import BigramPolicy

from learners.common.logprobs import accumulate_gradients
from learners.magrpo.groups import NodeGroup
from learners.magrpo.losses import NonFiniteLossError, sequence_pg_loss
from learners.magrpo.update import groups_with_signal, loss_coefficients, update_agent


def _group(prompt: list[int], completions: list[list[int]], returns: list[float]) -> NodeGroup:
    return NodeGroup(0, 1, [list(prompt) for _ in completions], completions, returns, 0.0, 0.0)


LEARNING = _group([1], [[2, 0], [3, 4, 0], [4]], [1.0, 0.0, 0.5])
TIED = _group([2], [[1, 0], [3, 3, 0], [2, 0]], [0.3, 0.3, 0.3])  # identical returns: zero advantages
TIED_TOO = _group([3], [[4, 4], [1, 0], [5, 0]], [2.0, 2.0, 2.0])


def _adam(policy: BigramPolicy) -> torch.optim.Optimizer:
    return torch.optim.AdamW(policy.parameters(), lr=0.05, weight_decay=0.0)


def _update(policy: BigramPolicy, optimizer: torch.optim.Optimizer, groups: list[NodeGroup], mode: str = "mean"):
    return update_agent(
        policy, optimizer, groups, advantage_mode=mode, normalize_advantage=False, micro_batch_size=4, step=0, agent=0
    )


def _score_everything(policy: BigramPolicy, optimizer: torch.optim.Optimizer, groups: list[NodeGroup]) -> None:
    """The step as it is written down: every response scored, zero coefficients included."""
    coef, _ = loss_coefficients([g.returns for g in groups], "mean", False, len(groups))
    optimizer.zero_grad(set_to_none=True)
    accumulate_gradients(
        policy,
        [p for g in groups for p in g.prompt_ids],
        [c for g in groups for c in g.completion_ids],
        lambda lp, mask, idx: sequence_pg_loss(lp, mask, coef[idx.start : idx.stop]),
        micro_batch_size=4,
    )
    optimizer.step()


def test_groups_without_signal_are_not_scored_and_the_step_is_the_same():
    skipping, reference = BigramPolicy(vocab=6), BigramPolicy(vocab=6)
    result = _update(skipping, _adam(skipping), [TIED, LEARNING, TIED_TOO])
    _score_everything(reference, _adam(reference), [TIED, LEARNING, TIED_TOO])
    assert sum(skipping.logprob_calls) == len(LEARNING.completion_ids)  # only the learning group's rows
    assert sum(reference.logprob_calls) == 9
    assert (result.zero_advantage_groups, result.num_groups) == (2, 3)
    assert torch.allclose(skipping.logits, reference.logits, atol=1e-7)
    assert not torch.equal(skipping.logits, BigramPolicy(vocab=6).logits)  # it did learn


def test_an_update_with_nothing_to_learn_still_steps_adams_moments():
    skipping, reference = BigramPolicy(vocab=6), BigramPolicy(vocab=6)
    opt_s, opt_r = _adam(skipping), _adam(reference)
    _update(skipping, opt_s, [LEARNING])
    _score_everything(reference, opt_r, [LEARNING])
    after_first = skipping.logits.detach().clone()
    calls = len(skipping.logprob_calls)
    result = _update(skipping, opt_s, [TIED, TIED_TOO])
    _score_everything(reference, opt_r, [TIED, TIED_TOO])
    assert len(skipping.logprob_calls) == calls  # nothing scored
    assert (result.zero_advantage_groups, result.num_groups, result.loss) == (2, 2, 0.0)
    assert not torch.equal(skipping.logits, after_first)  # the moments moved the weights
    assert torch.allclose(skipping.logits, reference.logits, atol=1e-7)


def test_raw_mode_skips_only_all_zero_returns():
    policy = BigramPolicy(vocab=6)
    zero_returns = _group([2], [[1, 0], [3, 0]], [0.0, 0.0])
    result = _update(policy, _adam(policy), [zero_returns, TIED], mode="raw")
    assert (result.zero_advantage_groups, result.num_groups) == (1, 2)  # TIED's returns are its advantages
    assert sum(policy.logprob_calls) == len(TIED.completion_ids)


def test_a_nan_return_is_scored_so_the_finiteness_check_sees_it():
    coef = torch.tensor([0.0, 0.0, 0.0, float("nan"), 0.0, 0.0])
    kept, kept_coef = groups_with_signal([TIED, TIED_TOO], coef)
    assert kept == [TIED_TOO] and kept_coef.isnan().tolist() == [True, False, False]
    policy = BigramPolicy(vocab=6)
    nan_group = _group([3], [[4, 4], [1, 0]], [float("nan"), 1.0])
    with pytest.raises(NonFiniteLossError, match="step 0 for agent 0"):  # refused as before
        _update(policy, _adam(policy), [nan_group])
