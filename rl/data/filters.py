"""Runtime filters of synthesized tasks: a GPU-queue job that runs a candidate and says whether
it is a usable training task, with the measurements behind the answer.

What it is: `run_filters(request) -> FilterResult` and its GPU-queue handler `filter_job`
(kind `KIND`, registered as `HANDLER` in `GpuQueueConfig.handlers`); `filter_on_queue` is the
orchestrator's side (package, submit, decode). The checks (the table at `run_filters`) follow
the CUDA Agent paper's data filters (runs in eager and torch.compile, no stochastic ops, outputs
neither constant nor input-independent, eager time in a window), cheapest first; the first
failing one is the rejection (`FilterResult.reason`, one of `REASONS`).

What it is not: decontamination (`rl.data.similarity`) or composition; a job that times out or
crashes comes back from `filter_on_queue` as a rejection ("timeout", "crashed"). The checks
themselves live in `rl.data.filter_checks`, the Structs and names in `rl.data.filter_types`;
this module re-exports the latter, so callers import everything from `rl.data.filters`.

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
import uuid
from collections.abc import Iterator

from agentcore.types import Task
from rewards.queue.jobs import Job, JobContext, JobStatus, decode, encode
from rl.data.filter_checks import CandidateRun, Reject
from rl.data.filter_types import (
    HANDLER,
    KIND,
    QUICK_TIMING,
    REASONS,
    STAGES,
    FilterConfig,
    FilterInfrastructureError,
    FilterMeasurements,
    FilterRequest,
    FilterResult,
)

__all__ = ["HANDLER", "KIND", "QUICK_TIMING", "REASONS", "STAGES", "FilterConfig", "FilterInfrastructureError",
           "FilterMeasurements", "FilterRequest", "FilterResult", "filter_job", "filter_on_queue",
           "resolve_device", "result_from_job", "run_filters"]


@contextlib.contextmanager
def _gpu_lock(path: str) -> Iterator[int | None]:
    """Several lanes may share one GPU (`synth` opens one queue per lane): `path` names a file
    whose exclusive flock is held while this job runs the model, so two jobs' GPU work and
    timings never overlap; only torch.compile's code generation (CPU-bound, the slowest step)
    runs outside it (`rl.data.filter_checks`)."""
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
    """Every filter in order on this process's device; never raises for the task.

        load         the source executes, Model builds, get_inputs draws    load_error
        eager        one forward runs eagerly                              eager_error
        finite       the output (task's own inputs) has no NaN/inf         nonfinite
        memory       peak memory of model + inputs + forward <= budget     memory
        deterministic  a second run on the same inputs, other RNG state,   stochastic
                     agrees (dropout, rand in forward, RReLU differ)
        non_constant the output is not one value (within atol/rtol)        constant_output
        input_sensitive outputs for inputs drawn from several distributions   input_independent
                     (the task's own, signed, scaled: `rewards.verify.inputs`) differ pairwise
                     beyond atol/rtol, so a replayed or cached answer cannot pass
        runtime      eager time in [min_ms, max_ms]                         too_fast / too_slow
        compile      torch.compile runs and matches eager within atol/rtol  compile_error / compile_mismatch

    Timing: on CUDA `rewards.timing.gpu_timer.measure` (CUDA events, L2 flush) with a short
    `TimingConfig`; on CPU a host timer (median of `host_repeats` calls), for tests and CPU
    lanes with a wider window.
    """
    run = CandidateRun(request, resolve_device(request.config.device))
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
    except Reject as rejection:
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
    """Run the filters of `task` on `queue` (a `rewards.queue.gpu_queue.GpuQueue` with `HANDLER` registered)."""
    request = FilterRequest(task_id=task.task_id, source=task.source, config=config)
    job = Job(job_id=f"filter-{task.task_id}-{uuid.uuid4().hex[:8]}", kind=KIND, payload=encode(request),
              deadline_s=deadline_s)
    result = await queue.submit(job)
    return result_from_job(result.status, result.value, result.error)
