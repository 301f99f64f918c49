"""Running a compiler as a killable process group, and a cross-process file lock.

What: `run_process(argv, cwd=, timeout_s=, tmp_root=)` starts the command in its own session
(so nvcc's children, cicc, ptxas and the host compiler, share one process group), writes its
output to a file (no pipe to fill and deadlock on), and on timeout or cancellation kills the
whole group and reaps it. `file_lock(path)` is an exclusive `flock` taken without blocking the
event loop.
What not: no retries, no output streaming; a timeout is reported in `ProcessRun`, not raised.
How used: by `rewards.build.compile_pool` for every compile, link and precompiled-header build.

    run = await run_process(["nvcc", "-c", "k.cu"], cwd=ws, timeout_s=60, tmp_root=cache / "tmp")
    run.returncode, run.timed_out, run.output, run.seconds
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
from msgspec import Struct

MAX_OUTPUT_BYTES = 1 << 20
LOCK_POLL_S = 0.1


class ProcessRun(Struct, frozen=True, kw_only=True):
    returncode: int | None
    """None when the process was killed at the timeout."""
    timed_out: bool
    output: str
    """stdout and stderr interleaved, at most the first MiB."""
    seconds: float


def kill_group(pgid: int) -> None:
    """SIGKILL every process of the group; a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def run_process(argv: list[str], *, cwd: Path, timeout_s: float, tmp_root: Path) -> ProcessRun:
    """Run `argv` in its own session with a private TMPDIR; kill the group at `timeout_s`."""
    tmp = Path(tempfile.mkdtemp(dir=tmp_root))
    env = {**os.environ, "LC_ALL": "C", "TMPDIR": str(tmp)}  # C locale: plain ASCII quotes
    start = time.perf_counter()
    returncode: int | None = None
    try:
        with open(tmp / "output.txt", "wb") as out:
            process = await anyio.open_process(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        try:
            with anyio.move_on_after(timeout_s):
                returncode = await process.wait()
        finally:
            # Also on success: a compiler's stray children must not outlive it.
            kill_group(process.pid)
            with anyio.CancelScope(shield=True):
                await process.wait()
        output = _read_head(tmp / "output.txt")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    seconds = time.perf_counter() - start
    return ProcessRun(returncode=returncode, timed_out=returncode is None, output=output, seconds=seconds)


def _read_head(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(MAX_OUTPUT_BYTES).decode("utf-8", errors="replace")


@contextlib.asynccontextmanager
async def file_lock(path: Path) -> AsyncIterator[None]:
    """Hold an exclusive lock on `path` (created if needed) across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await anyio.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
