"""bench.system.node: the issue-7 run driver. nvidia-smi lines parse, the report splits each step's time
and groups the GPUs by the layout, and a real CPU training run (smoke_cpu recipe) goes through
the driver end to end with a report whose steps are the run's steps."""

from __future__ import annotations

import json
import sys

import orjson

from bench.system import node
from bench.system.node_report import (
    GpuSample,
    gpu_groups,
    parse_smi_line,
    step_rows,
    write_report,
)


def test_nvidia_smi_lines_parse_and_junk_is_skipped():
    assert parse_smi_line("1, 87, 40312", 2.5) == GpuSample(t_s=2.5, gpu=1, util_pct=87.0, mem_mib=40312.0)
    assert parse_smi_line("index, utilization.gpu [%], memory.used [MiB]", 0.0) is None
    assert parse_smi_line("0, [N/A], 10", 0.0) is None
    assert parse_smi_line("", 0.0) is None


def test_steps_split_time_and_gpus_group_by_layout(tmp_path):
    metrics = [
        {"step": 0, "stage": "rft", "time/train_s": 2.0, "sync/weight_sync_s": 0.04, "train/tokens": 4000.0,
         "perf/tokens_per_s": 2000.0, "collect/reward_mean": -0.5},
        {"step": 1, "stage": "ppo", "time/rollout_s": 30.0, "time/train_s": 4.0, "time/weight_sync_s": 0.05,
         "train/tokens": 8000.0, "perf/tokens_per_s": 2000.0, "perf/mfu": 0.2, "gpu_queue/busy_fraction": 0.5},
    ]
    rows = step_rows(metrics, learner_gpus=2)
    assert [r["stage"] for r in rows] == ["rft", "ppo"]
    assert rows[0]["weight_sync_s"] == 0.04 and rows[0]["rollout_s"] is None and rows[0]["reward_mean"] == -0.5
    assert rows[1]["tokens_per_s_per_gpu"] == 1000.0 and rows[1]["mfu"] == 0.2 and rows[1]["gpu_queue_busy"] == 0.5
    samples = [GpuSample(t_s=t, gpu=g, util_pct=u, mem_mib=m) for t, g, u, m in
               [(0, 0, 50, 100), (1, 0, 100, 300), (0, 1, 10, 50), (1, 1, 30, 70), (0, 2, 99, 1)]]
    groups = gpu_groups(samples, {"learner_gpus": [0], "verify_gpus": [1]})
    assert [(g["group"], g["util_mean_pct"], g["mem_peak_mib"]) for g in groups] == [
        ("learner + engines", 75.0, 300.0), ("verification", 20.0, 70.0)]  # GPU 2 is in no group

    (tmp_path / "config.json").write_text(json.dumps({"recipe": "x", "layout": {"learner_gpus": [0, 1], "verify_gpus": [2]}}))
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join(orjson.dumps(m) for m in metrics) + b"\n{torn")
    ref = tmp_path / "learner.json"
    ref.write_text(json.dumps({"rows": [{"model": "1.5b", "tokens_per_s_per_gpu": 4000.0}]}))
    report = write_report(tmp_path, samples, {"train_rc": 0, "wall_s": 40.0}, single_gpu_json=ref)
    assert len(report["steps"]) == 2 and report["scaling"]["ratio"] == 0.25  # 1000 of 4000
    text = (tmp_path / "node_report.md").read_text()
    assert "| 1 | ppo | 30.00 | 4.00 | 0.050 | 8000 | 1000 | 20.0% | 0.50 |" in text


def test_a_cpu_training_run_through_the_driver(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "run"
    argv = ["--recipe", "smoke_cpu", "--run-dir", str(run_dir), "--time-limit-s", "600",
            "--set", "steps.rft=1", "--set", "steps.value=1", "--set", "steps.ppo=1",
            "--set", "checkpoint.export_hf=false"]
    monkeypatch.setattr(sys, "argv", ["bench.system.node"])
    assert node.main(argv) == 0, (run_dir / "node_train.log").read_text()[-3000:]
    report = orjson.loads((run_dir / "node_report.json").read_bytes())
    assert [s["stage"] for s in report["steps"]] == ["rft", "value", "ppo"]
    assert report["outcome"]["train_rc"] == 0 and not report["outcome"]["stopped_by_limit"]
    assert all(s["train_s"] > 0 and s["tokens_per_s_per_gpu"] > 0 for s in report["steps"])
    assert report["steps"][-1]["rollout_s"] is not None  # the PPO step rolled out
    assert report["checkpoints"]  # stage ends save
    assert "bench.system.node: 3 steps (1 PPO)" in capsys.readouterr().out


def test_the_time_limit_stops_the_run_and_still_reports(tmp_path):
    run_dir = tmp_path / "run"
    argv = ["--recipe", "smoke_cpu", "--run-dir", str(run_dir), "--time-limit-s", "2", "--grace-s", "5"]
    assert node.main(argv) == 1  # the training did not finish
    report = orjson.loads((run_dir / "node_report.json").read_bytes())
    assert report["outcome"]["stopped_by_limit"]
    assert report["outcome"]["train_rc"] not in (None, 0)  # stopped, and waited for, not left running
