"""GPU timing of one callable: `measure(fn, make_inputs, config) -> Measurement` and
`time_gpu(...) -> Timing`, with CuPy events and an L2-flush memset on torch's current stream,
NVML clocks and CUDA-graph capture around the pure sampling loop of `rewards.timing.sampling`;
`SubjectTimer` is one callable's warm-up, method and sampler (`rewards.timing.paired_timer` times
several of them together with it).

Importing this module does not touch CUDA (cupy and torch are imported inside functions); it must
run in a GPU worker process. The sample layout and the choices behind it are at `Gpu.timed`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgspec

from rewards.timing import stats
from rewards.timing.sampling import (
    METHOD_EVENT,
    METHOD_GRAPH,
    GraphCaptureError,
    Measurement,
    Run,
    Sample,
    Sampler,
    TimingConfig,
    WarmUp,
    flush_bytes,
    graph_calls,
    pool_size,
    sample_until_stable,
    summarize,
    use_graph,
    warm_up,
)
from rewards.verdict import ClockInfo, Timing


class Gpu:
    """The current device as the timer sees it: its stream, flush buffer, events and clocks."""

    def __init__(self, config: TimingConfig) -> None:
        import cupy
        import torch

        from rewards.timing.clocks import ClockReader

        self.index = torch.cuda.current_device()
        props = cupy.cuda.runtime.getDeviceProperties(self.index)
        name = props["name"]
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self.l2_bytes = int(props["l2CacheSize"])
        torch_stream = torch.cuda.current_stream()
        self.stream_ptr = torch_stream.cuda_stream
        self.stream = external_stream(torch_stream, self.index)
        self.flush_buffer = _flush_buffer(self.index, flush_bytes(self.l2_bytes, config))
        self.start, self.end = cupy.cuda.Event(), cupy.cuda.Event()
        self.clocks = ClockReader(cupy.cuda.runtime.deviceGetPCIBusId(self.index), self.name)
        self._runtime, self._elapsed = cupy.cuda.runtime, cupy.cuda.get_elapsed_time
        self._fill = 0

    def flush(self) -> None:
        self._fill = (self._fill + 1) & 0xFF  # a new byte each time: every line really changes
        buf = self.flush_buffer
        self._runtime.memsetAsync(buf.data_ptr(), self._fill, buf.numel(), self.stream_ptr)

    def timed(self, call: Callable[[], Any]) -> Sample:
        """One sample in event mode:

            memset of a buffer >= 2x L2 on the stream  # flushes L2 and keeps the GPU busy, so the
            host clock h0                              #   call's launch latency and Python overhead
            start event on the stream                  #   queue behind it instead of being timed
            call()
            end event on the stream
            device-wide synchronize; host clock h1     # waits for every stream, not just this one
            device = elapsed(start, end); host = h1 - h0; launch = (return of call()) - h0

        The end event is recorded right after the call, not after the synchronize: there it
        would see side-stream work too, but every sample would also carry the synchronize
        wake-up plus one launch onto an idle GPU (16-30 us on an H200), a constant 1-3% on a
        millisecond kernel that pulls every speedup toward 1. So the events time the stream
        exactly, the synchronize keeps samples apart, and the host interval is the cross-check
        (`rewards.timing.stats.side_work_suspect`).
        """
        self.flush()
        h0 = time.perf_counter()
        self.start.record(self.stream)
        call()
        launched = time.perf_counter()
        self.end.record(self.stream)
        self._runtime.deviceSynchronize()
        host_ms = (time.perf_counter() - h0) * 1e3
        return Sample(self._elapsed(self.start, self.end), host_ms, (launched - h0) * 1e3)

    def flush_ms(self, repeats: int = 5) -> float:
        """Duration of one flush on its own: the lead it gives the timed call."""
        times = []
        for _ in range(repeats):
            self.start.record(self.stream)
            self.flush()
            self.end.record(self.stream)
            self._runtime.deviceSynchronize()
            times.append(self._elapsed(self.start, self.end))
        return stats.median(times)

    def clock_ready(self, config: TimingConfig) -> Callable[[], bool] | None:
        top = self.clocks.max_sm_clock_mhz()
        if top is None:
            return None

        def ready() -> bool:
            now = self.clocks().sm_clock_mhz
            return now is None or now >= config.clock_ready_fraction * top

        return ready


def external_stream(torch_stream: Any, device: int) -> Any:
    """torch's stream as a CuPy stream: `Stream.from_external` (CUDA stream protocol, CuPy 14),
    else the older `ExternalStream` (deprecated in CuPy 14)."""
    import cupy

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None and hasattr(torch_stream, "__cuda_stream__"):
        try:
            stream = from_external(torch_stream)
            if stream.ptr == torch_stream.cuda_stream:
                return stream
        except (TypeError, ValueError):
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(torch_stream.cuda_stream, device)


_FLUSH_BUFFERS: dict[int, Any] = {}  # device -> torch uint8 tensor, reused across measurements


def _flush_buffer(device: int, nbytes: int) -> Any:
    """A torch-allocated buffer (one allocator for everything) of at least `nbytes`."""
    import torch

    buf = _FLUSH_BUFFERS.get(device)
    if buf is None or buf.numel() < nbytes:
        buf = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
        _FLUSH_BUFFERS[device] = buf
    return buf


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """A collection inside a timed call would leave the GPU idle: collect now, pause, restore."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _input_set(make_inputs: Callable[[int], Sequence[Any]], i: int) -> tuple:
    values = make_inputs(i)
    return tuple(values) if isinstance(values, (list, tuple)) else (values,)


def build_pool(make_inputs: Callable[[int], Sequence[Any]], config: TimingConfig) -> list[tuple]:
    """Input sets 0..k-1, k = config.input_pool or fewer when they would exceed the memory cap."""
    first = _input_set(make_inputs, 0)
    size = pool_size(sum(getattr(x, "nbytes", 0) for x in first), config)
    return [first] + [_input_set(make_inputs, i) for i in range(1, size)]


def graph_sampler(gpu: Gpu, fn: Callable[..., Any], pool: list[tuple], calls: int) -> tuple[Sampler, Any]:
    """Capture `calls` calls (inputs rotated) in one graph; a sample is a flushed replay / calls."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream before capture (torch's advice)
        for j in range(3):
            fn(*pool[j % len(pool)])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for j in range(calls):
            fn(*pool[j % len(pool)])
    for _ in range(3):  # the first replays upload the graph: keep them out of the samples
        graph.replay()
    torch.cuda.synchronize()

    def sample(i: int) -> Sample:
        s = gpu.timed(graph.replay)
        return Sample(s.device_ms / calls, s.host_ms / calls, s.launch_ms / calls)

    return sample, graph


class SubjectTimer:
    """One callable on a `Gpu` with its input pool: the warm-up, the timing method, the sampler
    and the Measurement. `measure` times one subject with it, `rewards.timing.paired_timer` several in rounds.

    Example (in a GPU worker, inside `cupy.cuda.Device(gpu.index)` with the GC paused):
        timer = SubjectTimer(gpu, model, pool, config)
        warm = timer.warm_up()
        run = sample_until_stable(timer.sample, config)
        m = timer.summary(run, flush_ms=gpu.flush_ms(), before=None, after=gpu.clocks())
    """

    def __init__(self, gpu: Gpu, fn: Callable[..., Any], pool: list[tuple], config: TimingConfig) -> None:
        self.gpu, self.fn, self.pool, self.config = gpu, fn, pool, config
        self.sample: Sampler = self.event_sample
        self.method, self.calls, self.graph_error, self.graph = METHOD_EVENT, 1, "", None
        self.warm = WarmUp(calls=0, seconds=0.0, estimate_ms=0.0)

    def event_sample(self, i: int) -> Sample:
        return self.gpu.timed(functools.partial(self.fn, *self.pool[i % len(self.pool)]))

    def warm_up(self, warmup_s: float | None = None) -> WarmUp:
        """`rewards.timing.sampling.warm_up` in event mode, for `warmup_s` (default: the config's)."""
        config = self.config if warmup_s is None else msgspec.structs.replace(self.config, warmup_s=warmup_s)
        self.warm = warm_up(self.event_sample, config, clock_ready=self.gpu.clock_ready(config))
        return self.warm

    def capture(self) -> None:
        """Time CUDA-graph replays from now on; GraphCaptureError when the call cannot be captured
        (it synchronizes, allocates outside torch, or launches on a stream that does not join)."""
        calls = graph_calls(self.config, self.warm.estimate_ms)
        try:
            self.sample, self.graph = graph_sampler(self.gpu, self.fn, self.pool, calls)
        except RuntimeError as exc:
            raise GraphCaptureError(f"{type(exc).__name__}: {exc}") from exc
        self.method, self.calls = METHOD_GRAPH, calls

    def to_events(self, why: str) -> None:
        """Back to event mode (a capture failed here or in another subject of the same task)."""
        self.sample, self.method, self.calls, self.graph = self.event_sample, METHOD_EVENT, 1, None
        self.graph_error = why[:300]

    def release(self) -> None:
        self.graph = None

    def summary(self, run: Run, *, flush_ms: float, before: ClockInfo | None, after: ClockInfo | None) -> Measurement:
        return summarize(
            run,
            self.warm,
            config=self.config,
            method=self.method,
            calls=self.calls,
            flush_ms=flush_ms,
            input_pool=len(self.pool),
            l2_bytes=self.gpu.l2_bytes,
            flush_bytes=self.gpu.flush_buffer.numel(),
            clocks_before=before,
            clocks_after=after,
            sm_clock_max_mhz=self.gpu.clocks.max_sm_clock_mhz(),
            graph_error=self.graph_error,
        )


def measure(
    fn: Callable[..., Any],
    make_inputs: Callable[[int], Sequence[Any]],
    config: TimingConfig = TimingConfig(),
) -> Measurement:
    """Time `fn(*inputs)` on the current CUDA device and torch stream.

    `make_inputs(i)` returns the i-th input set, already on the device. A call that raises
    propagates; a candidate's failure is the caller's to turn into a verdict."""
    import cupy

    gpu = Gpu(config)
    with cupy.cuda.Device(gpu.index), gc_paused():
        timer = SubjectTimer(gpu, fn, build_pool(make_inputs, config), config)
        before, flush_ms = gpu.clocks(), gpu.flush_ms()
        warm = timer.warm_up()
        if use_graph(config, warm.estimate_ms):
            try:
                timer.capture()
            except GraphCaptureError as exc:
                if config.graph == "always":
                    raise
                timer.to_events(str(exc))
        run = sample_until_stable(timer.sample, config)
        after = gpu.clocks()
        timer.release()
    return timer.summary(run, flush_ms=flush_ms, before=before, after=after)


def time_gpu(
    fn: Callable[..., Any],
    make_inputs: Callable[[int], Sequence[Any]],
    config: TimingConfig = TimingConfig(),
) -> Timing:
    """`measure(...).timing`: the median per-call time and its noise."""
    return measure(fn, make_inputs, config).timing
