"""ModelConfig.head_on_actions_only: the actor's LM head runs only at action positions, and the
actor's losses, gradients and metrics equal those of the full head (tiny Qwen2 on CPU; the CUDA
check with the compiled head and varlen attention carries the gpu marker)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import torch

from rl.learner.models import ModelConfig, build_actor, build_critic, tiny_qwen2_config
from rl.learner.packing import dummy_micro_batch, micro_batches
from rl.learner.perf import action_positions, update_flops
from rl.learner.update import PPOConfig, compute_logprobs, ppo_step, sft_step
from rl.samples import Sample

VOCAB = 48
EXACT = PPOConfig(
    max_grad_norm=1e9, token_budget=64
)  # no clipping; several rows of several documents


class Recorder(torch.optim.Optimizer):
    """Keeps a copy of each step's gradients; never changes the parameters."""

    def __init__(self, params) -> None:
        super().__init__(list(params), {})
        self.grads: list[torch.Tensor | None] = []

    def step(self, closure=None) -> None:
        self.grads = [
            None if p.grad is None else p.grad.clone()
            for g in self.param_groups
            for p in g["params"]
        ]


def sample(i: int, rng: random.Random) -> Sample:
    """prompt, turn, tool output, turn (masked prompt and tool spans between the actions)."""
    parts = [
        (rng.randint(3, 6), 0),
        (rng.randint(2, 6), 1),
        (rng.randint(2, 5), 0),
        (rng.randint(2, 5), 1),
    ]
    mask = [m for n, m in parts for _ in range(n)]
    return Sample(
        sample_id=f"s{i}", group_id="g", token_ids=[rng.randrange(VOCAB) for _ in mask], action_mask=mask,
        behaviour_logprobs=[-rng.uniform(2.0, 5.0) * m for m in mask], reward=float(i % 3) / 2, weight_version=0,
    )  # fmt: skip


def batch(n: int = 8) -> list[Sample]:
    rng = random.Random(0)
    return [sample(i, rng) for i in range(n)]


def config(on: bool, **hf) -> ModelConfig:
    hf_config = tiny_qwen2_config(vocab_size=VOCAB, hidden=32, intermediate=64) | hf
    return ModelConfig(
        hf_config=hf_config, logprob_chunk_tokens=8, head_on_actions_only=on
    )


def actor_pair(**hf):
    """Two actors with equal weights: head on action positions only, and over every position."""
    return build_actor(config(True, **hf), "cpu"), build_actor(
        config(False, **hf), "cpu"
    )


def assert_same_grads(xs, ys) -> None:
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        assert x is not None and y is not None
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-5)


def assert_same_metrics(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k, v in a.items():
        assert v == pytest.approx(b[k], rel=1e-5, abs=1e-7), k


def test_actor_output_matches_the_full_head_at_actions_and_is_zero_elsewhere():
    on, off = actor_pair()
    mb = micro_batches(batch(4), 256)[0]
    assert len(mb.doc_lengths) == 4
    lp, ent = on(mb.input_ids, mb.position_ids, mb.targets, mask=mb.mask)
    lp_full, ent_full = off(mb.input_ids, mb.position_ids, mb.targets, mask=mb.mask)
    actions = mb.mask > 0
    assert lp.shape == ent.shape == mb.mask.shape and lp.dtype == torch.float32
    torch.testing.assert_close(lp[actions], lp_full[actions], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ent[actions], ent_full[actions], atol=1e-6, rtol=1e-5)
    assert (lp[~actions] == 0).all() and (ent[~actions] == 0).all()
    assert (
        lp_full[~actions] != 0
    ).any()  # the full head did compute the masked positions
    # without a mask the switch changes nothing: every position
    torch.testing.assert_close(
        on(mb.input_ids, mb.position_ids, mb.targets)[0], lp_full
    )


def test_sft_step_loss_metrics_and_gradients_equal_the_full_head():
    on, off = actor_pair()
    results = []
    for actor in (on, off):
        opt = Recorder(actor.parameters())
        results.append((sft_step(actor, opt, batch(), EXACT, "cpu"), opt.grads))
    (m_on, g_on), (m_off, g_off) = results
    assert m_on["sft_loss"] > 0 and m_on["entropy"] > 0
    assert_same_metrics(m_on, m_off)
    assert_same_grads(g_on, g_off)


@pytest.mark.parametrize("updates", [1, 2])
def test_ppo_step_losses_metrics_and_gradients_equal_the_full_head(updates):
    # Entropy bonus, KL to a reference, truncated IS and (at 2 updates) the old log-probs pass on.
    cfg = msgspec.structs.replace(
        EXACT, entropy_coef=0.01, kl_coef=0.1, tis_cap=2.0, updates_per_batch=updates
    )
    on, off = actor_pair()
    samples = batch()
    ref = [
        lp - 0.3 for lp in compute_logprobs(off, samples, cfg, "cpu")
    ]  # a reference unequal to the actor
    results = []
    for actor in (on, off):
        critic = build_critic(config(True), "cpu")
        torch.manual_seed(1)  # equal non-zero value heads, so GAE uses the values
        torch.nn.init.normal_(critic.value_head.weight, std=0.5)
        a, c = Recorder(actor.parameters()), Recorder(critic.parameters())
        results.append(
            (
                ppo_step(actor, critic, a, c, samples, cfg, "cpu", ref_logprobs=ref),
                a.grads,
                c.grads,
            )
        )
    (m_on, ga_on, gc_on), (m_off, ga_off, gc_off) = results
    assert len(micro_batches(samples, cfg.token_budget)) > 1
    assert m_on["logprob_gap"] > 0.5 and m_on["kl"] > 0 and m_on["entropy"] > 0
    assert_same_metrics(m_on, m_off)
    assert_same_grads(ga_on, ga_off)
    assert_same_grads(gc_on, gc_off)


def test_compute_logprobs_equal_the_full_head_on_action_tokens():
    on, off = actor_pair()
    samples = batch(4)
    for s, lp, full in zip(
        samples,
        compute_logprobs(on, samples, EXACT, "cpu"),
        compute_logprobs(off, samples, EXACT, "cpu"),
    ):
        actions = torch.tensor(s.action_mask, dtype=torch.bool)
        actions[0] = False
        torch.testing.assert_close(lp[actions], full[actions], atol=1e-6, rtol=1e-5)
        assert (lp[~actions] == 0).all()


@pytest.mark.parametrize("tied", [True, False])
def test_a_row_without_actions_still_gives_every_parameter_a_gradient(tied):
    # FSDP2 reduce-scatters the parameters that have a gradient: a dummy micro-batch (no actions)
    # must reach the LM head too, or ranks would disagree when the head is not tied.
    actor = build_actor(config(True, tie_word_embeddings=tied), "cpu")
    mb = dummy_micro_batch()
    lp, ent = actor(mb.input_ids, mb.position_ids, mb.targets, mask=mb.mask)
    ((lp * mb.mask).sum() + (ent * mb.mask).sum()).backward()
    named = dict(actor.named_parameters())
    assert ("lm.lm_head.weight" in named) == (not tied)
    for name, p in named.items():
        assert p.grad is not None, name
        assert (p.grad == 0).all(), name


def test_update_flops_count_the_head_for_its_positions_only():
    cfg = tiny_qwen2_config(
        100, hidden=8, layers=2, heads=2, kv_heads=1, intermediate=16
    )
    docs = [3, 5]
    full = update_flops(cfg, docs, "sft")
    assert update_flops(cfg, docs, "sft", head_tokens=8) == full
    saved = (
        6 * 100 * 8 * (8 - 2)
    )  # fwd + bwd of a 100 x 8 head at the 6 positions without it
    assert full - update_flops(cfg, docs, "sft", head_tokens=2) == saved
    assert (
        update_flops(cfg, docs, "ppo", 2)
        - update_flops(cfg, docs, "ppo", 2, head_tokens=2)
        == 2 * saved
    )
    assert update_flops(cfg, docs, "value", head_tokens=2) == update_flops(
        cfg, docs, "value"
    )  # no actor
    assert (
        action_positions([[1, 1, 0, 1], [0, 0, 1]]) == 3
    )  # token 0 is never a head position


def _sharded_sft_worker(out: Path) -> None:
    """Rank body: sft_step under FSDP2 with an untied head; rank 1 has no samples, so it runs an
    all-masked dummy row while rank 0 trains. Rank 0 saves the gathered weights after the step."""
    from rl.learner.fsdp import (
        apply_activation_checkpointing,
        close_distributed,
        full_state_items,
        init_distributed,
        shard,
    )
    from rl.learner.models import layers
    from rl.learner.packing import balance

    d = init_distributed()
    actor = build_actor(config(True, tie_word_embeddings=False), "cpu")
    apply_activation_checkpointing(actor, layers(actor))
    shard(actor, layers=layers(actor))
    opt = torch.optim.SGD(actor.parameters(), lr=1.0)
    metrics = sft_step(
        actor, opt, balance(batch(1), d.world_size, d.rank), EXACT, "cpu"
    )
    state = {
        name: t.clone()
        for bucket in full_state_items(actor, 1 << 12)
        for name, t in bucket
    }
    if d.is_main:
        torch.save({"state": state, "metrics": metrics}, out / "result.pt")
    close_distributed(sync=True)


def test_fsdp2_rank_without_actions_trains_like_one_process_with_an_untied_head(
    tmp_path,
):
    env = dict(
        os.environ,
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        __file__,
        str(tmp_path),
    ]
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = torch.load(tmp_path / "result.pt", weights_only=False)
    ref = build_actor(
        config(False, tie_word_embeddings=False), "cpu"
    )  # unsharded, full head, all data
    opt = torch.optim.SGD(ref.parameters(), lr=1.0)
    metrics = sft_step(ref, opt, batch(1), EXACT, "cpu")
    assert result["metrics"]["sft_loss"] == pytest.approx(metrics["sft_loss"], rel=1e-5)
    expected = ref.lm.state_dict()
    assert (
        "lm_head.weight" in result["state"]
        and result["state"].keys() == expected.keys()
    )
    for name, t in result["state"].items():
        torch.testing.assert_close(t, expected[name], atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_compiled_head_on_actions_equals_full_head_values_and_gradients():
    # The learner's CUDA path: varlen (or flex) attention, compiled log-softmax, bf16 weights.
    mb = micro_batches(batch(8), 256)[0].to("cuda")
    outs = []
    for on in (True, False):
        cfg = msgspec.structs.replace(
            config(on, hidden_size=64, intermediate_size=128), param_dtype="bfloat16"
        )
        actor = build_actor(cfg, "cuda")
        assert actor.compile_head
        lp, ent = actor(mb.input_ids, mb.position_ids, mb.targets, mask=mb.mask)
        loss = -(lp * mb.mask).sum() - 0.01 * (ent * mb.mask).sum()
        loss.backward()
        outs.append((loss.detach(), [p.grad.float() for p in actor.parameters()]))
    (loss_on, g_on), (loss_off, g_off) = outs
    torch.testing.assert_close(loss_on, loss_off, atol=1e-3, rtol=1e-4)
    for x, y in zip(g_on, g_off):
        assert float((x - y).norm()) <= 1e-2 * float(y.norm()) + 1e-6


if __name__ == "__main__":  # the torchrun worker of the FSDP2 test
    from rl.learner.fsdp import end_rank_process

    _sharded_sft_worker(Path(sys.argv[1]))
    end_rank_process(0)
