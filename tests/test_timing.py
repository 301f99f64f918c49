"""GPU timing's CPU-testable core: statistics, the stopping rule and sampling loop (fake sampler,
fake clock), method decisions, the precision flags, baseline cache keys and the cache itself."""

from __future__ import annotations

import math
import random
import subprocess
import sys

import msgspec
import pytest

from rewards.queue.jobs import decode, encode
from rewards.timing import stats
from rewards.timing.baselines import (
    BaselineCache,
    BaselineRequest,
    Baselines,
    SubjectRun,
    fastest,
    load_task,
    make_key,
    report,
)
from rewards.timing.sampling import (
    METHOD_EVENT,
    METHOD_GRAPH,
    Run,
    Sample,
    TimingConfig,
    WarmUp,
    config_hash,
    flush_bytes,
    forced,
    graph_calls,
    pool_size,
    sample_until_stable,
    stop_reason,
    summarize,
    use_graph,
    warm_up,
)
from rewards.verify.precision import (
    FP32,
    POLICIES,
    TF32_BEST,
    changed_flags,
    policy,
    precision_flags,
    snapshot_flags,
)

H100_L2, H200_L2 = 50 << 20, 60 << 20


class FakeClock:
    """Seconds that advance only when a fake sample says the GPU spent time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_sampler(clock: FakeClock, times_ms, overhead_s: float = 1e-4):
    """A sampler returning times_ms(i) and advancing the clock by that much plus an overhead."""

    def sample(i: int) -> Sample:
        ms = times_ms(i)
        clock.now += ms / 1e3 + overhead_s
        return Sample(device_ms=ms, host_ms=ms + 0.02)

    return sample


def gauss_times(mean_ms: float, rel_sigma: float, seed: int = 0):
    rng = random.Random(seed)
    return lambda i: max(1e-6, rng.gauss(mean_ms, rel_sigma * mean_ms))


def measurement(median_ms: float, *, rel: float = 0.001, method: str = METHOD_EVENT, n: int = 200):
    """A Measurement around `median_ms` with relative noise `rel`, built through `summarize`."""
    rng = random.Random(7)
    device = [median_ms * (1 + rng.gauss(0, rel)) for _ in range(n)]
    run = Run(device_ms=device, host_ms=[d + 0.02 for d in device], stop="converged", seconds=1.0)
    return summarize(
        run,
        WarmUp(calls=10, seconds=0.2, estimate_ms=median_ms),
        config=TimingConfig(),
        method=method,
        calls=1,
        flush_ms=0.06,
        input_pool=4,
        l2_bytes=H200_L2,
        flush_bytes=256 << 20,
    )


# --- statistics ----------------------------------------------------------------------------------


def test_stderr_of_the_median_matches_normal_theory():
    rng = random.Random(1)
    sigma, n = 0.02, 4000
    xs = [rng.gauss(1.0, sigma) for _ in range(n)]
    theory = math.sqrt(math.pi / 2) * sigma / math.sqrt(n)
    assert stats.stderr_median(xs) == pytest.approx(theory, rel=0.2)


def test_stderr_of_the_median_is_zero_for_identical_samples_and_undefined_below_three():
    assert stats.stderr_median([2.0] * 50) == 0.0
    assert stats.rel_stderr_median([1.0, 1.1]) == math.inf


def test_a_huge_outlier_moves_the_median_noise_little_and_the_mean_noise_a_lot():
    rng = random.Random(2)
    xs = [rng.gauss(1.0, 0.01) for _ in range(200)]
    spiky = xs[:-1] + [50.0]
    assert stats.rel_stderr_median(spiky) < 1.5 * stats.rel_stderr_median(xs)
    assert stats.rel_stderr_mean(spiky) > 10 * stats.rel_stderr_mean(xs)


def test_outliers_are_counted_on_the_slow_side_only():
    xs = [1.0, 1.001, 0.999, 1.002, 0.998] * 20 + [1.5, 2.0, 0.5]
    assert stats.count_outliers(xs, mads=10.0) == 2


def test_speedup_adds_relative_errors_in_quadrature():
    s = stats.speedup(baseline_ms=3.0, baseline_rel_err=0.003, candidate_ms=1.5, candidate_rel_err=0.004)
    assert s.value == pytest.approx(2.0)
    assert s.rel_err == pytest.approx(0.005)
    assert s.sigmas_above(1.9) == pytest.approx(10.0)


def test_spread_of_medians_is_range_over_median():
    assert stats.relative_spread([1.0, 1.01, 0.99, 1.0, 1.0]) == pytest.approx(0.02)


def test_side_work_is_suspected_when_the_host_waited_far_longer_than_the_events():
    honest = dict(lead_ms=0.03, slack_ms=0.05, slack_rel=0.1)
    assert not stats.side_work_suspect(2.85, 2.92, **honest)
    assert stats.side_work_suspect(0.17, 2.95, **honest)  # rewards/README.md, hack 7


# --- the stopping rule ---------------------------------------------------------------------------


def test_no_convergence_before_min_samples():
    config = TimingConfig(min_samples=20)
    assert stop_reason([1.0] * 19, 0.1, config) is None
    assert stop_reason([1.0] * 20, 0.1, config) == "converged"


def test_noisy_samples_do_not_converge():
    rng = random.Random(3)
    xs = [rng.gauss(1.0, 0.2) for _ in range(40)]
    assert stop_reason(xs, 0.1, TimingConfig()) is None


def test_caps_stop_an_unconverged_run():
    rng = random.Random(4)
    xs = [rng.gauss(1.0, 0.5) for _ in range(50)]
    assert stop_reason(xs, 0.1, TimingConfig(max_samples=50)) == "max_samples"
    assert stop_reason(xs, 6.0, TimingConfig(max_time_s=5.0)) == "max_time"
    assert stop_reason(xs[:2], 60.0, TimingConfig(max_time_s=5.0)) is None  # a median needs 3


# --- the sampling loop, with a fake GPU and a fake clock ----------------------------------------


def test_a_noise_free_call_stops_at_min_samples():
    clock = FakeClock()
    run = sample_until_stable(fake_sampler(clock, lambda i: 1.0), TimingConfig(min_samples=20), clock=clock)
    assert (run.stop, len(run.device_ms)) == ("converged", 20)


def test_noisy_calls_take_about_the_predicted_number_of_samples():
    # SE(median) = 1.2533 * 0.05 / sqrt(n) <= 0.005  =>  n ~ 157
    clock = FakeClock()
    config = TimingConfig(max_time_s=1e9)
    run = sample_until_stable(fake_sampler(clock, gauss_times(1.0, 0.05)), config, clock=clock)
    assert run.stop == "converged"
    assert 100 <= len(run.device_ms) <= 300
    assert stats.rel_stderr_median(run.device_ms) <= config.target_rel_stderr


def test_the_time_cap_ends_a_slow_noisy_run():
    clock = FakeClock()
    config = TimingConfig(max_time_s=1.0)
    run = sample_until_stable(fake_sampler(clock, gauss_times(100.0, 0.5)), config, clock=clock)
    assert run.stop == "max_time"
    assert 5 <= len(run.device_ms) <= 15
    assert run.seconds >= 1.0


def test_warm_up_runs_by_time():
    clock = FakeClock()
    warm = warm_up(
        fake_sampler(clock, lambda i: 10.0, overhead_s=0.0), TimingConfig(warmup_s=0.2), clock=clock
    )
    assert warm.calls == 21  # the first call (compile, module load) does not count toward warmup_s
    assert warm.seconds == pytest.approx(0.2)


def test_a_slow_first_call_does_not_eat_the_warm_up_time():
    clock = FakeClock()
    sampler = fake_sampler(clock, lambda i: 500.0 if i == 0 else 10.0, overhead_s=0.0)
    warm = warm_up(sampler, TimingConfig(warmup_s=0.2, warmup_min_calls=3), clock=clock)
    assert warm.calls == 21 and warm.estimate_ms == 10.0


def test_warm_up_makes_at_least_min_calls_of_a_slow_call():
    clock = FakeClock()
    warm = warm_up(fake_sampler(clock, lambda i: 1000.0), TimingConfig(warmup_min_calls=3), clock=clock)
    assert warm.calls == 3


def test_warm_up_waits_for_the_clock_to_come_up_until_its_cap():
    clock = FakeClock()
    sampler = fake_sampler(clock, lambda i: 10.0, overhead_s=0.0)
    config = TimingConfig(warmup_s=0.2, warmup_max_s=1.0)
    ready_late = warm_up(sampler, config, clock=clock, clock_ready=lambda: clock.now >= 0.5)
    assert ready_late.seconds == pytest.approx(0.49)  # the clock starts after the first 10 ms call
    clock.now = 0.0
    never = warm_up(sampler, config, clock=clock, clock_ready=lambda: False)
    assert never.seconds == pytest.approx(1.0)


def test_a_clock_already_up_after_the_first_call_shortens_the_warm_up():
    clock = FakeClock()
    sampler = fake_sampler(clock, lambda i: 1.0, overhead_s=0.0)
    config = TimingConfig(warmup_s=0.2, warmup_ready_s=0.05)
    assert warm_up(sampler, config, clock=clock, clock_ready=lambda: True).seconds == pytest.approx(0.05)
    clock.now = 0.0
    assert warm_up(sampler, config, clock=clock, clock_ready=lambda: clock.now >= 0.1).seconds == pytest.approx(0.2)


def test_warm_up_measures_the_launch_ratio_of_its_second_half():
    clock = FakeClock()

    def sample(i: int) -> Sample:
        clock.now += 2e-3
        return Sample(device_ms=2.0, host_ms=2.02, launch_ms=5.0 if i < 10 else 0.04)

    warm = warm_up(sample, TimingConfig(warmup_s=0.2), clock=clock)
    assert warm.launch_ratio == pytest.approx(0.02)
    assert warm_up(fake_sampler(clock, lambda i: 1.0), TimingConfig(warmup_s=0.1), clock=clock).launch_ratio == 0.0


def test_warm_up_estimate_ignores_the_cold_first_calls():
    clock = FakeClock()
    sampler = fake_sampler(clock, lambda i: 20.0 if i < 5 else 1.0)
    assert warm_up(sampler, TimingConfig(warmup_s=0.5), clock=clock).estimate_ms == 1.0


# --- decisions and sizes -------------------------------------------------------------------------


def test_graph_mode_is_chosen_below_the_threshold_unless_pinned():
    config = TimingConfig(graph_threshold_us=50.0)
    assert use_graph(config, 0.004) and not use_graph(config, 0.2)
    assert use_graph(forced(config, METHOD_GRAPH), 5.0)
    assert not use_graph(forced(config, METHOD_EVENT), 0.001)


def test_graph_calls_fill_the_replay_target_within_the_cap():
    config = TimingConfig(graph_replay_us=1000.0, graph_max_calls=100)
    assert graph_calls(config, 0.1) == 10
    assert graph_calls(config, 0.001) == 100
    assert graph_calls(config, 5.0) == 1


@pytest.mark.parametrize("l2", [H100_L2, H200_L2, 256 << 20])
def test_flush_buffer_is_at_least_twice_the_l2(l2):
    assert flush_bytes(l2, TimingConfig()) >= 2 * l2
    assert flush_bytes(l2, TimingConfig()) >= 256 << 20
    assert flush_bytes(l2, TimingConfig(flush_min_mib=0)) == 2 * l2


def test_input_pool_shrinks_to_the_memory_cap_but_never_to_zero():
    config = TimingConfig(input_pool=4, input_pool_max_gib=16.0)
    assert pool_size(100 << 20, config) == 4
    assert pool_size(6 << 30, config) == 2  # KernelBench 19_ReLU: one 6.4 GB input
    assert pool_size(40 << 30, config) == 1


def test_config_hash_is_stable_and_sees_every_field():
    assert config_hash(TimingConfig()) == config_hash(TimingConfig())
    assert config_hash(TimingConfig()) != config_hash(TimingConfig(target_rel_stderr=0.01))
    assert config_hash(TimingConfig()) != config_hash(forced(TimingConfig(), METHOD_EVENT))


def test_summarize_reports_median_noise_and_side_work():
    m = measurement(2.0, rel=0.002)
    assert m.timing.method == METHOD_EVENT
    assert m.timing.median_ms == pytest.approx(2.0, rel=0.01)
    assert 0 < m.rel_stderr_median < 0.001
    assert not m.side_work_suspect and m.host_ratio == pytest.approx(0.99, abs=0.01)
    assert m.samples_ms == ()


def test_summarize_flags_a_call_whose_host_time_dwarfs_its_events():
    run = Run(device_ms=[0.17] * 30, host_ms=[2.9] * 30, stop="converged", seconds=0.1)
    m = summarize(
        run, WarmUp(3, 0.2, 0.17), config=TimingConfig(), method=METHOD_EVENT, calls=1, flush_ms=0.06,
        input_pool=4, l2_bytes=H200_L2, flush_bytes=256 << 20,
    )  # fmt: skip
    assert m.side_work_suspect


def test_summarize_records_host_ratio_in_the_timing_and_the_launch_ratio():
    run = Run(device_ms=[2.0] * 30, host_ms=[2.1] * 30, stop="converged", seconds=0.1, launch_ms=[1.9] * 30)
    m = summarize(
        run, WarmUp(3, 0.2, 2.0), config=TimingConfig(), method=METHOD_EVENT, calls=1, flush_ms=0.06,
        input_pool=4, l2_bytes=H200_L2, flush_bytes=256 << 20,
    )  # fmt: skip
    assert m.timing.host_ratio == pytest.approx(2.0 / 2.1) and m.timing.graph_ms is None
    assert m.launch_ratio == pytest.approx(0.95)


def test_the_sampling_loop_keeps_each_samples_launch_time():
    clock = FakeClock()

    def sample(i: int) -> Sample:
        clock.now += 1e-3
        return Sample(device_ms=1.0, host_ms=1.1, launch_ms=0.2)

    run = sample_until_stable(sample, TimingConfig(), clock=clock)
    assert list(run.launch_ms) == [0.2] * len(run.device_ms)


def test_measurement_round_trips_through_msgpack():
    m = measurement(1.0)
    assert decode(encode(m), type(m)) == m


# --- precision -----------------------------------------------------------------------------------


@pytest.fixture
def torch_flags():
    """Leave torch's global flags as the test found them."""
    from rewards.verify.precision import restore_flags

    saved = snapshot_flags()
    yield
    restore_flags(saved)


@pytest.mark.parametrize(("mode", "tf32", "matmul"), [("ieee", False, "highest"), ("tf32", True, "high")])
def test_precision_flags_set_the_math_mode(torch_flags, mode, tf32, matmul):
    import torch

    with precision_flags(mode):
        assert torch.backends.cuda.matmul.allow_tf32 is tf32
        assert torch.backends.cudnn.allow_tf32 is tf32
        assert torch.get_float32_matmul_precision() == matmul
        assert torch.backends.cudnn.benchmark is False


def test_precision_flags_restore_every_flag_also_after_an_exception(torch_flags):
    import torch

    torch.set_float32_matmul_precision("medium")
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    before = snapshot_flags()
    for mode in ("ieee", "tf32"):
        with pytest.raises(KeyError), precision_flags(mode):
            raise KeyError("candidate crashed")
        assert changed_flags(before, snapshot_flags()) == {}


def test_snapshot_survives_a_mixed_tf32_api_state(torch_flags):
    import torch

    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip("torch without the new TF32 API")
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # legacy getters now raise
    flags = snapshot_flags()
    assert flags["backends.cuda.matmul.fp32_precision"] == "tf32"
    with precision_flags("ieee"):
        assert torch.backends.cuda.matmul.allow_tf32 is False


def test_changed_flags_catch_a_candidate_enabling_tf32(torch_flags):
    import torch

    with precision_flags("ieee"):
        before = snapshot_flags()
        torch.backends.cuda.matmul.allow_tf32 = True
        assert "backends.cuda.matmul.allow_tf32" in changed_flags(before, snapshot_flags())


def test_policies_are_named_and_fp32_gives_baselines_and_candidate_the_same_mode():
    assert set(POLICIES) == {FP32.name, TF32_BEST.name}
    assert FP32.baseline_modes == (FP32.tolerance_mode,) == ("ieee",)
    assert TF32_BEST.baseline_modes == ("ieee", "tf32") and TF32_BEST.tolerance_mode == "tf32"
    assert policy("fp32-ieee") is FP32
    with pytest.raises(ValueError):
        policy("bf16-anything-goes")


# --- baselines: keys, cache, selection, task loading --------------------------------------------

KEY_ARGS = dict(
    gpu_name="NVIDIA H200", torch_version="2.11.0+cu130", cuda_version="13.0", config=TimingConfig()
)
TINY_TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8) * scale)

    def forward(self, x):
        return torch.relu(x * self.w)

def get_inputs():
    return [torch.rand(4, 8)]

def get_init_inputs():
    return [2.0]
"""


def baselines_value(eager_ms=2.0, compile_ms=1.0, *, policy_name=FP32.name, method=METHOD_EVENT) -> Baselines:
    runs = (
        SubjectRun(subject="eager", mode="ieee", measurement=measurement(eager_ms, method=method)),
        SubjectRun(subject="compile", mode="ieee", measurement=measurement(compile_ms, method=method)),
    )
    return Baselines(
        key=make_key("src", policy_name=policy_name, **KEY_ARGS),
        eager=runs[0],
        compiled=runs[1],
        method=method,
        compile_s=12.0,
        runs=runs,
    )


def test_cache_key_changes_with_task_gpu_stack_policy_and_config():
    base = make_key("src", policy_name=FP32.name, **KEY_ARGS)
    assert base == make_key("src", policy_name=FP32.name, **KEY_ARGS)
    variants = [
        make_key("src2", policy_name=FP32.name, **KEY_ARGS),
        make_key("src", policy_name=TF32_BEST.name, **KEY_ARGS),
        make_key("src", policy_name=FP32.name, **{**KEY_ARGS, "gpu_name": "NVIDIA H100 80GB HBM3"}),
        make_key("src", policy_name=FP32.name, **{**KEY_ARGS, "torch_version": "2.12.0"}),
        make_key("src", policy_name=FP32.name, **{**KEY_ARGS, "cuda_version": "12.8"}),
        make_key("src", policy_name=FP32.name, **{**KEY_ARGS, "config": TimingConfig(min_samples=50)}),
    ]
    assert len({base.digest(), *(v.digest() for v in variants)}) == len(variants) + 1


def test_cache_round_trip_marks_hits_and_leaves_no_temp_files(tmp_path):
    cache = BaselineCache(tmp_path / "baselines")
    value = baselines_value()
    assert cache.get(value.key) is None
    cache.put(value)
    hit = cache.get(value.key)
    assert hit is not None and hit.cached
    assert msgspec.structs.replace(hit, cached=False) == value
    assert [p.name for p in (tmp_path / "baselines").iterdir()] == [f"{value.key.digest()}.json"]


def test_corrupt_or_foreign_cache_files_are_misses(tmp_path):
    cache = BaselineCache(tmp_path)
    value = baselines_value()
    cache.path(value.key).write_bytes(b'{"truncated": ')
    assert cache.get(value.key) is None
    other = baselines_value(policy_name=TF32_BEST.name)
    cache.path(value.key).write_bytes(msgspec.json.encode(other))  # right file name, wrong key
    assert cache.get(value.key) is None


def test_fastest_picks_the_faster_mode_per_subject():
    runs = [
        SubjectRun(subject="eager", mode="ieee", measurement=measurement(3.0)),
        SubjectRun(subject="eager", mode="tf32", measurement=measurement(1.0)),
        SubjectRun(subject="compile", mode="ieee", measurement=measurement(2.0)),
    ]
    assert fastest(runs, "eager").mode == "tf32"
    assert fastest(runs, "compile").mode == "ieee"


def test_report_gives_speedups_with_noise_and_refuses_mixed_methods():
    r = report(measurement(0.5, rel=0.002), baselines_value(eager_ms=2.0, compile_ms=1.0))
    assert r.speedup_vs_eager.value == pytest.approx(4.0, rel=0.01)
    assert r.speedup_vs_compile.value == pytest.approx(2.0, rel=0.01)
    assert r.speedup_vs_compile.rel_err == pytest.approx(math.hypot(r.compile_noise, r.candidate_noise))
    with pytest.raises(ValueError):
        report(measurement(0.5, method=METHOD_GRAPH), baselines_value())


def test_baseline_request_round_trips_as_a_job_payload():
    request = BaselineRequest(source=TINY_TASK, name="tiny", config=TimingConfig(min_samples=5))
    assert decode(encode(request), BaselineRequest) == request


def test_load_task_builds_the_model_and_seeded_inputs_on_the_device():
    import torch

    model, make_inputs = load_task(TINY_TASK, init_seed=0, input_seed=5, device="cpu")
    (x0,), (x0_again,), (x1,) = make_inputs(0), make_inputs(0), make_inputs(1)
    assert torch.equal(x0, x0_again) and not torch.equal(x0, x1)
    assert model(x0).shape == (4, 8)
    again, _ = load_task(TINY_TASK, init_seed=0, device="cpu")
    assert torch.equal(model.w, again.w)


def test_timing_modules_import_without_torch_or_cupy():
    code = (
        "import sys\n"
        "import rewards.timing.sampling, rewards.timing.stats, rewards.timing.gpu_timer, rewards.timing.clocks\n"
        "import rewards.verify.precision, rewards.timing.baselines\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cupy'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_clock_reader_never_fails_without_a_driver():
    from rewards.timing.clocks import ClockReader

    info = ClockReader("0000:00:00.0", "none")()
    assert info.gpu_name == "none"
