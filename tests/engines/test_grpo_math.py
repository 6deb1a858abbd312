"""GRPO's arithmetic against TRL 1.16's formulas: scale_rewards group/batch/none, and the
cispo and sapo losses (value and gradient)."""

from __future__ import annotations

import math

import pytest
import torch

from race.engines.grpo_math import group_advantages, grpo_loss


def test_advantages_scale_by_group_batch_or_not():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    centred = r - r.view(2, 4).mean(1).repeat_interleave(4)
    none, zv = group_advantages(r, 4, scale="none")
    assert torch.allclose(none, centred) and not zv.any()
    group, _ = group_advantages(r, 4, scale="group")
    std_g = r.view(2, 4).std(1, unbiased=True).repeat_interleave(4)
    assert torch.allclose(group, centred / (std_g + 1e-4))
    batch, _ = group_advantages(r, 4, scale="batch")
    assert torch.allclose(batch, centred / (r.std(unbiased=True) + 1e-4))  # TRL: nanstd over the whole batch
    assert torch.equal(group_advantages(r, 4, scale=True)[0], group)
    assert torch.equal(group_advantages(r, 4, scale=False)[0], none)
    with pytest.raises(ValueError, match="group, batch or none"):
        group_advantages(r, 4, scale="std")


def _inputs():
    torch.manual_seed(0)
    logp = (-torch.rand(3, 5) - 0.1).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(3, 5)
    adv = torch.tensor([1.0, -0.5, 2.0])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    return logp, old, adv, mask


def test_cispo_is_the_detached_capped_ratio_times_the_policy_gradient():
    logp, old, adv, mask = _inputs()
    hi = 1.2
    loss, stats = grpo_loss(logp, old, adv, mask, epsilon=0.2, epsilon_high=hi, loss_type="cispo",
                            max_completion_length=5)
    ratio = torch.exp(logp.detach() - old)
    w = torch.clamp(ratio, max=hi) * adv[:, None] * mask
    assert math.isclose(loss.item(), float(-(w * logp.detach()).sum() / mask.sum()), rel_tol=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, -w / mask.sum())  # no gradient through the (detached) ratio
    want = float((((ratio > hi) & (adv[:, None] > 0)).float() * mask).sum() / mask.sum())
    assert math.isclose(stats.clip_frac, want, rel_tol=1e-6)


def test_sapo_is_the_soft_gate_averaged_per_sequence():
    logp, old, adv, mask = _inputs()
    loss, stats = grpo_loss(logp, old, adv, mask, epsilon=0.2, epsilon_high=None, loss_type="sapo",
                            max_completion_length=5, sapo_temperatures=(1.0, 1.05))
    ratio = torch.exp(logp.detach() - old)
    tau = torch.where(adv > 0, 1.0, 1.05)[:, None]
    per_tok = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv[:, None]
    want = ((per_tok * mask).sum(1) / mask.sum(1)).mean()
    assert math.isclose(loss.item(), float(want), rel_tol=1e-6) and stats.clip_frac == 0.0
    # on-policy (ratio 1) the gate's gradient is the plain policy gradient, as the clipped loss's
    logp2 = logp.detach().clone().requires_grad_(True)
    grpo_loss(logp2, logp2.detach(), adv, mask, epsilon=0.2, epsilon_high=None, loss_type="sapo",
              max_completion_length=5)[0].backward()
    logp3 = logp.detach().clone().requires_grad_(True)
    grpo_loss(logp3, logp3.detach(), adv, mask, epsilon=0.2, epsilon_high=None, loss_type="grpo",
              max_completion_length=5)[0].backward()
    assert torch.allclose(logp2.grad, logp3.grad, atol=1e-7)
