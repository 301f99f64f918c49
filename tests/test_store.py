"""The trajectory store keeps every finished trajectory exactly once across stops."""

from __future__ import annotations

import pytest

from agentcore.store import TrajectoryStore, read_trajectories
from agentcore.types import Status, Timings, Trajectory


def make(group: str, index: int, n_tokens: int = 5) -> Trajectory:
    return Trajectory(
        trajectory_id=f"{group}/{index}",
        task_id=group,
        group_id=group,
        sample_index=index,
        prompt_ids=[1, 2, 3],
        response_ids=list(range(n_tokens)),
        logprobs=[-0.5] * n_tokens,
        loss_mask=[1] * n_tokens,
        turns=[],
        status=Status.COMPLETED,
        weight_version_min=0,
        weight_version_max=0,
        timings=Timings(),
    )


async def test_appended_trajectories_read_back_equal(tmp_path):
    path = tmp_path / "t.jsonl"
    written = [make("a", 0), make("a", 1), make("b", 0)]
    async with TrajectoryStore(path) as store:
        for t in written:
            await store.append(t)
    assert list(read_trajectories(path)) == written


async def test_reopened_store_reports_stored_keys(tmp_path):
    path = tmp_path / "t.jsonl"
    async with TrajectoryStore(path) as store:
        await store.append(make("a", 0))
    async with TrajectoryStore(path) as store:
        assert store.keys() == {("a", 0)}
        assert store.statistics().resumed == 1


async def test_duplicate_append_is_refused(tmp_path):
    async with TrajectoryStore(tmp_path / "t.jsonl") as store:
        await store.append(make("a", 0))
        with pytest.raises(ValueError, match="already stored"):
            await store.append(make("a", 0))


async def test_torn_tail_from_killed_writer_is_dropped_and_appends_continue(tmp_path):
    path = tmp_path / "t.jsonl"
    async with TrajectoryStore(path) as store:
        await store.append(make("a", 0))
    with path.open("ab") as f:  # a write cut short by kill -9
        f.write(b'{"trajectory_id": "a/1", "task_')
    async with TrajectoryStore(path) as store:
        assert store.keys() == {("a", 0)}
        await store.append(make("a", 1))
    assert [t.sample_index for t in read_trajectories(path)] == [0, 1]


def test_corrupt_middle_line_is_named_in_strict_mode(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"not json\n" + b"\n")
    with pytest.raises(ValueError, match=":1:"):
        list(read_trajectories(path, strict=True))
