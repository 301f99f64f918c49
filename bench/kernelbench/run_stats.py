"""How a benchmark run used the machine: `OUT/run_stats.jsonl`, written by the runner, read by the report.

What it is: `DepthSampler` samples the GPU queue's depth (submitters waiting for a lane) while the
rollouts run, since the end-of-run statistics only show the drained queue; `write_run_stats`
appends one JSON line per run or resumed run (wall time, problems recorded, the orchestrator's
and the GPU queue's `statistics()`, the sampled depth); `summarize_run_stats` folds the lines of
each checkpoint into a `MachineUse`: wall time and problems summed over resumed runs, problems per
hour, busy fraction per GPU lane (weighted by each run's queue uptime), jobs, jobs/s, restarts,
timeouts, crashes, queue depth. What it is not: the per-problem records (`bench.system.records`) or the
metrics of the solutions (`bench.kernelbench.metrics`).

Example:
    for use in summarize_run_stats(read_run_stats(out / RUN_STATS_FILE)):
        print(use.checkpoint_step, use.wall_s, use.busy_fraction, [lane.busy_fraction for lane in use.lanes])
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
import msgspec
from msgspec import Struct

RUN_STATS_FILE = "run_stats.jsonl"


class DepthSampler:
    """Samples `queue.statistics().depth` every `interval_s` until cancelled.

    Example:
        sampler = DepthSampler(queue)
        tg.start_soon(sampler.run)       # ... rollouts ...
        sampler.summary()                # {"samples": 120, "mean": 3.2, "max": 17}
    """

    def __init__(self, queue: Any, interval_s: float = 0.5) -> None:
        self.queue, self.interval_s = queue, interval_s
        self.samples = self.total = self.max = 0

    async def run(self) -> None:
        while True:
            self.sample()
            await anyio.sleep(self.interval_s)

    def sample(self) -> None:
        depth = self.queue.statistics().depth
        self.samples += 1
        self.total += depth
        self.max = max(self.max, depth)

    def summary(self) -> dict[str, float]:
        return {"samples": self.samples, "mean": self.total / self.samples if self.samples else 0.0,
                "max": self.max}


def write_run_stats(path: Path, *, wall_s: float, checkpoint_step: int | None, problems: int,
                    orchestrator: Any, queue: Any = None, depth: DepthSampler | None = None) -> dict:
    """Append this run's line: `orchestrator` and `queue` are objects with `statistics()` (the
    queue is None for the fake env). Returns the row."""
    row = {"finished_at": round(time.time(), 3), "wall_s": round(wall_s, 3), "checkpoint_step": checkpoint_step,
           "problems": problems, "orchestrator": msgspec.to_builtins(orchestrator.statistics()),
           "gpu_queue": msgspec.to_builtins(queue.statistics()) if queue is not None else None,
           "gpu_queue_depth": depth.summary() if depth is not None else None}
    with open(path, "ab") as f:
        f.write(msgspec.json.encode(row) + b"\n")
    return row


def read_run_stats(path: str | Path) -> list[dict]:
    """The complete lines of `path` ([] if it does not exist); a torn line is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_bytes().splitlines():
        try:
            row = msgspec.json.decode(line)
        except msgspec.DecodeError:
            continue
        if isinstance(row, dict) and "wall_s" in row:
            rows.append(row)
    return rows


class LaneUse(Struct, frozen=True, kw_only=True):
    """One GPU lane over all runs of a checkpoint."""

    gpu: int
    busy_fraction: float
    """Seconds holding a job / seconds the queue was up, summed over the runs."""
    jobs_done: int
    restarts: int
    timeouts: int
    crashes: int


class MachineUse(Struct, frozen=True, kw_only=True):
    """The run_stats lines of one checkpoint, folded (resumed runs add up)."""

    checkpoint_step: int | None
    runs: int
    """Lines folded: the first run plus each resume."""
    wall_s: float
    """Rollout wall time, summed over the runs."""
    problems: int
    """Problems recorded by these runs (not those found already done)."""
    problems_per_hour: float | None
    trajectories: int
    """Trajectories the orchestrator finished."""
    queue_uptime_s: float | None = None
    """Seconds the GPU queue was up, summed; None: the fake env (no queue)."""
    busy_fraction: float | None = None
    """Mean over lanes of the lanes' busy fractions."""
    jobs_done: int = 0
    jobs_per_s: float | None = None
    restarts: int = 0
    timeouts: int = 0
    crashes: int = 0
    poisoned: int = 0
    depth_mean: float | None = None
    """GPU-queue depth sampled during the runs (weighted by samples); None: not sampled."""
    depth_max: int | None = None
    lanes: tuple[LaneUse, ...] = ()


def summarize_run_stats(rows: list[dict]) -> list[MachineUse]:
    """One MachineUse per checkpoint step (None first), in step order."""
    by_step: dict[int | None, list[dict]] = defaultdict(list)
    for row in rows:
        by_step[row.get("checkpoint_step")].append(row)
    return [_fold(step, by_step[step]) for step in sorted(by_step, key=lambda s: (s is not None, s or 0))]


def _fold(step: int | None, rows: list[dict]) -> MachineUse:
    wall_s = sum(float(r["wall_s"]) for r in rows)
    problems = sum(_problems(r) for r in rows)
    base = dict(checkpoint_step=step, runs=len(rows), wall_s=round(wall_s, 3), problems=problems,
                problems_per_hour=problems / (wall_s / 3600) if wall_s > 0 else None,
                trajectories=sum(int((r.get("orchestrator") or {}).get("finished", 0)) for r in rows))
    queues = [r["gpu_queue"] for r in rows if r.get("gpu_queue")]
    if not queues:
        return MachineUse(**base)
    return MachineUse(**base, **_queue_fields(queues), **_depth_fields([r.get("gpu_queue_depth") for r in rows]))


def _problems(row: dict) -> int:
    if "problems" in row:
        return int(row["problems"])
    return int((row.get("orchestrator") or {}).get("groups_emitted", 0))  # lines written before the field


def _queue_fields(queues: list[dict]) -> dict:
    """Sums over runs; fractions weighted by each run's queue uptime."""
    uptime = sum(float(q["uptime_s"]) for q in queues)
    lanes: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for q in queues:
        for lane in q["lanes"]:
            acc = lanes[int(lane["gpu"])]
            acc["busy_s"] += float(lane["busy_fraction"]) * float(q["uptime_s"])
            for name in ("jobs_done", "restarts", "timeouts", "crashes"):
                acc[name] += int(lane[name])
    per_lane = tuple(LaneUse(gpu=gpu, busy_fraction=acc["busy_s"] / uptime if uptime > 0 else 0.0,
                             jobs_done=int(acc["jobs_done"]), restarts=int(acc["restarts"]),
                             timeouts=int(acc["timeouts"]), crashes=int(acc["crashes"]))
                     for gpu, acc in sorted(lanes.items()))
    jobs = sum(int(q["jobs_done"]) for q in queues)
    return dict(queue_uptime_s=round(uptime, 3), jobs_done=jobs, jobs_per_s=jobs / uptime if uptime > 0 else None,
                busy_fraction=sum(u.busy_fraction for u in per_lane) / len(per_lane) if per_lane else None,
                restarts=sum(int(q["restarts"]) for q in queues), timeouts=sum(int(q["timeouts"]) for q in queues),
                crashes=sum(int(q["crashes"]) for q in queues), poisoned=sum(int(q.get("poisoned", 0)) for q in queues),
                lanes=per_lane)


def _depth_fields(depths: list[dict | None]) -> dict:
    sampled = [d for d in depths if d and d.get("samples")]
    if not sampled:
        return {}
    samples = sum(int(d["samples"]) for d in sampled)
    return dict(depth_mean=sum(float(d["mean"]) * int(d["samples"]) for d in sampled) / samples,
                depth_max=max(int(d["max"]) for d in sampled))


__all__ = ["RUN_STATS_FILE", "DepthSampler", "LaneUse", "MachineUse", "read_run_stats", "summarize_run_stats",
           "write_run_stats"]
