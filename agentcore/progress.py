"""A live progress line for long runs: counts by status, turns/s, tokens/s, in flight.

What it is: a small task that reads `statistics()` every `interval_s` and rewrites one line on
stderr (a new line every `plain_every_s` when stderr is not a terminal, e.g. in CI logs).
What it is not: metrics storage; the trainer writes its own JSON lines and TensorBoard.

Example:
    tg.start_soon(show_progress, orch.statistics, total)
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

import anyio

from agentcore.orchestrator import OrchestratorStats


def format_line(stats: OrchestratorStats, total: int | None, turns_s: float, tokens_s: float) -> str:
    done = f"{stats.finished}/{total}" if total else str(stats.finished)
    statuses = " ".join(f"{k}={v}" for k, v in sorted(stats.by_status.items())) or "-"
    return (
        f"[{done}] {statuses} | {turns_s:.1f} turns/s {tokens_s:.0f} tok/s "
        f"| in flight {stats.in_flight} | {stats.elapsed_s:.0f}s"
    )


async def show_progress(
    stats: Callable[[], OrchestratorStats],
    total: int | None = None,
    *,
    interval_s: float = 1.0,
    plain_every_s: float = 30.0,
    out: TextIO = sys.stderr,
) -> None:
    """Run until cancelled; the caller cancels it when the run ends."""
    tty = out.isatty()
    last = stats()
    last_t = last_print = time.monotonic()
    while True:
        await anyio.sleep(interval_s)
        now, cur = time.monotonic(), stats()
        dt = max(now - last_t, 1e-9)
        line = format_line(cur, total, (cur.turns - last.turns) / dt, (cur.generated_tokens - last.generated_tokens) / dt)
        last, last_t = cur, now
        if tty:
            out.write("\r\x1b[2K" + line)
            out.flush()
        elif now - last_print >= plain_every_s:
            out.write(line + "\n")
            out.flush()
            last_print = now
