"""Device memory left to the baselines while a candidate is timed beside them.

Why: paired timing runs eager and torch.compile in the candidate's process. Eager's cuDNN and
cuBLAS take their workspaces from the free memory at call time, and when an allocation fails
cuDNN quietly falls back to an algorithm that needs less (slower). A candidate that holds most
of the GPU (a tensor kept from `__init__`, a `cudaMalloc` in its binding) would slow its
baselines and be paid for it; the cached baselines of unpaired timing, measured in another
process, never had this hole.

What it is: `baseline_need` runs each baseline once before any candidate code exists and keeps
the most memory one call took beyond what was allocated before it (its workspaces and
temporaries); `HeadroomWatch` then samples the headroom (free device memory plus what torch's
allocator holds unused) after the warm-ups, after every round and after the last, and
`starved` names the first moment the headroom fell below what the baselines need (with a margin)
when it was there before the candidate was built (less what the harness itself took since). What
the headroom was short of before the candidate existed (another process on a shared GPU) is not
the candidate's doing and is not flagged.

On a GPU shared with other processes (the single-GPU layout: learner and engine beside the
queue), memory they take during the rounds counts the same: the baselines were starved all the
same, so nothing is decided, but no one is blamed either.

What it is not: a verdict. `rewards.timing.paired.paired_milestone` grants no speedup milestone
from a starved run (the candidate's own time is real; the baselines' are not).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

MIB = 1 << 20
NEED_FACTOR = 1.5
"""Required headroom: the baselines' need times this plus `NEED_SLACK` (allocator rounding and
fragmentation); an honest candidate leaves tens of GiB, a starving one less than the need."""
NEED_SLACK = 256 * MIB


def required(need_bytes: int) -> int:
    return int(need_bytes * NEED_FACTOR) + NEED_SLACK


def headroom_bytes() -> int:
    """Free device memory plus what torch's caching allocator reserved and does not use."""
    import torch

    free, _total = torch.cuda.mem_get_info()
    return int(free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated())


def baseline_need(calls: Iterable[Any], make_inputs: Callable[[int], Sequence[Any]]) -> int:
    """The most memory one call of a baseline took beyond what was allocated before it: each of
    `calls` (`PairedCall`s: `.fn`, `.context`) once on input set 0, under torch.no_grad()."""
    import torch

    need = 0
    for call in calls:
        inputs = make_inputs(0)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with call.context():
            out = call.fn(*inputs)
        torch.cuda.synchronize()
        need = max(need, torch.cuda.max_memory_allocated() - before)
        del out, inputs
    return need


class HeadroomWatch:
    """The headroom at named moments, against the baselines' need (module docstring).
    `probe` reads the headroom in bytes (`headroom_bytes` on a GPU; tests pass their own)."""

    def __init__(self, need_bytes: int, probe: Callable[[], int] = headroom_bytes) -> None:
        self.need_bytes = need_bytes
        self.probe = probe
        self.before = probe()  # before the candidate is built
        self.lowest = self.before
        self.lowest_at = "before the candidate was built"
        self.starved = ""

    def harness_since(self, start: int) -> None:
        """The timing harness allocated its own memory (the flush buffer, the input pool; no
        candidate call in between) since the probe read `start`: what the baselines could have
        had without the candidate shrinks by what it took."""
        self.before -= max(0, start - self.probe())

    def sample(self, where: str) -> None:
        now = self.probe()
        if now < self.lowest:
            self.lowest, self.lowest_at = now, where
        need = required(self.need_bytes)
        if not self.starved and now < need <= self.before:
            self.starved = (f"the baselines were starved of device memory {where}: {now / MIB:.0f} MiB "
                            f"free beside the candidate, they need {need / MIB:.0f} MiB "
                            f"({self.need_bytes / MIB:.0f} MiB per call; {self.before / MIB:.0f} MiB "
                            f"before the candidate was built)")


__all__ = ["HeadroomWatch", "baseline_need", "headroom_bytes", "required"]
