"""PPO's math as pure functions: tensors in, tensors out, nothing else.

What it is: GAE over one sample's action tokens, the clipped policy loss (asymmetric clip,
optional dual clip, optional truncated importance sampling), the clipped value loss, the KL
estimators k1/k2/k3, truncated importance weights, and masked reductions.
What it is not: packing, model calls or optimizer steps (`rl/learner/update.py`).

Loss aggregation is token-level: a micro-batch's loss is masked_sum(per-token loss) divided by
`normalizer`, the number of action tokens in the GLOBAL batch (all ranks, all micro-batches), so
summing the micro-batch gradients over gradient accumulation and data parallelism gives the
gradient of the global token mean. Stats follow the same rule (token sums / normalizer) so they
add up across micro-batches and ranks too; `*_max` stats are maxima.

Example:
    adv, ret = gae(rewards, values)                       # one sample's action tokens
    loss, stats = policy_loss(lp, old_lp, adv_pos, mask, normalizer=n_global)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum()


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    return masked_sum(x, mask) / mask.sum().clamp(min=1.0)


def masked_whiten(x: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mean) / std over the masked entries (population variance); masked entries become 0."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """1 - Var[returns - values] / Var[returns] over masked entries (population variances).

    1 is a perfect critic, 0 no better than a constant; nan when the returns are constant.
    """
    var_returns = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    diff = returns - values
    var_diff = masked_mean((diff - masked_mean(diff, mask)) ** 2, mask)
    if var_returns.item() == 0.0:
        return torch.tensor(math.nan)
    return 1.0 - var_diff / var_returns


def gae(rewards: Tensor, values: Tensor, gamma: float = 1.0, lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over ONE sample's action tokens, in order.

    rewards, values: [n] (values[k] = V(state before action k)); the value after the last
    action is 0 (the episode ends). Returns (advantages, returns), [n] each, returns = adv + V.
    """
    # A plain Python loop over floats: a sample has up to ~30k actions, and per-element tensor
    # indexing (let alone on a GPU) would cost 100x more than the loop itself.
    r, v = rewards.tolist(), values.tolist()
    out = [0.0] * len(r)
    running = 0.0
    for k in reversed(range(len(r))):
        next_value = v[k + 1] if k + 1 < len(r) else 0.0
        running = r[k] + gamma * next_value - v[k] + gamma * lam * running
        out[k] = running
    advantages = torch.tensor(out, dtype=torch.float32, device=values.device)
    return advantages, advantages + values.float()


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    tis_weights: Tensor | None = None,
    normalizer: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The clipped surrogate, token sum / normalizer, and its stats (detached).

    Per token: max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)) (DAPO's asymmetric "clip
    higher"); with dual_clip c > 1, tokens with A < 0 are capped at -A c (Ye et al. 2020,
    dual-clip PPO) so a huge ratio on a bad action cannot blow up the loss. `tis_weights`
    (detached) multiply the per-token loss: truncated importance sampling corrects for the
    rollout engine's log-probs differing from the trainer's.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(per_token, dtype=torch.bool)
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual_clipped = (advantages < 0) & (per_token > cap)
        per_token = torch.where(advantages < 0, torch.minimum(per_token, cap), per_token)
    if tis_weights is not None:
        per_token = per_token * tis_weights
    loss = masked_sum(per_token, mask) / normalizer
    with torch.no_grad():
        stats = {
            "clipfrac": masked_sum((clipped > unclipped).float(), mask) / normalizer,
            "dual_clipfrac": masked_sum(dual_clipped.float(), mask) / normalizer,
            "ratio_mean": masked_sum(ratio, mask) / normalizer,
            "ratio_max": _masked_max(ratio, mask),
        }
    return loss, stats


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = 0.2,
    normalizer: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """0.5 (V - R)^2, or with `clip` the PPO2 max of it and the clipped value's error.

    The clipped value is old + clamp(V - old, -clip, clip): the critic may not move further than
    `clip` from the values the advantages were computed with, per update.
    """
    err = (values - returns) ** 2
    clipfrac = torch.zeros((), device=values.device)
    if clip is not None:
        clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        err_clipped = (clipped - returns) ** 2
        with torch.no_grad():
            clipfrac = masked_sum((err_clipped > err).float(), mask) / normalizer
        err = torch.maximum(err, err_clipped)
    loss = 0.5 * masked_sum(err, mask) / normalizer
    return loss, {"value_clipfrac": clipfrac}


def kl(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(policy || reference) from tokens sampled by the policy.

    With log r = ref - policy (Schulman, "Approximating KL divergence", 2020):
    k1 = -log r (unbiased, high variance, can be negative), k2 = (log r)^2 / 2 (biased, low
    variance), k3 = r - 1 - log r (unbiased, always >= 0).
    """
    log_r = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    if estimator == "k3":
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"unknown KL estimator {estimator!r}; expected k1, k2 or k3")


def tis_weights(train_logprobs: Tensor, behaviour_logprobs: Tensor, cap: float = 2.0) -> Tensor:
    """min(exp(train - behaviour), cap), detached: truncated importance sampling weights."""
    with torch.no_grad():
        # Clamp the exponent first: exp of a large gap overflows before the cap applies.
        return torch.exp(torch.clamp(train_logprobs - behaviour_logprobs, max=math.log(cap))).clamp(max=cap)


def _masked_max(x: Tensor, mask: Tensor) -> Tensor:
    if not bool((mask > 0).any()):
        return torch.zeros((), device=x.device)
    return x[mask > 0].max()
