"""rl.learner.perf: the FLOPs of one update, counted by hand on a tiny config, agree with the per-token
count of rl.learner.models; the peak table finds the lent GPUs by name."""

from __future__ import annotations

import pytest

from rl.learner.models import flops_per_token, tiny_qwen2_config
from rl.learner.perf import matmul_params, peak_flops, update_flops

CFG = tiny_qwen2_config(100, hidden=8, layers=2, heads=2, kv_heads=1, intermediate=16)


def test_matmul_params_by_hand():
    # per layer: q 8x8, k and v 8x4 each, o 8x8, MLP 3 x 8x16 = 64 + 64 + 64 + 384 = 576
    n_actor, n_critic = matmul_params(CFG)
    assert n_actor == 2 * 576 + 100 * 8  # plus the LM head
    assert n_critic == 2 * 576 + 8  # plus a value head of `hidden` weights
    assert n_actor * 6 == flops_per_token(CFG, 0)


def test_update_flops_by_hand_for_each_kind():
    docs = [3, 5]
    n_a, n_c = matmul_params(CFG)
    attn = 2 * 2 * 8 * (9 + 25)  # 2 l q sum L^2, causal forward
    actor, critic, values = 6 * n_a * 8 + 3 * attn, 6 * n_c * 8 + 3 * attn, 2 * n_c * 8 + attn
    assert update_flops(CFG, docs, "sft") == actor
    assert update_flops(CFG, docs, "value") == values + critic
    assert update_flops(CFG, docs, "ppo") == actor + critic + values
    assert update_flops(CFG, docs, "ppo", updates=2) == 2 * (actor + critic) + values
    # one document of 8 tokens costs more attention than two of 3 and 5 (document masking)
    assert update_flops(CFG, [8], "sft") > update_flops(CFG, docs, "sft")
    with pytest.raises(ValueError, match="unknown update kind"):
        update_flops(CFG, docs, "dpo")


def test_peak_flops_by_device_name():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("NVIDIA H200") == 989e12
    assert peak_flops("cpu") is None
    assert peak_flops("cpu", override_tflops=100.0) == 100e12
