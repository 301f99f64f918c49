"""The parts of `rewards.queue.gpu_queue` that hold state: a worker process, a lane, the dispatcher.

What it is: `WorkerProcess` (one `rewards.queue.worker` process: its framed channel, the bounded tail
of its stderr, kill and retire), `Lane` (one GPU: its current worker, scratch dir and counters,
`LaneStatistics`), `Dispatcher` (free lanes to waiting submitters, first come first served, a
waiter pinned to a GPU taking only that lane) and `QueueClosed`.

What it is not: the queue (`rewards.queue.gpu_queue.GpuQueue` starts workers, runs jobs under the
watchdog and owns the task group) or the worker side (`rewards.queue.worker`).
"""

from __future__ import annotations

import os
import signal
import time
from collections import deque
from pathlib import Path

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from rewards.queue.jobs import HEADER, MAX_FRAME_BYTES, JobStatus, LaneStatistics, frame

TAIL_BYTES = 8192  # stderr kept per worker, for crash and timeout messages
BROKEN = (anyio.BrokenResourceError, anyio.ClosedResourceError)


class QueueClosed(RuntimeError):
    """`submit` on a queue that has shut down, or shut down while the job waited or ran."""


class WorkerProcess:
    """One worker process: its framed channel, the tail of its stderr, whether it must go."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.pid = process.pid
        self.stdout = BufferedByteReceiveStream(process.stdout)
        self.tail = bytearray()
        self.stderr_done = anyio.Event()
        self.exited = False
        self.retired = anyio.Event()

    async def send(self, message: bytes) -> None:
        await self.process.stdin.send(frame(message))

    async def receive(self) -> bytes | None:
        """The next frame; None at end of file or on a corrupted header."""
        try:
            (size,) = HEADER.unpack(await self.stdout.receive_exactly(HEADER.size))
            if size > MAX_FRAME_BYTES:
                return None
            return await self.stdout.receive_exactly(size)
        except (anyio.IncompleteRead, anyio.EndOfStream, *BROKEN):
            return None

    async def drain_stderr(self) -> None:
        try:
            async for chunk in self.process.stderr:
                self.tail += chunk
                if len(self.tail) > 2 * TAIL_BYTES:  # trim rarely: amortised O(1) per byte
                    del self.tail[:-TAIL_BYTES]
        except BROKEN:
            pass
        finally:
            self.stderr_done.set()

    async def last_words(self) -> str:
        """How the (killed or dead) worker ended, and the end of its stderr."""
        with anyio.move_on_after(1.0):
            await self.stderr_done.wait()
            await self.process.wait()
        code = self.process.returncode
        if code is None:
            how = "did not exit"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        tail = bytes(self.tail[-TAIL_BYTES:]).decode("utf-8", "replace")
        return f"worker {self.pid} {how}; its stderr ends:\n{tail}"

    def kill(self) -> None:
        """SIGKILL the whole process group: the worker, bwrap, and whatever a job started."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def retire(self) -> None:
        self.kill()
        self.retired.set()


class Lane:
    """One GPU: its current worker, its scratch dir, and its counters."""

    def __init__(self, gpu: int, scratch: Path) -> None:
        self.gpu = gpu
        self.scratch = scratch
        self.worker: WorkerProcess | None = None
        self.held_since: float | None = None
        self.busy_s = 0.0
        self.jobs_done = self.restarts = self.timeouts = self.crashes = self.poisoned = 0
        self.restart_s = 0.0

    def begin(self) -> None:
        self.held_since = time.monotonic()

    def end(self, status: JobStatus | None) -> None:
        self.busy_s += time.monotonic() - self.held_since
        self.held_since = None
        if status is not None:
            self.jobs_done += 1
            self.timeouts += status is JobStatus.TIMEOUT
            self.crashes += status is JobStatus.CRASHED
            self.poisoned += status is JobStatus.CUDA_POISONED

    def statistics(self, now: float, uptime_s: float, depth: int) -> LaneStatistics:
        busy_s = self.busy_s + (now - self.held_since if self.held_since is not None else 0.0)
        return LaneStatistics(
            gpu=self.gpu,
            worker_pid=self.worker.pid if self.worker else 0,
            busy=self.held_since is not None,
            depth=depth,
            busy_fraction=busy_s / uptime_s,
            jobs_done=self.jobs_done,
            jobs_per_s=self.jobs_done / uptime_s,
            restarts=self.restarts,
            restart_s=self.restart_s,
            timeouts=self.timeouts,
            crashes=self.crashes,
            poisoned=self.poisoned,
        )


class _Waiter:
    __slots__ = ("event", "lane", "wanted")

    def __init__(self, wanted: Lane | None) -> None:
        self.wanted = wanted
        self.lane: Lane | None = None
        self.event = anyio.Event()


class Dispatcher:
    """Hands free lanes to waiting submitters, first come first served; a waiter pinned to a GPU
    takes only that lane and does not hold up the waiters behind it. This is the queue's named
    limiter for GPUs: a `CapacityLimiter("gpus")` could count free lanes but not hand out a
    particular one, so a pinned job (baselines run on every GPU) would sit on a token meanwhile."""

    def __init__(self) -> None:
        self._free: list[Lane] = []
        self._waiters: deque[_Waiter] = deque()
        self.closed = False

    async def acquire(self, wanted: Lane | None) -> Lane:
        if self.closed:
            raise QueueClosed("the GPU queue is shut down")
        waiter = _Waiter(wanted)
        self._waiters.append(waiter)
        self._match()
        try:
            await waiter.event.wait()
        except BaseException:  # cancelled: give back what we may have been handed meanwhile
            if waiter.lane is not None:
                self.release(waiter.lane)
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise
        if waiter.lane is None:
            raise QueueClosed("the GPU queue shut down while the job waited")
        return waiter.lane

    def release(self, lane: Lane) -> None:
        self._free.append(lane)
        self._match()

    def withdraw(self, lane: Lane) -> bool:
        """Take a free lane out of service; False if it was not free (someone holds it)."""
        if lane in self._free:
            self._free.remove(lane)
            return True
        return False

    def close(self) -> None:
        self.closed = True
        for waiter in self._waiters:
            waiter.event.set()
        self._waiters.clear()

    def depth(self, lane: Lane | None = None) -> int:
        return sum(1 for w in self._waiters if lane is None or w.wanted is lane)

    def _match(self) -> None:
        for waiter in list(self._waiters):
            if not self._free:
                return
            lane = self._take(waiter.wanted)
            if lane is not None:
                self._waiters.remove(waiter)
                waiter.lane = lane
                waiter.event.set()

    def _take(self, wanted: Lane | None) -> Lane | None:
        if wanted is None:
            return self._free.pop(0)  # the longest idle: spreads jobs over the GPUs
        if wanted in self._free:
            self._free.remove(wanted)
            return wanted
        return None


__all__ = ["BROKEN", "Dispatcher", "Lane", "QueueClosed", "WorkerProcess"]
