"""The trajectory store: an append-only JSON-lines file, one finished trajectory per line.

What it is: durable output of rollouts. Each trajectory is appended as it completes (aiofiles,
orjson), flushed at once and fsync'd at safe points (every `fsync_every` lines, every
`fsync_interval_s`, and on close), so a killed run loses at most the unsynced tail, and the
reader skips a torn last line. A stopped run resumes by reading the keys already stored and
skipping them, so nothing is lost or duplicated. A store opened with `redo` statuses moves the
trajectories that ended so (e.g. `INFRA_FAILURES`) to `NAME.redone.jsonl` and leaves their keys
out, so the resumed run does them again and the file holds each key once.
What it is not: a database or a cache of in-flight work; aborted trajectories are not stored
by the orchestrator (they are rerun on resume).

Example:
    async with TrajectoryStore(run_dir / "trajectories.jsonl", redo=INFRA_FAILURES) as store:
        done = store.keys()              # {(group_id, sample_index), ...} from earlier runs
        await store.append(trajectory)
    for traj in read_trajectories(run_dir / "trajectories.jsonl"): ...
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Iterator

import aiofiles
import anyio
import msgspec
import orjson
from msgspec import Struct

from agentcore.types import Status, Trajectory

log = logging.getLogger(__name__)

_decoder = msgspec.json.Decoder(Trajectory)


class _Ending(Struct):
    status: Status | None = None


_ending_decoder = msgspec.json.Decoder(_Ending)

Key = tuple[str, int]  # (group_id, sample_index)


def _encode(traj: Trajectory) -> bytes:
    return orjson.dumps(msgspec.to_builtins(traj)) + b"\n"


def read_trajectories(path: str | Path, *, strict: bool = False) -> Iterator[Trajectory]:
    """Yield stored trajectories. A torn final line (killed writer) is skipped; a corrupt line
    elsewhere raises ValueError naming the line when `strict`, else is logged and skipped."""
    path = Path(path)
    if not path.exists():
        return
    with path.open("rb") as f:
        lines = f.read().split(b"\n")
    last = len(lines) - 1
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield _decoder.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            if number - 1 == last:  # no newline after it: a write cut short
                log.warning("%s: skipping torn last line %d", path, number)
            elif strict:
                raise ValueError(f"{path}:{number}: not a trajectory: {exc}") from exc
            else:
                log.error("%s:%d: skipping corrupt line: %s", path, number, exc)


def _repair(path: Path) -> int:
    """Cut a torn tail (bytes after the last newline) so appends start on a clean line."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        with path.open("r+b") as f:
            f.truncate(keep)
        return len(data) - keep
    return 0


def redone_path(path: str | Path) -> Path:
    """Where a store opened with `redo` moves the trajectories it does again."""
    path = Path(path)
    return path.with_name(f"{path.stem}.redone{path.suffix}")


def _status(line: bytes) -> Status | None:
    try:
        return _ending_decoder.decode(line).status
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # a corrupt line stays where it is; readers skip it


def set_aside(path: Path, moved: Callable[[bytes], bool]) -> int:
    """Move the lines for which `moved` is true from `path` to the end of its redone file, then
    replace `path` by the rest (written, fsync'd, renamed); returns how many moved. A JSON-lines
    file of the same shape (a benchmark's records) can be set aside the same way."""
    if not path.exists():
        return 0
    keep: list[bytes] = []
    move: list[bytes] = []
    for line in path.read_bytes().splitlines(keepends=True):
        (move if moved(line) else keep).append(line)
    if not move:
        return 0
    with redone_path(path).open("ab") as f:  # first: a crash before the rename loses nothing
        f.writelines(move)
        f.flush()
        os.fsync(f.fileno())
    staging = path.with_name(f".{path.name}.tmp")
    with staging.open("wb") as f:
        f.writelines(keep)
        f.flush()
        os.fsync(f.fileno())
    os.replace(staging, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return len(move)


class StoreStats(Struct, frozen=True, kw_only=True):
    appended: int
    resumed: int
    redone: int
    bytes_written: int
    fsyncs: int


class TrajectoryStore:
    """Append-only JSON-lines store of trajectories, resumable (see module docstring)."""

    def __init__(
        self,
        path: str | Path,
        *,
        redo: Collection[Status] = (),
        fsync_every: int = 32,
        fsync_interval_s: float = 5.0,
    ):
        self.path = Path(path)
        self.redo = frozenset(redo)
        self.fsync_every, self.fsync_interval_s = fsync_every, fsync_interval_s
        self._redone = 0
        self._file = None
        self._keys: set[Key] = set()
        self._existing: list[Trajectory] = []
        self._lock = anyio.Lock()
        self._appended = self._bytes = self._fsyncs = self._unsynced = 0
        self._last_sync = time.monotonic()

    async def __aenter__(self) -> "TrajectoryStore":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = await anyio.to_thread.run_sync(_repair, self.path)
        if torn:
            log.warning("%s: removed a torn tail of %d bytes from an earlier run", self.path, torn)
        if self.redo:
            self._redone = await anyio.to_thread.run_sync(set_aside, self.path, lambda line: _status(line) in self.redo)
        if self._redone:
            log.info("%s: %d trajectories run again (earlier ones kept in %s)", self.path, self._redone,
                     redone_path(self.path))
        self._existing = await anyio.to_thread.run_sync(lambda: list(read_trajectories(self.path)))
        self._keys = {(t.group_id, t.sample_index) for t in self._existing}
        self._file = await aiofiles.open(self.path, "ab")
        return self

    async def __aexit__(self, *exc) -> None:
        with anyio.CancelScope(shield=True):
            if self._file is not None:
                await self._sync()
                await self._file.close()
                self._file = None

    def keys(self) -> set[Key]:
        """(group_id, sample_index) of every trajectory stored, this run and earlier ones."""
        return set(self._keys)

    def existing(self) -> list[Trajectory]:
        """Trajectories found on disk when the store was opened (less those set aside to redo)."""
        return list(self._existing)

    async def append(self, traj: Trajectory) -> None:
        key = (traj.group_id, traj.sample_index)
        line = _encode(traj)
        async with self._lock:
            if key in self._keys:
                raise ValueError(f"trajectory {key} is already stored in {self.path}")
            await self._file.write(line)
            await self._file.flush()
            self._keys.add(key)
            self._appended += 1
            self._bytes += len(line)
            self._unsynced += 1
            due = time.monotonic() - self._last_sync >= self.fsync_interval_s
            if self._unsynced >= self.fsync_every or due:
                await self._sync()

    async def _sync(self) -> None:
        if self._file is None or not self._unsynced:
            return
        await self._file.flush()
        await anyio.to_thread.run_sync(os.fsync, self._file.fileno())
        self._fsyncs += 1
        self._unsynced = 0
        self._last_sync = time.monotonic()

    async def sync(self) -> None:
        """fsync now (a safe point: end of a step, before a checkpoint)."""
        async with self._lock:
            await self._sync()

    def statistics(self) -> StoreStats:
        return StoreStats(
            appended=self._appended,
            resumed=len(self._existing),
            redone=self._redone,
            bytes_written=self._bytes,
            fsyncs=self._fsyncs,
        )
