"""The policy-gradient loss: token masks (EOS in, pads out), group averaging, guards."""

from __future__ import annotations

import pytest
import torch
from magrpo_fakes import BigramPolicy

from comlrl_core.models.tokens import k3_kl, masked_sum
from learners.common.logprobs import accumulate_gradients, sequence_logprobs_nograd
from learners.magrpo.losses import NonFiniteLossError, check_finite, sequence_pg_loss
from learners.magrpo.update import loss_coefficients


def test_loss_counts_eos_and_never_pads():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, float("nan"), float("nan")]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])  # row 0 ends on EOS (counted); row 1 padded
    loss = sequence_pg_loss(logp, mask, [1.0, 2.0])
    assert loss.item() == pytest.approx(6.0 + 8.0)
    loss.backward()
    assert logp.grad.tolist() == [[-1.0, -1.0, -1.0], [-2.0, 0.0, 0.0]]


def test_loss_is_the_mean_over_groups_of_each_groups_mean():
    # raw advantages = returns; group sizes 2 and 1 weigh the same
    coef, adv_abs = loss_coefficients([[2.0, -1.0], [4.0]], "raw", False, num_groups=2)
    assert coef.tolist() == pytest.approx([2.0 / 4, -1.0 / 4, 4.0 / 2])
    assert adv_abs == pytest.approx((1.5 + 4.0) / 2)
    logp = torch.tensor([[-1.0], [-3.0], [-2.0]])
    mask = torch.ones(3, 1)
    group_means = [(2.0 * 1.0 + -1.0 * 3.0) / 2, 4.0 * 2.0 / 1]  # -A * logp averaged per group
    assert sequence_pg_loss(logp, mask, coef).item() == pytest.approx(sum(group_means) / 2)


def test_gradient_pushes_toward_positive_advantage():
    policy = BigramPolicy(vocab=4)
    prompts, comps = [[1], [1]], [[2, 0], [3, 0]]
    logp, mask = policy.token_logprobs(prompts, comps)
    coef, _ = loss_coefficients([[1.0, -1.0]], "raw", False, num_groups=1)
    sequence_pg_loss(logp, mask, coef).backward()
    with torch.no_grad():
        policy.logits -= 1.0 * policy.logits.grad
    new_logp, _ = policy.token_logprobs(prompts, comps)
    assert new_logp[0, 0] > logp[0, 0] and new_logp[1, 0] < logp[1, 0]


@pytest.mark.parametrize("micro", [1, 2, 5])
def test_micro_batches_add_up_to_the_full_gradient(micro):
    prompts = [[1], [2], [3], [1], [2]]
    comps = [[2, 0], [3], [1, 1, 0], [], [4, 0]]
    coef = torch.tensor([0.5, -1.0, 2.0, 1.0, 0.25])
    full = BigramPolicy(vocab=5)
    logp, mask = full.token_logprobs(prompts, comps)
    sequence_pg_loss(logp, mask, coef).backward()
    chunked = BigramPolicy(vocab=5)
    total = accumulate_gradients(
        chunked, prompts, comps, lambda lp, m, idx: sequence_pg_loss(lp, m, coef[list(idx)]), micro
    )
    assert torch.allclose(full.logits.grad, chunked.logits.grad, atol=1e-6)
    assert total == pytest.approx(sequence_pg_loss(logp, mask, coef).item(), rel=1e-5)
    assert max(chunked.logprob_calls) <= micro


def test_nograd_logprobs_drop_pads():
    policy = BigramPolicy(vocab=5)
    out = sequence_logprobs_nograd(policy, [[1], [2]], [[2, 3, 0], [4]], micro_batch_size=1)
    assert [t.numel() for t in out] == [3, 1] and not out[0].requires_grad


def test_k3_is_zero_at_equality_and_positive_otherwise():
    lp = torch.tensor([[-1.0, -2.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert k3_kl(lp, lp, mask).item() == pytest.approx(0.0)
    assert k3_kl(lp, lp - 0.5, mask).item() > 0
    assert masked_sum(lp, mask).item() == -3.0


def test_nonfinite_loss_names_step_and_agent():
    assert check_finite(1.0, step=3, agent=1)
    with pytest.raises(NonFiniteLossError, match=r"step 7 for agent 1"):
        check_finite(torch.tensor(float("nan")), step=7, agent=1)
    with pytest.raises(NonFiniteLossError, match="skip_nonfinite"):
        check_finite(float("inf"), step=0, agent=0)


def test_shared_prefix_scoring_equals_per_row_scoring():
    from comlrl_core.models.hf_policy import TransformersPolicy
    from learners.common.shared_prefix import shared_prefix_token_logprobs, supports_shared_prefix

    torch.manual_seed(0)
    policy = TransformersPolicy.from_source("tiny-random", device="cpu")
    assert supports_shared_prefix(policy) and not supports_shared_prefix(BigramPolicy())
    prompts = [policy.encode_prompt("short"), policy.encode_prompt("a much longer prompt with more words")]
    comps = [[[5, 6, 7, 2], [8, 9]], [[10], [11, 12, 13, 14, 15]]]
    flat_p = [p for p, group in zip(prompts, comps, strict=True) for _ in group]
    flat_c = [c for group in comps for c in group]
    per_row, mask_a = policy.token_logprobs(flat_p, flat_c)
    (per_row * torch.arange(1.0, 5.0).unsqueeze(1)).sum().backward()
    grads_a = [p.grad.clone() for p in policy.parameters()]
    for p in policy.parameters():
        p.grad = None
    shared, mask_b = shared_prefix_token_logprobs(policy, prompts, comps)
    (shared * torch.arange(1.0, 5.0).unsqueeze(1)).sum().backward()
    assert torch.equal(mask_a, mask_b)
    assert torch.allclose(per_row, shared, atol=1e-5)
    for a, b in zip(grads_a, [p.grad for p in policy.parameters()], strict=True):
        assert torch.allclose(a, b, atol=1e-4)
