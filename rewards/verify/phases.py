"""Where the time of a verify or profile job goes: named phases in milliseconds.

What it is: `Phases`, a stopwatch that adds `time.perf_counter()` intervals to named phases
(`with phases.phase("reference", sync=True): ...`), optionally ending a phase with a device
synchronize so GPU work is charged to the phase that queued it; `merge` folds a child process's
own phases in under a prefix; `process_age_ms()` is how long this process has existed (the
interpreter's start-up, before any of our code ran).

Naming (the target is each verify/profile job under 3 s; these say which part is over): top-level
names ("spawn", "load", "trial.reference", ...) are disjoint intervals of the trusted side, so
they sum to at most the handler's run time; a name that extends a recorded one by a dot part
("trial.judge.read" under "trial.judge") splits that interval further and is not added again.
Names under "child." are the child's own account of its side (import, CUDA warm-up, build, per-run
probes). They nest inside, or overlap with, the parent's "load" and "trial.candidate" waits and
are not added to the top-level sum.

What it is not: no timing of kernels (`rewards.timing.sampling`) and no policy. It never synchronizes
unless asked, and callers only ask on the trusted side, never in the candidate child, where an
extra synchronize would change what the side-stream check observes.

Importing it does not import torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

CHILD = "child."


class Phases:
    """Accumulated milliseconds per phase name; a phase entered twice adds up.

    Example:
        phases = Phases(sync=torch.cuda.synchronize)
        with phases.phase("reference", sync=True):
            refs = model(*inputs)
        verdict = msgspec.structs.replace(verdict, phases_ms=phases.as_dict())
    """

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync
        self.ms: dict[str, float] = {}

    def add(self, name: str, ms: float) -> None:
        self.ms[name] = self.ms.get(name, 0.0) + ms

    @contextmanager
    def phase(self, name: str, *, sync: bool = False) -> Iterator[None]:
        """Time the block; with `sync`, the device is synchronized before the clock stops."""
        start = time.perf_counter()
        try:
            yield
            if sync and self.sync is not None:
                self.sync()
        finally:
            self.add(name, (time.perf_counter() - start) * 1e3)

    def merge(self, other: Mapping[str, float], prefix: str = CHILD) -> None:
        for name, ms in other.items():
            self.add(prefix + name, float(ms))

    def as_dict(self) -> dict[str, float]:
        return {name: round(ms, 3) for name, ms in self.ms.items()}


def top_level_ms(phases_ms: Mapping[str, float]) -> float:
    """Sum of the trusted side's disjoint phases (child phases overlap them, and a phase's own
    parts are inside it)."""
    return sum(ms for name, ms in phases_ms.items()
               if not name.startswith(CHILD) and not _refines(name, phases_ms))


def _refines(name: str, phases_ms: Mapping[str, float]) -> bool:
    parts = name.split(".")
    return any(".".join(parts[:k]) in phases_ms for k in range(1, len(parts)))


def process_age_ms() -> float:
    """Milliseconds since this process was created (/proc/self/stat field 22, clock ticks since
    boot, against CLOCK_BOOTTIME); 0.0 where /proc cannot say. Resolution: one tick (10 ms)."""
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        age_s = time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0
    return max(0.0, age_s * 1e3)


__all__ = ["CHILD", "Phases", "process_age_ms", "top_level_ms"]
