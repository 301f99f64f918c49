"""rl.learner.models: building actor and critic, their initial weights, sizes and FLOP accounting."""

from __future__ import annotations

import itertools

import pytest
import torch

from rl.learner.models import (
    Actor,
    ModelConfig,
    build_actor,
    build_critic,
    count_params,
    flops_per_token,
    hf_model,
    layers,
    qwen2_config,
    tiny_qwen2_config,
)

TINY = tiny_qwen2_config(vocab_size=32)  # hidden 64, 2 layers, 4 heads, 2 kv heads, mlp 128


def _backbone_state(module) -> dict[str, torch.Tensor]:
    hf = hf_model(module).base_model if isinstance(module, Actor) else module.backbone
    return hf.state_dict()


def test_random_init_actor_and_critic_backbones_start_equal():
    cfg = ModelConfig(hf_config=TINY, seed=3)
    actor, critic = build_actor(cfg, "cpu"), build_critic(cfg, "cpu")
    a, c = _backbone_state(actor), _backbone_state(critic)
    assert a.keys() == c.keys()
    assert all(torch.equal(a[k], c[k]) for k in a)


def test_seed_decides_the_random_init():
    same = build_actor(ModelConfig(hf_config=TINY, seed=1), "cpu")
    again = build_actor(ModelConfig(hf_config=TINY, seed=1), "cpu")
    other = build_actor(ModelConfig(hf_config=TINY, seed=2), "cpu")
    w = lambda m: m.lm.model.layers[0].mlp.up_proj.weight
    assert torch.equal(w(same), w(again))
    assert not torch.equal(w(same), w(other))



def test_an_uninitialised_actor_loaded_from_a_state_equals_the_original():
    cfg = ModelConfig(hf_config=TINY, seed=5)
    ref, bare = build_actor(cfg, "cpu"), build_actor(cfg, "cpu", init=False)
    assert bare.lm.state_dict().keys() == ref.lm.state_dict().keys()
    bare.lm.load_state_dict(ref.lm.state_dict())
    ids = torch.randint(0, 32, (1, 12))
    with torch.no_grad():
        assert torch.equal(bare.lm(ids).logits, ref.lm(ids).logits)  # rotary buffers are built, not skipped

def test_build_from_local_directory_loads_the_weights(tmp_path):
    source = build_actor(ModelConfig(hf_config=TINY, seed=7), "cpu")
    hf_model(source).save_pretrained(tmp_path)
    cfg = ModelConfig(path=str(tmp_path))
    actor, critic = build_actor(cfg, "cpu"), build_critic(cfg, "cpu")
    want = hf_model(source).state_dict()
    got = hf_model(actor).state_dict()
    assert all(torch.equal(want[k], got[k]) for k in want)
    backbone = _backbone_state(critic)
    assert all(torch.equal(want[f"model.{k}"], v) for k, v in backbone.items())


def test_critic_value_head_starts_at_zero():
    critic = build_critic(ModelConfig(hf_config=TINY), "cpu")
    values = critic(torch.tensor([[1, 2, 3, 4]]), torch.arange(4)[None])
    assert values.shape == (1, 4) and values.dtype == torch.float32
    assert torch.count_nonzero(values) == 0


def test_actor_outputs_fp32_logprobs_and_entropy_shapes():
    actor = build_actor(ModelConfig(hf_config=TINY, logprob_chunk_tokens=3), "cpu")
    lp, ent = actor(torch.tensor([[1, 2, 3, 4, 5]]), torch.arange(5)[None], torch.tensor([[2, 3, 4, 5, 0]]))
    assert lp.shape == ent.shape == (1, 5)
    assert lp.dtype == ent.dtype == torch.float32
    assert bool((lp < 0).all()) and bool((ent > 0).all())
    assert bool((ent <= torch.log(torch.tensor(32.0)) + 1e-5).all())  # at most the uniform entropy


def test_param_dtype_sets_master_weights_dtype():
    cfg = ModelConfig(hf_config=TINY, param_dtype="bfloat16")
    for module in (build_actor(cfg, "cpu"), build_critic(cfg, "cpu")):
        assert {p.dtype for p in module.parameters()} == {torch.bfloat16}


def test_auto_attention_is_sdpa_on_cpu():
    actor = build_actor(ModelConfig(hf_config=TINY), "cpu")
    assert hf_model(actor).config._attn_implementation == "sdpa"


def test_layers_are_the_decoder_blocks():
    cfg = ModelConfig(hf_config=TINY)
    actor, critic = build_actor(cfg, "cpu"), build_critic(cfg, "cpu")
    assert layers(actor) == list(actor.lm.model.layers) and len(layers(actor)) == 2
    assert layers(critic) == list(critic.backbone.layers)
    assert layers(hf_model(actor)) == layers(actor)


def test_missing_path_and_config_raises():
    with pytest.raises(ValueError, match="path"):
        build_actor(ModelConfig(), "cpu")


def test_count_params_of_tiny_qwen2_by_hand():
    # embed 32*64 = 2048 (tied with lm_head, counted once);
    # per layer: q 64*64+64, k 64*32+32, v 64*32+32, o 64*64 -> 12416; mlp 3*64*128 = 24576;
    # 2 RMSNorms 128 -> 37120; two layers 74240; final norm 64 -> 76352. Critic head: +65.
    cfg = ModelConfig(hf_config=TINY)
    assert count_params(build_actor(cfg, "cpu")) == 76352
    assert count_params(build_critic(cfg, "cpu")) == 76352 + 65


def test_flops_per_token_by_hand():
    # Matmul weights per layer: q 64*64 + k,v 2*64*32 + o 64*64 = 12288, mlp 24576 -> 36864;
    # 2 layers 73728 + lm_head 32*64 = 2048 -> N = 75776; 6N = 454656;
    # attention 12 * L * (heads*head_dim) * S = 12 * 2 * 64 * 100 = 153600.
    assert flops_per_token(TINY, 100) == 454656 + 153600


def test_qwen2_configs_match_the_published_architectures():
    small, large = qwen2_config("0.5b"), qwen2_config("1.5b")
    shape = lambda c: (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"])
    assert shape(small) == (896, 24, 14, 2, 4864)
    assert shape(large) == (1536, 28, 12, 2, 8960)
    assert small["tie_word_embeddings"] and large["tie_word_embeddings"] and small["vocab_size"] == 151936
    with pytest.raises(ValueError, match="7b"):
        qwen2_config("7b")


def test_flops_per_token_qwen2_05b_is_about_6_n():
    # Qwen2-0.5B has ~494M parameters with 136M in the tied embedding, so the matmul weights
    # (layers + lm_head) are ~494M; 6N is ~2.96 GFLOP per token before the attention term.
    flops = flops_per_token(qwen2_config("0.5b"), 0)
    assert 2.9e9 < flops < 3.0e9



@pytest.mark.gpu
def test_cuda_actor_uses_flex_attention_and_packed_rows_equal_separate_rows():
    from rl.learner.packing import collate
    from rl.samples import Sample

    cfg = ModelConfig(hf_config=TINY, attn_implementation="flex_attention", logprob_chunk_tokens=8)
    actor = build_actor(cfg, "cuda")
    assert hf_model(actor).config._attn_implementation == "flex_attention"
    g = torch.Generator().manual_seed(0)
    samples = [
        Sample(sample_id=str(i), group_id="g", token_ids=torch.randint(0, 32, (n,), generator=g).tolist(),
               action_mask=[0] + [1] * (n - 1), behaviour_logprobs=[0.0] * n, reward=0.0, weight_version=0)
        for i, n in enumerate((37, 5, 90, 18))
    ]  # fmt: skip
    packed = collate(samples, range(4)).to("cuda")
    with torch.no_grad():
        lp, _ = actor(packed.input_ids, packed.position_ids, packed.targets)
        for i, got in enumerate(packed.split(lp)):
            one = collate(samples, [i]).to("cuda")
            alone, _ = actor(one.input_ids, one.position_ids, one.targets)
            torch.testing.assert_close(got, alone[0], atol=1e-4, rtol=0)


@pytest.mark.gpu
def test_cuda_compiled_head_stats_equal_eager_values_and_gradients():
    """The fused (compiled) log-softmax / entropy over LM-head chunks matches the eager ops, at
    temperature 1 and at a rollout temperature of 0.7."""
    from rl.learner.models import _compiled_stats, _logit_stats

    g = torch.Generator(device="cuda").manual_seed(0)
    # a second static call, then a shorter last chunk (dynamic), then the same at temperature 0.7
    for rows, t in ((64, 1.0), (64, 1.0), (23, 1.0), (64, 0.7), (23, 0.7)):
        logits = torch.randn(rows, 5000, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
        targets = torch.randint(0, 5000, (rows,), device="cuda", generator=g)
        want, got = _logit_stats(logits, targets, t), _compiled_stats()(logits, targets, t)
        grad_want = torch.autograd.grad(want[0].sum() + 0.1 * want[1].sum(), logits)[0]
        grad_got = torch.autograd.grad(got[0].sum() + 0.1 * got[1].sum(), logits)[0]
        for w, o in zip(want, got):
            assert o.dtype == torch.float32
            torch.testing.assert_close(o, w, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(grad_got.float(), grad_want.float(), atol=1e-3, rtol=1e-2)


def _packed_samples(lengths, vocab=32, seed=0):
    from rl.samples import Sample

    g = torch.Generator().manual_seed(seed)
    return [
        Sample(sample_id=str(i), group_id="g", token_ids=torch.randint(0, vocab, (n,), generator=g).tolist(),
               action_mask=[0] + [1] * (n - 1), behaviour_logprobs=[0.0] * n, reward=0.0, weight_version=0)
        for i, n in enumerate(lengths)
    ]  # fmt: skip


def test_varlen_attention_on_a_packed_row_equals_packed_sdpa_values_and_gradients():
    """The "varlen" attention plumbing (cu_seq_lens through the HF forward, no mask) gives the
    same log-probs, values and gradients as transformers' own packed sdpa path."""
    from rl.learner.packing import collate

    samples = _packed_samples((9, 3, 14, 6))
    packed = collate(samples, range(4))
    results = []
    for attn in ("sdpa", "varlen"):
        cfg = ModelConfig(hf_config=TINY, attn_implementation=attn, logprob_chunk_tokens=8)
        actor, critic = build_actor(cfg, "cpu"), build_critic(cfg, "cpu")
        lp, ent = actor(packed.input_ids, packed.position_ids, packed.targets)
        values = critic(packed.input_ids, packed.position_ids)
        (lp.sum() + values.sum()).backward()
        grad = next(hf_model(actor).model.layers[0].self_attn.q_proj.parameters()).grad
        results.append((lp, ent, values, grad))
    for want, got in zip(*results):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.gpu
def test_cuda_varlen_kernel_is_causal_within_each_document():
    """The FlashAttention varlen call (whichever causal spelling this torch takes) against causal
    sdpa per document in fp32: packed-vs-separate rows alone would not see a non-causal kernel."""
    from rl.learner.attention import _per_document_sdpa, varlen_attention, varlen_available

    if not varlen_available():
        pytest.skip("this torch has no varlen_attn")
    g = torch.Generator(device="cuda").manual_seed(0)
    lengths = (37, 5, 300, 18)
    total = sum(lengths)
    q, k, v = (torch.randn(1, h, total, 64, device="cuda", generator=g) for h in (8, 2, 2))  # GQA 8/2
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
    leaves = [t.bfloat16().requires_grad_() for t in (q, k, v)]
    out, _ = varlen_attention(None, *leaves, None, scaling=0.125, cu_seq_lens_q=cu, max_length_q=max(lengths))
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    kk, vv = (t[0].transpose(0, 1).repeat_interleave(4, dim=1) for t in ref[1:])
    want = _per_document_sdpa(ref[0][0].transpose(0, 1), kk, vv, cu, 0.125)  # [T, H, D]
    torch.testing.assert_close(out[0].float(), want.detach(), atol=3e-2, rtol=0)
    weights = torch.randn(want.shape, device="cuda", generator=g)
    (out[0].float() * weights).sum().backward()
    (want * weights).sum().backward()  # the shared KV heads' gradients: summed over their query heads
    for got, expected in zip(leaves, ref, strict=True):
        error = (got.grad.float() - expected.grad).norm() / expected.grad.norm()
        assert error < 2e-2, error


@pytest.mark.gpu
def test_cuda_varlen_packed_rows_equal_separate_rows():
    from rl.learner.attention import varlen_available
    from rl.learner.packing import collate

    if not varlen_available():
        pytest.skip("this torch has no varlen_attn")
    cfg = ModelConfig(hf_config={**TINY, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2},
                      logprob_chunk_tokens=8, param_dtype="bfloat16")  # fmt: skip
    actor = build_actor(cfg, "cuda")
    assert hf_model(actor).config._attn_implementation == "varlen"
    samples = _packed_samples((37, 5, 90, 18))
    packed = collate(samples, range(4)).to("cuda")
    with torch.no_grad():
        lp, _ = actor(packed.input_ids, packed.position_ids, packed.targets)
        for i, got in enumerate(packed.split(lp)):
            one = collate(samples, [i]).to("cuda")
            alone, _ = actor(one.input_ids, one.position_ids, one.targets)
            torch.testing.assert_close(got, alone[0], atol=2e-2, rtol=0)


def test_a_bf16_critic_keeps_the_rope_frequencies_in_fp32():
    """param_dtype casts the parameters (value head included), not RoPE's fp32 inv_freq."""
    critic = build_critic(ModelConfig(hf_config=TINY, param_dtype="bfloat16"), "cpu")
    assert {p.dtype for p in critic.parameters()} == {torch.bfloat16}
    buffers = {name: b.dtype for name, b in critic.named_buffers() if name.endswith("inv_freq")}
    assert buffers and set(buffers.values()) == {torch.float32}
