"""Stop a long-running command cleanly on Ctrl-C or SIGTERM.

What it is: `stop_on_signal`, a task that waits for SIGINT or SIGTERM, says which one arrived on
stderr and cancels the scope it was given; the command then unwinds through its `async with`
blocks (children's process groups killed, stores flushed) and returns its exit code as usual.
What it is not: a handler for worker processes; they stop with their parent's process group.

Example:
    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_on_signal, tg.cancel_scope, "cuda-agent rollout")
        await work()
        tg.cancel_scope.cancel()  # the work is done: stop the watcher too
"""

from __future__ import annotations

import signal
import sys

import anyio
from anyio.abc import TaskStatus

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def stop_on_signal(
    scope: anyio.CancelScope,
    prog: str,
    note: str = "",
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Cancel `scope` at the first SIGINT or SIGTERM, printing `<prog>: SIGTERM, stopping<note>`.

    The line starts on a fresh line (after a progress line or the terminal's `^C`). Under
    `tg.start` it returns once the handlers are installed.
    """
    with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
        task_status.started()
        async for signum in signals:
            print(f"\n{prog}: {signal.Signals(signum).name}, stopping{note}", file=sys.stderr)
            scope.cancel()
            return
