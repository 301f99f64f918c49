"""The pure half of GPU timing: the config, the sampling loop and the summary of one callable.

One sample flushes L2, times one call between CUDA events on torch's current stream, then
synchronizes the device (the layout and its reasons: `rewards.timing.gpu_timer.Gpu.timed`).
Around the samples: inputs rotate through a pool, the warm-up runs by time and SM clock, the
result is the median and sampling stops when its standard error is small; calls under 50 us are
timed as CUDA-graph replays. `rewards.timing.gpu_timer.measure` drives this loop on a GPU; tests
drive it on a CPU with fake samplers and clocks. It imports without CuPy or torch.

What it is not: no statistics (`rewards.timing.stats`), no correctness check, no precision flags
(`rewards.verify.precision`), no baselines (`rewards.timing.baselines`), no reward.

Example (with `rewards.timing.gpu_timer.measure`, in a GPU worker process):
    x = torch.rand(1 << 26, device="cuda")
    m = measure(torch.relu, lambda i: (torch.rand_like(x),), TimingConfig())
    m.timing.median_ms, m.rel_stderr_median, m.clocks_after.sm_clock_mhz
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import msgspec
from msgspec import Struct

from rewards.timing import stats
from rewards.verdict import ClockInfo, Timing

METHOD_EVENT = "cuda_event+l2_flush"
METHOD_GRAPH = "cuda_graph+l2_flush"
MIN_SAMPLES_ON_TIMEOUT = 3  # a time-capped run still needs a median of something


class GraphCaptureError(RuntimeError):
    """`graph="always"` and the call could not be captured (it synchronizes, allocates outside
    torch, or launches on a stream that does not join the capture)."""


class TimingConfig(Struct, frozen=True, kw_only=True):
    warmup_s: float = 0.2
    """Warm-up of at least this long (samples discarded): the SM clock climbs from 345 MHz idle."""
    warmup_max_s: float = 1.0
    """Warm-up goes on past warmup_s, up to this long, while the SM clock is below ready."""
    warmup_ready_s: float = 0.05
    """Warm-up instead of warmup_s when the SM clock already reads ready after the first call (a
    GPU that has just run other work): warmup_s is there for the clock to climb."""
    warmup_min_calls: int = 3
    """Warm-up calls at least, whatever the time; the first (module load, autotuning, handle
    creation, NVRTC) does not count toward warmup_s."""
    clock_ready_fraction: float = 0.8
    """The SM clock counts as up at this fraction of its maximum (when NVML can read it)."""
    min_samples: int = 20
    """Samples before the stopping rule may declare convergence."""
    max_samples: int = 2000
    """Cap on samples, converged or not."""
    max_time_s: float = 5.0
    """Cap on sampling time after the warm-up (once MIN_SAMPLES_ON_TIMEOUT samples exist)."""
    target_rel_stderr: float = 0.005
    """Stop when the standard error of the median is at most this fraction of the median."""
    check_every: int = 10
    """Samples between two evaluations of the stopping rule."""
    flush_factor: float = 2.0
    """The L2 flush buffer is at least this many times the device's L2 size."""
    flush_min_mib: int = 256
    """...and at least this many MiB (triton do_bench and KernelBench flush 256 MB)."""
    input_pool: int = 4
    """Input sets rotated through (defeats caching by pointer); fewer if over the memory cap."""
    input_pool_max_gib: float = 16.0
    """Memory cap of the input pool; a single set larger than this still makes a pool of one."""
    graph: Literal["auto", "always", "never"] = "auto"
    """CUDA-graph replay: auto = when a warm-up call is shorter than graph_threshold_us."""
    graph_threshold_us: float = 50.0
    """Below this per-call time launch overheads rival the kernel: time graph replays."""
    graph_replay_us: float = 1000.0
    """Calls per captured graph are chosen so that one replay lasts about this long."""
    graph_max_calls: int = 100
    """Cap on calls captured in one graph (each keeps its outputs in the graph's pool)."""
    host_slack_ms: float = 0.05
    """Host minus device time allowed beyond the flush lead before side work is suspected."""
    host_slack_rel: float = 0.1
    """...plus this fraction of the host time (synchronize latency, Python)."""
    outlier_mads: float = 10.0
    """A sample above the median by this many robust sigmas counts as an outlier (kept)."""
    keep_samples: bool = False
    """Return the per-call samples in the Measurement (for benchmarks and debugging)."""


class Measurement(Struct, frozen=True, kw_only=True):
    """A `Timing` and the evidence behind it. Times are per call, milliseconds."""

    timing: Timing
    stop: str  # converged | max_samples | max_time
    rel_stderr_median: float  # the stopping statistic (Timing.rel_stderr is the mean's)
    outliers: int
    calls_per_sample: int  # 1 in event mode, N in graph mode
    input_pool: int
    warmup_calls: int
    warmup_s: float
    sampling_s: float
    l2_bytes: int
    flush_bytes: int
    flush_ms: float
    host_median_ms: float
    host_ratio: float  # device median / host median: near 1 for an honest millisecond call
    side_work_suspect: bool
    launch_ratio: float = 0.0
    """Median host time to launch the call (return of the call) over the device median: near 1
    or above when the GPU waited for the host's launches (launch-bound); 0 when not measured."""
    clocks_before: ClockInfo | None = None
    clocks_after: ClockInfo | None = None
    sm_clock_max_mhz: float | None = None
    graph_error: str = ""  # why auto mode fell back to events, if it did
    samples_ms: tuple[float, ...] = ()
    graph_info_ms: float | None = None
    """A launch-bound subject's time per call as a CUDA-graph replay, for information only
    (rewards.timing.paired); None when not measured."""
    graph_info_error: str = ""
    """Why that graph could not be captured or replayed, if it could not."""


class Sample(NamedTuple):
    device_ms: float
    host_ms: float
    launch_ms: float = 0.0  # host time until the call returned (its launches), 0 if not measured


Sampler = Callable[[int], Sample]  # sample(i): one timed call on input set i
Clock = Callable[[], float]  # seconds, monotonic


# ---------------------------------------------------------------------------------------------
# The pure core: sizes, decisions, the stopping rule and the sampling loop.


def config_hash(config: TimingConfig) -> str:
    """Stable digest of every field, for cache keys."""
    return hashlib.sha256(msgspec.json.encode(config)).hexdigest()[:16]


def forced(config: TimingConfig, method: str) -> TimingConfig:
    """The config that times with `method` whatever the call length. All subjects of one task
    must use one method (`rewards.reward` refuses to compare two), so the candidate is timed
    with the method its baselines chose."""
    graph = {METHOD_GRAPH: "always", METHOD_EVENT: "never"}[method]
    return msgspec.structs.replace(config, graph=graph)


def flush_bytes(l2_bytes: int, config: TimingConfig) -> int:
    return max(math.ceil(config.flush_factor * l2_bytes), config.flush_min_mib << 20)


def pool_size(set_bytes: int, config: TimingConfig) -> int:
    fit = int(config.input_pool_max_gib * (1 << 30)) // max(set_bytes, 1)
    return max(1, min(config.input_pool, fit))


# CUDA-graph mode, for calls under `graph_threshold_us`, where the harness and not the kernel
# decides the number: N calls (inputs rotated) are captured in one graph and a sample is one
# flushed replay / N. Only the first call of a replay sees a cold L2, which does not matter at
# that size. KernelBench-style tasks mostly run 1-15 ms (v0.1 sizes on an H100; the CUDA Agent
# paper's data filter keeps eager 1-100 ms), so event mode is the common path.
def use_graph(config: TimingConfig, call_ms: float) -> bool:
    if config.graph != "auto":
        return config.graph == "always"
    return call_ms * 1e3 < config.graph_threshold_us


def graph_calls(config: TimingConfig, call_ms: float) -> int:
    per_call_us = max(call_ms * 1e3, 1e-3)
    return max(1, min(config.graph_max_calls, math.ceil(config.graph_replay_us / per_call_us)))


def stop_reason(samples: Sequence[float], elapsed_s: float, config: TimingConfig) -> str | None:
    """converged | max_samples | max_time, or None to keep sampling.

    Converged: `min_samples` exist and the standard error of the median is at most
    `target_rel_stderr` (0.5%) of it. That statistic is `Measurement.rel_stderr_median`, which
    speedups use (`rewards.timing.baselines.report`); `Timing.rel_stderr` keeps its meaning (the
    mean's)."""
    n = len(samples)
    if n >= config.min_samples and stats.rel_stderr_median(samples) <= config.target_rel_stderr:
        return "converged"
    if n >= config.max_samples:
        return "max_samples"
    if elapsed_s >= config.max_time_s and n >= MIN_SAMPLES_ON_TIMEOUT:
        return "max_time"
    return None


class WarmUp(NamedTuple):
    calls: int
    seconds: float
    estimate_ms: float  # median of the second half: the call length that picks the method
    launch_ratio: float = 0.0  # as Measurement.launch_ratio, over the second half; 0 when not measured


def warm_up(
    sample: Sampler,
    config: TimingConfig,
    *,
    clock: Clock = time.perf_counter,
    clock_ready: Callable[[], bool] | None = None,
) -> WarmUp:
    """Call until warmup_s has passed, then on while the SM clock is not ready (up to warmup_max_s).
    The clock starts after the first call, which may compile, load modules or autotune. Warm-up
    goes by time because the SM clock climbs from idle (345 MHz) to 1980 MHz under load on an
    H200; `clock_ready` says when NVML reads it at `clock_ready_fraction` of its maximum. When it
    already does after the first call, `warmup_ready_s` replaces warmup_s (if shorter)."""
    first = sample(0)
    times, launches = [first.device_ms], [first.launch_ms]
    floor_s = config.warmup_s
    if clock_ready is not None and clock_ready():
        floor_s = min(floor_s, config.warmup_ready_s)
    start = clock()
    while True:
        s = sample(len(times))
        times.append(s.device_ms)
        launches.append(s.launch_ms)
        elapsed = clock() - start
        if len(times) < config.warmup_min_calls or elapsed < floor_s:
            continue
        if elapsed >= config.warmup_max_s or clock_ready is None or clock_ready():
            half = len(times) // 2
            estimate = stats.median(times[half:])
            launch = stats.median(launches[half:])
            return WarmUp(len(times), elapsed, estimate, launch / estimate if estimate > 0 else 0.0)


class Run(NamedTuple):
    device_ms: list[float]
    host_ms: list[float]
    stop: str
    seconds: float
    launch_ms: Sequence[float] = ()


def sample_until_stable(sample: Sampler, config: TimingConfig, *, clock: Clock = time.perf_counter) -> Run:
    """Sample until `stop_reason` says so, evaluating it every `check_every` samples or at the cap."""
    start, device, host, launch = clock(), [], [], []
    while True:
        s = sample(len(device))
        device.append(s.device_ms)
        host.append(s.host_ms)
        launch.append(s.launch_ms)
        elapsed = clock() - start
        due = len(device) % config.check_every == 0 or elapsed >= config.max_time_s
        reason = stop_reason(device, elapsed, config) if due or len(device) >= config.max_samples else None
        if reason is not None:
            return Run(device, host, reason, elapsed, launch)


def summarize(
    run: Run,
    warm: WarmUp,
    *,
    config: TimingConfig,
    method: str,
    calls: int,
    flush_ms: float,
    **evidence: Any,
) -> Measurement:
    """A Measurement from a finished run; `evidence` fills the device-side fields."""
    device_median = stats.median(run.device_ms)
    host_median = stats.median(run.host_ms)
    # The host interval of a sample is the cross-check of its events: work the events do not see
    # (a side stream) shows up only there. The flag is reported in the Measurement; SIDE_STREAM
    # verdicts come from the verifier's own stream checks (rewards.verify.judge).
    suspect = stats.side_work_suspect(
        device_median,
        host_median,
        lead_ms=flush_ms / calls,
        slack_ms=config.host_slack_ms / calls,
        slack_rel=config.host_slack_rel,
    )
    host_ratio = device_median / host_median if host_median > 0 else math.inf
    timing = Timing.from_samples(run.device_ms, method=method, clocks=evidence.get("clocks_after"))
    launch_median = stats.median(run.launch_ms) if run.launch_ms else 0.0
    return Measurement(
        timing=msgspec.structs.replace(timing, host_ratio=host_ratio if math.isfinite(host_ratio) else None),
        stop=run.stop,
        rel_stderr_median=stats.rel_stderr_median(run.device_ms),
        outliers=stats.count_outliers(run.device_ms, config.outlier_mads),
        calls_per_sample=calls,
        warmup_calls=warm.calls,
        warmup_s=warm.seconds,
        sampling_s=run.seconds,
        flush_ms=flush_ms,
        host_median_ms=host_median,
        host_ratio=host_ratio,
        side_work_suspect=suspect,
        launch_ratio=launch_median / device_median if device_median > 0 else 0.0,
        samples_ms=tuple(run.device_ms) if config.keep_samples else (),
        **evidence,
    )
