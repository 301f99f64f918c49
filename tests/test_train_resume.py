"""`cuda-agent train --resume` after kill -9: the run continues from its latest checkpoint and
ends with every step recorded exactly once (CPU variant: learner on CPU, fake kernel env)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import orjson

ARGS = ["--recipe", "smoke_cpu", "--set", "steps.rft=3", "--set", "steps.value=1", "--set", "steps.ppo=2",
        "--set", "checkpoint.every_steps=1", "--set", "checkpoint.export_hf=false"]


def _train(run_dir, *extra, **kw):
    cmd = [sys.executable, "-m", "agentcore.cli", "train", *ARGS, "--run-dir", str(run_dir), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, **kw)


def _processes_of(run_dir) -> list[int]:
    """Live processes whose command line names `run_dir` (the learner ranks of that run)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError, PermissionError):
            continue
        if str(run_dir).encode() in cmdline and not zombie:
            pids.append(int(entry))
    return pids


def test_killed_run_resumes_without_losing_or_repeating_steps(tmp_path):
    run_dir = tmp_path / "run"
    proc = _train(run_dir)
    deadline = time.monotonic() + 600
    while not (run_dir / "ckpt" / "step_000002").exists():
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint within 600 s"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver, mid-run
    proc.wait()
    deadline = time.monotonic() + 15  # the learner rank, in a session of its own, dies with it
    while ranks := _processes_of(run_dir):
        assert time.monotonic() < deadline, f"processes of the killed run still alive: {ranks}"
        time.sleep(0.1)
    refused = subprocess.run([sys.executable, "-m", "agentcore.cli", "train", *ARGS, "--run-dir", str(run_dir)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--resume" in refused.stderr

    resumed = _train(run_dir, "--resume")
    out = resumed.communicate(timeout=900)[0].decode()
    assert resumed.returncode == 0, out[-3000:]
    rows = [orjson.loads(line) for line in (run_dir / "metrics.jsonl").read_bytes().splitlines()]
    assert [r["step"] for r in rows] == list(range(6))
    assert (run_dir / "ckpt" / "step_000006").exists()


def test_rerun_step_reuses_its_stored_trajectories(tmp_path):
    run_dir = tmp_path / "run"
    proc = _train(run_dir, "--set", "checkpoint.keep=10")
    assert proc.communicate(timeout=900)[0] is not None and proc.returncode == 0
    rollouts = run_dir / "rollouts" / "ppo_000004.jsonl"
    before = [orjson.loads(line)["trajectory_id"] for line in rollouts.read_bytes().splitlines()]
    for step in (5, 6):  # back to the checkpoint taken before step 4's update
        shutil.rmtree(run_dir / "ckpt" / f"step_{step:06d}")
    (run_dir / "ckpt" / "latest").unlink()
    again = _train(run_dir, "--resume", "--set", "checkpoint.keep=10")
    out = again.communicate(timeout=900)[0].decode()
    assert again.returncode == 0, out[-3000:]
    after = [orjson.loads(line)["trajectory_id"] for line in rollouts.read_bytes().splitlines()]
    assert after == before and len(set(before)) == len(before) > 0
