"""Files of a checkpoint directory: rename into place, fsync, listing and cleaning (rl.learner.checkpoint).

What it is: the filesystem side of `rl.learner.checkpoint` - directory replacement by rename, one parallel
fsync pass over a tree, removal in the background, the complete and the committed steps of
`RUN/ckpt` (`committed_steps` is what readers outside the trainer use, e.g. `cuda-agent bench
--watch`), a per-part clock, and the rank helpers the writers use. What it is not: the checkpoint
format or its commit order (`rl.learner.checkpoint` decides what is written when).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch.distributed as dist

log = logging.getLogger("cuda-agent.checkpoint")
_STEP_DIR = re.compile(r"^step_(\d+)$")
# DCP writer threads per rank: one thread serialises ~0.5-1 GB/s, and a 0.5B actor + critic with
# AdamW is ~12 GB. DCP's own per-file fsync is off: `_publish` fsyncs every file once, in parallel.
_IO_THREADS = max(1, min(4, os.cpu_count() or 1))


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename `src` to `dst`; an existing `dst` is moved aside first and then deleted."""
    old = dst.with_name(dst.name + ".old")
    if dst.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dst, old)
    os.replace(src, dst)
    _fsync_dir(dst.parent)
    shutil.rmtree(old, ignore_errors=True)


def _remove_later(path: Path) -> None:
    doomed = path.with_name(path.name + ".del")
    shutil.rmtree(doomed, ignore_errors=True)
    os.replace(path, doomed)
    threading.Thread(target=shutil.rmtree, args=(doomed, True), name="ckpt-prune", daemon=True).start()


def _clean(root: Path) -> None:
    """Remove what killed saves left: torn `.tmp` directories, pruned `.del` ones, and `.old` ones moved aside
    (an `.old` whose replacement never arrived is moved back instead)."""
    for torn in [*root.glob("*.tmp"), *root.glob("*.del")]:
        shutil.rmtree(torn, ignore_errors=True)
    for old in root.glob("*.old"):
        target = old.with_name(old.name.removesuffix(".old"))
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(old, target)


def _complete_steps(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.match(path.name)
        if match and (path / "meta.json").is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def committed_steps(root: Path) -> list[tuple[int, Path]]:
    """(step, dir) of the complete checkpoints in `root` (RUN/ckpt) up to the one `latest` names,
    oldest first; all complete ones when the pointer is missing or names nothing complete. A step
    past the pointer was renamed into place by a save that died before it committed."""
    found = _complete_steps(root)
    pointer = root / "latest"
    named = _STEP_DIR.match(pointer.read_text().strip()) if pointer.is_file() else None
    if named and (root / named.group(0) / "meta.json").is_file():
        found = [(step, path) for step, path in found if step <= int(named.group(1))]
    return found


def _fsync_tree(path: Path) -> None:
    """Flush every file and directory under `path`, so the rename publishes durable bytes.

    Files are flushed in parallel: each fsync waits on the device, and the shards of one save
    are many GB (a directory fsync alone would not flush the files' data)."""
    files, dirs = [], []
    for dirpath, _, names in os.walk(path):
        files += [os.path.join(dirpath, name) for name in names]
        dirs.append(dirpath)
    with ThreadPoolExecutor(max_workers=_IO_THREADS) as pool:
        list(pool.map(_fsync_path, files))
    for d in dirs:
        _fsync_path(d)


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    _fsync_path(str(path))


class _Clock:
    """Seconds between laps, added into `timings` under each lap's name (nothing when None)."""

    def __init__(self, timings: dict[str, float] | None) -> None:
        self.timings, self.t = timings, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        if self.timings is not None:
            self.timings[name] = self.timings.get(name, 0.0) + now - self.t
        self.t = now


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """Silence DCP's warning that it runs without collectives: at world size 1 that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
