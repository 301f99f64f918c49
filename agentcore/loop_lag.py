"""How late the event loop runs: a task that sleeps a fixed interval and records how late it woke.

What it is: `LoopLag.run()` sleeps `interval_s` again and again; each wake-up later than asked
is one lag sample. A late loop delays every trajectory's next step, the GPU queue's reading of
results and the compile pool's reaping of compilers alike; it is late when a callback blocks, or
when other threads of the process hold the GIL (an in-process inference engine's). Each reader
named at construction takes the max and mean lag since its own previous take, so the progress
line and a step's metrics see their own windows.
What it is not: a profiler: it says that the loop was late, not what held it.

Example:
    lag = LoopLag(readers=("progress", "step"))
    tg.start_soon(lag.run)   # in the task group whose work it watches; cancelled with it
    lag.take("progress")     # LagStatistics(samples=600, max_ms=41.2, mean_ms=1.3)
"""

from __future__ import annotations

import time

import anyio
from msgspec import Struct


class LagStatistics(Struct, frozen=True, kw_only=True):
    """The lag samples of one window; zeros when it had none."""

    samples: int = 0
    max_ms: float = 0.0
    mean_ms: float = 0.0


class _Window:
    __slots__ = ("max_s", "samples", "total_s")

    def __init__(self) -> None:
        self.samples, self.total_s, self.max_s = 0, 0.0, 0.0

    def add(self, lag_s: float) -> None:
        self.samples += 1
        self.total_s += lag_s
        self.max_s = max(self.max_s, lag_s)

    def statistics(self) -> LagStatistics:
        mean_s = self.total_s / self.samples if self.samples else 0.0
        return LagStatistics(samples=self.samples, max_ms=self.max_s * 1e3, mean_ms=mean_s * 1e3)


class LoopLag:
    """Event-loop lag, sampled every `interval_s` while `run` runs, in one window per reader.

    Example:
        lag = LoopLag(interval_s=0.05, readers=("progress",))
        async with anyio.create_task_group() as tg:
            tg.start_soon(lag.run)
            ...
            print(f"loop lag max {lag.take('progress').max_ms:.0f} ms")
    """

    def __init__(self, interval_s: float = 0.05, readers: tuple[str, ...] = ("progress",)) -> None:
        self.interval_s = interval_s
        self._windows = {reader: _Window() for reader in readers}

    async def run(self) -> None:
        """Sample until cancelled."""
        while True:
            asked = time.monotonic()
            await anyio.sleep(self.interval_s)
            self.record(time.monotonic() - asked - self.interval_s)

    def record(self, lag_s: float) -> None:
        """One wake-up `lag_s` late, into every reader's window."""
        for window in self._windows.values():
            window.add(max(lag_s, 0.0))

    def take(self, reader: str) -> LagStatistics:
        """`reader`'s window since its previous take (or since the start), and a fresh one."""
        window, self._windows[reader] = self._windows[reader], _Window()
        return window.statistics()


__all__ = ["LagStatistics", "LoopLag"]
