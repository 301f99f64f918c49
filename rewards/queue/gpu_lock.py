"""`GpuLocks`: the rule "a timing job has its GPU alone" across every GPU queue of the machine.

What it is: a GPU queue's dispatcher keeps its own jobs off a GPU while one of them times
something; this keeps the jobs of the other queues off it too (seeds of a benchmark run at once on
one GPU, a checkpoint watcher beside a training run). Each physical GPU has two lock files
(`flock`) in a directory every queue of the machine shares:
- a shared job (verification) passes `gate` (shared, for a moment) and holds `gpu` shared while it runs;
- an exclusive job (timing) closes `gate` (exclusive): no shared job enters after it. It then waits
  for `gpu` exclusive (the shared jobs already in end), opens `gate` and holds `gpu` until it ends;
- a staged job (one that prepares beside shared jobs, then times) holds shared, and when ready
  (`Hold.alone`) lets go of `gpu` and takes it exclusive as above. It holds nothing while it waits,
  so staged jobs of several queues never wait for each other. Once it times nothing more it goes
  back to shared (`Hold.shared`) for what is left of it.
The kernel drops the locks of a process that dies. Waiting is polled (a non-blocking attempt
every few milliseconds), so a waiter that is cancelled holds nothing afterwards.

What it is not: a lock on the GPU's other users. A learner or an engine on the same GPU takes
none; only GPU queues do.

Example:
    locks = GpuLocks(default_directory())
    async with locks.hold("3", exclusive=True):  # "3": the GPU as CUDA_VISIBLE_DEVICES names it
        ...  # no job of any queue of this machine runs on GPU 3 meanwhile
    async with locks.hold("3", exclusive=False) as hold:
        ...  # beside other shared jobs
        await hold.alone()  # (`let_go` first, to hold nothing while other waits come before it)
        ...  # GPU 3 alone
        await hold.shared()  # timing done: beside other shared jobs again until the block ends
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import anyio

ENV = "CUDA_AGENT_GPU_LOCKS"
"""A directory of the GPU lock files other than the default (queues that must see each other
share it)."""


def default_directory() -> Path:
    return Path(os.environ.get(ENV) or Path(tempfile.gettempdir()) / "cuda-agent-gpu-locks")


class GpuLocks:
    """The lock files of the GPUs in `directory` (made if missing)."""

    def __init__(self, directory: str | Path, *, poll_s: float = 0.005) -> None:
        self.directory = Path(directory)
        self.poll_s = poll_s
        self.directory.mkdir(parents=True, exist_ok=True)

    @asynccontextmanager
    async def hold(self, device: str, *, exclusive: bool) -> AsyncIterator[Hold]:
        """`device` to yourself (`exclusive`), or beside other shared holders, until the block ends."""
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", device) or "_"
        hold = Hold(self.directory / name, exclusive, self.poll_s)
        try:
            await hold.enter(fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield hold
        finally:
            os.close(hold.gpu)


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)


async def _flock(fd: int, how: int, poll_s: float) -> None:
    """`flock(fd, how)`, polled without blocking: a cancelled waiter holds nothing afterwards."""
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            await anyio.sleep(poll_s)


class Hold:
    """One holder's lock on one GPU (`GpuLocks.hold`): `path`.gpu, entered through `path`.gate."""

    def __init__(self, path: Path, exclusive: bool, poll_s: float) -> None:
        self.path, self.exclusive, self.poll_s = path, exclusive, poll_s
        self.gpu = _open(path.with_name(path.name + ".gpu"))

    async def enter(self, how: int) -> None:
        gate = _open(self.path.with_name(self.path.name + ".gate"))
        try:
            await _flock(gate, how, self.poll_s)
            await _flock(self.gpu, how, self.poll_s)
        finally:
            os.close(gate)  # closing drops its lock: the gate opens

    def let_go(self) -> None:
        """A shared hold holds nothing from now until `alone`."""
        if not self.exclusive:
            fcntl.flock(self.gpu, fcntl.LOCK_UN)

    async def alone(self) -> None:
        """From shared to exclusive: lets go, then waits like an exclusive job (at once if it is)."""
        if self.exclusive:
            return
        self.let_go()
        await self.enter(fcntl.LOCK_EX)
        self.exclusive = True

    async def shared(self) -> None:
        """From exclusive back to shared (the holder times nothing more): other shared jobs may enter
        beside it, exclusive ones still wait for it to end. flock converts by letting go and locking
        again, so an exclusive waiter polling at that moment may come first: then this waits for it."""
        if not self.exclusive:
            return
        await _flock(self.gpu, fcntl.LOCK_SH, self.poll_s)
        self.exclusive = False


__all__ = ["ENV", "GpuLocks", "Hold", "default_directory"]
