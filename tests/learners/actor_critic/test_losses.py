"""Gradient checks of the actor and critic losses."""

from __future__ import annotations

import pytest
import torch

from learners.actor_critic.losses import NonFiniteLossError, actor_loss_terms, check_finite, value_loss_terms


def test_actor_loss_value_and_gradient_count_real_tokens_only():
    logp = torch.tensor([[-1.0, -2.0, 5.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([2.0, -1.0])
    terms = actor_loss_terms(logp, mask, adv)
    assert terms.tolist() == pytest.approx([-2.0 * -3.0, 1.0 * -1.5])
    terms.sum().backward()
    # d/dlogp = -A on real tokens, exactly 0 on the pad (even though its value is 5)
    assert logp.grad.tolist() == [[-2.0, -2.0, 0.0], [1.0, 1.0, 1.0]]


def test_actor_loss_advantage_is_a_constant():
    logp = torch.tensor([[-1.0]], requires_grad=True)
    adv = torch.tensor([3.0], requires_grad=True)
    actor_loss_terms(logp, torch.ones(1, 1), adv).sum().backward()
    assert adv.grad is None


def test_actor_loss_gradcheck():
    logp = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]])
    adv = torch.randn(3, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: actor_loss_terms(x, mask, adv), (logp,))


def test_value_loss_unclipped_value_and_gradient():
    v = torch.tensor([0.5, -1.0], requires_grad=True)
    y = torch.tensor([1.0, 1.0])
    terms = value_loss_terms(v, y)
    assert terms.tolist() == pytest.approx([0.25, 4.0])
    terms.sum().backward()
    assert v.grad.tolist() == pytest.approx([2 * (0.5 - 1.0), 2 * (-1.0 - 1.0)])


def test_value_loss_clipping_by_hand():
    old = torch.tensor([0.0, 0.0, 0.0])
    y = torch.tensor([1.0, 1.0, -1.0])
    # sample 0 moved inside the range; sample 1 moved past +0.2 towards the target (clipped
    # term is larger -> the max picks it and the gradient vanishes); sample 2 moved past
    # +0.2 away from the target (unclipped term is larger -> normal gradient)
    v = torch.tensor([0.1, 0.5, 0.5], requires_grad=True)
    terms = value_loss_terms(v, y, old, 0.2)
    assert terms.tolist() == pytest.approx([0.81, max(0.25, 0.64), max(2.25, 1.44)])
    terms.sum().backward()
    assert v.grad.tolist() == pytest.approx([2 * (0.1 - 1.0), 0.0, 2 * (0.5 + 1.0)])


def test_value_loss_gradcheck_clipped_and_not():
    v = torch.tensor([0.3, -0.7, 1.9, 0.05], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1.0, 0.0, 0.5, -0.2], dtype=torch.float64)
    old = torch.tensor([0.0, -0.6, 1.0, 0.0], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: value_loss_terms(x, y), (v,))
    assert torch.autograd.gradcheck(lambda x: value_loss_terms(x, y, old, 0.2), (v,))


def test_clipping_needs_old_values_and_shapes_must_match():
    with pytest.raises(ValueError, match="old values"):
        value_loss_terms(torch.zeros(2), torch.zeros(2), None, 0.2)
    with pytest.raises(ValueError, match="differ"):
        value_loss_terms(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="advantages"):
        actor_loss_terms(torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(3))


def test_nonfinite_loss_is_refused():
    with pytest.raises(NonFiniteLossError, match="step 7 for agent 1"):
        check_finite(torch.tensor(float("nan")), what="loss", step=7, agent="agent 1")
