"""How a benchmark run used the machine: the runner's run_stats.jsonl lines (a replay on CPU through
a real GPU queue whose lane runs `sleep` jobs where a GPU would verify and profile), their folding
over resumed runs, and their place in summary.json and report.md."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from agentcore.kernel_env import FakeKernelEnv
from bench.kernelbench.candidates import EnvEvaluator
from bench.kernelbench.report import write_report
from bench.kernelbench.run import run_benchmark
from bench.kernelbench.run_stats import RUN_STATS_FILE, read_run_stats, summarize_run_stats
from rewards.queue.gpu_queue import GpuQueue, GpuQueueConfig
from rewards.queue.jobs import Job, JobStatus, SleepArgs, encode
from tests.test_bench_run import CountingEvaluator, fake_config

JOB_S = 0.05


class QueuedFakeEnv(FakeKernelEnv):
    """The fake env, holding a GPU-queue lane for a `sleep` job on every verify and profile."""

    def __init__(self, queue: GpuQueue) -> None:
        super().__init__()
        self.queue = queue

    async def _hold_lane(self, kind: str) -> None:
        result = await self.queue.submit(Job(job_id=f"{kind}-{sum(self.calls.values())}", kind="sleep",
                                             payload=encode(SleepArgs(seconds=JOB_S))))
        assert result.status is JobStatus.OK, result.error

    async def verify(self, workspace, task):
        await self._hold_lane("verify")
        return await super().verify(workspace, task)

    async def profile(self, workspace, task):
        await self._hold_lane("profile")
        return await super().profile(workspace, task)


def queue_config(tmp_path: Path) -> GpuQueueConfig:
    return GpuQueueConfig(gpus=(0,), scratch_root=str(tmp_path / "scratch"), job_default_deadline_s=60.0,
                          worker_start_timeout_s=60.0)


async def test_a_queued_run_writes_lane_busy_fraction_jobs_and_depth(tmp_path):
    config = fake_config(tmp_path, workers=3)
    async with GpuQueue(queue_config(tmp_path)) as queue:
        env = QueuedFakeEnv(queue)
        records = await run_benchmark(config, kernel_env=env, evaluator=EnvEvaluator(env))
    assert len(records) == 3
    [row] = read_run_stats(Path(config.out_dir) / RUN_STATS_FILE)
    q = row["gpu_queue"]
    assert q["jobs_done"] == env.calls["verify"] + env.calls["profile"] > 0
    assert [lane["gpu"] for lane in q["lanes"]] == [0]
    assert 0 < q["lanes"][0]["busy_fraction"] <= 1 and q["busy_fraction"] == q["lanes"][0]["busy_fraction"]
    assert row["problems"] == 3 and row["checkpoint_step"] is None
    assert row["gpu_queue_depth"]["samples"] >= 1 and row["gpu_queue_depth"]["max"] >= 0


async def test_summary_and_report_carry_the_machine_use(tmp_path):
    config = fake_config(tmp_path, workers=2)
    async with GpuQueue(queue_config(tmp_path)) as queue:
        env = QueuedFakeEnv(queue)
        records = await run_benchmark(config, kernel_env=env, evaluator=EnvEvaluator(env))
    out = Path(config.out_dir)
    path = write_report(out, records)
    [machine] = json.loads((out / "summary.json").read_text())["machine"]
    [row] = read_run_stats(out / RUN_STATS_FILE)
    assert machine["wall_s"] == row["wall_s"] and machine["problems"] == 3
    assert machine["busy_fraction"] == pytest.approx(row["gpu_queue"]["busy_fraction"])
    assert machine["jobs_done"] == row["gpu_queue"]["jobs_done"]
    assert machine["problems_per_hour"] == pytest.approx(3 / (row["wall_s"] / 3600))
    assert machine["lanes"][0]["gpu"] == 0
    text = path.read_text()
    assert "## Machine use" in text
    assert f"| final | 0 | {100 * machine['lanes'][0]['busy_fraction']:.1f}% | {machine['jobs_done']} |" in text


async def test_a_resumed_run_adds_a_line_and_the_summary_adds_them_up(tmp_path):
    config = fake_config(tmp_path)
    env = FakeKernelEnv()
    with anyio.CancelScope() as scope:
        await run_benchmark(config, kernel_env=env, evaluator=CountingEvaluator(env, cancel_at=2, scope=scope))
    await run_benchmark(config, kernel_env=env, evaluator=EnvEvaluator(env))
    rows = read_run_stats(Path(config.out_dir) / RUN_STATS_FILE)
    # the stopped run wrote no line (it never finished); the resume recorded the problems left
    [use] = summarize_run_stats(rows)
    assert use.runs == len(rows) == 1 and 1 <= use.problems <= 2
    assert use.busy_fraction is None and use.lanes == ()  # the fake env has no GPU queue


def lane(gpu: int, busy: float, jobs: int, restarts: int = 0) -> dict:
    return {"gpu": gpu, "busy_fraction": busy, "jobs_done": jobs, "restarts": restarts, "timeouts": 0, "crashes": 0}


def row(wall_s: float, uptime_s: float, lanes: list[dict], *, problems: int | None = None, step=None,
        depth: dict | None = None) -> dict:
    jobs = sum(x["jobs_done"] for x in lanes)
    queue = {"lanes": lanes, "depth": 0, "busy_fraction": sum(x["busy_fraction"] for x in lanes) / len(lanes),
             "jobs_done": jobs, "jobs_per_s": jobs / uptime_s, "restarts": sum(x["restarts"] for x in lanes),
             "timeouts": 0, "crashes": 0, "poisoned": 0, "uptime_s": uptime_s}
    out = {"wall_s": wall_s, "checkpoint_step": step, "orchestrator": {"finished": 5, "groups_emitted": 4},
           "gpu_queue": queue, "gpu_queue_depth": depth}
    return out if problems is None else out | {"problems": problems}


def test_resumed_runs_weight_busy_fractions_by_queue_uptime():
    rows = [row(90, 100, [lane(0, 0.5, 10), lane(1, 1.0, 20, restarts=1)], problems=6,
                depth={"samples": 10, "mean": 2.0, "max": 5}),
            row(270, 300, [lane(0, 0.9, 30), lane(1, 0.1, 40)], problems=12, depth={"samples": 30, "mean": 6.0, "max": 9})]
    [use] = summarize_run_stats(rows)
    assert (use.runs, use.wall_s, use.problems, use.trajectories) == (2, 360, 18, 10)
    assert use.problems_per_hour == pytest.approx(18 / 0.1)
    assert [x.busy_fraction for x in use.lanes] == pytest.approx([(50 + 270) / 400, (100 + 30) / 400])
    assert use.busy_fraction == pytest.approx(((50 + 270) + (100 + 30)) / 800)
    assert (use.jobs_done, use.restarts, use.lanes[1].restarts) == (100, 1, 1)
    assert use.jobs_per_s == pytest.approx(100 / 400)
    assert use.depth_mean == pytest.approx((10 * 2 + 30 * 6) / 40) and use.depth_max == 9


def test_checkpoints_are_folded_apart_and_old_lines_count_groups():
    rows = [row(10, 10, [lane(0, 0.5, 1)], step=20), row(10, 10, [lane(0, 0.5, 1)], step=10),
            {"wall_s": 5.0, "orchestrator": {"finished": 2, "groups_emitted": 2}, "gpu_queue": None}]
    uses = summarize_run_stats(rows)
    assert [u.checkpoint_step for u in uses] == [None, 10, 20]
    assert uses[0].problems == 2 and uses[0].busy_fraction is None and uses[0].depth_mean is None
    assert uses[1].problems == 4  # no "problems" field: the orchestrator's groups


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / RUN_STATS_FILE
    path.write_bytes(json.dumps(row(1, 1, [lane(0, 0.1, 1)])).encode() + b'\n{"wall_s": 3, "orchestr')
    assert len(read_run_stats(path)) == 1
    assert read_run_stats(tmp_path / "missing.jsonl") == []
