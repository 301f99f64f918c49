"""bench.system.suite: the report from saved JSON, a missing GPU as a skipped row, a failing module as a
failed row, and one real (tiny) orchestrator run through the subprocess path."""

from __future__ import annotations

import json

import pytest

from bench.system import run as system_run
from bench.system import suite as s

H200 = s.Machine(gpus=("NVIDIA H200 (143771 MiB)",), driver="580.95.05", cpu_model="Intel Xeon", cpus=16,
                 cpus_usable=16, mem_gib=125.0, torch="2.11.0+cu130", torch_cuda="13.0", nvcc="13.0",
                 python="3.11.7", platform="Linux", commit="abc1234", date="2026-11-22 05:00 UTC")
ORCH = {"trajectories": 512, "turns_per_trajectory": 20, "turns": 10240, "wall_over_ideal": 1.013,
        "cpu_ms_per_turn": 0.61, "loop_lag_p99_ms": 7.5, "rss_kib_per_trajectory": 95.2}
LEARNER = {"device": "NVIDIA H200", "rows": [
    {"model": "0.5b", "tokens_per_micro_batch": 16384, "micro_batches": 2, "world_size": 1, "step_s_median": 1.234,
     "tokens_per_s_per_gpu": 26550.0, "mfu": 0.41, "peak_mem_gib": 33.3}]}
WEIGHT_SYNC = [{"size": "1.5b", "params": 1.54e9, "bytes": 3.09e9, "sync_s_median": 0.2051, "gb_per_s": 15.07}]


@pytest.fixture
def saved(tmp_path):
    """Raw `--out` JSON of three modules, an envelope of a skipped and of a failed one, the machine."""
    (tmp_path / "machine.json").write_text(json.dumps(system_run._builtins(H200)))
    (tmp_path / "orchestrator.json").write_text(json.dumps(ORCH))
    (tmp_path / "learner.json").write_text(json.dumps(LEARNER))
    (tmp_path / "weight_sync.json").write_text(json.dumps(WEIGHT_SYNC))
    s.save(tmp_path, H200, [
        s.Outcome(bench="timing", status="skipped", reason="no CUDA", argv=("-m", "bench.system.timing")),
        s.Outcome(bench="compile", status="failed", reason="exit code 1", argv=("-m", "bench.system.compile"),
                  wall_s=3.0, output_tail="RuntimeError: nvcc not found"),
    ])
    return tmp_path


def test_report_from_saved_json_has_machine_figures_and_failure_rows(saved, capsys):
    assert s.main(["--from", str(saved)]) == 0
    text = (saved / "system_report.md").read_text()
    assert "NVIDIA H200 (143771 MiB); driver 580.95.05; Intel Xeon, 16 CPUs" in text
    assert "torch 2.11.0+cu130 (CUDA 13.0)" in text
    assert "| wall / ideal | 1.013 | <= 1.05 |" in text
    assert "| 0.5b, 16384 tokens x 2 mb, 1 GPU | 1.23 s/step, 26550 tok/s/GPU, MFU 41.0%, peak 33.3 GiB |" in text
    assert "| 1.5b (1540M params, 3.09 GB) | 205.1 ms, 15.1 GB/s |" in text
    assert "| timing | skipped: no CUDA | - | `python -m bench.system.timing` |" in text
    assert "| compile | failed: exit code 1 | 3.0 |" in text and "RuntimeError: nvcc not found" in text
    order = [text.index(f"## {name}") for name in ("orchestrator", "compile", "timing", "learner", "weight_sync")]
    assert order == sorted(order)  # the report follows BENCHES' order
    assert text in capsys.readouterr().out


def test_missing_gpu_is_a_skipped_row_not_a_run():
    timing = next(b for b in s.BENCHES if b.name == "timing")
    outcome = s.run_bench(timing, ["--runs", "2"], s.Machine())
    assert (outcome.status, outcome.reason, outcome.wall_s) == ("skipped", "no CUDA", None)


def test_real_subprocess_runs_capture_json_and_failures(tmp_path):
    orch = next(b for b in s.BENCHES if b.name == "orchestrator")
    broken = s.Bench(name="broken", module="bench.no_such_module")
    tiny = ["--trajectories", "4", "--turns", "2", "--latency-s", "0.01", "--tool-latency-s", "0.01"]
    path = s.run_all([orch, broken], quick=True, out_dir=tmp_path, extra={"orchestrator": tiny}, host=s.Machine())
    saved = json.loads((tmp_path / "orchestrator.json").read_text())
    assert saved["status"] == "ok" and saved["result"]["trajectories"] == 4 and saved["result"]["turns"] == 8
    failed = json.loads((tmp_path / "broken.json").read_text())
    assert failed["status"] == "failed" and failed["reason"] == "exit code 1"
    assert "No module named bench.no_such_module" in failed["output_tail"]
    text = path.read_text()
    assert "| trajectories x turns | 4 x 2 |" in text and "| broken | failed: exit code 1 |" in text


def test_json_is_found_after_other_output():
    assert system_run._json_of('building...\nnote: {not json\n{\n "a": 1\n}\n') == {"a": 1}
    with pytest.raises(ValueError):
        system_run._json_of("no json here\n")


def test_only_and_skip_select_and_reject_unknown_names():
    assert [b.name for b in s.select("orchestrator,learner", "learner")] == ["orchestrator"]
    assert "compile" not in [b.name for b in s.select("", "compile")]
    with pytest.raises(ValueError, match="unknown"):
        s.select("orchestra", "")


def test_machine_records_this_host():
    host = s.machine()
    assert host.cpus >= 1 and host.python and host.torch
