"""Process-level setup for the long-running async commands: uvloop and garbage-collector tuning.

What it is: `run(main, *args)` runs an async entry point on asyncio with uvloop after freezing
the objects created at start-up (imports, tokenizer, configs) out of the collector's view and
raising the young-generation threshold. A run holds hundreds of trajectories whose token lists
survive many collections; with the defaults, full collections walk all of them and stall the
event loop for tens of milliseconds (measured by `python -m bench.system.orchestrator`).
What it is not: a place for configuration; commands own their configs.
"""

from __future__ import annotations

import gc
from typing import Any, Awaitable, Callable

import anyio

GC_THRESHOLDS = (50_000, 20, 100)  # young objects before a collection; older generations' ratios


def tune_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run(main: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """Run `main(*args)`; an exception group holding one exception (a task group around a single
    failure) raises that exception, so a command's `except FileNotFoundError` still sees it."""
    tune_gc()
    try:
        return anyio.run(main, *args, backend="asyncio", backend_options={"use_uvloop": True})
    except BaseExceptionGroup as group:
        if (sole := sole_exception(group)) is None:
            raise
        raise sole from group


def sole_exception(group: BaseExceptionGroup) -> BaseException | None:
    """The one leaf exception of a (nested) group, or None when it holds several."""
    while len(group.exceptions) == 1:
        inner = group.exceptions[0]
        if not isinstance(inner, BaseExceptionGroup):
            return inner
        group = inner
    return None
