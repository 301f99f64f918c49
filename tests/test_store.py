"""The trajectory store keeps every finished trajectory exactly once across stops."""

from __future__ import annotations

import msgspec
import pytest

from agentcore.store import TrajectoryStore, read_trajectories, redone_path
from agentcore.types import INFRA_FAILURES, Status, Timings, Trajectory


def make(group: str, index: int, n_tokens: int = 5, status: Status = Status.COMPLETED) -> Trajectory:
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
        status=status,
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


ENDINGS = {
    ("a", 0): Status.COMPLETED,
    ("a", 1): Status.ENGINE_ERROR,
    ("b", 0): Status.PARSE_ERROR,
    ("b", 1): Status.FAILED,
    ("c", 0): Status.TRUNCATED_TURNS,
}


async def _store_endings(path):
    async with TrajectoryStore(path) as store:
        for (group, index), status in ENDINGS.items():
            await store.append(make(group, index, status=status))


async def test_redo_leaves_infrastructure_failures_out_and_keeps_the_model_s_endings(tmp_path):
    path = tmp_path / "t.jsonl"
    await _store_endings(path)
    async with TrajectoryStore(path, redo=INFRA_FAILURES) as store:
        assert store.keys() == {("a", 0), ("b", 0), ("c", 0)}
        assert {t.status for t in store.existing()} == {Status.COMPLETED, Status.PARSE_ERROR, Status.TRUNCATED_TURNS}
        assert store.statistics().redone == 2
        await store.append(make("a", 1))  # the rerun of a redone key is stored once
        await store.append(make("b", 1))
    keys = [(t.group_id, t.sample_index) for t in read_trajectories(path, strict=True)]
    assert sorted(keys) == sorted(ENDINGS)
    assert {t.status for t in read_trajectories(path)} == {Status.COMPLETED, Status.PARSE_ERROR, Status.TRUNCATED_TURNS}


async def test_redone_trajectories_are_kept_in_the_redone_file(tmp_path):
    path = tmp_path / "t.jsonl"
    await _store_endings(path)
    async with TrajectoryStore(path, redo=INFRA_FAILURES):
        pass
    moved = list(read_trajectories(redone_path(path), strict=True))
    assert redone_path(path).name == "t.redone.jsonl"
    assert {(t.group_id, t.sample_index): t.status for t in moved} == {
        ("a", 1): Status.ENGINE_ERROR,
        ("b", 1): Status.FAILED,
    }


async def test_without_redo_every_stored_trajectory_counts_as_done(tmp_path):
    path = tmp_path / "t.jsonl"
    await _store_endings(path)
    async with TrajectoryStore(path) as store:
        assert store.keys() == set(ENDINGS)
    assert not redone_path(path).exists()


async def test_redo_keeps_a_corrupt_line_in_place(tmp_path):
    path = tmp_path / "t.jsonl"
    await _store_endings(path)
    with path.open("ab") as f:
        f.write(b"not json\n")
    async with TrajectoryStore(path, redo=INFRA_FAILURES):
        pass
    assert path.read_bytes().endswith(b"not json\n")
    assert b"not json" not in redone_path(path).read_bytes()
    assert all(msgspec.json.decode(line)["status"] not in ("engine_error", "failed")
               for line in path.read_bytes().splitlines()[:-1])
