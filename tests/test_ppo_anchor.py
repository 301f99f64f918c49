"""`ppo.sft_coef` in the training loop: each PPO step's batch carries a batch of rft's collection
as demonstrations beside its rollouts, and the update imitates them (the learner's own math is
tested in tests/test_update.py). The CPU training loop with the real tiny policy, learner rank,
embedded engine, tools and sandbox; the kernel environment is the CPU variant's fake."""

from __future__ import annotations

import anyio
import orjson

from rl.config import apply_overrides
from rl.recipes import smoke_cpu


async def test_each_ppo_step_learns_from_rfts_demonstrations_beside_its_rollouts(tmp_path):
    run_dir = tmp_path / "run"
    cfg = apply_overrides(smoke_cpu(), [f"run_dir={run_dir}", "ppo.sft_coef=0.5", "checkpoint.export_hf=false"])
    from rl.train import run_training

    with anyio.fail_after(900):
        rows = await run_training(cfg)
    rft = [r for r in rows if r["stage"] == "rft"]
    ppo = [r for r in rows if r["stage"] == "ppo"]
    assert ppo and all(r["samples"] > 0 for r in ppo)
    kept = rft[0]["rft/kept"]  # what rft learnt from: its batches are at most that many
    for row in ppo:
        assert 0 < row["demonstrations"] <= kept
        assert row["train/sft_loss"] > 0  # the learner read them as demonstrations, not rollouts
        assert row["train/action_tokens"] > 0
    stored = [orjson.loads(line) for line in (run_dir / "metrics.jsonl").read_bytes().splitlines()]
    assert [r.get("demonstrations") for r in stored if r["stage"] == "ppo"] == [r["demonstrations"] for r in ppo]


async def test_without_sft_coef_a_ppo_step_has_no_demonstrations(tmp_path):
    run_dir = tmp_path / "run"
    cfg = apply_overrides(smoke_cpu(), [f"run_dir={run_dir}", "checkpoint.export_hf=false", "steps.rft=1",
                                        "steps.value=0", "steps.ppo=1"])
    from rl.train import run_training

    with anyio.fail_after(900):
        rows = await run_training(cfg)
    [ppo] = [r for r in rows if r["stage"] == "ppo"]
    assert ppo["samples"] > 0 and "train/policy_loss" in ppo  # the step did update
    assert "demonstrations" not in ppo and "train/sft_loss" not in ppo
