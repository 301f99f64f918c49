"""The compile pool's statistics: what it built, what it found cached, and where its time went.

What: `CompilePoolStatistics`, the immutable figures `CompilePool.statistics()` returns (counts,
summed seconds of builds, compiler processes, slot waits, plans, precompiled-header waits and
links, and their means), and `CompileCounters`, the running sums the pool adds to as it works.
What not: it measures nothing itself; `rewards.build.compile_pool` times its steps and adds them here.

Example:
    counters = CompileCounters()
    counters.add(processes=1, slot_wait_seconds_total=0.2, compile_seconds_total=1.5)
    counters.snapshot(in_flight=0, queue_length=0).process_s_mean   # 1.5
"""

from __future__ import annotations

import msgspec
from msgspec import Struct


class CompilePoolStatistics(Struct, frozen=True, kw_only=True):
    builds: int = 0
    builds_failed: int = 0
    units_built: int = 0
    units_failed: int = 0
    cache_hits: int = 0
    timeouts: int = 0
    links: int = 0
    link_cache_hits: int = 0
    pch_builds: int = 0
    in_flight: int = 0
    """Compiler or linker processes running now."""
    queue_length: int = 0
    """Compiles waiting for a slot."""
    compile_seconds_total: float = 0.0
    """Summed wall time of compiler and linker processes."""
    build_seconds_total: float = 0.0
    """Summed wall time of `build` calls, from the call to the result."""
    processes: int = 0
    """Compiler, linker and precompiled-header processes run (the count behind compile_seconds_total)."""
    slot_wait_seconds_total: float = 0.0
    """Summed seconds those processes waited for a compiler slot (`max_parallel`) before starting."""
    plan_seconds_total: float = 0.0
    """Summed seconds of builds from the call until their units start: the layout check and the
    source snapshot (worker threads, so the wait for a free one too); builds whose check failed excluded."""
    pch_wait_seconds_total: float = 0.0
    """Summed seconds builds waited for the precompiled header (building it, or another build's build)."""
    link_seconds_total: float = 0.0
    """Summed wall time of linker processes (also in compile_seconds_total)."""

    @property
    def build_s_mean(self) -> float:
        return self.build_seconds_total / max(self.builds, 1)

    @property
    def process_s_mean(self) -> float:
        """Mean seconds one compiler (or linker) process ran: the compiler's speed, without waits."""
        return self.compile_seconds_total / max(self.processes, 1)

    @property
    def slot_wait_s_mean(self) -> float:
        return self.slot_wait_seconds_total / max(self.processes, 1)


class CompileCounters:
    """The pool's running sums, kept as one `CompilePoolStatistics` replaced on every `add`."""

    def __init__(self) -> None:
        self._sums = CompilePoolStatistics()

    def add(self, **deltas: float) -> None:
        """Add each delta to the field of its name (`cache_hits=1`, `link_seconds_total=0.8`)."""
        sums = self._sums
        self._sums = msgspec.structs.replace(sums, **{k: getattr(sums, k) + v for k, v in deltas.items()})

    def snapshot(self, *, in_flight: int, queue_length: int) -> CompilePoolStatistics:
        """The sums so far, with the compiler slots' live figures, which are no sums."""
        return msgspec.structs.replace(self._sums, in_flight=in_flight, queue_length=queue_length)

