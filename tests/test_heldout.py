"""The held-out evaluation's row (`rl.heldout.evaluate`) when its rollouts did or did not reach the
policy's own end. The run's rollouts are the faked edge: they come back as the orchestrator
returns them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from agentcore.types import Status, Timings, Trajectory
from bench.system.policy_learning import CPU_FAMILIES
from rl import heldout
from rl.config import TrainConfig, apply_overrides
from rl.data import families
from rl.recipes import smoke_cpu


@dataclass
class _Run:
    """What `evaluate` reads of a run: its config, directory and rollouts."""

    cfg: TrainConfig
    run_dir: Path
    status: Status
    reward: float | None

    async def rollouts(self, items, *, tag, rollout):  # noqa: ARG002 - the run's signature
        return [_trajectory(item.task.task_id, self.status, self.reward) for item in items]


def _trajectory(task_id: str, status: Status, reward: float | None) -> Trajectory:
    return Trajectory(
        trajectory_id=f"{task_id}/0", task_id=task_id, group_id=f"{task_id}@heldout", sample_index=0,
        prompt_ids=[1, 2], response_ids=[] if status is Status.ENGINE_ERROR else [3], logprobs=[], loss_mask=[],
        turns=[], status=status, weight_version_min=-1, weight_version_max=-1, timings=Timings(),
        error="SGLang at http://127.0.0.1:1/generate failed after 6 attempt(s): ConnectError" if status is Status.ENGINE_ERROR else None,
        reward=reward,
    )


@pytest.fixture
def cfg(tmp_path) -> TrainConfig:
    base = apply_overrides(smoke_cpu(), CPU_FAMILIES)
    return msgspec.structs.replace(base, run_dir=str(tmp_path))


async def test_rollouts_the_model_server_failed_write_no_row_and_a_rerun_evaluates_again(cfg, tmp_path):
    dead = _Run(cfg, tmp_path, Status.ENGINE_ERROR, -1.0)
    n = len(families.split(scale=0.01).heldout)
    with pytest.raises(heldout.HeldoutError, match=rf"before_rft: {n} of {n} rollouts ended in engine_error: SGLang at"):
        await heldout.evaluate(dead, "before_rft", version=0)
    assert heldout.read_rows(tmp_path) == []

    row = await heldout.evaluate(_Run(cfg, tmp_path, Status.COMPLETED, 1.0), "before_rft", version=0)
    assert row is not None and row.pass_rate == 1.0 and row.trajectories == n
    assert [r.label for r in heldout.read_rows(tmp_path)] == ["before_rft"]


async def test_a_policy_that_fails_every_task_still_gets_its_row(cfg, tmp_path):
    row = await heldout.evaluate(_Run(cfg, tmp_path, Status.PARSE_ERROR, -1.0), "before_rft", version=0)
    assert row is not None and row.pass_rate == 0.0 and row.reward_mean == -1.0
