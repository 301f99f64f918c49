"""GPU timing on a real device: reproducible, flushes enough, graph mode agrees with event mode,
side-stream work is flagged, the KernelBench 19_ReLU baselines run and cache. Marker `gpu`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rewards.timing.gpu_timer import measure
from rewards.timing.sampling import METHOD_EVENT, METHOD_GRAPH, TimingConfig, forced
from rl.data.kernelbench import default_problems_path

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]


def scale_kernel(n: int):
    """y = 2x as one torch kernel over n fp32 elements (8n bytes moved), inputs rotated."""
    import torch

    def make_inputs(i: int):
        g = torch.Generator("cuda").manual_seed(i)
        return torch.rand(n, device="cuda", generator=g), torch.empty(n, device="cuda")

    return (lambda x, y: torch.mul(x, 2.0, out=y)), make_inputs


def relu_source() -> str:
    rows = (json.loads(line) for line in default_problems_path().read_text().splitlines())
    return next(r["code"] for r in rows if r["level"] == 1 and r["name"] == "19_ReLU")


def test_timing_a_known_kernel_twice_agrees_within_two_percent():
    fn, make_inputs = scale_kernel(1 << 26)  # 512 MB moved: ~130-170 us
    first = measure(fn, make_inputs)
    second = measure(fn, make_inputs)
    assert first.timing.method == second.timing.method == METHOD_EVENT
    assert abs(first.timing.median_ms - second.timing.median_ms) <= 0.02 * first.timing.median_ms
    assert first.stop == "converged" and first.rel_stderr_median <= 0.005


def test_l2_flush_buffer_is_at_least_twice_the_l2():
    import torch

    fn, make_inputs = scale_kernel(1 << 20)
    m = measure(fn, make_inputs, TimingConfig(min_samples=5, max_time_s=0.5))
    assert m.l2_bytes == torch.cuda.get_device_properties(0).L2_cache_size
    assert m.flush_bytes >= 2 * m.l2_bytes
    assert m.flush_ms > 0


def test_graph_mode_agrees_with_event_mode_for_a_100_us_kernel():
    fn, make_inputs = scale_kernel(48 << 20)  # 384 MB moved: ~90-130 us
    event = measure(fn, make_inputs, forced(TimingConfig(), METHOD_EVENT))
    graph = measure(fn, make_inputs, forced(TimingConfig(), METHOD_GRAPH))
    assert graph.timing.method == METHOD_GRAPH and graph.calls_per_sample > 1
    # Within 3%, or within the few microseconds of launch gap an event-timed sample carries and a
    # graph replay of back-to-back calls does not (on an H200 this kernel takes ~96 us, the gap ~4 us).
    gap_ms = abs(graph.timing.median_ms - event.timing.median_ms)
    assert gap_ms <= max(0.03 * event.timing.median_ms, 0.006), (graph.timing, event.timing)


def test_microsecond_calls_switch_to_graph_mode():
    fn, make_inputs = scale_kernel(1 << 16)
    m = measure(fn, make_inputs)
    assert m.timing.method == METHOD_GRAPH
    assert m.timing.median_ms < 0.05


def test_side_stream_work_is_flagged_and_honest_work_is_not():
    import torch

    from rewards.verify.precision import precision_flags

    side = torch.cuda.Stream()

    def make_inputs(i: int):
        g = torch.Generator("cuda").manual_seed(i)
        return torch.rand(4096, 4096, device="cuda", generator=g), torch.rand(4096, 4096, device="cuda")

    def cheat(a, b):  # rewards/README.md, hack 7: the events never see this matmul
        with torch.cuda.stream(side):
            return a @ b

    config = forced(TimingConfig(max_time_s=1.0), METHOD_EVENT)
    with precision_flags("ieee"):
        honest = measure(torch.mm, make_inputs, config)
        hidden = measure(cheat, make_inputs, config)
    assert not honest.side_work_suspect and honest.host_ratio > 0.8
    assert hidden.side_work_suspect and hidden.host_ratio < 0.5


def test_relu_baselines_run_restore_flags_and_cache(tmp_path):
    from rewards.timing.baselines import BaselineRequest, measure_baselines
    from rewards.verify.precision import changed_flags, snapshot_flags

    before = snapshot_flags()
    request = BaselineRequest(source=relu_source(), name="19_ReLU", cache_dir=str(tmp_path))
    fresh = measure_baselines(request)
    assert changed_flags(before, snapshot_flags()) == {}
    assert not fresh.cached and fresh.method == METHOD_EVENT
    assert fresh.eager.measurement.timing.median_ms > 1.0  # 12.9 GB moved
    assert fresh.compiled.measurement.timing.median_ms > 1.0
    assert fresh.compile_s > 0
    again = measure_baselines(request)
    assert again.cached and again.eager == fresh.eager and again.compiled == fresh.compiled
