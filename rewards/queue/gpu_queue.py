"""`GpuQueue`: the async queue through which verify, profile, baseline and final-evaluation jobs
reach the GPUs.

What it is: `lanes_per_gpu` lanes per GPU (one by default), each a `rewards.queue.worker` process
started in its own session with CUDA_VISIBLE_DEVICES pinned, optionally inside bubblewrap.
`submit(job)` waits, first come first served, for a free lane (any GPU's, or the GPU asked for),
runs the job under a watchdog and returns a `JobResult`. Jobs that time something (every kind
not in `config.shared_kinds`) have their GPU to themselves; verification jobs share it, one per
lane; a staged kind (`config.staged_kinds`) starts beside them and has its GPU alone from when its
handler asks (`JobContext.gpu_alone`), the wait not counted in its deadline, until it ends or
shares it again (`JobContext.gpu_shared`: it times nothing more). A submitter may start a staged
job before it knows it wants it timed (a final evaluation's profile beside its verification): its
`gate` is awaited when the job asks, and a no withdraws the job (`GpuWithdrawn` in the handler)
instead of giving it the GPU; `running` tells a submitter that its job has a lane. A worker that timed
out, crashed or poisoned its CUDA context is killed with its whole process group and replaced in
the background; the result goes back at once, and the GPU counts the job as running until the
killed worker is reaped.

What it is not: it knows nothing of what a job does (handlers do, see `rewards.queue.jobs`), and it
never touches CUDA itself, not even to count GPUs (a subprocess does that).

Topology, one task group owned by `async with GpuQueue(config)`:

    submit() --acquire--> Dispatcher: free lanes + FIFO of waiters (a pinned one takes only its GPU's
       |                  lanes; a timing job waits for its GPU to be idle and reserves it meanwhile)
       |                    ^ release: job done, worker healthy    ^ release: fresh worker ready
       |                    ^ vacate: the job's worker retired and reaped
       +-- holds the lane and its GPU's machine-wide lock (`gpu_lock`: the same rule against the
       |   machine's other GPU queues): Job frame --> worker [bwrap] --> handler(payload, ctx) --> JobResult frame
    task group
       +-- one task per lane: start worker, release lane, wait until the worker is retired, reap,
           vacate, repeat
             +-- per worker: stderr drain (bounded tail), exit watcher

Parts: `rewards.queue.config` (the settings, the sandbox among them), `rewards.queue.lanes`
(worker process, lane, dispatcher), `rewards.queue.gpu_lock` (the machine-wide lock of a GPU),
`rewards.queue.worker_command` (the worker's command line, sandbox and environment),
`rewards.queue.kind_times` (each job kind's wait, lock wait and run time); this module is the queue.
"""

from __future__ import annotations

import logging
import math
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import NamedTuple, Self

import anyio
import anyio.abc
import msgspec

from rewards.queue.config import SECRET_PATHS, GpuQueueConfig
from rewards.queue.gpu_lock import GpuLocks, default_directory
from rewards.queue.jobs import (
    GpuAsk,
    GpuGiven,
    Job,
    JobResult,
    JobStatus,
    QueueStatistics,
    ask_decoder,
    encode,
    ready_decoder,
    result_decoder,
)
from rewards.queue.kind_times import KindTimes
from rewards.queue.lanes import BROKEN, Dispatcher, Lane, QueueClosed, WorkerProcess
from rewards.queue.worker_command import count_gpus, device_name, worker_argv, worker_env

log = logging.getLogger(__name__)

_START_ATTEMPTS = 3  # a lane that cannot start a worker this many times in a row is broken
_REAP_WAIT_S = 5.0  # a SIGKILLed process stuck in the driver (D state) is not waited on forever
class WorkerStartError(RuntimeError):
    """A lane could not start a worker `_START_ATTEMPTS` times in a row: broken infrastructure."""


# ---------------------------------------------------------------------------------------------


class GpuQueue:
    """Jobs to GPU worker processes, one job per lane at a time and a timing job alone on its
    GPU, with a watchdog and restarts.

    Example:
        config = GpuQueueConfig(gpus=(0, 1), sandbox=True, hidden_paths=SECRET_PATHS + (tasks_dir,))
        async with GpuQueue(config) as queue:
            result = await queue.submit(Job(job_id="t3-verify-1", kind="verify", payload=payload))
            if result.status is JobStatus.OK:
                verdict = decode(result.value, Verdict)
            log.info("gpu queue %s", queue.statistics())
    """

    def __init__(self, config: GpuQueueConfig = GpuQueueConfig()) -> None:
        if len(set(config.gpus)) != len(config.gpus):
            raise ValueError(f"a GPU is listed twice: {config.gpus}")
        if config.lanes_per_gpu < 1:
            raise ValueError(f"lanes_per_gpu must be at least 1, not {config.lanes_per_gpu}")
        self.config = config
        self._dispatcher = Dispatcher()
        self._kind_times = KindTimes()
        self._lanes: list[Lane] = []
        self._closed = False
        self._started = time.monotonic()
        self._stack = AsyncExitStack()
        self._own_scratch: str | None = None
        self._locks = GpuLocks(config.gpu_lock_dir or default_directory()) if config.gpu_locks else None

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(lane.gpu for lane in self._lanes))

    async def __aenter__(self) -> Self:
        gpus = self.config.gpus or tuple(range(await count_gpus(self.config.python)))
        if not gpus:
            raise RuntimeError("GpuQueue: no GPUs (config.gpus is empty and torch sees none)")
        root = self._scratch_root()
        self._lanes = [Lane(gpu, root / _scratch_name(gpu, slot), slot)
                       for gpu in gpus for slot in range(self.config.lanes_per_gpu)]
        for lane in self._lanes:
            lane.scratch.mkdir(parents=True, exist_ok=True)
        self._tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._started = time.monotonic()
        try:
            async with anyio.create_task_group() as boot:  # start the lanes' workers together
                for lane in self._lanes:
                    boot.start_soon(self._tg.start, self._run_lane, lane)
        except BaseException as exc:
            await self.__aexit__(None, None, None)
            if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
                raise exc.exceptions[0] from None
            raise
        return self

    async def __aexit__(self, *exc_info) -> bool | None:
        self._closed = True
        self._dispatcher.close()
        self._tg.cancel_scope.cancel()
        try:
            return await self._stack.__aexit__(*exc_info)
        except BaseExceptionGroup as group:
            if exc_info[1] is not None and group.exceptions == (exc_info[1],):
                return False  # the body's own exception, unwrapped: the caller sees what it raised
            raise
        finally:
            if self._own_scratch:
                shutil.rmtree(self._own_scratch, ignore_errors=True)

    async def submit(self, job: Job, *, gpu: int | None = None, running: anyio.Event | None = None,
                     gate: Callable[[], Awaitable[bool]] | None = None) -> JobResult:
        """Run `job` on a free lane (or on a lane of `gpu`), waiting first come first served; a
        kind not in `config.shared_kinds` waits until it can have its GPU alone, a staged kind
        (`config.staged_kinds`) starts beside the shared jobs and has it alone from when its
        handler asks. `running` is set once the job has its lane (and its GPU's machine lock).
        `gate`, for a staged job: awaited when it asks for its GPU alone, still sharing it (the
        wait not counted in its deadline); False withdraws the job instead (module docstring).
        A gate must not wait for a job that has no lane yet: the gated job holds one meanwhile.
        What the job did is never an exception: timeouts, crashes and poisoned contexts are
        statuses. Raises QueueClosed if the queue shuts down first."""
        wanted = self._gpu(gpu)
        exclusive = job.kind not in self.config.shared_kinds
        staged = exclusive and job.kind in self.config.staged_kinds and not self.config.fork_per_job
        exclusive = exclusive and not staged
        queued = time.monotonic()
        if gate is not None and not staged:  # only a staged job can start before its gate answers
            if not await gate():
                return JobResult(job_id=job.job_id, status=JobStatus.WITHDRAWN, error=WITHDRAWN_BEFORE,
                                 wait_s=time.monotonic() - queued)
            gate = None
        lane = await self._dispatcher.acquire(wanted, exclusive=exclusive)
        laned = held = time.monotonic()
        async with AsyncExitStack() as machine:  # the GPU against other queues of the machine
            hold = None
            if self._locks is not None:
                try:
                    hold = await machine.enter_async_context(self._locks.hold(device_name(lane.gpu), exclusive=exclusive))
                except BaseException:  # cancelled while another queue's job held the GPU
                    self._dispatcher.release(lane)
                    raise
                finally:
                    held = time.monotonic()  # held - laned: the one lock wait, for the lane's and the kind's times
                    lane.locked(held - laned)

            async def gpu_alone() -> bool:
                if gate is not None and not await gate():
                    return False
                if hold is not None:
                    hold.let_go()  # nothing of the machine's lock held while this queue drains
                await self._dispatcher.alone(lane)
                if hold is not None:
                    await hold.alone()
                lane.alone()
                return True

            async def gpu_shared() -> None:
                lane.shared()
                if hold is not None:  # shared on the machine first, then this queue's jobs may start
                    await hold.shared()
                self._dispatcher.shared(lane)

            worker = lane.worker
            lane.begin()
            if running is not None:
                running.set()
            result, reusable, waited_s, alone_s = None, False, 0.0, 0.0
            try:
                result, reusable, waited_s = await self._run(msgspec.structs.replace(job, staged=staged), worker,
                                                             _Staging(gpu_alone, gpu_shared) if staged else None)
            finally:
                alone_s = lane.end(result.status if result else None, exclusive=exclusive)
                if reusable and not worker.exited:
                    self._dispatcher.release(lane)
                else:  # also when cancelled mid-job: the worker may still be running it
                    worker.retire()  # the lane's task vacates the lane once the worker is reaped
        wall_s = time.monotonic() - held - waited_s
        self._kind_times.record(job.kind, wait_s=laned - queued + waited_s, lock_s=held - laned, run_s=wall_s)
        return msgspec.structs.replace(result, worker_pid=worker.pid, gpu=lane.gpu, wall_s=wall_s,
                                       wait_s=held - queued + waited_s, alone_s=alone_s)

    def spare_lane(self) -> bool:
        """Whether a job submitted now would take a free lane that no waiting job wanted (work
        started on speculation, such as a final evaluation's profile beside its verification,
        should not hold up jobs that are known to be needed)."""
        return not self._closed and self._dispatcher.spare()

    def statistics(self) -> QueueStatistics:
        now = time.monotonic()
        uptime_s = max(now - self._started, 1e-9)
        lanes = tuple(lane.statistics(now, uptime_s, self._dispatcher.depth(lane.gpu)) for lane in self._lanes)
        jobs_done = sum(s.jobs_done for s in lanes)

        def mean(field: str) -> float:
            return sum(getattr(s, field) for s in lanes) / max(len(lanes), 1)

        return QueueStatistics(
            lanes=lanes,
            depth=self._dispatcher.depth(),
            exclusive_depth=self._dispatcher.depth(exclusive=True),
            busy_fraction=mean("busy_fraction"),
            exclusive_busy_fraction=mean("exclusive_busy_fraction"),
            lock_wait_fraction=mean("lock_wait_fraction"),
            jobs_done=jobs_done,
            jobs_per_s=jobs_done / uptime_s,
            restarts=sum(s.restarts for s in lanes),
            timeouts=sum(s.timeouts for s in lanes),
            crashes=sum(s.crashes for s in lanes),
            poisoned=sum(s.poisoned for s in lanes),
            uptime_s=uptime_s,
            kinds=self._kind_times.statistics(),
        )

    # -- running a job --------------------------------------------------------------------------

    def _gpu(self, gpu: int | None) -> int | None:
        if self._closed:
            raise QueueClosed("the GPU queue is shut down")
        if gpu is not None and gpu not in self.gpus:
            raise ValueError(f"no lane for gpu {gpu}; GPUs: {self.gpus}")
        return gpu

    async def _run(self, job: Job, worker: WorkerProcess,
                   staging: _Staging | None = None) -> tuple[JobResult, bool, float]:
        """The result, whether the worker may take the next job, and the seconds a staged job
        waited for its GPU alone (`staging.alone`, when its handler asked; not counted in its
        deadline). A staged job's asks are answered as they come, until its result."""
        deadline_s = job.deadline_s if job.deadline_s is not None else self.config.job_default_deadline_s
        job = msgspec.structs.replace(job, deadline_s=deadline_s)  # handlers may budget by it
        del worker.tail[:]  # the stderr tail of a failure should be this job's
        message, waited_s, withdrawn = None, 0.0, False
        with anyio.move_on_after(deadline_s) as watchdog:
            try:
                await worker.send(encode(job))
            except BROKEN:
                pass  # it died: receive() sees the end of file
            message = await worker.receive()
            while staging is not None and message is not None and (ask := _ask(message)) is not None:
                asked = time.monotonic()
                if ask.wants == "gpu_alone":
                    deadline, watchdog.deadline = watchdog.deadline, math.inf
                    withdrawn = not await staging.alone()
                    waited = time.monotonic() - asked
                    watchdog.deadline, waited_s = deadline + waited, waited_s + waited
                else:
                    await staging.shared()
                    waited = time.monotonic() - asked
                try:
                    await worker.send(encode(GpuGiven(waited_s=waited, withdrawn=withdrawn)))
                except BROKEN:
                    pass
                message = await worker.receive()
        if watchdog.cancelled_caught:
            worker.kill()
            error = f"killed at its {deadline_s:g} s deadline; {await worker.last_words()}"
            return JobResult(job_id=job.job_id, status=JobStatus.TIMEOUT, error=error), False, waited_s
        result = _decode_result(job, message)
        if result is None:
            if self._closed:
                raise QueueClosed("the GPU queue shut down while the job ran")
            worker.kill()
            error = await worker.last_words()
            return JobResult(job_id=job.job_id, status=JobStatus.CRASHED, error=error), False, waited_s
        # A worker that poisoned its context has exited; a zygote only lost the child.
        reusable = result.status is not JobStatus.CUDA_POISONED or self.config.fork_per_job
        if withdrawn and result.status in (JobStatus.OK, JobStatus.ERROR):  # what it returned is moot
            result = msgspec.structs.replace(result, status=JobStatus.WITHDRAWN, error=WITHDRAWN_ASKED)
        return result, reusable, waited_s

    # -- lanes and their workers ----------------------------------------------------------------

    def _scratch_root(self) -> Path:
        if self.config.scratch_root:
            return Path(self.config.scratch_root)
        self._own_scratch = tempfile.mkdtemp(prefix="gpu-queue-")
        return Path(self._own_scratch)

    async def _run_lane(self, lane: Lane, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """Keeps one worker alive in `lane`: start, serve until retired, replace; forever."""
        failures, started = 0, False
        try:
            while True:
                began = time.monotonic()
                error = await self._serve_one_worker(lane, began, started, task_status)
                if error is None:
                    failures, started = 0, True
                    continue
                failures += 1
                log.warning("%s: no worker (%d/%d): %s", lane.name, failures, _START_ATTEMPTS, error)
                if failures >= _START_ATTEMPTS:
                    raise WorkerStartError(f"{lane.name}: no worker after {failures} attempts: {error}")
                await anyio.sleep(0.5 * failures)
        except BaseException:
            self._dispatcher.close()  # waiters must not wait for a queue that is going away
            raise

    async def _serve_one_worker(self, lane: Lane, began: float, started: bool, task_status) -> str | None:
        """One worker's life; returns why it failed to start, or None once it has served."""
        try:
            process = await anyio.open_process(
                worker_argv(self.config, lane.gpu, lane.scratch),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=lane.scratch,
                env=worker_env(self.config, lane.gpu, lane.scratch),
                start_new_session=True,  # its own process group: one killpg ends it all
            )
        except OSError as exc:
            return f"cannot start the worker: {exc}"
        worker = WorkerProcess(process)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.drain_stderr)
                error = await self._wait_ready(worker)
                if error is None:
                    lane.worker = worker
                    if started:
                        lane.restarts += 1
                        lane.restart_s += time.monotonic() - began
                    else:
                        task_status.started()
                    tg.start_soon(self._watch_exit, lane, worker)
                    self._dispatcher.release(lane)
                    await worker.retired.wait()
                    self._dispatcher.withdraw(lane)
                tg.cancel_scope.cancel()
        finally:
            worker.kill()
            with anyio.move_on_after(_REAP_WAIT_S, shield=True):
                await process.aclose()
            self._dispatcher.vacate(lane)  # a job it ran no longer holds the GPU
        return error

    async def _wait_ready(self, worker: WorkerProcess) -> str | None:
        with anyio.move_on_after(self.config.worker_start_timeout_s) as timer:
            message = await worker.receive()
        if timer.cancelled_caught:
            worker.kill()
            return f"not ready within {self.config.worker_start_timeout_s:g} s; {await worker.last_words()}"
        if message is None:
            return await worker.last_words()
        try:
            ready_decoder.decode(message)
        except msgspec.DecodeError as exc:
            worker.kill()
            return f"unreadable ready frame ({exc})"
        return None

    async def _watch_exit(self, lane: Lane, worker: WorkerProcess) -> None:
        await worker.process.wait()
        worker.exited = True
        if self._dispatcher.withdraw(lane):  # died while idle: no submitter will see its EOF
            log.warning("%s: idle worker %d exited", lane.name, worker.pid)
            worker.retire()


def _scratch_name(gpu: int, slot: int) -> str:
    return f"gpu{gpu}" if slot == 0 else f"gpu{gpu}-{slot}"


WITHDRAWN_BEFORE = "withdrawn by its submitter before it ran"
WITHDRAWN_ASKED = "withdrawn by its submitter when it asked for its GPU alone: nothing was timed"


class _Staging(NamedTuple):
    """A staged job's two moves on its lane and its GPU's machine lock (`GpuQueue.submit`);
    `alone` says False when the submitter's gate withdrew the job (nothing moved)."""

    alone: Callable[[], Awaitable[bool]]
    shared: Callable[[], Awaitable[None]]


def _ask(message: bytes) -> GpuAsk | None:
    """A staged job's `GpuAsk`, or None (a result frame lacks its `wants`)."""
    try:
        return ask_decoder.decode(message)
    except msgspec.DecodeError:
        return None


def _decode_result(job: Job, message: bytes | None) -> JobResult | None:
    """The worker's result, or None for a missing, unreadable or mismatched frame."""
    if message is None:
        return None
    try:
        result = result_decoder.decode(message)
    except msgspec.DecodeError:
        log.warning("job %s: undecodable result frame", job.job_id)
        return None
    return result if result.job_id == job.job_id else None


__all__ = ["SECRET_PATHS", "GpuQueue", "GpuQueueConfig", "QueueClosed", "WorkerStartError", "count_gpus",
           "worker_argv", "worker_env"]
