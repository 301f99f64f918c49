"""rl.learner.fsdp: FSDP2 over 2 CPU ranks (gloo) trains exactly like one unsharded process, and the
gathered full state is the unsharded model's state under Hugging Face names.

The 2-rank case runs this file as the torchrun worker (`python -m torch.distributed.run
--standalone --nproc-per-node 2 tests/test_fsdp.py OUT`); it runs once per session and the
tests below check what it wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 64
DOC_LENGTHS = [(9, 6), (7, 8)]  # rank r packs documents DOC_LENGTHS[r] into one row


def _model_cfg(hidden: int = 32):
    """hidden 32 on CPU; 64 on CUDA, where flex attention needs heads of at least 16 dims."""
    from rl.learner.models import ModelConfig, tiny_qwen2_config

    hf = tiny_qwen2_config(VOCAB, hidden=hidden, layers=2, intermediate=2 * hidden)
    return ModelConfig(hf_config=hf, logprob_chunk_tokens=8)


def _packed(lengths: tuple[int, ...], seed: int) -> dict[str, torch.Tensor]:
    """One packed row of random documents: input_ids, position_ids, targets, mask, returns; [1, T]."""
    g = torch.Generator().manual_seed(seed)
    ids, pos, tgt, mask = [], [], [], []
    for n in lengths:
        doc = torch.randint(1, VOCAB, (n,), generator=g)
        ids.append(doc)
        pos.append(torch.arange(n))
        tgt.append(torch.cat([doc[1:], torch.zeros(1, dtype=doc.dtype)]))
        m = (torch.rand(n, generator=g) < 0.6).float()
        m[-1] = 0.0  # the last position has no next token
        mask.append(m)
    row = {"input_ids": ids, "position_ids": pos, "targets": tgt, "mask": mask}
    out = {k: torch.cat(v)[None] for k, v in row.items()}
    out["returns"] = torch.rand(out["mask"].shape, generator=g)
    return out


def _losses(actor, critic, batch, normalizer: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level sums divided by the global token count (rl.learner.ppo's aggregation)."""
    logprobs, entropy = actor(batch["input_ids"], batch["position_ids"], batch["targets"])
    actor_loss = -((logprobs + 0.01 * entropy) * batch["mask"]).sum() / normalizer
    values = critic(batch["input_ids"], batch["position_ids"])
    critic_loss = ((values - batch["returns"]) ** 2 * batch["mask"]).sum() / normalizer
    return actor_loss, critic_loss


def _step(modules, opts, batches, normalizer: float) -> float:
    """Accumulate gradients over `batches`, then step; returns the summed loss."""
    total = 0.0
    for batch in batches:
        actor_loss, critic_loss = _losses(*modules, batch, normalizer)
        (actor_loss + critic_loss).backward()
        total += float(actor_loss + critic_loss)
    for opt in opts:
        opt.step()
        opt.zero_grad()
    return total


def _full_state(module) -> dict[str, torch.Tensor]:
    from rl.learner.fsdp import full_state_items

    return {name: t.clone() for bucket in full_state_items(module, 1 << 12) for name, t in bucket}


def _models(cfg, device) -> tuple:
    """Actor and critic; the critic's value head gets fixed non-zero weights, so that one step
    also moves its backbone (a zero head passes no gradient back)."""
    from rl.learner.models import build_actor, build_critic

    critic = build_critic(cfg, device)
    head = critic.value_head.weight  # [1, H]
    with torch.no_grad():
        head.copy_(torch.linspace(-1.0, 1.0, head.numel()).view_as(head))
    return build_actor(cfg, device), critic


def _by_name(states) -> dict[str, dict[str, torch.Tensor]]:
    return dict(zip(("Actor", "Critic"), states))


def _worker(out: Path) -> None:
    """Rank body: the same update sharded (both ranks) and unsharded (each rank, all data)."""
    import torch.distributed as dist

    from rl.learner.fsdp import apply_activation_checkpointing, close_distributed, init_distributed, shard
    from rl.learner.models import layers

    d = init_distributed()
    cfg = _model_cfg()
    batches = [_packed(lengths, seed) for seed, lengths in enumerate(DOC_LENGTHS)]
    normalizer = float(sum(b["mask"].sum() for b in batches))

    ref = _models(cfg, "cpu")
    ref_opts = [torch.optim.SGD(m.parameters(), lr=1.0) for m in ref]
    ref_loss = _step(ref, ref_opts, batches, normalizer)

    model = _models(cfg, "cpu")
    before = _by_name(m.state_dict() for m in model)
    for m in model:
        apply_activation_checkpointing(m, layers(m))
        shard(m, layers=layers(m))
    gathered_before = _by_name(_full_state(m) for m in model)
    opts = [torch.optim.SGD(m.parameters(), lr=1.0) for m in model]
    loss = torch.tensor(_step(model, opts, [batches[d.rank]], normalizer))
    dist.all_reduce(loss)
    result = {
        "world_size": d.world_size,
        "ref_loss": ref_loss,
        "loss": float(loss),
        "ref_after": _by_name(m.state_dict() for m in ref),
        "after": _by_name(_full_state(m) for m in model),
        "before": before,
        "gathered_before": gathered_before,
        "hf_names": {"Actor": list(model[0].lm.state_dict()), "Critic": list(model[1].backbone.state_dict())},
    }
    if d.is_main:
        torch.save(result, out / "result.pt")
    close_distributed(sync=True)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")  # CPU ranks, gloo
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__, str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out / "result.pt", weights_only=False)


def test_two_ranks_form_one_group(two_ranks):
    assert two_ranks["world_size"] == 2


def test_sharded_step_gives_the_unsharded_loss(two_ranks):
    assert two_ranks["loss"] == pytest.approx(two_ranks["ref_loss"], rel=1e-5)


@pytest.mark.parametrize("name", ["Actor", "Critic"])
def test_sharded_step_gives_the_unsharded_weights(two_ranks, name):
    ref, after = two_ranks["ref_after"][name], two_ranks["after"][name]
    before = two_ranks["gathered_before"][name]
    prefix = "lm." if name == "Actor" else "backbone."
    for key, want in ref.items():
        got = after[key.removeprefix(prefix)]
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=key)
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(moved) > len(before) // 2  # the step changed the weights


@pytest.mark.parametrize("name", ["Actor", "Critic"])
def test_gathered_state_is_the_unsharded_state_under_hf_names(two_ranks, name):
    prefix = "lm." if name == "Actor" else "backbone."
    want = {k.removeprefix(prefix): v for k, v in two_ranks["before"][name].items()}
    got = two_ranks["gathered_before"][name]
    assert set(got) == set(want)
    hf_names = set(two_ranks["hf_names"][name])
    assert hf_names <= set(got)  # HF names exactly; only the critic's value head is extra
    assert set(got) - hf_names == (set() if name == "Actor" else {"value_head.weight", "value_head.bias"})
    for key, value in want.items():
        assert torch.equal(got[key], value), key


# ---------------------------------------------------------------------------------------------
# One process


def test_activation_checkpointing_keeps_names_and_gradients():
    from rl.learner.fsdp import apply_activation_checkpointing
    from rl.learner.models import build_actor, layers

    batch = _packed((9, 6), seed=0)
    plain, wrapped = build_actor(_model_cfg(), "cpu"), build_actor(_model_cfg(), "cpu")
    wrappers = apply_activation_checkpointing(wrapped, layers(wrapped))
    assert len(wrappers) == 2 and all(w is not b for w, b in zip(wrappers, layers(plain)))
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    for m in (plain, wrapped):
        lp, _ = m(batch["input_ids"], batch["position_ids"], batch["targets"])
        (lp * batch["mask"]).sum().backward()
    grads = {n: p.grad for n, p in plain.named_parameters()}
    for name, p in wrapped.named_parameters():
        torch.testing.assert_close(p.grad, grads[name.replace("_checkpoint_wrapped_module.", "")])


def test_full_state_items_buckets_by_size_and_shares_tied_weights():
    from rl.learner.fsdp import full_state_items
    from rl.learner.models import build_actor

    actor = build_actor(_model_cfg(), "cpu")
    limit = 8 << 10
    buckets = list(full_state_items(actor, limit))
    assert len(buckets) > 1
    items = dict(item for bucket in buckets for item in bucket)
    assert list(items) == list(actor.lm.state_dict())
    assert items["lm_head.weight"].data_ptr() == items["model.embed_tokens.weight"].data_ptr()
    for bucket in buckets[:-1]:
        sizes = [t.numel() * t.element_size() for _, t in bucket]
        assert sum(sizes[:-1]) < limit <= sum(sizes) or len(bucket) == 1


def test_full_state_items_casts_to_the_requested_dtype():
    from rl.learner.fsdp import full_state_items
    from rl.learner.models import build_actor

    actor = build_actor(_model_cfg(), "cpu")
    items = dict(item for bucket in full_state_items(actor, 1 << 30, dtype=torch.bfloat16) for item in bucket)
    assert {t.dtype for t in items.values()} == {torch.bfloat16}
    torch.testing.assert_close(items["model.norm.weight"], actor.lm.model.norm.weight.to(torch.bfloat16))


# ---------------------------------------------------------------------------------------------
# CUDA: one rank without torchrun (a one-rank NCCL group), bf16 compute over fp32 master weights


def _cuda_worker(out: Path) -> None:
    from rl.learner.fsdp import apply_activation_checkpointing, close_distributed, init_distributed, shard
    from rl.learner.models import layers

    d = init_distributed()
    cfg = _model_cfg(hidden=64)
    batches = [_packed(lengths, seed) for seed, lengths in enumerate(DOC_LENGTHS)]
    batches = [{k: v.to(d.device) for k, v in b.items()} for b in batches]
    normalizer = float(sum(b["mask"].sum() for b in batches))
    ref = _models(cfg, d.device)
    init = _flat(ref[0].lm.state_dict())
    ref_loss = _step(ref, [torch.optim.SGD(m.parameters(), lr=1.0) for m in ref], batches, normalizer)
    model = _models(cfg, d.device)
    for m in model:
        apply_activation_checkpointing(m, layers(m))
        shard(m, layers=layers(m))
    loss = _step(model, [torch.optim.SGD(m.parameters(), lr=1.0) for m in model], batches, normalizer)
    ref_delta, delta = _flat(ref[0].lm.state_dict()) - init, _flat(_full_state(model[0])) - init
    result = {
        "backend": torch.distributed.get_backend(),
        "world_size": d.world_size,
        "ref_loss": ref_loss,
        "loss": loss,
        "master_dtypes": sorted({str(p.dtype) for m in model for p in m.parameters()}),
        "update_cosine": float(torch.nn.functional.cosine_similarity(delta, ref_delta, dim=0)),
        "update_norm_ratio": float(delta.norm() / ref_delta.norm()),
    }
    torch.save(result, out / "result.pt")
    close_distributed(sync=True)


def test_every_kth_layer_keeps_the_last_one_and_rejects_zero():
    from rl.learner.fsdp import every_kth

    assert every_kth(list("abcde"), 1) == list("abcde")
    assert every_kth(list("abcde"), 2) == ["a", "c", "e"]
    assert every_kth(list("abcdef"), 3) == ["c", "f"]
    with pytest.raises(ValueError, match="k >= 1"):
        every_kth(list("ab"), 0)


def test_checkpointing_every_other_layer_gives_the_same_gradients():
    """Partial activation checkpointing recomputes some blocks in backward: same loss, same
    gradients as no checkpointing, and only the chosen blocks are wrapped."""
    import msgspec

    from rl.learner.fsdp import apply_activation_checkpointing, every_kth
    from rl.learner.models import layers

    cfg = _model_cfg()
    cfg = msgspec.structs.replace(cfg, hf_config={**cfg.hf_config, "num_hidden_layers": 4})
    batch = _packed((9, 6), seed=3)
    grads = []
    for k in (None, 2):
        torch.manual_seed(0)
        modules = _models(cfg, "cpu")
        if k:
            wrapped = [apply_activation_checkpointing(m, every_kth(layers(m), k)) for m in modules]
            assert [len(w) for w in wrapped] == [2, 2]
        actor_loss, critic_loss = _losses(*modules, batch, 10.0)
        (actor_loss + critic_loss).backward()
        grads.append(torch.cat([p.grad.flatten() for m in modules for p in m.parameters() if p.grad is not None]))
    assert grads[0].numel() == grads[1].numel()
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)


def _flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([state[k].detach().float().flatten().cpu() for k in sorted(state)])


@pytest.mark.gpu
def test_cuda_rank_trains_in_bf16_over_fp32_master_weights(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [sys.executable, __file__, "cuda", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = torch.load(tmp_path / "result.pt", weights_only=False)
    assert (r["backend"], r["world_size"], r["master_dtypes"]) == ("nccl", 1, ["torch.float32"])
    assert r["loss"] == pytest.approx(r["ref_loss"], rel=2e-2)  # bf16 matmuls vs fp32
    assert r["update_cosine"] > 0.99  # the actor's update points where the fp32 update points
    assert r["update_norm_ratio"] == pytest.approx(1.0, rel=5e-2)


if __name__ == "__main__":
    if sys.argv[1] == "cuda":
        _cuda_worker(Path(sys.argv[2]))
    else:
        _worker(Path(sys.argv[1]))
    from rl.learner.fsdp import end_rank_process

    end_rank_process(0)
