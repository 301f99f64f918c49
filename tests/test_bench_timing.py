"""bench.system.timing's CPU-side parts: the CPU-load helper (busy processes for a block, none left
after it), the loaded / quiet report, and problem lookup across levels."""

from __future__ import annotations

import json

import pytest

from bench.system import timing


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_cpu_load_runs_busy_processes_for_the_block_only():
    with timing.cpu_load(2) as procs:
        assert len(procs) == 2 and all(_alive(p.pid) and p.poll() is None for p in procs)
    assert not any(_alive(p.pid) for p in procs)


def test_cpu_load_processes_go_when_the_block_raises():
    with pytest.raises(RuntimeError):
        with timing.cpu_load(1) as procs:
            raise RuntimeError("timing failed")
    assert not _alive(procs[0].pid)


def _run(eager: float, compile_: float) -> dict:
    return {"eager": {"median_ms": eager}, "compile": {"median_ms": compile_}}


def test_load_report_is_loaded_over_quiet_per_subject():
    report = timing.load_report([_run(1.0, 2.0), _run(1.2, 2.0)], [_run(1.65, 2.1), _run(1.65, 2.1)], 16)
    assert report["processes"] == 16
    assert report["eager"]["loaded_over_quiet"] == pytest.approx(1.5)
    assert report["eager"]["within_10pct"] is False
    assert report["compile"]["loaded_over_quiet"] == pytest.approx(1.05)
    assert report["compile"]["within_10pct"] is True


def test_problems_are_found_by_name_on_any_level(tmp_path):
    path = tmp_path / "problems.jsonl"
    rows = [{"level": 1, "name": "19_ReLU", "code": "relu"}, {"level": 3, "name": "4_LeNet5", "code": "lenet"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert timing._problem_source("4_LeNet5", path) == "lenet"
    with pytest.raises(SystemExit, match="9_Nope not found"):
        timing._problem_source("9_Nope", path)


def test_cpu_load_flag_parses():
    assert timing._parse_args(["--cpu-load", "8"]).cpu_load == 8
    assert timing._parse_args([]).cpu_load == 0


def _affinity(pid: int) -> set[int]:
    import os

    return os.sched_getaffinity(pid)


def test_cpu_load_on_given_cores_stays_there():
    import os

    cpus = {min(os.sched_getaffinity(0))}
    with timing.cpu_load(2, cpus) as procs:
        assert [_affinity(p.pid) for p in procs] == [cpus, cpus]


def test_split_cores_gives_the_last_k_to_the_lane_and_refuses_all_or_none():
    import os

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    own, rest = timing.split_cores(1)
    assert own == {cpus[-1]} and rest == set(cpus[:-1])
    for k in (0, len(cpus)):
        with pytest.raises(SystemExit, match="--pin-cores"):
            timing.split_cores(k)


def test_a_pinned_child_runs_on_its_cores_only():
    import os
    import subprocess
    import sys

    cpus = {min(os.sched_getaffinity(0))}
    out = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                         capture_output=True, text=True, check=True, preexec_fn=timing._pin(cpus))
    assert json.loads(out.stdout) == sorted(cpus)
    assert timing._pin(None) is None


def test_load_report_adds_pinned_over_quiet():
    quiet, loaded, pinned = [_run(1.0, 2.0)] * 2, [_run(1.5, 2.0)] * 2, [_run(1.02, 2.5)] * 2
    report = timing.load_report(quiet, loaded, 8, pinned, pin_cores=2)
    assert report["pin_cores"] == 2
    assert report["eager"]["pinned_over_quiet"] == pytest.approx(1.02) and report["eager"]["pinned_within_10pct"]
    assert report["compile"]["pinned_over_quiet"] == pytest.approx(1.25)
    assert not report["compile"]["pinned_within_10pct"]
    assert "pinned_ms" not in timing.load_report(quiet, loaded, 8)["eager"]


def test_pin_cores_flag_parses():
    assert timing._parse_args(["--cpu-load", "8", "--pin-cores", "2"]).pin_cores == 2
    assert timing._parse_args([]).pin_cores == 0
