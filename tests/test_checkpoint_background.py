"""rl.learner.checkpoint.Saver(background=True): a save returns once staged and the training that follows
cannot leak into it, a kill during the background commit keeps the previous checkpoint, a
failure surfaces at the next save naming its step, 2 FSDP2 ranks agree on success and failure,
and `cuda-agent train --resume` with background saves loses no step after kill -9.

This file is also the body of two subprocesses: `kill RUN_DIR` (a background save paused
before its commit, then SIGKILLed) and the torchrun worker `fsdp OUT` (2 CPU ranks, gloo).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.test_checkpoint import (
    _assert_states_equal,
    _opt_tensors,
    _params,
    _plain_setup,
    _plain_train,
)
from tests.test_train_resume import ARGS

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")  # CPU ranks, gloo


def _kw(models) -> dict:
    return {"actor": models[0], "critic": models[1], "actor_opt": models[2], "critic_opt": models[3]}


def _snapshot(models) -> tuple:
    return _params(*models[:2]), [[t.clone() for t in _opt_tensors(o)] for o in models[2:]]


def _assert_restored(models, snapshot) -> None:
    params, opts = snapshot
    _assert_states_equal(_params(*models[:2]), params)
    for opt, want in zip(models[2:], opts):
        got = _opt_tensors(opt)
        assert len(got) == len(want) > 0 and all(torch.equal(a, b) for a, b in zip(got, want))


def test_training_right_after_a_background_save_does_not_leak_into_it(tmp_path, monkeypatch):
    from rl.learner import checkpoint

    gate = threading.Event()  # DCP's writer waits until training has moved every tensor

    class GatedWriter(checkpoint.dcp.FileSystemWriter):
        def write_data(self, *a, **k):
            gate.wait(60)
            return super().write_data(*a, **k)

    monkeypatch.setattr(checkpoint.dcp, "FileSystemWriter", GatedWriter)
    models = _plain_setup()
    _plain_train(*models, seed=0)
    want = _snapshot(models)
    saver = checkpoint.Saver(background=True)
    parts: dict[str, float] = {}
    saver.save(tmp_path, 1, **_kw(models), extra={"cursor": 3}, timings=parts)
    assert not (tmp_path / "ckpt" / "latest").exists()  # not committed yet: still a .tmp
    _plain_train(*models, seed=1)
    gate.set()
    done = saver.close()

    assert set(parts) == {"state_dict", "stage"}
    assert {"dcp_write", "rng", "fsync", "commit", "prune", "background"} <= set(done)
    fresh = _plain_setup()
    assert checkpoint.load_latest(tmp_path, **_kw(fresh)) == (1, {"cursor": 3})
    _assert_restored(fresh, want)


def test_background_and_blocking_saves_load_the_same_state(tmp_path):
    from rl.learner import checkpoint

    models = _plain_setup()
    _plain_train(*models, seed=0)
    checkpoint.Saver().save(tmp_path / "blocking", 1, **_kw(models))
    saver = checkpoint.Saver(background=True)
    saver.save(tmp_path / "background", 1, **_kw(models))
    _plain_train(*models, seed=1)
    saver.close()
    blocking, background = _plain_setup(), _plain_setup()
    assert checkpoint.load_latest(tmp_path / "blocking", **_kw(blocking))[0] == 1
    assert checkpoint.load_latest(tmp_path / "background", **_kw(background))[0] == 1
    _assert_restored(background, _snapshot(blocking))


def test_a_failed_background_write_is_reported_at_the_next_save_naming_its_step(tmp_path, monkeypatch):
    from rl.learner import checkpoint

    models = _plain_setup()
    saver = checkpoint.Saver(background=True)
    saver.save(tmp_path, 1, **_kw(models))
    saver.wait()
    real_write = checkpoint._write_atomic

    def failing(path, data):
        if path.parent.name == "rng":
            raise OSError(28, "No space left on device")
        real_write(path, data)

    monkeypatch.setattr(checkpoint, "_write_atomic", failing)
    saver.save(tmp_path, 2, **_kw(models))  # returns: the failure is in the background
    with pytest.raises(checkpoint.CheckpointError, match=r"step 2 .*No space left"):
        saver.save(tmp_path, 3, **_kw(models))
    assert checkpoint.latest_dir(tmp_path).name == "step_000001"

    monkeypatch.setattr(checkpoint, "_write_atomic", real_write)
    saver.save(tmp_path, 3, **_kw(models))  # the saver goes on after reporting
    saver.close()
    assert checkpoint.latest_dir(tmp_path).name == "step_000003"


# ---------------------------------------------------------------------------------------------
# SIGKILL while the background thread commits


def _kill_child(run_dir: Path) -> None:
    """Background-save step 1, train, background-save step 2 and pause before its `latest`."""
    from rl.learner import checkpoint

    models = _plain_setup()
    saver = checkpoint.Saver(background=True)
    _plain_train(*models, seed=0)
    torch.save(_params(*models[:2]), run_dir / "expected_1.pt")
    saver.save(run_dir, 1, **_kw(models))
    real_write = checkpoint._write_atomic

    def pause_at_pointer(path, data):
        if path.name == "latest" and data == b"step_000002":
            print("PAUSED", flush=True)
            time.sleep(600)
        real_write(path, data)

    checkpoint._write_atomic = pause_at_pointer
    _plain_train(*models, seed=1)
    saver.save(run_dir, 2, **_kw(models))
    _plain_train(*models, seed=2)  # training goes on while step 2 commits
    saver.wait()


def test_sigkill_during_a_background_commit_keeps_the_previous_checkpoint(tmp_path):
    from rl.learner import checkpoint

    child = subprocess.Popen([sys.executable, __file__, "kill", str(tmp_path)], env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    assert line.strip() == "PAUSED", child.stderr.read()[-3000:]
    os.kill(child.pid, signal.SIGKILL)
    child.wait()

    models = _plain_setup()
    assert checkpoint.load_latest(tmp_path, **_kw(models))[0] == 1
    _assert_states_equal(_params(*models[:2]), torch.load(tmp_path / "expected_1.pt"))
    assert not list((tmp_path / "ckpt").glob("*.tmp"))


# ---------------------------------------------------------------------------------------------
# FSDP2: 2 ranks, background saves on their own gloo group


def _fsdp_worker(out: Path) -> None:
    from rl.learner import checkpoint
    from rl.learner.fsdp import close_distributed, full_state_items, init_distributed, shard
    from rl.learner.models import layers
    from tests.test_checkpoint import _setup, _train

    d = init_distributed()
    models = _setup()
    for m in models[:2]:
        shard(m, layers=layers(m))
    models = (*models[:2], *[torch.optim.AdamW(m.parameters(), lr=1e-2) for m in models[:2]])

    def full() -> list[dict[str, torch.Tensor]]:
        return [{n: t.clone() for b in full_state_items(m, 1 << 20) for n, t in b} for m in models[:2]]

    saver = checkpoint.Saver(background=True)
    _train(*models, seed=d.rank)
    saved = full()
    saver.save(out / "run", 5, **_kw(models), extra={"cursor": 9})
    _train(*models, seed=7)  # training collectives while the save's run on the gloo group
    trained = full()
    saver.wait()
    found = checkpoint.load_latest(out / "run", **_kw(models))
    result = {"found": found, "saved": saved, "trained": trained, "loaded": full()}

    real_write = checkpoint._write_atomic  # rank 1 alone fails to write its RNG file
    checkpoint._write_atomic = lambda p, b: (_ for _ in ()).throw(OSError("disk gone")) \
        if d.rank == 1 and p.parent.name == "rng" else real_write(p, b)
    saver.save(out / "run", 6, **_kw(models))
    try:
        saver.close()
        result["error"] = None
    except checkpoint.CheckpointError as exc:
        result["error"] = str(exc)
    result["latest"] = checkpoint.latest_dir(out / "run").name
    torch.save(result, out / f"result_{d.rank}.pt")
    close_distributed(sync=True)


def test_fsdp_ranks_save_in_the_background_and_agree_on_a_failure(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__, "fsdp"]
    proc = subprocess.run([*cmd, str(tmp_path)], env=ENV, check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for rank in range(2):
        r = torch.load(tmp_path / f"result_{rank}.pt", weights_only=False)
        assert r["found"] == (5, {"cursor": 9})
        assert any(not torch.equal(r["trained"][0][k], r["saved"][0][k]) for k in r["saved"][0])
        _assert_states_equal(r["loaded"], r["saved"])
        assert "step 6" in r["error"] and "rank(s) [1]" in r["error"] and "disk gone" in r["error"]
        assert r["latest"] == "step_000005"


# ---------------------------------------------------------------------------------------------
# The whole run: kill -9 mid-run, --resume, background saves


def test_killed_run_with_background_saves_resumes_without_losing_steps(tmp_path):
    import orjson

    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "agentcore.cli", "train", *ARGS, "--set", "checkpoint.background=true",
            "--set", "checkpoint.export_hf=true", "--run-dir", str(run_dir)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600
    def mid_run() -> bool:  # step 2 or a later one saved (keep=2 may have pruned step 2 already)
        steps = [p.name.removeprefix("step_") for p in (run_dir / "ckpt").glob("step_*")]
        return any(n.isdigit() and int(n) >= 2 for n in steps)

    while not mid_run():
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint within 600 s"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()

    resumed = subprocess.run([*args, "--resume"], check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    assert resumed.returncode == 0, resumed.stdout.decode()[-3000:]
    rows = [orjson.loads(line) for line in (run_dir / "metrics.jsonl").read_bytes().splitlines()]
    assert [r["step"] for r in rows] == list(range(6))
    assert (run_dir / "ckpt" / "latest").read_text() == "step_000006"  # the last save, committed at exit
    assert (run_dir / "hf" / "config.json").is_file()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if sys.argv[1] == "kill":
        _kill_child(Path(sys.argv[2]))
    else:
        _fsdp_worker(Path(sys.argv[2]))
    from rl.learner.fsdp import end_rank_process

    end_rank_process(0)
