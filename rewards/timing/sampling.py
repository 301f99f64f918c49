"""GPU timing of one callable: CuPy events on torch's current stream, L2 flushed before every
sample, inputs rotated, warm-up by time, median with adaptive repetitions, clocks logged.

What it is: the pure half of `rewards.timing.gpu_timer.measure` (which returns a `Measurement`,
a `Timing` plus the evidence behind it): the config, the sampling loop (`warm_up`,
`sample_until_stable`, `stop_reason`) over any sampler and clock, so tests drive it on a CPU with
fakes, and the summary. The statistics are in `rewards.timing.stats`. This module imports on a
machine without CuPy or torch.

What it is not: no correctness check, no precision flags (`rewards.verify.precision`), no baselines
(`rewards.timing.baselines`), no reward (`rewards.reward`). It must run in a GPU worker process.

One sample in event mode (REFERENCE.md section 4):

    memset of a buffer >= 2x L2 on the stream  # flushes L2 and keeps the GPU busy, so the call's
    host clock h0                              #   launch latency and Python overhead queue
    start event on the stream                  #   behind it instead of being timed
    fn(*pool[i % len(pool)])
    end event on the stream
    device-wide synchronize; host clock h1     # waits for every stream, not just this one
    device = elapsed(start, end); host = h1 - h0

Why the end event is recorded right after the call and not after the device-wide synchronize:
recorded after a synchronize, the events would see side-stream work too, but every sample would
also carry the synchronize wake-up plus one launch onto an idle GPU (16-30 us on an H200), a
constant 1-3% on a millisecond kernel that pulls every speedup toward 1. So the events time the
candidate's stream exactly, the synchronize keeps samples apart, and the host interval of the
same sample is the cross-check: `side_work_suspect` is set when host - device exceeds the flush
still running at h0 plus a slack (REFERENCE.md section 3, item 7). The verifier turns that flag
into a SIDE_STREAM verdict; this module only reports it.

Around the samples: `input_pool` input sets are made up front and rotated (a cache keyed by
pointer sees a new one each call); the warm-up runs by time (`warmup_s`, the first call not
counted) and, when NVML reads the SM clock, on until it reaches `clock_ready_fraction` of its
maximum (idle 345 MHz, loaded 1980 MHz on an H200); clocks are logged before and after; Python's
GC is paused. The stopping rule runs every `check_every` samples: stop once `min_samples` exist
and the standard error of the median is at most `target_rel_stderr` (0.5%) of it, else at
`max_samples` or `max_time_s`. The result is the median; `Timing.rel_stderr` keeps its meaning
(the mean's), `Measurement.rel_stderr_median` is the stopping statistic, which speedups use
(`rewards.timing.baselines.report`); statistics in `rewards.timing.stats`.

CUDA-graph mode, for calls under `graph_threshold_us` (at that size the harness, not the kernel,
decides the number): N calls (inputs rotated) are captured in one `torch.cuda.CUDAGraph`; a
sample is one flushed replay / N. Only the first call of a replay sees a cold L2, which does not
matter at that size. KernelBench-style tasks are mostly millisecond-scale (v0.1 sizes run 1-15 ms
on an H100; the paper's data filter keeps eager 1-100 ms), so event mode is the common path. All
subjects of one task must use one method (`rewards.reward` refuses to compare two): `forced`
pins the method that the first subject chose.

Example:
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
    clocks_before: ClockInfo | None = None
    clocks_after: ClockInfo | None = None
    sm_clock_max_mhz: float | None = None
    graph_error: str = ""  # why auto mode fell back to events, if it did
    samples_ms: tuple[float, ...] = ()


class Sample(NamedTuple):
    device_ms: float
    host_ms: float


Sampler = Callable[[int], Sample]  # sample(i): one timed call on input set i
Clock = Callable[[], float]  # seconds, monotonic


# ---------------------------------------------------------------------------------------------
# The pure core: sizes, decisions, the stopping rule and the sampling loop.


def config_hash(config: TimingConfig) -> str:
    """Stable digest of every field, for cache keys."""
    return hashlib.sha256(msgspec.json.encode(config)).hexdigest()[:16]


def forced(config: TimingConfig, method: str) -> TimingConfig:
    """The config that times with `method` whatever the call length (same method for all subjects)."""
    graph = {METHOD_GRAPH: "always", METHOD_EVENT: "never"}[method]
    return msgspec.structs.replace(config, graph=graph)


def flush_bytes(l2_bytes: int, config: TimingConfig) -> int:
    return max(math.ceil(config.flush_factor * l2_bytes), config.flush_min_mib << 20)


def pool_size(set_bytes: int, config: TimingConfig) -> int:
    fit = int(config.input_pool_max_gib * (1 << 30)) // max(set_bytes, 1)
    return max(1, min(config.input_pool, fit))


def use_graph(config: TimingConfig, call_ms: float) -> bool:
    if config.graph != "auto":
        return config.graph == "always"
    return call_ms * 1e3 < config.graph_threshold_us


def graph_calls(config: TimingConfig, call_ms: float) -> int:
    per_call_us = max(call_ms * 1e3, 1e-3)
    return max(1, min(config.graph_max_calls, math.ceil(config.graph_replay_us / per_call_us)))


def stop_reason(samples: Sequence[float], elapsed_s: float, config: TimingConfig) -> str | None:
    """converged | max_samples | max_time, or None to keep sampling."""
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


def warm_up(
    sample: Sampler,
    config: TimingConfig,
    *,
    clock: Clock = time.perf_counter,
    clock_ready: Callable[[], bool] | None = None,
) -> WarmUp:
    """Call until warmup_s has passed, then on while the SM clock is not ready (up to warmup_max_s).
    The clock starts after the first call, which may compile, load modules or autotune."""
    times = [sample(0).device_ms]
    start = clock()
    while True:
        times.append(sample(len(times)).device_ms)
        elapsed = clock() - start
        if len(times) < config.warmup_min_calls or elapsed < config.warmup_s:
            continue
        if elapsed >= config.warmup_max_s or clock_ready is None or clock_ready():
            return WarmUp(len(times), elapsed, stats.median(times[len(times) // 2 :]))


class Run(NamedTuple):
    device_ms: list[float]
    host_ms: list[float]
    stop: str
    seconds: float


def sample_until_stable(sample: Sampler, config: TimingConfig, *, clock: Clock = time.perf_counter) -> Run:
    """Sample until `stop_reason` says so, evaluating it every `check_every` samples or at the cap."""
    start, device, host = clock(), [], []
    while True:
        s = sample(len(device))
        device.append(s.device_ms)
        host.append(s.host_ms)
        elapsed = clock() - start
        due = len(device) % config.check_every == 0 or elapsed >= config.max_time_s
        reason = stop_reason(device, elapsed, config) if due or len(device) >= config.max_samples else None
        if reason is not None:
            return Run(device, host, reason, elapsed)


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
    suspect = stats.side_work_suspect(
        device_median,
        host_median,
        lead_ms=flush_ms / calls,
        slack_ms=config.host_slack_ms / calls,
        slack_rel=config.host_slack_rel,
    )
    return Measurement(
        timing=Timing.from_samples(run.device_ms, method=method, clocks=evidence.get("clocks_after")),
        stop=run.stop,
        rel_stderr_median=stats.rel_stderr_median(run.device_ms),
        outliers=stats.count_outliers(run.device_ms, config.outlier_mads),
        calls_per_sample=calls,
        warmup_calls=warm.calls,
        warmup_s=warm.seconds,
        sampling_s=run.seconds,
        flush_ms=flush_ms,
        host_median_ms=host_median,
        host_ratio=device_median / host_median if host_median > 0 else math.inf,
        side_work_suspect=suspect,
        samples_ms=tuple(run.device_ms) if config.keep_samples else (),
        **evidence,
    )
