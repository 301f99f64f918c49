"""rl.learner.update: ppo_step, sft_step and value_step on a tiny Qwen2 actor and critic (CPU).

Gradients are read through `Recorder`, an optimizer whose step copies the gradients and leaves
the weights alone, so several steps can be compared on one pair of models.
"""

from __future__ import annotations

import math
import random

import msgspec
import pytest
import torch

from rl.learner.models import ModelConfig, build_actor, build_critic, tiny_qwen2_config
from rl.learner.packing import micro_batches
from rl.learner.update import (
    PPOConfig,
    advantages_and_returns,
    compute_values,
    group_advantages,
    group_rewards,
    mixed_groups,
    ppo_step,
    reward_reach,
    sft_step,
    value_step,
)
from rl.samples import Sample

VOCAB = 40
EXACT = PPOConfig(max_grad_norm=1e9)  # no clipping: gradients compare exactly


class Recorder(torch.optim.Optimizer):
    """Keeps a copy of each step's gradients; never changes the parameters."""

    def __init__(self, params) -> None:
        super().__init__(list(params), {})
        self.grads: list[torch.Tensor | None] = []

    def step(self, closure=None) -> None:
        self.grads = [None if p.grad is None else p.grad.clone() for g in self.param_groups for p in g["params"]]


def sample(i: int, rng: random.Random) -> Sample:
    """prompt (0), turn (1), tool output (0), turn (1)."""
    parts = [(rng.randint(2, 4), 0), (rng.randint(2, 6), 1), (rng.randint(1, 3), 0), (rng.randint(2, 5), 1)]
    mask = [m for n, m in parts for _ in range(n)]
    ids = [rng.randrange(VOCAB) for _ in mask]
    return Sample(
        sample_id=f"s{i}",
        group_id="g",
        token_ids=ids,
        action_mask=mask,
        behaviour_logprobs=[-rng.uniform(2.0, 5.0) * m for m in mask],
        reward=float(i % 3) / 2,
        weight_version=0,
    )


def batch(n: int = 6, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    return [sample(i, rng) for i in range(n)]


@pytest.fixture
def models():
    torch.manual_seed(0)  # the same weights in every run: a test on them passes or fails every time
    cfg = ModelConfig(hf_config=tiny_qwen2_config(vocab_size=VOCAB, hidden=32, intermediate=64), logprob_chunk_tokens=16)
    actor, critic = build_actor(cfg, "cpu"), build_critic(cfg, "cpu")
    torch.nn.init.normal_(critic.value_head.weight, std=0.5)  # non-zero values, so GAE uses them
    return actor, critic


def grads(models, samples, cfg=EXACT, **kw) -> tuple[list, list, dict]:
    actor, critic = models
    a, c = Recorder(actor.parameters()), Recorder(critic.parameters())
    metrics = ppo_step(actor, critic, a, c, samples, cfg, "cpu", **kw)
    return a.grads, c.grads, metrics


def assert_same(xs, ys, atol=1e-6):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        torch.testing.assert_close(x, y, atol=atol, rtol=1e-5)


def test_first_update_ratio_is_one_and_clipfrac_zero(models):
    # The behaviour log-probs in `batch` are far from the model's: only the same-pass detached
    # log-probs give a ratio of exactly 1.
    *_, m = grads(models, batch())
    assert m["ratio_max"] == 1.0
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert m["clipfrac"] == 0.0
    assert m["logprob_gap"] > 0.5


def test_metrics_keys_present(models):
    *_, m = grads(models, batch())
    keys = {"policy_loss", "value_loss", "entropy", "clipfrac", "ratio_mean", "ratio_max", "tis_mean",
            "logprob_gap", "explained_variance", "grad_norm_actor", "grad_norm_critic", "tokens", "action_tokens"}  # fmt: skip
    assert keys <= m.keys()
    samples = batch()
    assert m["tokens"] == sum(len(s.token_ids) for s in samples)
    assert m["action_tokens"] == sum(s.num_actions for s in samples)


def test_all_parameters_receive_finite_gradients(models):
    ga, gc, _ = grads(models, batch())
    for g in ga + gc:
        assert g is not None and bool(torch.isfinite(g).all())
    assert sum(float(g.abs().sum()) for g in ga) > 0 and sum(float(g.abs().sum()) for g in gc) > 0


def test_behaviour_logprobs_on_masked_tokens_do_not_change_gradients(models):
    cfg = msgspec.structs.replace(EXACT, tis_cap=2.0)
    samples = batch()
    noisy = [
        msgspec.structs.replace(s, behaviour_logprobs=[lp if m else -50.0 for lp, m in zip(s.behaviour_logprobs, s.action_mask)])
        for s in samples
    ]
    ga, gc, m = grads(models, samples, cfg)
    ga2, gc2, m2 = grads(models, noisy, cfg)
    assert_same(ga, ga2, atol=0)
    assert_same(gc, gc2, atol=0)
    assert m["logprob_gap"] == m2["logprob_gap"] and m["tis_mean"] == m2["tis_mean"]


def test_trailing_tool_output_does_not_change_gradients(models):
    plain = batch(5)
    longer = [  # the same samples followed by 4 tool-output tokens
        msgspec.structs.replace(
            s, token_ids=s.token_ids + [7, 8, 9, 10], action_mask=s.action_mask + [0] * 4,
            behaviour_logprobs=s.behaviour_logprobs + [0.0] * 4,
        )
        for s in plain
    ]
    ga, gc, _ = grads(models, plain)
    ga2, gc2, _ = grads(models, longer)
    assert_same(ga, ga2)
    assert_same(gc, gc2)


def test_small_token_budget_gives_the_gradients_of_one_micro_batch(models):
    samples = batch(8)
    assert len(micro_batches(samples, 24)) >= 4
    ga, gc, m = grads(models, samples, msgspec.structs.replace(EXACT, token_budget=24))
    ga2, gc2, m2 = grads(models, samples, msgspec.structs.replace(EXACT, token_budget=4096))
    assert_same(ga, ga2)
    assert_same(gc, gc2)
    assert m["policy_loss"] == pytest.approx(m2["policy_loss"], abs=1e-6)


def test_samples_longer_than_the_budget_train_alone_with_the_same_gradients(models):
    samples = batch(8)
    budget = max(len(s.token_ids) for s in samples) - 1  # the longest sample does not fit
    ga, gc, m = grads(models, samples, msgspec.structs.replace(EXACT, token_budget=budget))
    ga2, gc2, m2 = grads(models, samples, msgspec.structs.replace(EXACT, token_budget=4096))
    assert_same(ga, ga2)
    assert_same(gc, gc2)
    assert m["policy_loss"] == pytest.approx(m2["policy_loss"], abs=1e-6)


def test_reward_goes_to_the_last_action_token_and_gae_skips_tool_tokens():
    s = Sample(sample_id="a", group_id="g", token_ids=[1, 2, 3, 4, 5, 6], action_mask=[0, 1, 1, 0, 1, 0],
               behaviour_logprobs=[0.0] * 6, reward=1.0, weight_version=0)  # fmt: skip
    values = torch.tensor([0.0, 0.1, 0.2, 9.0, 0.3, 9.0])  # 9.0 on non-action tokens: never read
    # Actions 1, 2, 4 with V [0.1, 0.2, 0.3], rewards [0, 0, 1], gamma 1, lambda 0.95:
    # A(4) = 1 - 0.3 = 0.7; A(2) = 0.3 - 0.2 + 0.95 * 0.7 = 0.765; A(1) = 0.2 - 0.1 + 0.95 * 0.765 = 0.82675
    (adv,), (ret,) = advantages_and_returns([s], [values], PPOConfig())
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.82675, 0.765, 0.0, 0.7, 0.0]))
    torch.testing.assert_close(ret, torch.tensor([0.0, 0.92675, 0.965, 0.0, 1.0, 0.0]))


def test_at_lambda_one_every_action_gets_the_reward_minus_its_value():
    s = Sample(sample_id="a", group_id="g", token_ids=[1, 2, 3, 4, 5, 6], action_mask=[0, 1, 1, 0, 1, 0],
               behaviour_logprobs=[0.0] * 6, reward=2.0, weight_version=0)  # fmt: skip
    values = torch.tensor([0.0, 0.1, 0.2, 9.0, 0.3, 9.0])
    (adv,), (ret,) = advantages_and_returns([s], [values], PPOConfig(lam=1.0))
    torch.testing.assert_close(adv, torch.tensor([0.0, 1.9, 1.8, 0.0, 1.7, 0.0]))
    torch.testing.assert_close(ret, torch.tensor([0.0, 2.0, 2.0, 0.0, 2.0, 0.0]))


def test_the_group_baseline_gives_every_action_its_reward_minus_its_groups_mean():
    def of(sample_id: str, group_id: str, reward: float) -> Sample:
        return Sample(sample_id=sample_id, group_id=group_id, token_ids=[1, 2, 3, 4, 5],
                      action_mask=[1, 1, 0, 1, 0], behaviour_logprobs=[0.0] * 5, reward=reward,
                      weight_version=0)  # fmt: skip

    samples = [of("a", "x", 1.0), of("b", "x", -1.0), of("c", "x", 3.0), of("d", "y", 2.0), of("e", "z", -1.0)]
    got = group_advantages(samples, group_rewards(samples))  # x's mean 1; y and z alone: 0
    want = [[0, 0, 0, 0, 0], [0, -2, 0, -2, 0], [0, 2, 0, 2, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, torch.tensor(w, dtype=torch.float32))
    assert mixed_groups(group_rewards(samples)) == 3 / 5  # x's three samples teach; y and z alone do not
    assert mixed_groups(group_rewards([of("a", "x", 1.0), of("b", "x", 1.0)])) == 0.0 and mixed_groups({}) == 0.0


def test_a_ppo_step_with_the_group_baseline_ignores_the_critic_for_the_policy(models):
    samples = [msgspec.structs.replace(s, group_id=f"g{i % 2}") for i, s in enumerate(batch())]
    group = msgspec.structs.replace(EXACT, baseline="group")
    ga, gc, m = grads(models, samples, group)
    assert m["reward_reach"] == 1.0
    actor, critic = models
    torch.nn.init.normal_(critic.value_head.weight, std=2.0)  # other values: the same actor gradient
    ga2, gc2, _ = grads(models, samples, group)
    assert_same(ga, ga2)
    assert not all(torch.allclose(x, y) for x, y in zip(gc, gc2))  # the critic still fits its GAE returns
    ga3, _, _ = grads(models, samples)
    assert not all(torch.allclose(x, y) for x, y in zip(ga, ga3))


def test_an_unknown_baseline_is_refused_when_the_config_is_read():
    from rl.config import apply_overrides
    from rl.recipes import smoke

    assert apply_overrides(smoke(), ["ppo.baseline=group"]).ppo.baseline == "group"
    with pytest.raises(Exception, match="baseline"):
        apply_overrides(smoke(), ["ppo.baseline=grpo"])


def test_reward_reach_is_the_rewards_weight_on_each_samples_first_action():
    def of(actions: int) -> Sample:  # a prompt token, then `actions` action tokens
        return Sample(sample_id=f"s{actions}", group_id="g", token_ids=[1] * (actions + 1),
                      action_mask=[0] + [1] * actions, behaviour_logprobs=[0.0] * (actions + 1),
                      reward=1.0, weight_version=0)  # fmt: skip

    samples = [of(1), of(3), of(1201)]  # the last: a write turn and the turns after it
    assert reward_reach(samples, PPOConfig(lam=0.95), "cpu") == pytest.approx((1 + 0.95**2 + 0.95**1200) / 3)
    assert reward_reach(samples, PPOConfig(lam=0.95), "cpu") < 0.7  # the long sample's code learns ~nothing
    assert reward_reach(samples, PPOConfig(lam=1.0), "cpu") == 1.0
    assert reward_reach([of(11)], PPOConfig(gamma=0.5, lam=1.0), "cpu") == pytest.approx(0.5**10)


def test_ppo_and_value_steps_report_the_reward_reach(models):
    samples = batch()
    _, _, m = grads(models, samples, msgspec.structs.replace(EXACT, lam=1.0))
    assert m["reward_reach"] == 1.0
    _, _, m = grads(models, samples)
    assert 0.0 < m["reward_reach"] < 1.0
    actor, critic = models
    out = value_step(critic, Recorder(critic.parameters()), samples, PPOConfig(), "cpu")
    assert out["reward_reach"] == pytest.approx(m["reward_reach"])


def test_compute_values_are_the_critic_output_before_each_token(models):
    _, critic = models
    samples = batch(4)
    values = compute_values(critic, samples, PPOConfig(token_budget=64), "cpu")
    for s, v in zip(samples, values):
        with torch.no_grad():
            direct = critic(torch.tensor([s.token_ids]), torch.arange(len(s.token_ids))[None])[0]
        assert v[0] == 0.0
        torch.testing.assert_close(v[1:], direct[:-1], atol=1e-5, rtol=0)


def test_tis_with_behaviour_equal_to_training_logprobs_changes_nothing(models):
    actor, _ = models
    samples = batch()
    with torch.no_grad():
        matched = []
        for s in samples:
            (mb,) = micro_batches([s], 4096)
            lp = actor(mb.input_ids, mb.position_ids, mb.targets)[0][0]  # position t -> token t+1
            own = [0.0] + [float(x) * m for x, m in zip(lp[:-1], s.action_mask[1:])]
            matched.append(msgspec.structs.replace(s, behaviour_logprobs=own))
    ga, _, m = grads(models, matched, msgspec.structs.replace(EXACT, tis_cap=2.0))
    ga_off, _, _ = grads(models, matched)
    assert m["tis_mean"] == pytest.approx(1.0, abs=1e-5)
    assert_same(ga, ga_off, atol=1e-6)
    ga_far, _, _ = grads(models, samples, msgspec.structs.replace(EXACT, tis_cap=2.0))  # control
    assert not all(torch.allclose(x, y) for x, y in zip(ga_far, ga_off))


def test_kl_to_a_reference_equal_to_the_policy_adds_nothing(models):
    actor, _ = models
    samples = batch()
    with torch.no_grad():
        ref = []
        for s in samples:
            (mb,) = micro_batches([s], 4096)
            lp = actor(mb.input_ids, mb.position_ids, mb.targets)[0][0]
            ref.append(torch.cat([torch.zeros(1), lp[:-1]]))  # token-indexed
    cfg = msgspec.structs.replace(EXACT, kl_coef=0.5, kl_estimator="k3")
    ga, _, m = grads(models, samples, cfg, ref_logprobs=ref)
    ga_off, _, _ = grads(models, samples)
    assert m["kl"] == pytest.approx(0.0, abs=1e-6)
    assert_same(ga, ga_off, atol=1e-6)


def test_kl_without_reference_logprobs_raises(models):
    with pytest.raises(ValueError, match="ref_logprobs"):
        grads(models, batch(), msgspec.structs.replace(EXACT, kl_coef=0.1))


def test_entropy_bonus_changes_the_actor_gradient(models):
    ga, gc, _ = grads(models, batch(), msgspec.structs.replace(EXACT, entropy_coef=0.1))
    ga_off, gc_off, _ = grads(models, batch())
    assert not all(torch.allclose(x, y) for x, y in zip(ga, ga_off))
    assert_same(gc, gc_off, atol=0)


def test_normalized_advantages_have_zero_mean(models):
    *_, m = grads(models, batch(), msgspec.structs.replace(EXACT, normalize_advantages=True))
    assert m["advantage_mean"] == pytest.approx(0.0, abs=1e-6)
    *_, raw = grads(models, batch())
    assert abs(raw["advantage_mean"]) > 1e-3


def test_second_update_ratios_move_away_from_one(models):
    actor, critic = models
    a, c = torch.optim.Adam(actor.parameters(), lr=1e-2), torch.optim.Adam(critic.parameters(), lr=1e-2)
    m = ppo_step(actor, critic, a, c, batch(), PPOConfig(updates_per_batch=2), "cpu")
    # Old log-probs are frozen before the first update, so the second update sees ratios != 1.
    assert m["ratio_max"] > 1.001


def test_batch_without_action_tokens_is_a_zero_update(models):
    samples = [msgspec.structs.replace(s, action_mask=[0] * len(s.token_ids)) for s in batch(3)]
    ga, gc, m = grads(models, samples)
    assert all(float(g.abs().max()) == 0.0 for g in ga + gc)
    assert m["action_tokens"] == 0 and m["policy_loss"] == 0.0


def test_sft_loss_is_the_mean_nll_of_action_tokens(models):
    actor, _ = models
    samples = batch()
    nll, count = 0.0, 0
    with torch.no_grad():
        for s in samples:
            (mb,) = micro_batches([s], 4096)
            lp = actor(mb.input_ids, mb.position_ids, mb.targets)[0]
            nll -= float((lp * mb.mask).sum())
            count += s.num_actions
    m = sft_step(actor, Recorder(actor.parameters()), samples, EXACT, "cpu")
    assert m["sft_loss"] == pytest.approx(nll / count, rel=1e-5)


def test_sft_steps_lower_the_nll(models):
    actor, _ = models
    opt = torch.optim.Adam(actor.parameters(), lr=1e-2)
    losses = [sft_step(actor, opt, batch(), PPOConfig(), "cpu")["sft_loss"] for _ in range(5)]
    assert losses[-1] < losses[0] - 0.1


def _demos(n: int = 3, seed: int = 9) -> list[Sample]:
    return [msgspec.structs.replace(s, sample_id=f"d{i}", demonstration=True) for i, s in enumerate(batch(n, seed))]


def test_demonstrations_add_sft_coef_times_their_nll_gradient_to_the_actors(models):
    """ppo.sft_coef: the actor's gradient is PPO's on the rollouts plus sft_coef times the NLL's on
    the demonstrations (a token mean of their own); the critic's is PPO's alone."""
    actor, _ = models
    ppo_actor, ppo_critic, plain = grads(models, batch())
    nll = Recorder(actor.parameters())
    sft_step(actor, nll, _demos(), EXACT, "cpu")
    coef = 0.5
    got_actor, got_critic, m = grads(models, batch(), msgspec.structs.replace(EXACT, sft_coef=coef),
                                     demonstrations=_demos())
    assert_same(got_actor, [p + coef * d for p, d in zip(ppo_actor, nll.grads)], atol=1e-5)
    assert_same(got_critic, ppo_critic)
    assert m["sft_loss"] > 0
    for key in ("policy_loss", "value_loss", "advantage_mean", "tokens", "action_tokens"):
        assert m[key] == pytest.approx(plain[key], rel=1e-6), key


def test_policy_coef_0_leaves_the_actor_the_demonstrations_alone(models):
    """ppo.policy_coef=0 (the anchor's ablation): the actor's gradient is sft_coef times the NLL's,
    the rewards take no part in it; the critic's is PPO's as before."""
    actor, _ = models
    _, ppo_critic, _ = grads(models, batch())
    nll = Recorder(actor.parameters())
    sft_step(actor, nll, _demos(), EXACT, "cpu")
    cfg = msgspec.structs.replace(EXACT, sft_coef=2.0, policy_coef=0.0)
    got_actor, got_critic, m = grads(models, batch(), cfg, demonstrations=_demos())
    assert_same(got_actor, [2.0 * d for d in nll.grads], atol=1e-5)
    assert_same(got_critic, ppo_critic)
    flipped = [msgspec.structs.replace(s, reward=-s.reward) for s in batch()]
    assert_same(grads(models, flipped, cfg, demonstrations=_demos())[0], got_actor, atol=1e-5)
    assert m["policy_loss"] != 0.0  # still computed and logged


def test_demonstrations_without_sft_coef_are_refused(models):
    with pytest.raises(ValueError, match="sft_coef"):
        grads(models, batch(), demonstrations=_demos())


def test_value_steps_lower_the_value_loss(models):
    _, critic = models
    opt = torch.optim.Adam(critic.parameters(), lr=1e-2)
    losses = [value_step(critic, opt, batch(), PPOConfig(value_clip=None), "cpu")["value_loss"] for _ in range(8)]
    assert losses[-1] < 0.5 * losses[0]
    assert all(math.isfinite(x) for x in losses)


# --- two ranks -------------------------------------------------------------------------------
# `python -m torch.distributed.run --nproc-per-node 2 tests/test_update.py OUT` runs `_worker`:
# ppo_step on each rank's balanced share with FSDP2 (gloo, CPU). The tests compare it with one
# unsharded process on the whole batch.

DIST_CFG = PPOConfig(max_grad_norm=1e9, token_budget=24, tis_cap=2.0, normalize_advantages=True)
GROUP_CFG = msgspec.structs.replace(DIST_CFG, baseline="group", normalize_advantages=False)
ANCHOR_CFG = msgspec.structs.replace(GROUP_CFG, sft_coef=0.5)


def _grouped(samples: list[Sample]) -> list[Sample]:
    """Two groups by sample id, so that each spans both ranks' shares."""
    return [msgspec.structs.replace(s, group_id=f"g{int(s.sample_id[1:]) % 2}") for s in samples]


def _dist_models():
    cfg = ModelConfig(hf_config=tiny_qwen2_config(vocab_size=VOCAB, hidden=32, intermediate=64), logprob_chunk_tokens=16)
    actor, critic = build_actor(cfg, "cpu"), build_critic(cfg, "cpu")
    with torch.no_grad():
        critic.value_head.weight.copy_(torch.randn(critic.value_head.weight.shape, generator=torch.Generator().manual_seed(5)))
    return actor, critic


def _sgd(module):
    return torch.optim.SGD(module.parameters(), lr=1.0)


def _worker(out) -> None:
    import torch.distributed as dist

    from rl.learner.fsdp import close_distributed, full_state_items, init_distributed, shard
    from rl.learner.models import layers
    from rl.learner.packing import balance

    d = init_distributed()
    share = balance(batch(7, seed=4), d.world_size, d.rank)
    counts = [None] * d.world_size
    dist.all_gather_object(counts, len(micro_batches(share, DIST_CFG.token_budget)))
    actor, critic = _dist_models()
    for m in (actor, critic):
        shard(m, layers=layers(m))
    metrics = ppo_step(actor, critic, _sgd(actor), _sgd(critic), share, DIST_CFG, "cpu")
    after = [{k: v.clone() for b in full_state_items(m, 1 << 20) for k, v in b} for m in (actor, critic)]
    grouped = ppo_step(actor, critic, _sgd(actor), _sgd(critic), _grouped(share), GROUP_CFG, "cpu")
    after_grouped = [{k: v.clone() for b in full_state_items(m, 1 << 20) for k, v in b} for m in (actor, critic)]
    demos = _demos()[d.rank::2]  # two on rank 0, one on rank 1: their micro-batches are padded to line up
    anchored = ppo_step(actor, critic, _sgd(actor), _sgd(critic), share, ANCHOR_CFG, "cpu", demonstrations=demos)
    after_anchored = {k: v.clone() for b in full_state_items(actor, 1 << 20) for k, v in b}
    if d.is_main:
        torch.save({"metrics": metrics, "after": after, "micro_batches": counts, "grouped": grouped,
                    "after_grouped": after_grouped, "anchored": anchored, "after_anchored": after_anchored},
                   out / "result.pt")
    close_distributed(sync=True)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path_factory.mktemp("ppo2")
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__, str(out)]
    proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = torch.load(out / "result.pt", weights_only=False)
    actor, critic = _dist_models()
    ref = ppo_step(actor, critic, _sgd(actor), _sgd(critic), batch(7, seed=4), DIST_CFG, "cpu")
    from rl.learner.fsdp import hf_name, hf_submodule

    def state() -> list[dict]:
        out = []
        for m in (actor, critic):
            prefix, _ = hf_submodule(m)
            out.append({hf_name(k, prefix): v.clone() for k, v in m.state_dict().items()})
        return out

    ref_after = state()
    ref["grouped"] = ppo_step(actor, critic, _sgd(actor), _sgd(critic), _grouped(batch(7, seed=4)), GROUP_CFG, "cpu")
    result["ref_after_grouped"] = state()
    ref["anchored"] = ppo_step(actor, critic, _sgd(actor), _sgd(critic), batch(7, seed=4), ANCHOR_CFG, "cpu",
                               demonstrations=_demos())
    result["ref_after_anchored"] = state()[0]
    return result, ref, ref_after


def test_two_ranks_run_different_micro_batch_counts(two_ranks):
    result, *_ = two_ranks
    counts = result["micro_batches"]
    assert len(counts) == 2 and counts[0] != counts[1]  # so the dummy padding is exercised


def test_two_ranks_update_equals_one_process_on_the_whole_batch(two_ranks):
    result, _, ref_after = two_ranks
    for got, want in zip(result["after"], ref_after):
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], atol=2e-5, rtol=1e-4, msg=k)


def test_two_ranks_group_baseline_equals_one_process(two_ranks):
    """The groups' means come from both ranks' samples: the actor's update and the metrics are one
    process's. (The critic, at SGD lr 1 for a second step, has values in the hundreds: its float
    noise is compared through the value loss.)"""
    result, ref, _ = two_ranks
    got, want = result["after_grouped"][0], result["ref_after_grouped"][0]
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=2e-5, rtol=1e-4, msg=k)
    for key in ("policy_loss", "value_loss", "advantage_mean", "reward_reach", "mixed_groups"):
        assert result["grouped"][key] == pytest.approx(ref["grouped"][key], rel=1e-4, abs=1e-6), key


def test_two_ranks_with_demonstrations_equal_one_process(two_ranks):
    """ppo.sft_coef over two ranks holding different numbers of demonstrations: the NLL is the
    global token mean, as in one process."""
    result, ref, _ = two_ranks
    got, want = result["after_anchored"], result["ref_after_anchored"]
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=2e-5, rtol=1e-4, msg=k)
    assert result["anchored"]["sft_loss"] == pytest.approx(ref["anchored"]["sft_loss"], rel=1e-4)


def test_two_ranks_metrics_equal_one_process(two_ranks):
    result, ref, _ = two_ranks
    for key in ("policy_loss", "value_loss", "entropy", "tis_mean", "logprob_gap", "explained_variance",
                "grad_norm_actor", "grad_norm_critic", "tokens", "action_tokens", "advantage_mean",
                "reward_reach"):  # fmt: skip
        assert result["metrics"][key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key


if __name__ == "__main__":
    import sys
    from pathlib import Path

    from rl.learner.fsdp import end_rank_process

    _worker(Path(sys.argv[1]))
    end_rank_process(0)


@pytest.mark.gpu
def test_ppo_step_on_cuda_under_fsdp_bf16_mixed_precision():
    from rl.learner.fsdp import close_distributed, init_distributed, shard
    from rl.learner.models import layers

    init_distributed()  # one rank
    try:
        cfg = ModelConfig(hf_config=tiny_qwen2_config(vocab_size=VOCAB, hidden=64), logprob_chunk_tokens=16)
        actor, critic = build_actor(cfg, "cuda"), build_critic(cfg, "cuda")
        for m in (actor, critic):
            shard(m, layers=layers(m), mixed_precision=True)
        a, c = Recorder(actor.parameters()), Recorder(critic.parameters())
        m = ppo_step(actor, critic, a, c, batch(8), PPOConfig(token_budget=48, tis_cap=2.0, sft_coef=0.5), "cuda",
                     demonstrations=_demos())
    finally:
        close_distributed(sync=True)
    assert m["ratio_max"] == 1.0 and m["clipfrac"] == 0.0 and m["sft_loss"] > 0
    assert all(math.isfinite(v) for k, v in m.items() if k != "explained_variance")
    for g in a.grads + c.grads:
        local = g.to_local() if hasattr(g, "to_local") else g
        assert local.dtype == torch.float32 and bool(torch.isfinite(local).all())


def _choice_then_filler(i: int, choice: int, filler: int) -> Sample:
    """A prompt token, one choice (3 is rewarded, 4 is not), then `filler` more action tokens: a
    write turn's decision followed by the turns after it."""
    ids = [1, choice] + [5 + k % 7 for k in range(filler)]
    return Sample(sample_id=f"c{i}", group_id="g", token_ids=ids, action_mask=[0] + [1] * (len(ids) - 1),
                  behaviour_logprobs=[0.0] * len(ids), reward=1.0 if choice == 3 else -1.0, weight_version=0)


def _choice_margin(actor) -> float:
    """log p(3 | prompt) - log p(4 | prompt)."""
    out = []
    with torch.no_grad():
        for s in (_choice_then_filler(0, 3, 0), _choice_then_filler(1, 4, 0)):
            (mb,) = micro_batches([s], 4096)
            out.append(float(actor(mb.input_ids, mb.position_ids, mb.targets)[0][0][0]))
    return out[0] - out[1]


def test_a_choice_100_actions_before_the_reward_is_learned_at_lambda_one_and_not_at_095():
    """PPO on samples whose reward depends only on their first action: at lambda 1 every seed's
    policy moves toward the rewarded choice; at 0.95 the reward reaches it with weight 0.006 and
    the move is the critic's noise. The group baseline ignores lambda: at 0.95 it moves every seed
    toward the rewarded choice too."""
    rises = {}
    for lam, baseline in ((0.95, "critic"), (1.0, "critic"), (0.95, "group")):
        for seed in range(3):
            torch.manual_seed(seed)
            cfg = ModelConfig(hf_config=tiny_qwen2_config(vocab_size=VOCAB, hidden=32, intermediate=64),
                              logprob_chunk_tokens=16)
            actor, critic = build_actor(cfg, "cpu"), build_critic(cfg, "cpu")
            torch.nn.init.normal_(critic.value_head.weight, std=0.5)
            before = _choice_margin(actor)
            opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in (actor, critic)]
            samples = [_choice_then_filler(i, 3 if i % 2 else 4, 100) for i in range(8)]
            for _ in range(6):
                ppo_step(actor, critic, *opts, samples, PPOConfig(lam=lam, updates_per_batch=2, baseline=baseline), "cpu")
            rises[lam, baseline, seed] = _choice_margin(actor) - before
    at_one = [rises[1.0, "critic", seed] for seed in range(3)]
    at_095 = [rises[0.95, "critic", seed] for seed in range(3)]
    grouped = [rises[0.95, "group", seed] for seed in range(3)]
    assert min(at_one) > 0.1, rises
    assert sum(at_one) / 3 > sum(at_095) / 3 + 0.2, rises
    assert min(grouped) > 0.1, rises
