"""rl.learner.ppo against numbers worked out by hand (each derivation is in the test's comments)."""

from __future__ import annotations

import math

import pytest
import torch

from rl.learner import ppo


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float32)


# --- GAE -------------------------------------------------------------------------------------


def test_gae_gamma_1_lambda_095_three_actions():
    # rewards [0, 0, 1], V [0.5, 0.6, 0.8], V after the last action = 0.
    # delta2 = 1 + 0 - 0.8 = 0.2              A2 = 0.2
    # delta1 = 0 + 0.8 - 0.6 = 0.2            A1 = 0.2 + 0.95 * 0.2 = 0.39
    # delta0 = 0 + 0.6 - 0.5 = 0.1            A0 = 0.1 + 0.95 * 0.39 = 0.4705
    # returns = A + V = [0.9705, 0.99, 1.0]
    adv, ret = ppo.gae(t(0, 0, 1), t(0.5, 0.6, 0.8), gamma=1.0, lam=0.95)
    torch.testing.assert_close(adv, t(0.4705, 0.39, 0.2))
    torch.testing.assert_close(ret, t(0.9705, 0.99, 1.0))


def test_gae_lambda_1_is_monte_carlo_return_minus_value():
    # gamma = lam = 1: A_k = (sum of rewards from k) - V_k = 2 - V_k; returns are all 2.
    adv, ret = ppo.gae(t(0, 0, 0, 2), t(0.2, 0.4, 0.1, 0.3), gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, t(1.8, 1.6, 1.9, 1.7))
    torch.testing.assert_close(ret, t(2, 2, 2, 2))


def test_gae_discount_applies_to_next_value():
    # gamma 0.5, lam 0: A_k = r_k + 0.5 V_{k+1} - V_k (one-step TD).
    # A0 = 0 + 0.5 * 1.0 - 0.5 = 0.0; A1 = 1 + 0 - 1.0 = 0.0; returns = [0.5, 1.0]
    adv, ret = ppo.gae(t(0, 1), t(0.5, 1.0), gamma=0.5, lam=0.0)
    torch.testing.assert_close(adv, t(0.0, 0.0))
    torch.testing.assert_close(ret, t(0.5, 1.0))


# --- policy loss -----------------------------------------------------------------------------

# Tokens (ratio r, advantage A) -> per-token max(-A r, -A clip(r, 0.8, 1.28)):
#   a: r 0.5, A +1 -> max(-0.5, -0.8) = -0.5          (no clip: low side only binds for A < 0)
#   b: r 1.5, A +1 -> max(-1.5, -1.28) = -1.28        (high clip)
#   c: r 0.5, A -1 -> max(0.5, 0.8) = 0.8             (low clip)
#   d: r 5.0, A -1 -> max(5.0, 1.28) = 5.0            (dual clip 3 -> min(5.0, 3.0) = 3.0)
#   e: r 1.1, A +2 -> max(-2.2, -2.2) = -2.2
#   f: masked out (r 10, A 5)
RATIOS = (0.5, 1.5, 0.5, 5.0, 1.1, 10.0)
ADVANTAGES = t(1, 1, -1, -1, 2, 5)
MASK = t(1, 1, 1, 1, 1, 0)


def _policy(dual_clip=None, tis=None):
    old = t(-1.0, -2.0, -0.5, -3.0, -1.5, -1.0)
    logprobs = (old + torch.log(t(*RATIOS))).requires_grad_()
    loss, stats = ppo.policy_loss(
        logprobs, old, ADVANTAGES, MASK, clip_low=0.2, clip_high=0.28, dual_clip=dual_clip, tis_weights=tis, normalizer=5.0
    )
    loss.backward()
    return loss, stats, logprobs.grad


def test_policy_loss_asymmetric_clip_values():
    # (-0.5 - 1.28 + 0.8 + 5.0 - 2.2) / 5 = 1.82 / 5
    loss, stats, _ = _policy()
    assert loss.item() == pytest.approx(0.364, abs=1e-6)
    assert stats["clipfrac"].item() == pytest.approx(2 / 5)  # b and c
    assert stats["dual_clipfrac"].item() == 0.0
    assert stats["ratio_mean"].item() == pytest.approx((0.5 + 1.5 + 0.5 + 5.0 + 1.1) / 5, rel=1e-6)
    assert stats["ratio_max"].item() == pytest.approx(5.0, rel=1e-6)  # the masked 10 is ignored


def test_policy_loss_clipped_tokens_get_no_gradient():
    # d(-A r)/d logprob = -A r for unclipped tokens, 0 for clipped ones; / normalizer 5.
    # a: -0.5/5 = -0.1; b, c clipped: 0; d: 5/5 = 1.0; e: -2.2/5 = -0.44; f masked: 0
    _, _, grad = _policy()
    torch.testing.assert_close(grad, t(-0.1, 0, 0, 1.0, -0.44, 0))


def test_policy_loss_dual_clip_caps_negative_advantage_tokens():
    # d becomes min(5.0, -A * 3) = 3.0 with no gradient: (-0.5 - 1.28 + 0.8 + 3.0 - 2.2) / 5 = -0.036
    loss, stats, grad = _policy(dual_clip=3.0)
    assert loss.item() == pytest.approx(-0.036, abs=1e-6)
    assert stats["dual_clipfrac"].item() == pytest.approx(1 / 5)
    torch.testing.assert_close(grad, t(-0.1, 0, 0, 0, -0.44, 0))


def test_policy_loss_tis_weights_multiply_per_token_loss():
    # weights [2, 1, 1, 0.5, 1, 1]: (-0.5*2 - 1.28 + 0.8 + 5.0*0.5 - 2.2) / 5 = -1.18 / 5
    loss, _, grad = _policy(tis=t(2, 1, 1, 0.5, 1, 1))
    assert loss.item() == pytest.approx(-0.236, abs=1e-6)
    torch.testing.assert_close(grad, t(-0.2, 0, 0, 0.5, -0.44, 0))


# --- value loss ------------------------------------------------------------------------------

# (V, old V, R) per token, clip 0.2:
#   1: (1.0, 0.5, 1.0): err 0; clipped V = 0.5 + 0.2 = 0.7, err 0.09 -> 0.09 (clip binds)
#   2: (0.6, 0.5, 0.0): err 0.36; clipped V = 0.6 -> 0.36
#   3: (-0.5, 0.0, 1.0): err 2.25; clipped V = -0.2, err 1.44 -> 2.25
VALUES, OLD_VALUES, RETURNS = t(1.0, 0.6, -0.5, 9.0), t(0.5, 0.5, 0.0, 0.0), t(1.0, 0.0, 1.0, 0.0)
VMASK = t(1, 1, 1, 0)


def test_value_loss_clipped():
    # 0.5 * (0.09 + 0.36 + 2.25) / 3 = 0.45
    loss, stats = ppo.value_loss(VALUES, OLD_VALUES, RETURNS, VMASK, clip=0.2, normalizer=3.0)
    assert loss.item() == pytest.approx(0.45, abs=1e-6)
    assert stats["value_clipfrac"].item() == pytest.approx(1 / 3)


def test_value_loss_unclipped():
    # 0.5 * (0 + 0.36 + 2.25) / 3 = 0.435
    loss, _ = ppo.value_loss(VALUES, OLD_VALUES, RETURNS, VMASK, clip=None, normalizer=3.0)
    assert loss.item() == pytest.approx(0.435, abs=1e-6)


# --- KL, TIS ---------------------------------------------------------------------------------

# Token 1: policy -1.0, reference -1.5 -> log r = ref - policy = -0.5
#   k1 = 0.5, k2 = 0.125, k3 = e^-0.5 - 1 + 0.5 = 0.1065306597
# Token 2: policy -2.0, reference -1.0 -> log r = 1
#   k1 = -1, k2 = 0.5, k3 = e - 2 = 0.7182818285
@pytest.mark.parametrize(
    "estimator, expected", [("k1", (0.5, -1.0)), ("k2", (0.125, 0.5)), ("k3", (0.1065306597, 0.7182818285))]
)
def test_kl_estimators(estimator, expected):
    out = ppo.kl(t(-1.0, -2.0), t(-1.5, -1.0), estimator)
    torch.testing.assert_close(out, t(*expected))


def test_kl_unknown_estimator_raises():
    with pytest.raises(ValueError, match="k4"):
        ppo.kl(t(0.0), t(0.0), "k4")


def test_tis_weights_truncate_at_cap():
    # exp(0) = 1, exp(log 3) = 3 -> 2, exp(-log 2) = 0.5, exp(log 2) = 2, exp(100) -> 2 (no overflow)
    train = t(0.0, math.log(3), -math.log(2), math.log(2), 100.0).requires_grad_()
    w = ppo.tis_weights(train, t(0, 0, 0, 0, 0), cap=2.0)
    torch.testing.assert_close(w, t(1.0, 2.0, 0.5, 2.0, 2.0))
    assert not w.requires_grad


# --- masked reductions -----------------------------------------------------------------------


def test_masked_sum_and_mean():
    x, mask = t(1, 2, 3, 100), t(1, 1, 1, 0)
    assert ppo.masked_sum(x, mask).item() == 6.0
    assert ppo.masked_mean(x, mask).item() == 2.0


def test_masked_whiten():
    # mean 2, population variance (1 + 0 + 1) / 3 = 2/3, std 0.8164966; masked entry -> 0
    out = ppo.masked_whiten(t(1, 2, 3, 100), t(1, 1, 1, 0))
    torch.testing.assert_close(out, t(-1.2247449, 0.0, 1.2247449, 0.0))


def test_explained_variance():
    # R [1, 2, 3], V [1, 2, 2]: Var R = 2/3; R - V = [0, 0, 1], Var = 2/9; EV = 1 - (2/9)/(2/3) = 2/3
    ev = ppo.explained_variance(t(1, 2, 2, 50), t(1, 2, 3, -7), t(1, 1, 1, 0))
    assert ev.item() == pytest.approx(2 / 3, rel=1e-6)


def test_explained_variance_constant_returns_is_nan():
    assert math.isnan(ppo.explained_variance(t(0, 1), t(1, 1), t(1, 1)).item())


# --- token-level normalisation ---------------------------------------------------------------


def test_two_micro_batches_give_the_gradient_of_one_big_batch():
    # Micro-batches with 3 and 1 action tokens: each loss is its token sum / 4 (global count),
    # so the accumulated gradient equals the big batch's token-mean gradient.
    torch.manual_seed(0)
    feats = torch.randn(6, 3)
    adv = t(1.0, -0.5, 2.0, 0.3, -1.0, 0.7)
    mask = t(1, 1, 0, 1, 0, 1)
    old = torch.randn(6)

    def loss(theta, rows, normalizer):
        lp = old[rows] + feats[rows] @ theta * 0.1
        return ppo.policy_loss(lp, old[rows], adv[rows], mask[rows], normalizer=normalizer)[0]

    big = torch.zeros(3, requires_grad=True)
    loss(big, slice(0, 6), 4.0).backward()
    acc = torch.zeros(3, requires_grad=True)
    for rows in (slice(0, 4), slice(4, 6)):
        loss(acc, rows, 4.0).backward()
    torch.testing.assert_close(acc.grad, big.grad)
    # The per-micro-batch mean (normaliser = local tokens) would weight the lone token 3x.
    naive = torch.zeros(3, requires_grad=True)
    for rows, n in ((slice(0, 4), 3.0), (slice(4, 6), 1.0)):
        (loss(naive, rows, n) / 2).backward()
    assert not torch.allclose(naive.grad, big.grad)
