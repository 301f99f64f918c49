"""`cuda-agent smoke` on a CPU machine: the CPU variant of the README's main job runs the whole
training path (learner rank process, embedded engine over HTTP, orchestrator, real tools in the
sandbox, fake kernel environment) and leaves a loadable run behind; it ends saying what ran and
what the CPU variant cannot show, prints our own lines only, and keeps directories it did not make."""

from __future__ import annotations

import re
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


def test_smoke_ends_saying_what_ran_and_what_the_cpu_variant_cannot_show(smoke_run):
    out, proc = smoke_run
    verdict, cpu = proc.stdout.strip().splitlines()[-2:]
    assert verdict.startswith("smoke passed: 8 trajectories rolled out and scored (rft 2, value 2, ppo 4)")
    assert "7 updates applied (rft 4, value 1, ppo 2)" in verdict
    assert "checkpoint step_000007" in verdict and f"Hugging Face export {out / 'hf'}" in verdict
    assert "a resume starts at step 7" in verdict
    assert cpu.startswith("CPU variant: no GPU, so no kernel was compiled, verified or timed")
    assert orjson.loads((out / "summary.json").read_bytes())["passed"] is True


def test_smoke_prints_the_seconds_of_each_phase(smoke_run):
    out, proc = smoke_run
    [line] = [text for text in proc.stdout.splitlines() if text.startswith("phases (s): ")]
    phases = orjson.loads((out / "summary.json").read_bytes())["phases_s"]
    assert list(phases) == ["rft collection", "rft 4 steps", "value collection", "value 1 step", "ppo 2 steps"]
    assert all(seconds > 0 for seconds in phases.values())
    assert line.startswith("phases (s): rft collection ") and "start-up, checkpoints and the rest" in line


def test_a_heldout_evaluation_beside_a_collection_counts_once_in_the_wall_time():
    from rl.heldout import Row
    from rl.smoke import phase_line, phase_seconds

    def held(label: str, seconds: float) -> Row:
        return Row(label=label, weight_version=0, tasks=1, trajectories=1, pass_rate=0.0, reward_mean=None,
                   faster_than_eager_rate=0.0, scored=0.0, parse_error_rate=None, turns_mean=None, by_task={},
                   seconds=seconds)

    rows = [{"stage": "rft", "time/collect_s": 30.0, "time/step_s": 1.0}, {"stage": "rft", "time/step_s": 1.0},
            {"stage": "value", "time/collect_s": 6.0, "time/step_s": 1.0}, {"stage": "ppo", "time/step_s": 5.0}]
    spent = phase_seconds(rows, [held("before_rft", 20.0), held("after_rft", 4.0), held("after_ppo", 3.0)])
    assert spent == {"held-out before_rft": 20.0, "rft collection": 30.0, "rft 2 steps": 2.0,
                     "held-out after_rft": 4.0, "value collection": 6.0, "value 1 step": 1.0, "ppo 1 step": 5.0,
                     "held-out after_ppo": 3.0}
    line = phase_line(spent, 60.0)
    assert line.startswith("phases (s): held-out before_rft 20 (alongside the rft collection), rft collection 30,")
    assert "held-out after_rft 4 (alongside the value collection), value collection 6," in line
    assert line.endswith("start-up, checkpoints and the rest 13; wall 60")  # 60 - (71 - 20 - 4)


def test_progress_line_and_log_name_the_same_steps(smoke_run):
    _, proc = smoke_run
    bar = [int(n) for n in re.findall(r"^\[step (\d+) \(\d+/7\)\]", proc.stderr, re.MULTILINE)]
    log = [int(n) for n in re.findall(r"cuda-agent\.train: step (\d+) \(", proc.stderr)]
    assert bar == log == list(range(7))


def test_smoke_prints_no_progress_bars_or_warnings_but_its_own(smoke_run):
    out, proc = smoke_run
    for text in (proc.stdout, proc.stderr, (out / "learner.log").read_text()):
        assert "it/s]" not in text and "Warning" not in text


def test_smoke_marks_its_directory(smoke_run):
    out, _ = smoke_run
    marker = orjson.loads((out / ".cuda-agent-run").read_bytes())
    assert marker["command"] == "smoke" and "--out" in marker["argv"] and marker["time"]


def test_smoke_refuses_a_directory_it_did_not_make(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    proc = subprocess.run([sys.executable, "-m", "agentcore.cli", "smoke", "--cpu", "--out", "."],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith("cuda-agent smoke: . holds files and is not an earlier smoke run; pass --force")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
