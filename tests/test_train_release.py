"""Colocated engines free their memory for each learner update (`engine.release_during_training`).

The CPU smoke run (embedded engine in the learner rank) releases and resumes around every rft,
value and ppo update and records the seconds; under `max_staleness > 0` the next rollouts
generate during training, so nothing is released. The rank's handlers act on the real embedded
engine: a release holds its admission until the resume. The SGLang side (release -> train ->
weights back -> buckets -> KV cache back) is in tests/test_train_sglang_tensor.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import anyio
import orjson
import pytest

from rl.config import apply_overrides
from rl.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig
from rl.learner.protocol import Empty, ReleaseRequest
from rl.learner.rank import Rank
from rl.recipes import smoke_cpu
from rl.stages import releases_memory
from rl.train import run_training

BOUND_S = 600


def config(tmp_path: Path, *extra: str):
    return apply_overrides(smoke_cpu(), [
        f"run_dir={tmp_path / 'run'}", "steps.rft=1", "steps.value=1", "steps.ppo=2",
        "checkpoint.export_hf=false", *extra,
    ])  # fmt: skip


def metric_rows(run_dir: Path) -> list[dict]:
    return [orjson.loads(line) for line in (run_dir / "metrics.jsonl").read_bytes().splitlines()]


async def test_every_update_of_the_cpu_smoke_run_releases_and_resumes_the_engine(tmp_path):
    with anyio.fail_after(BOUND_S):
        rows = await run_training(config(tmp_path))
    assert [r["stage"] for r in rows] == ["rft", "value", "ppo", "ppo"]
    assert all(r["samples"] > 0 for r in rows if r["stage"] == "ppo")  # each ppo step updated
    for row in metric_rows(tmp_path / "run"):
        assert row["time/release_s"] >= 0.0 and row["time/resume_s"] >= 0.0, row["stage"]
        assert row["time/train_s"] >= 0.0
    assert "sync/version" not in rows[1]  # the value step pushes no weights, yet resumes



async def test_rft_pushes_the_weights_once_after_its_last_step(tmp_path):
    with anyio.fail_after(BOUND_S):
        rows = await run_training(config(tmp_path, "stage=rft", "steps.rft=3"))
    assert ["sync/version" in r for r in rows] == [False, False, True]  # no rollouts between rft steps
    assert rows[2]["sync/version"] >= 1

async def test_nothing_is_released_while_the_next_rollouts_overlap_training(tmp_path):
    cfg = config(tmp_path, "stage=ppo", "max_staleness=1")
    with anyio.fail_after(BOUND_S):
        rows = await run_training(cfg)
    assert [r["step"] for r in rows] == [0, 1]
    assert "time/overlapped_rollout_s" in rows[0]
    assert not any(k in r for r in rows for k in ("time/release_s", "time/resume_s"))


def test_release_needs_the_switch_colocated_engines_and_strict_on_policy():
    urls = 'engine.urls=["http://127.0.0.1:1"]'
    assert releases_memory(smoke_cpu())
    assert not releases_memory(apply_overrides(smoke_cpu(), ["engine.release_during_training=false"]))
    assert not releases_memory(apply_overrides(smoke_cpu(), ["max_staleness=1"]))
    tensor = apply_overrides(smoke_cpu(), ["engine.kind=sglang", urls, "weight_sync.mode=sglang_tensor"])
    assert releases_memory(tensor)
    disk = apply_overrides(smoke_cpu(), ["engine.kind=sglang", urls, "weight_sync.mode=sglang_disk"])
    assert not releases_memory(disk)  # servers elsewhere: their memory is not the learner's


@pytest.fixture
def engine(tiny_hf_dir) -> EmbeddedEngine:
    return EmbeddedEngine.from_pretrained(str(tiny_hf_dir), EmbeddedEngineConfig(device="cpu"))


async def test_the_rank_holds_its_engine_from_release_until_resume(engine, tmp_path):
    dist = SimpleNamespace(rank=0, world_size=1, device=engine.device)
    rank = Rank(smoke_cpu(), tmp_path, dist, learner=None, engine=engine)
    assert "memory" not in engine.statistics().holds
    await rank.release(ReleaseRequest(weights=True))
    assert "memory" in engine.statistics().holds  # admission held: no generation during training
    await rank.resume(Empty())
    assert engine.statistics().holds == ()
    await rank.resume(Empty())  # a second resume (the failure path's) is harmless
    assert engine.statistics().holds == ()
