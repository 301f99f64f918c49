"""`cuda-agent train` with several learner ranks (the node layout: an FSDP2 learner over several
GPUs, one embedded engine per rank behind the router), and the progress lines a rollout batch logs.

On CPU the two ranks run with gloo; on two GPUs (the `gpu` test) with NCCL, where each rank's
learner commands and engine calls run in worker threads whose current CUDA device must be the
rank's own: a fresh thread's is cuda:0, and rank 1's first collective then failed on 6 H200s
("Attempt to perform collective on tensor not on device passed to init_process_group")."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import anyio
import pytest
import torch

from agentcore.loop_lag import LoopLag
from agentcore.orchestrator import LimiterStats, OrchestratorStats
from rewards.build.compile_stats import CompilePoolStatistics
from rewards.queue.jobs import KindStatistics, QueueStatistics
from rl.config import apply_overrides
from rl.recipes import smoke_cpu
from rl.run import Run, env_metrics
from rl.train import run_training

SHORT = ["steps.rft=2", "steps.value=1", "steps.ppo=1", "layout.learner_gpus=[0,1]"]


def _check_rows(rows: list[dict]) -> None:
    stages = [r["stage"] for r in rows]
    assert stages == ["rft", "rft", "value", "ppo"], stages
    assert all(math.isfinite(r["train/sft_loss"]) for r in rows[:2]), rows
    assert math.isfinite(rows[2]["train/value_loss"]) and math.isfinite(rows[3]["train/policy_loss"]), rows
    rollout_rows = [r for r in rows if "rollout/reward_mean" in r]  # each says how late its event loop ran
    assert rollout_rows and all(r["loop_lag/samples"] > 0 and r["loop_lag/max_ms"] >= 0 for r in rollout_rows), rows
    synced = [r["sync/version"] for r in rows if "sync/version" in r]  # the actor's updates reach the engines:
    assert synced == sorted(synced) and len(synced) == 2, rows  # after the last rft step and the ppo step


def test_two_cpu_learner_ranks_run_every_stage(tmp_path):
    cfg = apply_overrides(smoke_cpu(), [*SHORT, f"run_dir={tmp_path / 'run'}"])
    rows = anyio.run(run_training, cfg)
    _check_rows(rows)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpu_learner_ranks_run_every_stage(tmp_path):
    cfg = apply_overrides(smoke_cpu(), [*SHORT, "layout.cpu=false", "layout.verify_gpus=[]",
                                        f"run_dir={tmp_path / 'run'}"])
    rows = anyio.run(run_training, cfg)
    _check_rows(rows)


def _kernel_env() -> SimpleNamespace:
    """A kernel environment's edge faked: its GPU queue and compile pool report these figures."""
    queue = QueueStatistics(lanes=(), depth=1, busy_fraction=0.87, jobs_done=5, jobs_per_s=0.1, restarts=0,
                            timeouts=0, crashes=0, poisoned=0, uptime_s=50.0,
                            kinds={"verify": KindStatistics(jobs=57, wait_s=0.4, lock_s=0.3, run_s=1.2)})
    pool = CompilePoolStatistics(builds=66, build_seconds_total=66 * 30.0, processes=132,
                                 compile_seconds_total=132 * 2.5, slot_wait_seconds_total=132 * 12.0)
    return SimpleNamespace(queue=SimpleNamespace(statistics=lambda: queue),
                           pool=SimpleNamespace(statistics=lambda: pool))


def test_the_kernel_envs_queue_and_pool_figures_become_metrics():
    metrics = env_metrics(_kernel_env())
    assert metrics["gpu_queue/busy_fraction"] == 0.87 and metrics["gpu_queue/verify/jobs"] == 57.0
    assert (metrics["gpu_queue/verify/wait_s"], metrics["gpu_queue/verify/lock_s"], metrics["gpu_queue/verify/run_s"]) \
        == (0.4, 0.3, 1.2)
    assert (metrics["compile_pool/builds"], metrics["compile_pool/build_s_mean"]) == (66.0, 30.0)
    assert (metrics["compile_pool/process_s_mean"], metrics["compile_pool/slot_wait_s_mean"]) == (2.5, 12.0)
    assert env_metrics(SimpleNamespace()) == {}  # the fake environment has neither


def test_a_running_batch_logs_where_it_waits(caplog):
    """Every `progress_every_s` a batch logs groups and trajectories done, turns, tokens, the
    limiters (held/total + waiting), the GPU queue with its job kinds, the compile pool and the
    event loop's lag since the last line: a stalled collection shows where it waits."""
    stats = OrchestratorStats(
        started=4, finished=1, in_flight=3, by_status={"completed": 1}, turns=21, generated_tokens=7102,
        groups_emitted=1, samples_waiting=0, results_waiting=0, elapsed_s=90.0,
        limiters={"gpu_slots": LimiterStats(borrowed=1, total=1, waiting=2)},
    )
    orch = SimpleNamespace(statistics=lambda: stats)
    env = _kernel_env()
    run = SimpleNamespace(cfg=smoke_cpu(), env_statistics=lambda: env_metrics(env), loop_lag=LoopLag())
    run.cfg = apply_overrides(run.cfg, ["orchestrator.progress_every_s=0.05"])
    run.loop_lag.record(0.045)  # the loop woke 45 ms late before the first line

    async def two_lines() -> None:
        with anyio.move_on_after(0.12):
            await Run._report_progress(run, "rft_demos", orch, 4)

    with caplog.at_level(logging.INFO, logger="cuda-agent.train"):
        anyio.run(two_lines)
    lines = [r.getMessage() for r in caplog.records if r.name == "cuda-agent.train"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("rft_demos: 1 of 4 groups, 1 trajectories done {'completed': 1}, 3 in flight, 21 turns"), lines
    assert "gpu_slots=1/1+2w" in lines[0] and "gpu queue depth 1, 5 jobs, busy 87%" in lines[0], lines
    assert ", verify 57 x 1.2 s (wait 0.4 s, lock 0.3 s)" in lines[0], lines
    assert "; builds 66 x 30.0 s (compiler 2.5 s, slot wait 12.0 s)" in lines[0], lines
    assert "; loop lag max 45 ms" in lines[0] and "; loop lag max 0 ms" in lines[1], lines  # each line its own window
