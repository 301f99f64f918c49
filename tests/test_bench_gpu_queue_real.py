"""`python -m bench.system.gpu_queue --real-jobs` (bench.system.gpu_queue_real): argument handling, the
no-GPU stop, the report's arithmetic, and the whole run on a CPU machine with only the GPU faked
(a GPU count of 2 and CPU handlers for the `verify` and `profile` kinds, in a module the workers
import from PYTHONPATH); the compile pool (nvcc, g++) and the queue's workers are real. The relu
fixture stands in for a demo there: every demo's binding needs the CUDA build of torch.

The `gpu` test runs the real mode with the real handlers on a demo:
`python -m pytest -m gpu tests/test_bench_gpu_queue_real.py`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.system.gpu_queue import _parse_args
from bench.system.gpu_queue import main as bench_main
from bench.system.gpu_queue_real import (
    DEFAULT_DEMOS,
    JobRecord,
    latency_ms,
    load_demos,
    run,
    summarize,
    targets,
)

REPO = Path(__file__).resolve().parents[1]
RELU = REPO / "tests" / "fixtures" / "build" / "relu"  # builds on a CPU machine (no c10/cuda headers)

needs_compiler = pytest.mark.skipif(
    shutil.which("nvcc") is None or shutil.which("g++") is None, reason="needs nvcc and g++"
)

# CPU stand-ins for the GPU handlers: they check what a real job carries (the request, the built
# module and the sources under candidate/) and answer the handlers' value types.
FAKE_HANDLERS = '''
import os, time
from rewards.queue.jobs import decode, encode
from rewards.timing.profile import Profile, ProfileRequest
from rewards.verdict import Timing, Verdict, VerdictStatus
from rewards.verify.verifier import VerifyRequest

def _missing(ctx, request):
    root = os.path.join(ctx.scratch_dir, "candidate")
    need = ["model_new.py", "kernels/relu.cu", request.so_path]
    return [n for n in need if not n or not os.path.isfile(os.path.join(root, n))]

def verify(payload, ctx):
    request = decode(payload, VerifyRequest)
    missing = _missing(ctx, request)
    time.sleep(0.02)
    if missing or "class Model" not in request.task_source:
        return encode(Verdict(status=VerdictStatus.RUNTIME_ERROR, message=f"missing {missing}"))
    return encode(Verdict(status=VerdictStatus.OK, trials=5, max_abs_err=0.0))

def profile(payload, ctx):
    request = decode(payload, ProfileRequest)
    missing = _missing(ctx, request)
    time.sleep(0.02)
    if missing:
        return encode(Profile(ok=False, message=f"missing {missing}"))
    t = Timing(median_ms=1.0, mean_ms=1.0, std_ms=0.0, rel_stderr=0.0, samples=1, min_ms=1.0, max_ms=1.0,
               method="fake")
    return encode(Profile(ok=True, candidate=t, eager=t, compiled=t))
'''


def record(kind: str, wall_s: float, ok: bool = True) -> JobRecord:
    return JobRecord(kind=kind, demo="d", ok=ok, status="ok", message="" if ok else "wrong", run_s=wall_s / 2,
                     wall_s=wall_s, wait_s=0.0, gpu=0)


# ---------------------------------------------------------------------------------------------
# Arguments.


def test_unknown_demo_is_a_usage_error_naming_the_demos(capsys):
    assert bench_main(["--real-jobs", "--demo", "no_such_demo"]) == 2
    err = capsys.readouterr().err
    assert "no_such_demo" in err and "l1_1_matmul_cublas" in err and "Traceback" not in err


def test_malformed_gpus_is_a_usage_error(capsys):
    assert bench_main(["--real-jobs", "--gpus", "0,x"]) == 2
    assert "--gpus" in capsys.readouterr().err


def test_jobs_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exit_:
        _parse_args(["--real-jobs", "--jobs", "0"])
    assert exit_.value.code == 2
    assert "positive integer" in capsys.readouterr().err


def test_real_mode_flags_parse_with_their_defaults():
    args = _parse_args(["--real-jobs", "--demo", "a", "--demo", "b", "--verify-mode", "final"])
    assert args.real_jobs and args.demo == ["a", "b"] and args.verify_mode == "final"
    assert not _parse_args([]).real_jobs and _parse_args([]).demo == []


def test_the_paired_and_staging_flags_reach_the_env_and_its_queue():
    from bench.system.gpu_queue_real import env_config
    from rewards.env import queue_config

    plain = env_config(_parse_args(["--real-jobs"]))
    assert plain.lanes_per_gpu == 1 and plain.queue.staged_kinds == ("profile",)
    args = _parse_args(["--real-jobs", "--paired", "--lanes-per-gpu", "4", "--unstaged"])
    config = env_config(args)
    assert args.paired and config.lanes_per_gpu == 4 and config.queue.staged_kinds == ()
    assert queue_config(config, (0,)).lanes_per_gpu == 4 and queue_config(config, (0,)).staged_kinds == ()


def test_demos_are_names_or_directories_in_the_demo_layout():
    assert [d.task.task_id for d in load_demos([])] == list(DEFAULT_DEMOS)
    demos = load_demos(["l1_1_matmul_cublas", str(RELU), "l1_1_matmul_cublas"])
    assert [d.task.task_id for d in demos] == ["l1_1_matmul_cublas", "relu"]
    assert {"model_new.py", "kernels/relu.cu", "kernels/relu_binding.cpp"} <= set(demos[1].files)
    assert "model.py" not in demos[1].files and "class Model" in demos[1].task.source


def test_without_a_gpu_it_stops_with_a_clear_message(capsys):
    from conftest import cuda_available

    if cuda_available():
        pytest.skip("this machine has a GPU")
    assert bench_main(["--real-jobs", "--gpus", "0"]) == 3
    captured = capsys.readouterr()
    assert "needs a CUDA GPU" in captured.err and "Traceback" not in captured.err
    assert captured.out == ""


# ---------------------------------------------------------------------------------------------
# The report's arithmetic.


def test_latency_is_nearest_rank_in_ms():
    got = latency_ms([i / 10 for i in range(10, 0, -1)])  # 1.0 .. 0.1 s, unsorted
    assert got["p50"] == pytest.approx(500) and got["p90"] == pytest.approx(900)
    assert got["max"] == pytest.approx(1000) and got["mean"] == pytest.approx(550)
    assert latency_ms([]) == {}


def test_summary_counts_each_kind_and_keeps_the_failures():
    records = [record("verify", 1.0), record("verify", 4.0, ok=False), record("profile", 2.0)]
    summary = summarize(records)
    verify, profile = summary["kinds"]["verify"], summary["kinds"]["profile"]
    assert (verify["jobs"], verify["ok"], profile["jobs"], profile["ok"]) == (2, 1, 1, 1)
    assert verify["under_target_fraction"] == 0.5 and profile["under_target_fraction"] == 1.0
    assert verify["wall_ms"]["max"] == pytest.approx(4000)
    assert [f["message"] for f in summary["failures"]] == ["wrong"]


def test_targets_take_the_slowest_job_and_the_mean_busy_fraction():
    saturation = {"busy_fraction": 0.95, **summarize([record("verify", 1.0), record("profile", 3.5)])}
    got = targets(saturation)
    assert got["worst_job_s"] == pytest.approx(3.5) and not got["jobs_met"] and got["busy_met"]


# ---------------------------------------------------------------------------------------------
# The whole run: real build and queue, the GPU faked.


async def fake_two_gpus(python: str) -> int:
    return 2


@pytest.mark.slow  # builds the precompiled torch header: about a minute on 2 cores
@needs_compiler
async def test_run_builds_the_demo_and_saturates_both_lanes(tmp_path, monkeypatch):
    (tmp_path / "handlers").mkdir()
    (tmp_path / "handlers" / "fake_gpu_jobs.py").write_text(FAKE_HANDLERS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "handlers"))
    args = _parse_args(["--real-jobs", "--demo", str(RELU), "--gpus", "0,1", "--jobs", "6",
                        "--handler", "verify=fake_gpu_jobs:verify", "--handler", "profile=fake_gpu_jobs:profile",
                        "--deadline-s", "60", "--compile-cache-dir", str(tmp_path / "cache")])
    report = json.loads(json.dumps(await run(args, gpu_count=fake_two_gpus)))  # plain JSON data
    assert report["builds"]["relu"]["built_units"] >= 2
    warm, sat = report["warmup"], report["saturation"]
    assert warm["failures"] == [] and {k: v["jobs"] for k, v in warm["kinds"].items()} == {"verify": 2, "profile": 2}
    assert warm["profiles"]["relu"]["candidate_ms"] == 1.0
    assert sat["all_ok"], sat["failures"]
    assert sat["jobs"] == 12 and {k: v["ok"] for k, v in sat["kinds"].items()} == {"verify": 6, "profile": 6}
    assert set(sat["busy_fraction_per_lane"]) == {"0", "1"} and 0 < sat["busy_fraction"] <= 1
    assert sat["restarts"] == 0 and sat["timeouts"] == 0
    assert set(report["targets"]) >= {"jobs_met", "busy_met", "worst_job_s"}


# ---------------------------------------------------------------------------------------------
# On the GPU: the real handlers.


@pytest.mark.gpu
@needs_compiler
async def test_real_jobs_on_a_demo_all_pass(tmp_path):
    argv = ["--real-jobs", "--gpus", "0", "--jobs", "4", "--demo", "l1_1_matmul_cublas",
            "--compile-cache-dir", str(tmp_path / "cache")]
    argv += ["--sandbox"] if shutil.which("bwrap") else []
    report = json.loads(json.dumps(await run(_parse_args(argv))))
    warm, sat = report["warmup"], report["saturation"]
    assert warm["failures"] == [] and warm["cached_baselines"] == ["l1_1_matmul_cublas"]
    assert warm["profiles"]["l1_1_matmul_cublas"]["candidate_ms"] > 0
    assert sat["all_ok"], sat["failures"]
    assert {k: v["ok"] for k, v in sat["kinds"].items()} == {"verify": 4, "profile": 4}
    assert set(sat["kinds"]["verify"]["wall_ms"]) == {"mean", "p50", "p90", "max"}
    assert set(sat["busy_fraction_per_lane"]) == {"0"} and sat["restarts"] == 0
    print(json.dumps({"targets": report["targets"], "kinds": sat["kinds"], "busy": sat["busy_fraction"]}))
