"""`KindTimes`: how long the GPU queue's jobs of each kind waited and ran.

What it is: sums, per `Job.kind`, of three spans of every finished job, which
`rewards.queue.gpu_queue.GpuQueue.submit` records: submitted -> a lane free (`wait_s`), lane held
-> the GPU's machine-wide lock taken (`lock_s`), lock taken -> done (`run_s`); `statistics()`
gives their means as `KindStatistics`. A run whose verify jobs take ten times a benchmark's reads
here whether they queued, waited for other queues' jobs, or ran slowly.
What it is not: the lanes' busy fractions (`rewards.queue.lanes.Lane`), which count time, not jobs.

Example:
    times = KindTimes()
    times.record("verify", wait_s=0.4, lock_s=0.0, run_s=1.2)
    times.statistics()["verify"]   # KindStatistics(jobs=1, wait_s=0.4, lock_s=0.0, run_s=1.2)
"""

from __future__ import annotations

from dataclasses import dataclass

from rewards.queue.jobs import KindStatistics


@dataclass
class _Sums:
    jobs: int = 0
    wait_s: float = 0.0
    lock_s: float = 0.0
    run_s: float = 0.0


class KindTimes:
    """Per-kind sums of the queue's job spans (one entry per kind the queue has run)."""

    def __init__(self) -> None:
        self._sums: dict[str, _Sums] = {}

    def record(self, kind: str, *, wait_s: float, lock_s: float, run_s: float) -> None:
        """One finished job of `kind`: seconds waiting for a lane, for the lock, and running."""
        sums = self._sums.setdefault(kind, _Sums())
        sums.jobs += 1
        sums.wait_s += wait_s
        sums.lock_s += lock_s
        sums.run_s += run_s

    def statistics(self) -> dict[str, KindStatistics]:
        return {kind: KindStatistics(jobs=s.jobs, wait_s=s.wait_s / s.jobs, lock_s=s.lock_s / s.jobs,
                                     run_s=s.run_s / s.jobs)
                for kind, s in sorted(self._sums.items())}


__all__ = ["KindTimes"]
