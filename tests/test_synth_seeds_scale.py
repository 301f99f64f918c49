"""rl.data.sizing and the sized compositions: the roofline estimate counts what eager mode runs,
and at scale 1 compositions are sized into the filters' runtime window under the memory budget.

Nothing here runs a full-size task: estimates come from meta tensors, and sized sources run on
the meta device."""

from __future__ import annotations

import types

import pytest
import torch

from rl.data import sizing as sz
from rl.data.compose import Config, compose, compose_many
from rl.data.seeds import output_shape, seed_ops, seed_task

SIZING = sz.Config()
OPS = {op.name: op for op in seed_ops()}


@pytest.fixture(scope="module")
def sized():
    return compose_many(200)


def _stage(name: str, shape):
    op = OPS[name]
    return [(op, shape, output_shape(op, shape))]


def test_most_sized_compositions_estimate_near_the_target(sized):
    ms = [t.metadata["est_eager_ms"] for t in sized]
    near = [m for m in ms if SIZING.target_ms / 2 <= m <= 2 * SIZING.target_ms]
    assert len(near) >= 0.8 * len(ms), sorted(ms)[:20]


def test_every_sized_composition_estimates_inside_the_window_and_memory(sized):
    for t in sized:
        assert SIZING.min_ms <= t.metadata["est_eager_ms"] <= SIZING.max_ms, t.metadata
        assert t.metadata["est_peak_gib"] <= SIZING.memory_gib, t.metadata
        assert SIZING.memory_gib < 16.0  # the filter's default budget, with room to spare


def test_sized_sources_use_the_chosen_batch_and_run_on_meta(sized):
    for task in sized[:25]:
        module = types.ModuleType("generated")
        exec(compile(task.source, "model.py", "exec"), module.__dict__)
        with torch.device("meta"), torch.no_grad():
            inputs = module.get_inputs()
            out = module.Model(*module.get_init_inputs())(*inputs)
        assert inputs[0].shape[0] == task.metadata["batch"], task.metadata
        assert out.numel() > 0


def test_estimate_of_a_convolution_is_its_flops_at_the_conv_rate():
    shape = (8, 64, 64, 64)
    prof = sz.profile(_stage("nn.Conv2d", shape))
    flops = 2 * 64 * 64 * 9 * 8 * 64 * 64  # 2 * Cin * Cout * k*k * output pixels
    assert prof.eager_ms(8) == pytest.approx(1e3 * flops / SIZING.conv_flops_per_s + SIZING.launch_ms, rel=0.02)


def test_estimate_of_a_linear_is_its_flops_at_the_gemm_rate():
    prof = sz.profile(_stage("nn.Linear", (1024, 4096)))
    flops = 2 * 1024 * 4096 * 4096
    assert prof.eager_ms(1024) == pytest.approx(1e3 * flops / SIZING.gemm_flops_per_s + SIZING.launch_ms, rel=0.02)
    assert prof.param_bytes == 4 * (4096 * 4096 + 4096)


def test_estimate_of_an_activation_is_one_read_and_one_write():
    prof = sz.profile(_stage("nn.ReLU", (4, 1 << 20)))
    nbytes = 2 * 4 * (1 << 20) * 4  # read + write fp32
    assert prof.eager_ms(4) == pytest.approx(1e3 * nbytes / SIZING.hbm_bytes_per_s + SIZING.launch_ms)
    assert len(prof.kernels) == 1


def test_views_launch_no_kernel():
    assert sz.profile(_stage("nn.Flatten", (4, 8, 16, 16))).kernels == ()


def test_decomposed_ops_fused_on_cuda_are_charged_one_pass():
    prof = sz.profile(_stage("nn.RMSNorm", (4, 4096)))
    assert [k.name for k in prof.kernels] == ["fused_nn.RMSNorm"]
    unfused = sz.profile(_stage("transformers.LlamaRMSNorm", (4, 4096)))
    assert len(unfused.kernels) > 3  # plain torch: pow, mean, add, rsqrt, mul, mul run separately


def test_estimates_grow_linearly_with_the_batch():
    prof = sz.profile(_stage("nn.GroupNorm", (2, 64, 32, 32)))
    one, two = prof.eager_ms(1000) - prof.eager_ms(0), prof.eager_ms(2000) - prof.eager_ms(0)
    assert two == pytest.approx(2 * one, rel=1e-6)


def test_sized_batch_is_the_largest_round_batch_under_the_target():
    prof = sz.profile(_stage("nn.Conv2d", (32, 64, 256, 256)))
    b = sz.sized_batch(prof, SIZING)
    assert prof.eager_ms(b) <= SIZING.target_ms < prof.eager_ms(2 * b)
    assert b == sz.round_down(b)


def test_memory_caps_the_batch_of_a_cheap_op():
    prof = sz.profile(_stage("nn.ReLU", (32, 64, 256, 256)))
    b = sz.sized_batch(prof, SIZING)
    assert prof.peak_bytes(b) <= SIZING.memory_gib * 2**30 < prof.peak_bytes(2 * b)
    assert prof.eager_ms(b) < SIZING.target_ms  # a single streaming op cannot reach 3 ms within 12 GiB


def test_round_down_keeps_three_significant_bits():
    assert [sz.round_down(n) for n in (1, 7, 8, 9, 15, 17, 100, 1000)] == [1, 7, 8, 8, 14, 16, 96, 896]


def test_a_seed_task_at_scale_one_is_sized():
    task = seed_task(OPS["nn.Conv2d"])
    assert SIZING.min_ms <= task.metadata["est_eager_ms"] <= SIZING.target_ms
    assert f"torch.randn({task.metadata['batch']}, 64, 256, 256)" in task.source


def test_toy_scale_is_not_sized():
    task = compose(5, config=Config(scale=0.02))
    assert "est_eager_ms" not in task.metadata and "batch" not in task.metadata


def test_sizing_is_deterministic():
    assert compose(17).source == compose(17).source


def test_a_lower_target_gives_smaller_problems():
    fast = compose(17, config=Config(sizing=sz.Config(target_ms=1.5)))
    assert fast.metadata["ops"] == compose(17).metadata["ops"]
    assert fast.metadata["batch"] < compose(17).metadata["batch"]
