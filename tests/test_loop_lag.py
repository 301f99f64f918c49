"""The event-loop lag monitor (agentcore.loop_lag): a blocked loop shows as a late wake-up, in
every reader's window, and a take starts that reader's window afresh."""

from __future__ import annotations

import time

import anyio
import pytest

from agentcore.loop_lag import LagStatistics, LoopLag


async def test_a_blocked_loop_shows_as_lag_in_every_readers_window():
    lag = LoopLag(interval_s=0.02, readers=("progress", "step"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(lag.run)
        await anyio.sleep(0.1)
        time.sleep(0.3)  # blocks the loop, as a callback that does I/O or a thread holding the GIL would
        await anyio.sleep(0.1)
        tg.cancel_scope.cancel()
    progress, step = lag.take("progress"), lag.take("step")
    assert progress == step and progress.samples >= 3, progress
    assert progress.max_ms >= 250 and 0 < progress.mean_ms <= progress.max_ms, progress


def test_a_take_starts_its_readers_window_afresh_and_leaves_the_others():
    lag = LoopLag(readers=("progress", "step"))
    lag.record(0.040)
    lag.record(0.010)
    assert lag.take("progress") == LagStatistics(samples=2, max_ms=40.0, mean_ms=25.0)
    lag.record(0.002)
    assert lag.take("progress") == LagStatistics(samples=1, max_ms=2.0, mean_ms=2.0)
    assert lag.take("step") == LagStatistics(samples=3, max_ms=40.0, mean_ms=pytest.approx(52 / 3))
    assert lag.take("step") == LagStatistics()  # nothing since: zeros


def test_an_early_wake_up_is_no_lag_and_an_unknown_reader_is_a_bug():
    lag = LoopLag(readers=("progress",))
    lag.record(-0.001)
    assert lag.take("progress").max_ms == 0.0
    with pytest.raises(KeyError):
        lag.take("step")
