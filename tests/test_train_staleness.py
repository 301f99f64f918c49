"""Bounded staleness: with `max_staleness=1` the next PPO step's rollouts run while the current
step trains, and those trajectories are exactly one weight version behind when used."""

from __future__ import annotations

import subprocess
import sys

import orjson


def test_next_rollouts_overlap_training_one_version_behind(tmp_path):
    run_dir = tmp_path / "run"
    args = ["--recipe", "smoke_cpu", "--run-dir", str(run_dir), "--set", "steps.rft=1", "--set", "steps.value=0",
            "--set", "steps.ppo=3", "--set", "max_staleness=1", "--set", "checkpoint.export_hf=false"]
    proc = subprocess.run([sys.executable, "-m", "agentcore.cli", "train", *args],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [orjson.loads(line) for line in (run_dir / "metrics.jsonl").read_bytes().splitlines()]
    ppo = [r for r in rows if r.get("stage_index") == 3]
    assert ["time/overlapped_rollout_s" in r for r in ppo] == [True, True, False]
    assert all(r["samples"] > 0 for r in ppo)
    for g in (2, 3):  # rolled out during step g-1's update: sampled with the version before it
        trajs = [orjson.loads(line) for line in (run_dir / "rollouts" / f"ppo_{g:06d}.jsonl").read_bytes().splitlines()]
        before = ppo[g - 2]["sync/version"] - 1
        assert {t["weight_version_min"] for t in trajs} == {before}
