"""One learner update on this rank's samples: PPO, rejection fine-tuning, or value pretraining.

What it is: `PPOConfig`, `compute_values` and `advantages_and_returns` (the critic's values and
GAE per sample, token-indexed), and the three steps `ppo_step`, `sft_step`, `value_step`. Each
step packs the samples into micro-batches (`rl/learner/packing.py`), accumulates gradients over them,
clips, and takes one optimizer step per update; it returns global metrics as floats.
What it is not: the math (`rl/learner/ppo.py`), sharding (`rl/learner/fsdp.py`), or choosing this rank's
samples (`rl/packing.balance`, called by the learner).

Data parallelism: every step is a collective when torch.distributed is initialised. All ranks
run the same number of forwards (short ranks run all-masked dummy micro-batches, so FSDP's
all-gathers line up), the loss is normalised by the action tokens of the GLOBAL batch, and
metrics are all-reduced over `group` (None = the default group). `rl.learner.fsdp.shard` makes FSDP2
SUM gradients over ranks (divide factor 1), so the summed gradient is that of the global token
mean; under a wrapper that averages instead (DDP, FSDP2's default) it would be 1/world of that.

Example:
    metrics = ppo_step(actor, critic, actor_opt, critic_opt, balance(batch, world, rank), cfg, device)
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.distributed as dist
from msgspec import Struct
from torch import Tensor, nn

from rl.learner import ppo
from rl.learner.packing import MicroBatch, dummy_micro_batch, micro_batches
from rl.samples import Sample


class PPOConfig(Struct, frozen=True, kw_only=True):
    """PPO hyper-parameters (the CUDA Agent paper's defaults where it gives them)."""

    clip_low: float = 0.2
    """Ratio clip below 1 (1 - clip_low)."""
    clip_high: float = 0.28
    """Ratio clip above 1 (1 + clip_high); larger than clip_low ("clip higher", DAPO)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (e.g. 3.0); None = off."""
    value_clip: float | None = 0.2
    """Largest change of a value per update in the clipped value loss; None = unclipped."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to a reference policy (needs ref_logprobs); 0 = off."""
    sft_coef: float = 0.0
    """Weight of the mean NLL of the batch's demonstrations (`Sample.demonstration`: rft's samples,
    which the PPO stage adds to each step's batch when this is above 0) in the actor's loss; 0 =
    off. A small policy tells sibling tasks (softmax, log-softmax) apart by a few tokens of their
    prompts: an update that raises one task's answer raises it in its sibling's nearly identical
    context too. The demonstrations of every taught task are meant to pull each context back to its
    own answer (InstructGPT's pretraining mix, "PPO-ptx", with rft's data)."""
    policy_coef: float = 1.0
    """Weight of the PPO surrogate in the actor's loss. 0 with sft_coef > 0 leaves the actor the
    demonstrations' NLL alone: the anchor's own effect, the ablation that says how much of a
    PPO-with-anchor run's change the rewards made (the critic still learns its returns)."""
    kl_estimator: str = "k3"
    """k1, k2 or k3 (see rl.learner.ppo.kl)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (entropy is logged either way)."""
    gamma: float = 1.0
    """Discount per action token."""
    lam: float = 0.95
    """GAE lambda. The reward (on a sample's last action) reaches the action k tokens before it
    with weight (gamma lam)^k: at 0.95 a token 100 actions back gets 0.6% of it, the rest of its
    advantage is the critic's own differences. `reward_reach` in the step metrics is that weight
    on each sample's first action, averaged."""
    tis_cap: float | None = None
    """Truncated importance sampling cap (e.g. 2.0): weights min(exp(train - behaviour), cap)."""
    baseline: Literal["critic", "group"] = "critic"
    """What the policy's advantages subtract from the reward. "critic": GAE(gamma, lam) over the
    critic's values. "group": every action of a sample gets its reward minus the mean reward of
    its group (`Sample.group_id`: one task's samples in a step, over all ranks; a group of one
    gets 0), the same for all its actions (gamma and lam apply to the critic's returns alone)."""
    normalize_advantages: bool = False
    """Whiten advantages over the global batch's action tokens."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip, per model."""
    token_budget: int = 16384
    """Tokens per micro-batch (packed row)."""
    updates_per_batch: int = 1
    """Optimizer steps on each batch; at 1 the old log-probs come from the same forward pass."""


Fields = dict[str, Sequence[Tensor]]


def compute_values(
    critic: nn.Module, samples: Sequence[Sample], cfg: PPOConfig, device: torch.device | str, *, group=None
) -> list[Tensor]:
    """The critic's values, no grad: per sample a token-indexed fp32 CPU tensor [n] whose entry i
    is the critic output at position i-1 (the state before token i); entry 0 is 0."""
    out: list[Tensor] = [torch.zeros(0)] * len(samples)
    with torch.no_grad():
        for mb in _aligned(micro_batches(samples, cfg.token_budget), (), group):
            mb = mb.to(device)
            values = critic(mb.input_ids, mb.position_ids).float().cpu()  # [1, T]
            for i, v in zip(mb.sample_index, mb.split(values)):
                out[i] = torch.cat([v.new_zeros(1), v[:-1]])
    return out


def compute_logprobs(
    actor: nn.Module, samples: Sequence[Sample], cfg: PPOConfig, device: torch.device | str, *, group=None,
    temperature: float = 1.0,
) -> list[Tensor]:
    """Per-token log-probs of each sample under `actor` (e.g. the frozen reference policy for the
    KL penalty) at `temperature`, no grad: token-indexed fp32 CPU tensors [n]; entry i is
    log p(token i | < i) for action tokens, and for the others too unless the actor's head runs on
    actions only (then 0)."""
    out: list[Tensor] = [torch.zeros(0)] * len(samples)
    with torch.no_grad():
        for mb in _aligned(micro_batches(samples, cfg.token_budget), (), group):
            mb = mb.to(device)
            logprobs = actor(mb.input_ids, mb.position_ids, mb.targets, mask=mb.mask,
                             temperature=temperature)[0].float().cpu()  # [1, T]
            for i, lp in zip(mb.sample_index, mb.split(logprobs)):
                out[i] = torch.cat([lp.new_zeros(1), lp[:-1]])
    return out


def _actions(sample: Sample) -> Tensor:
    """The sample's action positions, bool [n]: its action mask but token 0, which has no position
    before it and so is never an action."""
    actions = torch.tensor(sample.action_mask, dtype=torch.bool)
    actions[0] = False
    return actions


def advantages_and_returns(
    samples: Sequence[Sample], values: Sequence[Tensor], cfg: PPOConfig
) -> tuple[list[Tensor], list[Tensor]]:
    """GAE over each sample's action tokens (reward on its last action), token-indexed [n] each,
    zero on tokens that are not actions."""
    advantages, returns = [], []
    for sample, value in zip(samples, values):
        actions = _actions(sample)
        rewards = torch.zeros(int(actions.sum()))
        if rewards.numel():
            rewards[-1] = sample.reward
        adv, ret = ppo.gae(rewards, value[actions], cfg.gamma, cfg.lam)
        advantages.append(torch.zeros(len(actions)).masked_scatter(actions, adv))
        returns.append(torch.zeros(len(actions)).masked_scatter(actions, ret))
    return advantages, returns


def ppo_step(
    actor: nn.Module,
    critic: nn.Module,
    actor_opt: torch.optim.Optimizer,
    critic_opt: torch.optim.Optimizer,
    samples: Sequence[Sample],
    cfg: PPOConfig,
    device: torch.device | str,
    *,
    group=None,
    ref_logprobs: Sequence[Tensor] | None = None,
    temperature: float = 1.0,
    demonstrations: Sequence[Sample] = (),
) -> dict[str, float]:
    """One PPO update of actor and critic on this rank's samples; global metrics.

    `ref_logprobs` (token-indexed per sample, like behaviour_logprobs) is needed when kl_coef > 0.
    `temperature`: the one the samples were drawn at; the policy whose ratios, KL and entropy the
    update computes is softmax(logits / temperature), the distribution the engine sampled from.
    `demonstrations` (this rank's share of the batch's `Sample.demonstration`s) add sft_coef times
    their mean NLL (at temperature 1, the distribution rft fitted) to the actor's loss; they take
    no part in advantages or the critic.
    """
    if demonstrations and cfg.sft_coef <= 0:
        raise ValueError(f"{len(demonstrations)} demonstrations in a PPO batch need ppo.sft_coef > 0")
    values = compute_values(critic, samples, cfg, device, group=group)
    advantages, returns = advantages_and_returns(samples, values, cfg)
    by_group = group_rewards(samples, group)
    if cfg.baseline == "group":
        advantages = group_advantages(samples, by_group)
    if cfg.normalize_advantages:
        advantages = _whiten_global(advantages, samples, device, group)
    fields: Fields = {"advantages": advantages, "returns": returns, "old_values": values}
    if cfg.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        fields["ref_logprobs"] = ref_logprobs
    mbs = [mb.to(device) for mb in _aligned(micro_batches(samples, cfg.token_budget, fields), fields, group)]
    if cfg.updates_per_batch > 1:
        mbs = [mb.replace(old_logprobs=_no_grad_logprobs(actor, mb, temperature)) for mb in mbs]
    actions = _global_action_tokens(mbs, device, group)
    norm = max(actions, 1.0)
    # every rank packs its demonstrations (maybe none) when any rank may have some: the collectives line up
    anchor = ([mb.to(device) for mb in _aligned(micro_batches(demonstrations, cfg.token_budget), (), group)]
              if cfg.sft_coef > 0 else [])
    anchor_norm = max(_global_action_tokens(anchor, device, group), 1.0)
    m = _Metrics(device)
    for _ in range(cfg.updates_per_batch):
        for mb in mbs:
            _actor_loss(actor, mb, cfg, norm, m, temperature).backward()
            _critic_loss(critic, mb, cfg.value_clip, norm, m).backward()
        for mb in anchor:
            (cfg.sft_coef * _nll(actor, mb, anchor_norm, m, "sft_loss")).backward()
        m.max("grad_norm_actor", _clip_and_step(actor, actor_opt, cfg.max_grad_norm, m))
        m.max("grad_norm_critic", _clip_and_step(critic, critic_opt, cfg.max_grad_norm, m))
    out = m.result(group, updates=cfg.updates_per_batch, tokens=_global_tokens(mbs, device, group), actions=actions)
    return out | {"reward_reach": reward_reach(samples, cfg, device, group), "mixed_groups": mixed_groups(by_group)}


def group_rewards(samples: Sequence[Sample], group=None) -> dict[str, list[float]]:
    """Every group's rewards, from every rank's samples (one collective)."""
    by_group: dict[str, list[float]] = defaultdict(list)
    for rank_samples in _gathered([(s.group_id, s.reward) for s in samples], group):
        for group_id, reward in rank_samples:
            by_group[group_id].append(reward)
    return by_group


def group_advantages(samples: Sequence[Sample], by_group: dict[str, list[float]]) -> list[Tensor]:
    """Per sample, token-indexed: its reward minus its group's mean reward (`group_rewards`) on
    every action (token 0 never is one), 0 elsewhere."""
    return [_actions(s).float() * (s.reward - sum(by_group[s.group_id]) / len(by_group[s.group_id]))
            for s in samples]


def mixed_groups(by_group: dict[str, list[float]]) -> float:
    """The share of the batch's samples whose group's rewards (`group_rewards`) are not all
    equal: with the group baseline only those samples have a nonzero advantage."""
    total = sum(len(rewards) for rewards in by_group.values())
    mixed = sum(len(rewards) for rewards in by_group.values() if len(set(rewards)) > 1)
    return mixed / total if total else 0.0


def reward_reach(samples: Sequence[Sample], cfg: PPOConfig, device, group=None, *, policy: bool = True) -> float:
    """The reward's weight in the advantage of each sample's first action, (gamma lam)^(n - 1)
    for n action tokens (1 with the group baseline), averaged over the global batch: near 0, the
    reward teaches only a sample's last tokens (e.g. the turns after the one that wrote the code).
    `policy=False`: in the critic's returns, which are GAE's whatever the policy's baseline."""
    decay = 1.0 if policy and cfg.baseline == "group" else cfg.gamma * cfg.lam
    local = [decay ** max(int(_actions(s).sum()) - 1, 0) for s in samples]
    totals = torch.tensor([float(sum(local)), float(len(local))], dtype=torch.float64, device=device)
    total, count = _all_reduce(totals, dist.ReduceOp.SUM, group).tolist()
    return total / count if count else math.nan


def sft_step(
    actor: nn.Module,
    opt: torch.optim.Optimizer,
    samples: Sequence[Sample],
    cfg: PPOConfig,
    device: torch.device | str,
    *,
    group=None,
) -> dict[str, float]:
    """Rejection fine-tuning: one step on the mean NLL of the action tokens (global token mean)."""
    mbs = [mb.to(device) for mb in _aligned(micro_batches(samples, cfg.token_budget), (), group)]
    actions = _global_action_tokens(mbs, device, group)
    norm = max(actions, 1.0)
    m = _Metrics(device)
    for mb in mbs:
        _nll(actor, mb, norm, m, "sft_loss", entropy=True).backward()
    m.max("grad_norm_actor", _clip_and_step(actor, opt, cfg.max_grad_norm, m))
    return m.result(group, updates=1, tokens=_global_tokens(mbs, device, group), actions=actions)


def value_step(
    critic: nn.Module,
    opt: torch.optim.Optimizer,
    samples: Sequence[Sample],
    cfg: PPOConfig,
    device: torch.device | str,
    *,
    actor: nn.Module | None = None,
    group=None,
) -> dict[str, float]:
    """Value pretraining: one step fitting GAE(lambda) returns computed from the critic's own
    values and the rewards (token level, clipped like PPO's value loss). `actor` is not used;
    it is accepted so the loop can call every step alike."""
    del actor
    values = compute_values(critic, samples, cfg, device, group=group)
    _, returns = advantages_and_returns(samples, values, cfg)
    fields: Fields = {"returns": returns, "old_values": values}
    mbs = [mb.to(device) for mb in _aligned(micro_batches(samples, cfg.token_budget, fields), fields, group)]
    actions = _global_action_tokens(mbs, device, group)
    norm = max(actions, 1.0)
    m = _Metrics(device)
    for mb in mbs:
        _critic_loss(critic, mb, cfg.value_clip, norm, m).backward()
    m.max("grad_norm_critic", _clip_and_step(critic, opt, cfg.max_grad_norm, m))
    out = m.result(group, updates=1, tokens=_global_tokens(mbs, device, group), actions=actions)
    return out | {"reward_reach": reward_reach(samples, cfg, device, group, policy=False)}


# ---------------------------------------------------------------------------------------------
# Per micro-batch losses (they also record their metrics as token sums / normaliser).


def _actor_loss(
    actor: nn.Module, mb: MicroBatch, cfg: PPOConfig, norm: float, m: _Metrics, temperature: float = 1.0
) -> Tensor:
    # mask: the actor may run its LM head only where the loss reads (ModelConfig.head_on_actions_only).
    logprobs, entropy = actor(mb.input_ids, mb.position_ids, mb.targets, mask=mb.mask,
                              temperature=temperature)  # [1, T] fp32
    # At updates_per_batch 1 the policy that is updated is the one these log-probs come from.
    old = mb.old_logprobs if mb.old_logprobs is not None else logprobs.detach()
    weights = ppo.tis_weights(old, mb.behaviour_logprobs, cfg.tis_cap or 2.0)
    loss, stats = ppo.policy_loss(
        logprobs, old, mb.advantages, mb.mask,
        clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip,
        tis_weights=weights if cfg.tis_cap is not None else None, normalizer=norm,
    )  # fmt: skip
    m.add("policy_loss", loss.detach())
    total = cfg.policy_coef * loss
    if cfg.kl_coef > 0:
        kl = ppo.masked_sum(ppo.kl(logprobs, mb.ref_logprobs, cfg.kl_estimator), mb.mask) / norm
        m.add("kl", kl.detach())
        total = total + cfg.kl_coef * kl
    ent = ppo.masked_sum(entropy, mb.mask) / norm
    if cfg.entropy_coef > 0:
        total = total - cfg.entropy_coef * ent
    m.add("entropy", ent.detach())
    m.add("tis_mean", ppo.masked_sum(weights, mb.mask) / norm)
    m.add("logprob_gap", ppo.masked_sum((old - mb.behaviour_logprobs).abs(), mb.mask) / norm)
    for name in ("clipfrac", "dual_clipfrac", "ratio_mean"):
        m.add(name, stats[name])
    m.max("ratio_max", stats["ratio_max"])
    return total


def _nll(actor: nn.Module, mb: MicroBatch, norm: float, m: _Metrics, name: str, *, entropy: bool = False) -> Tensor:
    """The micro-batch's share of the mean NLL of its action tokens (recorded as `name`)."""
    logprobs, ent = actor(mb.input_ids, mb.position_ids, mb.targets, mask=mb.mask)  # [1, T]
    loss = -ppo.masked_sum(logprobs, mb.mask) / norm
    m.add(name, loss.detach())
    if entropy:
        m.add("entropy", ppo.masked_sum(ent.detach(), mb.mask) / norm)
    return loss


def _critic_loss(critic: nn.Module, mb: MicroBatch, clip: float | None, norm: float, m: _Metrics) -> Tensor:
    values = critic(mb.input_ids, mb.position_ids)  # [1, T]; values[t] is used for token t+1
    loss, stats = ppo.value_loss(values, mb.old_values, mb.returns, mb.mask, clip=clip, normalizer=norm)
    m.add("value_loss", loss.detach())
    m.add("value_clipfrac", stats["value_clipfrac"])
    m.add("value_mean", ppo.masked_sum(mb.old_values, mb.mask) / norm)
    m.add("return_mean", ppo.masked_sum(mb.returns, mb.mask) / norm)
    if mb.advantages is not None:
        m.add("advantage_mean", ppo.masked_sum(mb.advantages, mb.mask) / norm)
    # Moments for the global explained variance of the values the advantages used.
    diff = mb.returns - mb.old_values
    for name, x in (("ret", mb.returns), ("ret2", mb.returns**2), ("diff", diff), ("diff2", diff**2)):
        m.add(f"_ev_{name}", ppo.masked_sum(x, mb.mask) / norm)
    return loss


def _no_grad_logprobs(actor: nn.Module, mb: MicroBatch, temperature: float = 1.0) -> Tensor:
    with torch.no_grad():
        return actor(mb.input_ids, mb.position_ids, mb.targets, mask=mb.mask, temperature=temperature)[0]


def _clip_and_step(model: nn.Module, opt: torch.optim.Optimizer, max_norm: float, m: _Metrics) -> Tensor:
    """Clip the global gradient norm, step, free the gradients; a non-finite norm skips the step."""
    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], max_norm)
    if hasattr(norm, "full_tensor"):  # FSDP2: the norm is a DTensor over the shards
        norm = norm.full_tensor()
    finite = bool(torch.isfinite(norm))
    if finite:
        opt.step()
    m.max("skipped_steps", torch.tensor(0.0 if finite else 1.0))
    opt.zero_grad(set_to_none=True)
    return norm.detach().float()


# ---------------------------------------------------------------------------------------------
# Collectives.


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized()


def _all_reduce(t: Tensor, op, group) -> Tensor:
    if _dist_on():
        dist.all_reduce(t, op=op, group=group)
    return t


def _gathered(local: list, group) -> list[list]:
    """Every rank's `local` (picklable), in rank order; [local] without distributed training."""
    if not _dist_on():
        return [local]
    out: list[list] = [[] for _ in range(dist.get_world_size(group))]
    dist.all_gather_object(out, local, group=group)
    return out


def _aligned(mbs: list[MicroBatch], fields: Sequence[str], group) -> list[MicroBatch]:
    """`mbs` padded with dummy micro-batches to the largest count over the ranks."""
    if not _dist_on():
        return mbs
    count = torch.tensor([len(mbs)], device=_collective_device())
    most = int(_all_reduce(count, dist.ReduceOp.MAX, group).item())
    return mbs + [dummy_micro_batch(list(fields)) for _ in range(most - len(mbs))]


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _global_action_tokens(mbs: Sequence[MicroBatch], device, group) -> float:
    local = sum((mb.mask.sum() for mb in mbs), torch.zeros((), device=device))
    return float(_all_reduce(local.double(), dist.ReduceOp.SUM, group).item())


def _global_tokens(mbs: Sequence[MicroBatch], device, group) -> float:
    local = torch.tensor(float(sum(sum(mb.doc_lengths) for mb in mbs if mb.sample_index)), device=device)
    return float(_all_reduce(local, dist.ReduceOp.SUM, group).item())


def _whiten_global(advantages: list[Tensor], samples: Sequence[Sample], device, group) -> list[Tensor]:
    """Advantages whitened with the mean and std of all action tokens of the global batch."""
    masks = [torch.tensor(s.action_mask, dtype=torch.float64) for s in samples]
    moments = torch.zeros(3, dtype=torch.float64)
    for a, mask in zip(advantages, masks):
        moments += torch.stack([mask.sum(), (a * mask).sum(), (a.double() ** 2 * mask).sum()])
    n, s, s2 = _all_reduce(moments.to(device), dist.ReduceOp.SUM, group).tolist()
    mean = s / max(n, 1.0)
    std = math.sqrt(max(s2 / max(n, 1.0) - mean**2, 0.0) + 1e-8)
    return [((a - mean) / std) * mask.float() for a, mask in zip(advantages, masks)]


class _Metrics:
    """Token sums (already divided by the global normaliser; averaged over the updates) and maxima
    (over micro-batches, updates and ranks; grad norms are global already), reduced once at the end."""

    def __init__(self, device) -> None:
        self.device = device
        self.sums: dict[str, Tensor] = {}
        self.maxes: dict[str, Tensor] = {}

    def add(self, name: str, value: Tensor) -> None:
        value = value.detach().to(self.device, torch.float64)
        self.sums[name] = self.sums.get(name, 0.0) + value

    def max(self, name: str, value: Tensor) -> None:
        value = value.detach().to(self.device, torch.float64)
        self.maxes[name] = torch.maximum(self.maxes[name], value) if name in self.maxes else value

    def result(self, group, *, updates: int, tokens: float, actions: float) -> dict[str, float]:
        out = _reduced(self.sums, dist.ReduceOp.SUM, group, lambda x: x / updates)
        out |= _reduced(self.maxes, dist.ReduceOp.MAX, group, lambda x: x)
        if "_ev_ret" in out:
            var_ret = out.pop("_ev_ret2") - out["_ev_ret"] ** 2
            var_diff = out.pop("_ev_diff2") - out.pop("_ev_diff") ** 2
            out.pop("_ev_ret")
            out["explained_variance"] = 1.0 - var_diff / var_ret if var_ret > 1e-12 else math.nan
        return out | {"tokens": tokens, "action_tokens": actions}


def _reduced(values: dict[str, Tensor], op, group, finish: Callable[[float], float]) -> dict[str, float]:
    if not values:
        return {}
    names = sorted(values)
    stacked = _all_reduce(torch.stack([values[n] for n in names]), op, group)
    return {n: finish(v) for n, v in zip(names, stacked.tolist())}
