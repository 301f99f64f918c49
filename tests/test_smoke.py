"""`cuda-agent smoke` on a CPU machine: the CPU variant of the README's main job runs the whole
training path (learner rank process, embedded engine over HTTP, orchestrator, real tools in the
sandbox, fake kernel environment) and leaves a loadable run behind."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "agentcore.cli", "smoke", "--cpu", "--out", str(out)],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_smoke_runs_every_stage_of_the_plan(smoke_run):
    out, proc = smoke_run
    summary = orjson.loads((out / "summary.json").read_bytes())
    stages = [row["stage"] for row in summary["rows"]]
    assert stages == ["rft"] * 4 + ["value"] + ["ppo"] * 2
    assert all(row["perf/tokens_per_s"] > 0 for row in summary["rows"])  # every update's throughput
    assert "step" in proc.stdout and "reward" in proc.stdout  # the printed reward curve


def test_smoke_demonstrations_are_rewarded_and_sft_loss_falls(smoke_run):
    out, _ = smoke_run
    rows = [orjson.loads(line) for line in (out / "metrics.jsonl").read_bytes().splitlines()]
    rft = [r for r in rows if r.get("stage_index") == 1]
    assert rft[0]["collect/pass_rate"] == 1.0  # every demonstration passed the environment
    assert rft[-1]["train/sft_loss"] < rft[0]["train/sft_loss"]
    value = [r for r in rows if r.get("stage_index") == 2]
    # the value collection's rollouts are logged too: the policy PPO starts from
    assert value[0]["collect/trajectories"] > 0 and "collect/pass_rate" in value[0]


def test_smoke_ppo_steps_record_rewards_and_weight_versions(smoke_run):
    out, _ = smoke_run
    rows = [orjson.loads(line) for line in (out / "metrics.jsonl").read_bytes().splitlines()]
    ppo = [r for r in rows if r.get("stage_index") == 3]
    assert len(ppo) == 2
    assert all(r["rollout/reward_mean"] is not None and r["samples"] > 0 for r in ppo)
    assert ppo[1]["sync/version"] == ppo[0]["sync/version"] + 1


def test_smoke_export_loads_in_transformers(smoke_run):
    out, _ = smoke_run
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out / "hf", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(out / "hf", local_files_only=True)
    assert model.config.vocab_size >= len(tok)
    assert (out / "ckpt" / "latest").exists()
