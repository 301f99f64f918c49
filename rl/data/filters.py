"""Runtime filters of synthesized tasks: a GPU-queue job that runs a candidate and says whether
it is a usable training task, with the measurements behind the answer.

What it is: `run_filters(request) -> FilterResult` and its GPU-queue handler `filter_job`
(kind `KIND`, registered as `HANDLER` in `GpuQueueConfig.handlers`); `filter_on_queue` is the
orchestrator's side (package, submit, decode). The checks follow the paper's data filters
(REFERENCE.md section 1) plus the degenerate-output lessons of section 2 item 13, in order,
cheapest first; the first failing one is the rejection (`FilterResult.reason`, one of `REASONS`):

    load         the source executes, Model builds, get_inputs draws    load_error
    eager        one forward runs eagerly                              eager_error
    finite       the output (task's own inputs) has no NaN/inf         nonfinite
    memory       peak memory of model + inputs + forward <= budget     memory
    deterministic  a second run on the same inputs, other RNG state,   stochastic
                 agrees (dropout, rand in forward, RReLU differ)
    non_constant the output is not one value (within atol/rtol)        constant_output
    input_sensitive outputs for inputs drawn from several distributions   input_independent
                 (the task's own, signed, scaled: `rewards.inputs`) differ pairwise
                 beyond atol/rtol, so a replayed or cached answer cannot pass
    runtime      eager time in [min_ms, max_ms]                         too_fast / too_slow
    compile      torch.compile runs and matches eager within atol/rtol  compile_error / compile_mismatch

Timing: on CUDA `rewards.timing.measure` (CUDA events, L2 flush) with a short `TimingConfig`;
on CPU a host timer (median of `host_repeats` calls), for tests and CPU lanes with a wider window.
Several lanes may share one GPU (`synth` opens one queue per lane): `gpu_lock` names a file whose
exclusive flock is held while this job runs the model, so two jobs' GPU work and timings never
overlap; only torch.compile's code generation (CPU-bound, the slowest step) runs outside it.

What it is not: decontamination (`rl.data.similarity`) or composition; a job that times out or
crashes comes back from `filter_on_queue` as a rejection ("timeout", "crashed").

Example:
    config = GpuQueueConfig(gpus=(0,), handlers={KIND: HANDLER})
    async with GpuQueue(config) as queue:
        result = await filter_on_queue(queue, task, FilterConfig(min_ms=1.0, max_ms=100.0))
        result.ok, result.reason, result.measurements.eager_ms
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import math
import time
import uuid
from collections.abc import Iterator
from typing import Any

from msgspec import Struct

from agentcore.types import Task
from rewards.jobs import Job, JobContext, JobStatus, decode, encode
from rewards.timing import TimingConfig

KIND = "synth_filter"
HANDLER = "rl.data.filters:filter_job"

STAGES = ("load", "eager", "finite", "memory", "deterministic", "non_constant", "input_sensitive", "runtime", "compile")
"""The filters in the order they run; acceptance per filter is counted over these."""

REASONS: dict[str, str] = {
    "load_error": "load", "eager_error": "eager", "nonfinite": "finite", "memory": "memory",
    "stochastic": "deterministic", "constant_output": "non_constant", "input_independent": "input_sensitive",
    "too_fast": "runtime", "too_slow": "runtime", "compile_error": "compile", "compile_mismatch": "compile",
    "timeout": "job", "crashed": "job",
}
"""Rejection reason -> the filter stage that rejected ("job": the queue killed or lost the job)."""

QUICK_TIMING = TimingConfig(warmup_s=0.05, warmup_max_s=0.3, min_samples=5, max_samples=40, max_time_s=1.0,
                            target_rel_stderr=0.02, input_pool=1, graph="never")
"""A filter only needs the order of magnitude: a short run, no CUDA graphs."""


class FilterConfig(Struct, frozen=True, kw_only=True):
    """What a candidate must satisfy, and how it is measured."""

    device: str = "auto"
    """"cuda", "cpu", or "auto" (CUDA when the worker sees a GPU)."""
    min_ms: float = 1.0
    """Eager runtime floor (the paper keeps 1-100 ms)."""
    max_ms: float = 100.0
    """Eager runtime ceiling."""
    memory_gib: float = 16.0
    """Peak memory of model, inputs and one forward (CPU: parameter, input and output bytes)."""
    atol: float = 1e-2
    """Absolute tolerance under which two outputs count as the same (the reward's correctness tolerance)."""
    rtol: float = 1e-2
    """Relative tolerance of the same comparison."""
    repeat_atol: float = 1e-5
    """Two runs on the same inputs may differ by this much (atomics, algorithm choice) and still agree."""
    repeat_rtol: float = 1e-3
    """...plus this fraction of the value."""
    compile: bool = True
    """Run the model under torch.compile and compare with eager."""
    compile_backend: str = "inductor"
    """torch.compile backend (tests on CPU use "eager": dynamo traces, no C++ build)."""
    compile_mode: str = "default"
    """torch.compile mode."""
    timing: TimingConfig = QUICK_TIMING
    """CUDA timing of the eager forward."""
    host_repeats: int = 5
    """CPU: timed calls after one warm-up; the median is the runtime."""
    slow_factor: float = 5.0
    """A first call slower than slow_factor * max_ms is too slow without a precise timing."""
    init_seed: int = 0
    """Seed before Model(*get_init_inputs())."""
    input_seed: int = 1
    """Seed of the first input draw; the other draws derive from it."""
    gpu_lock: str = ""
    """A file to flock while running on the GPU (lanes sharing a GPU); empty: none."""


class FilterRequest(Struct, frozen=True, kw_only=True):
    task_id: str
    source: str
    config: FilterConfig = FilterConfig()


class FilterMeasurements(Struct, frozen=True, kw_only=True):
    """What the filters saw; fields stay None where the run stopped before measuring them."""

    device: str = ""
    eager_ms: float | None = None
    eager_rel_stderr: float | None = None
    timer: str = ""
    first_call_ms: float | None = None
    peak_mem_mib: float | None = None
    param_count: int | None = None
    output_shape: str = ""
    output_std: float | None = None
    repeat_max_diff: float | None = None
    min_pair_diff: float | None = None
    compile_s: float | None = None
    compile_max_diff: float | None = None


class FilterResult(Struct, frozen=True, kw_only=True):
    ok: bool
    reason: str = ""
    message: str = ""
    measurements: FilterMeasurements = FilterMeasurements()

    @property
    def stage(self) -> str:
        return REASONS.get(self.reason, "")


class FilterInfrastructureError(RuntimeError):
    """The filter job failed as a job (the handler raised): a bug or broken worker, not the task."""


class _Reject(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


# ---------------------------------------------------------------------------------------------
# Tensors: outputs as lists, comparisons.


def _tensors(out: Any) -> list:
    import torch

    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        raise _Reject("eager_error", f"forward returned {type(out).__name__}, not tensors")
    return [o.detach() for o in outs]


def _excess(a: list, b: list, atol: float, rtol: float) -> float:
    """max over elements of |a - b| - rtol * |b|, minus atol: <= 0 means allclose."""
    worst = -math.inf
    for x, y in zip(a, b, strict=True):
        x, y = x.float(), y.float()
        worst = max(worst, float(((x - y).abs() - rtol * y.abs()).max()) - atol)
    return worst


def _max_diff(a: list, b: list) -> float:
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))


def _finite(outs: list) -> bool:
    import torch

    return all(bool(torch.isfinite(o.float()).all()) for o in outs)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if hasattr(t, "element_size"))


# ---------------------------------------------------------------------------------------------
# The run.


class _Run:
    """One candidate on one device: the model, its input draws, and the checks."""

    def __init__(self, request: FilterRequest, device: str) -> None:
        self.request, self.config, self.device = request, request.config, device
        self.m: dict[str, Any] = {"device": device}
        self.lock: Any = None  # the flock'd file while the job holds the GPU

    def sync(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

    def forward(self, model, inputs: list, seed: int) -> list:
        import torch

        torch.manual_seed(seed)
        with torch.no_grad():
            return _tensors(model(*inputs))

    def load(self) -> None:
        import torch

        from rewards.inputs import draw_inputs, load_task

        c = self.config
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            self.task = load_task(self.request.source)
            torch.manual_seed(c.init_seed)
            with torch.device(self.device):
                self.model = self.task.Model(*self.task.get_init_inputs())
            self.model = self.model.to(self.device) if isinstance(self.model, torch.nn.Module) else self.model
            self.inputs = draw_inputs(self.task, seed=c.input_seed, variant="task", scale=1.0, device=self.device)
        except torch.OutOfMemoryError as exc:
            raise _Reject("memory", f"out of memory building the model or inputs: {str(exc)[:300]}") from None
        except Exception as exc:  # noqa: BLE001 - task code: any failure is the task's
            raise _Reject("load_error", f"{type(exc).__name__}: {str(exc)[:500]}") from None
        params = self.model.parameters() if isinstance(self.model, torch.nn.Module) else []
        self.m["param_count"] = sum(p.numel() for p in params)

    def eager(self) -> list:
        import torch

        start = time.perf_counter()
        try:
            out = self.forward(self.model, self.inputs, seed=1000)
            self.sync()
        except _Reject:
            raise
        except torch.OutOfMemoryError as exc:
            raise _Reject("memory", f"out of memory in forward: {str(exc)[:300]}") from None
        except Exception as exc:  # noqa: BLE001
            raise _Reject("eager_error", f"{type(exc).__name__}: {str(exc)[:500]}") from None
        self.m["first_call_ms"] = 1e3 * (time.perf_counter() - start)
        self.m["output_shape"] = ";".join("x".join(map(str, o.shape)) for o in out)
        return out

    def check_values(self, out: list) -> None:
        """finite, memory, deterministic, non_constant, input_sensitive."""
        import torch

        c = self.config
        if not _finite(out):
            raise _Reject("nonfinite", "the output on the task's own inputs has NaN or inf")
        self.m["output_std"] = float(torch.cat([o.float().flatten() for o in out]).std()) if sum(o.numel() for o in out) > 1 else 0.0
        self._check_memory(out)
        again = self.forward(self.model, self.inputs, seed=2000)
        self.m["repeat_max_diff"] = _max_diff(out, again)
        if _excess(again, out, c.repeat_atol, c.repeat_rtol) > 0:
            raise _Reject("stochastic", f"two runs on the same inputs differ by up to {self.m['repeat_max_diff']:.3g}")
        constant = [torch.full_like(o, float(o.float().mean())) for o in out]
        if _excess(out, constant, c.atol, c.rtol) <= 0:
            raise _Reject("constant_output", f"the output is one value within atol={c.atol:g} rtol={c.rtol:g}")
        self._check_sensitivity(out)

    def _check_memory(self, out: list) -> None:
        import torch

        if self.device == "cuda":
            peak = torch.cuda.max_memory_allocated()
        else:  # no allocator statistics on CPU: what must exist at once, at least
            params = self.model.parameters() if isinstance(self.model, torch.nn.Module) else []
            peak = _nbytes(list(params)) + _nbytes(self.inputs) + _nbytes(out)
        self.m["peak_mem_mib"] = peak / 2**20
        if peak > self.config.memory_gib * 2**30:
            raise _Reject("memory", f"peak memory {peak / 2**30:.2f} GiB > {self.config.memory_gib:g} GiB")

    def _check_sensitivity(self, out: list) -> None:
        """Outputs for the task's inputs, a second seed, signed and scaled draws differ pairwise."""
        from rewards.inputs import derive_seed, draw_inputs, trial_scale

        c = self.config
        outs = [out]
        for k, variant in enumerate(("task", "signed", "scaled"), start=1):
            seed = derive_seed(c.input_seed, "filter", k)
            inputs = draw_inputs(self.task, seed=seed, variant=variant, scale=trial_scale(seed), device=self.device)
            other = self.forward(self.model, inputs, seed=1000)
            if _finite(other):  # a log of a negative draw: that distribution says nothing
                outs.append(other)
        closest = math.inf
        for i in range(len(outs)):
            for j in range(i + 1, len(outs)):
                closest = min(closest, _max_diff(outs[i], outs[j]))
                if _excess(outs[i], outs[j], c.atol, c.rtol) <= 0:
                    self.m["min_pair_diff"] = closest
                    raise _Reject("input_independent", f"outputs for two different input draws agree within atol={c.atol:g} rtol={c.rtol:g}")
        self.m["min_pair_diff"] = closest

    def runtime(self) -> None:
        c = self.config
        first = self.m["first_call_ms"]
        if first > c.slow_factor * c.max_ms:
            self.m["eager_ms"], self.m["timer"] = first, "first_call"
            raise _Reject("too_slow", f"one eager call took {first:.1f} ms > {c.slow_factor:g} x {c.max_ms:g} ms")
        self._time_cuda() if self.device == "cuda" else self._time_host()
        ms = self.m["eager_ms"]
        if ms < c.min_ms:
            raise _Reject("too_fast", f"eager {ms:.4g} ms < {c.min_ms:g} ms")
        if ms > c.max_ms:
            raise _Reject("too_slow", f"eager {ms:.4g} ms > {c.max_ms:g} ms")

    def _time_cuda(self) -> None:
        from rewards.baselines import measure_model

        try:
            m = measure_model(self.model, lambda i: tuple(self.inputs), self.config.timing)
        except ImportError:  # no CuPy in this environment: torch's own events, no L2 flush
            self._time_torch_events()
            return
        self.m |= {"eager_ms": m.timing.median_ms, "eager_rel_stderr": m.rel_stderr_median, "timer": m.timing.method}

    def _time_torch_events(self) -> None:
        import statistics

        import torch

        samples = []
        for i in range(3 + max(5, self.config.host_repeats)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.forward(self.model, self.inputs, seed=1000)
            end.record()
            torch.cuda.synchronize()
            if i >= 3:  # warm-up calls not counted
                samples.append(start.elapsed_time(end))
        self.m |= {"eager_ms": statistics.median(samples), "timer": "torch_event"}

    def _time_host(self) -> None:
        import statistics

        samples = []
        for _ in range(max(1, self.config.host_repeats)):
            start = time.perf_counter()
            self.forward(self.model, self.inputs, seed=1000)
            samples.append(1e3 * (time.perf_counter() - start))
        self.m |= {"eager_ms": statistics.median(samples), "timer": "host"}

    def compiled(self, out: list) -> None:
        import torch

        c = self.config
        start = time.perf_counter()
        try:
            compiled = torch.compile(self.model, backend=c.compile_backend, mode=c.compile_mode)
            with self._unlocked():
                fused = self.forward(compiled, self.inputs, seed=1000)
                self.sync()
        except torch.OutOfMemoryError as exc:
            raise _Reject("memory", f"out of memory under torch.compile: {str(exc)[:300]}") from None
        except Exception as exc:  # noqa: BLE001 - dynamo/inductor refuse some task code
            raise _Reject("compile_error", f"{type(exc).__name__}: {str(exc)[:500]}") from None
        self.m["compile_s"] = time.perf_counter() - start
        self.m["compile_max_diff"] = _max_diff(fused, out)
        if _excess(fused, out, c.atol, c.rtol) > 0:
            raise _Reject("compile_mismatch", f"torch.compile differs from eager by up to {self.m['compile_max_diff']:.3g}")

    @contextlib.contextmanager
    def _unlocked(self) -> Iterator[None]:
        if self.lock is None:
            yield
            return
        fcntl.flock(self.lock, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_EX)


@contextlib.contextmanager
def _gpu_lock(path: str) -> Iterator[int | None]:
    if not path:
        yield None
        return
    fd = open(path, "rb")  # read-only is enough for flock, and works in a read-only sandbox
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        fd.close()


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def run_filters(request: FilterRequest) -> FilterResult:
    """Every filter in order on this process's device (module docstring); never raises for the task."""
    run = _Run(request, resolve_device(request.config.device))
    try:
        with _gpu_lock(request.config.gpu_lock) as lock:
            run.lock = lock
            run.load()
            out = run.eager()
            run.check_values(out)
            run.runtime()
            if request.config.compile:
                run.compiled(out)
        return FilterResult(ok=True, measurements=FilterMeasurements(**run.m))
    except _Reject as rejection:
        return FilterResult(ok=False, reason=rejection.reason, message=rejection.message,
                            measurements=FilterMeasurements(**run.m))
    except Exception as exc:  # noqa: BLE001 - task code failing in a later run (a draw, a timing call)
        reason = "memory" if type(exc).__name__ == "OutOfMemoryError" else "eager_error"
        return FilterResult(ok=False, reason=reason, message=f"{type(exc).__name__}: {str(exc)[:500]}",
                            measurements=FilterMeasurements(**run.m))
    finally:
        del run
        _release(request.config.compile)


def _release(compiled: bool) -> None:
    """The worker lives on: drop this task's compiled graphs and cached GPU memory."""
    import torch

    if compiled:
        torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def filter_job(payload: bytes, ctx: JobContext) -> bytes:
    """GPU-queue handler: FilterRequest (msgpack) in, FilterResult (msgpack) out."""
    return encode(run_filters(decode(payload, FilterRequest)))


# ---------------------------------------------------------------------------------------------
# The orchestrator's side.


def result_from_job(status: JobStatus, value: bytes, error: str) -> FilterResult:
    """The handler's result; a killed or crashed job is the task's rejection, a raising handler a bug."""
    if status is JobStatus.OK:
        return decode(value, FilterResult)
    if status is JobStatus.TIMEOUT:
        return FilterResult(ok=False, reason="timeout", message=error[-500:])
    if status in (JobStatus.CRASHED, JobStatus.CUDA_POISONED):
        return FilterResult(ok=False, reason="crashed", message=error[-1500:])
    raise FilterInfrastructureError(f"filter job failed: {error[-3000:]}")


async def filter_on_queue(queue, task: Task, config: FilterConfig = FilterConfig(), *,
                          deadline_s: float | None = 300.0) -> FilterResult:
    """Run the filters of `task` on `queue` (a `rewards.gpu_queue.GpuQueue` with `HANDLER` registered)."""
    request = FilterRequest(task_id=task.task_id, source=task.source, config=config)
    job = Job(job_id=f"filter-{task.task_id}-{uuid.uuid4().hex[:8]}", kind=KIND, payload=encode(request),
              deadline_s=deadline_s)
    result = await queue.submit(job)
    return result_from_job(result.status, result.value, result.error)
