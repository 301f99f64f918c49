"""The parts of `rewards.queue.gpu_queue` that hold state: a worker process, a lane, the dispatcher.

What it is: `WorkerProcess` (one `rewards.queue.worker` process: its framed channel, the bounded tail
of its stderr, kill and retire), `Lane` (one worker's place on a GPU, of `lanes_per_gpu`: its
current worker, scratch dir and counters, `LaneStatistics`), `Dispatcher` (free lanes to waiting
submitters, first come first served, a waiter pinned to a GPU taking only that GPU's lanes; jobs
that time something have their GPU to themselves, verification jobs share it, and a staged job
that prepared beside them asks for its GPU alone once it is ready to time) and `QueueClosed`.

What it is not: the queue (`rewards.queue.gpu_queue.GpuQueue` starts workers, runs jobs under the
watchdog and owns the task group) or the worker side (`rewards.queue.worker`).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter, deque
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
    """One worker's place on a GPU (`slot` of the GPU's lanes): its current worker, its scratch
    dir, and its counters."""

    def __init__(self, gpu: int, scratch: Path, slot: int = 0) -> None:
        self.gpu = gpu
        self.slot = slot
        self.scratch = scratch
        self.worker: WorkerProcess | None = None
        self.held_since: float | None = None
        self.alone_since: float | None = None  # a staged job's GPU alone (`Dispatcher.alone`) from then
        self.alone_s = 0.0  # the job's time alone before it went back to sharing (`shared`)
        self.busy_s = 0.0
        self.exclusive_busy_s = 0.0  # of busy_s, jobs that had the GPU to themselves
        self.lock_wait_s = 0.0  # held by a submitter that waits for the machine-wide lock of the GPU
        self.jobs_done = self.exclusive_jobs = self.restarts = self.timeouts = self.crashes = self.poisoned = 0
        self.restart_s = 0.0

    @property
    def name(self) -> str:
        """For messages: "gpu 0", or "gpu 0 lane 1" for a GPU's second lane."""
        return f"gpu {self.gpu}" if self.slot == 0 else f"gpu {self.gpu} lane {self.slot}"

    def begin(self) -> None:
        self.held_since = time.monotonic()
        self.alone_since, self.alone_s = None, 0.0

    def alone(self) -> None:
        """The staged job holding this lane has its GPU alone from now on."""
        self.alone_since = time.monotonic()

    def shared(self) -> None:
        """The staged job holding this lane shares its GPU again from now on."""
        if self.alone_since is not None:
            self.alone_s += time.monotonic() - self.alone_since
            self.alone_since = None

    def locked(self, waited_s: float) -> None:
        """The submitter holding this lane waited `waited_s` for the GPU's machine-wide lock
        (other queues' jobs on the GPU) before its job could begin."""
        self.lock_wait_s += waited_s

    def end(self, status: JobStatus | None, *, exclusive: bool = False) -> float:
        """The job is over; returns the seconds it had its GPU alone (all of it if `exclusive`,
        from `alone()` to `shared()` or its end for a staged job, else 0)."""
        now = time.monotonic()
        held_s = now - self.held_since
        self.shared()
        alone_s = held_s if exclusive else self.alone_s
        self.busy_s += held_s
        self.exclusive_busy_s += alone_s
        self.held_since, self.alone_s = None, 0.0
        if status is not None:
            self.jobs_done += 1
            self.exclusive_jobs += alone_s > 0
            self.timeouts += status is JobStatus.TIMEOUT
            self.crashes += status is JobStatus.CRASHED
            self.poisoned += status is JobStatus.CUDA_POISONED
        return alone_s

    def statistics(self, now: float, uptime_s: float, depth: int) -> LaneStatistics:
        busy_s = self.busy_s + (now - self.held_since if self.held_since is not None else 0.0)
        return LaneStatistics(
            gpu=self.gpu,
            slot=self.slot,
            worker_pid=self.worker.pid if self.worker else 0,
            busy=self.held_since is not None,
            depth=depth,
            busy_fraction=busy_s / uptime_s,
            exclusive_busy_fraction=self.exclusive_busy_s / uptime_s,
            lock_wait_fraction=self.lock_wait_s / uptime_s,
            jobs_done=self.jobs_done,
            exclusive_jobs=self.exclusive_jobs,
            jobs_per_s=self.jobs_done / uptime_s,
            restarts=self.restarts,
            restart_s=self.restart_s,
            timeouts=self.timeouts,
            crashes=self.crashes,
            poisoned=self.poisoned,
        )


class _Waiter:
    __slots__ = ("event", "exclusive", "gpu", "held", "lane")

    def __init__(self, gpu: int | None, exclusive: bool, held: Lane | None = None) -> None:
        self.gpu = gpu
        self.exclusive = exclusive
        self.held = held  # a staged job's lane: it waits for its GPU alone, not for a lane
        self.lane: Lane | None = None
        self.event = anyio.Event()


class Dispatcher:
    """Hands free lanes to waiting submitters, first come first served, with a reader/writer
    discipline per GPU. A shared job (verification) takes a free lane of any GPU that no exclusive
    job holds; an exclusive job (one that times something) takes a lane only once no other job runs
    on its GPU, and no job starts there until it is done. Exclusive jobs do not starve: one that
    waits reserves a GPU (its own if pinned, else the one running the fewest jobs), and no waiter
    behind it starts on that GPU, which therefore drains. A waiter pinned to a GPU takes only that
    GPU's lanes and does not hold up the waiters behind it. With one lane per GPU every job has its
    GPU to itself and the two kinds are served alike.

    A staged job (a timing job that builds what it times beside verification jobs) takes its lane
    shared and calls `alone(lane)` once it is ready to time: its lane stops counting as running,
    it goes ahead of every waiter, reserves its GPU and gets it alone once the GPU's other jobs
    end. Parked so, two staged jobs of one GPU never wait for each other. Once it times nothing
    more, `shared(lane)` lets the GPU's other jobs start beside the rest of it.

    This is the queue's named limiter for GPUs: a `CapacityLimiter("gpus")` could count free lanes
    but not hand out a particular one, so a pinned job (baselines run on every GPU) would sit on a
    token meanwhile. One process owns every lane, so the discipline is this object's state, not a
    lock shared between processes.

    Example:
        lane = await dispatcher.acquire(None, exclusive=True)  # a profile job: the GPU alone
        try:
            ...  # run the job on lane.worker
        finally:
            dispatcher.release(lane)  # or, when its worker must go: retire it, then vacate(lane)
    """

    def __init__(self) -> None:
        self._free: list[Lane] = []  # lanes with an idle, healthy worker, the longest idle first
        self._holders: dict[Lane, bool] = {}  # lanes a job holds -> whether it holds the GPU alone
        self._waiters: deque[_Waiter] = deque()
        self.closed = False

    async def acquire(self, gpu: int | None, *, exclusive: bool = False) -> Lane:
        """A lane (of `gpu`, when given), held until `release` or `vacate`; `exclusive`: and no
        other job on its GPU meanwhile."""
        if self.closed:
            raise QueueClosed("the GPU queue is shut down")
        waiter = _Waiter(gpu, exclusive)
        self._waiters.append(waiter)
        self._match()
        try:
            await waiter.event.wait()
        except BaseException:  # cancelled: give back what we may have been handed meanwhile
            if waiter.lane is not None:
                self.release(waiter.lane)
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
                self._match()  # it may have reserved a GPU that the waiters behind it can now use
            raise
        if waiter.lane is None:
            raise QueueClosed("the GPU queue shut down while the job waited")
        return waiter.lane

    async def alone(self, lane: Lane) -> None:
        """`lane`, held shared, has its GPU alone once the GPU's other jobs are done (no job starts
        there meanwhile); at once if it is alone already."""
        if self._holders.get(lane):
            return
        if self.closed:
            raise QueueClosed("the GPU queue is shut down")
        self._holders.pop(lane, None)  # parked: its job waits, so the GPU's others may end
        waiter = _Waiter(lane.gpu, True, held=lane)
        staged = sum(1 for w in self._waiters if w.held is not None)
        self._waiters.insert(staged, waiter)  # after the staged jobs that asked before it
        self._match()
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
                self._match()
            raise
        if waiter.lane is None:
            raise QueueClosed("the GPU queue shut down while the job waited for its GPU")

    def shared(self, lane: Lane) -> None:
        """`lane`'s staged job, which had its GPU alone, times nothing more: other jobs may start on
        its GPU beside what is left of it (at once, and nothing if it was not alone)."""
        if self._holders.get(lane):
            self._holders[lane] = False
            self._match()

    def release(self, lane: Lane) -> None:
        """`lane`'s worker may take a job: its job is done and the worker healthy, or the worker
        is fresh."""
        self._holders.pop(lane, None)
        self._free.append(lane)
        self._match()

    def vacate(self, lane: Lane) -> None:
        """`lane`'s worker is gone (killed and reaped): its job, if any, no longer holds the GPU."""
        if self._holders.pop(lane, None) is not None:
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

    def spare(self) -> bool:
        """A lane is free and no submitter waits: a job submitted now takes a lane nobody else wanted."""
        return bool(self._free) and not self._waiters

    def depth(self, gpu: int | None = None, *, exclusive: bool | None = None) -> int:
        """Waiting submitters: all, or those pinned to `gpu`; of either kind, or of `exclusive`'s."""
        return sum(1 for w in self._waiters
                   if (gpu is None or w.gpu == gpu) and (exclusive is None or w.exclusive == exclusive))

    def _match(self) -> None:
        """One pass over the waiters in arrival order, handing out what each may take."""
        reserved: set[int] = set()  # GPUs an earlier exclusive waiter is waiting to have alone
        running = Counter(lane.gpu for lane in self._holders)  # jobs running per GPU
        alone = {lane.gpu for lane, exclusive in self._holders.items() if exclusive}  # held by a timing job
        for waiter in list(self._waiters):
            if waiter.held is not None:  # a staged job: its GPU alone, no lane to take
                lane = waiter.held if not running[waiter.gpu] and waiter.gpu not in reserved else None
                if lane is None:
                    reserved.add(waiter.gpu)
                    continue
                self._waiters.remove(waiter)
                self._holders[lane] = True
                running[lane.gpu] += 1
                alone.add(lane.gpu)
                waiter.lane = lane
                waiter.event.set()
                continue
            if not self._free:
                return
            lane = self._take(waiter, reserved, running, alone)
            if lane is not None:
                self._waiters.remove(waiter)
                self._holders[lane] = waiter.exclusive
                running[lane.gpu] += 1
                if waiter.exclusive:
                    alone.add(lane.gpu)
                waiter.lane = lane
                waiter.event.set()
            elif waiter.exclusive and (gpu := self._reservation(waiter, reserved, running)) is not None:
                reserved.add(gpu)

    def _take(self, waiter: _Waiter, reserved: set[int], running: Counter[int], alone: set[int]) -> Lane | None:
        """A free lane `waiter` may have, on the GPU running the fewest jobs, the longest idle
        among equals (spreads jobs over the GPUs); None if there is none."""
        usable = [lane for lane in self._free
                  if (waiter.gpu is None or lane.gpu == waiter.gpu) and lane.gpu not in reserved
                  and lane.gpu not in alone and not (waiter.exclusive and running[lane.gpu])]
        if not usable:
            return None
        lane = min(usable, key=lambda lane: running[lane.gpu])
        self._free.remove(lane)
        return lane

    def _reservation(self, waiter: _Waiter, reserved: set[int], running: Counter[int]) -> int | None:
        """The GPU a waiting exclusive job keeps later waiters off: its own, or the one in service
        running the fewest jobs, the lowest index among equals; None if every such GPU is reserved
        already. A reserved GPU only drains (no waiter behind starts there), and it changes only
        for a GPU of a smaller (jobs, index), so the waiter gets a GPU within finitely many jobs."""
        if waiter.gpu is not None:
            return waiter.gpu if waiter.gpu not in reserved else None
        in_service = {lane.gpu for lane in (*self._free, *self._holders)} - reserved
        return min(in_service, key=lambda gpu: (running[gpu], gpu), default=None)


__all__ = ["BROKEN", "Dispatcher", "Lane", "QueueClosed", "WorkerProcess"]
