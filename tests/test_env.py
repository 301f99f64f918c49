"""The real KernelEnv and the final evaluation on a CPU machine: the static checks and the build
run for real (nvcc, g++), verify and profile need a GPU and are covered by test_env_gpu.py.

Also `cuda-agent eval` as a subprocess: a cheat prints its category and exits non-zero, a
missing task is a one-line error, neither with a traceback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentcore.kernel_env import KernelEnv
from agentcore.types import Status, Task, Timings, Trajectory
from rewards.build.compile_pool import CompileConfig, CompilePool
from rewards.env import NoGpuError, RewardsKernelEnv, pristine_files
from rewards.evaluate import FinalEvaluator, snapshot_solution

REPO = Path(__file__).resolve().parents[1]
RELU = REPO / "tests" / "fixtures" / "build" / "relu"
CHEAT = REPO / "tests" / "fixtures" / "cheats" / "call_counter"  # output_caching, caught statically

needs_compiler = pytest.mark.skipif(
    shutil.which("nvcc") is None or shutil.which("g++") is None, reason="needs nvcc and g++"
)


def task_of(fixture: Path) -> Task:
    return Task(task_id=fixture.name, source=(fixture / "model.py").read_text())


def make_workspace(fixture: Path, root: Path) -> Path:
    """The fixture plus the pristine files, as agentcore's Workspace lays them out."""
    ws = root / fixture.name
    shutil.copytree(fixture, ws, ignore=shutil.ignore_patterns("cheat.json"))
    for rel, data in pristine_files(task_of(fixture)).items():
        (ws / rel).write_bytes(data)
    return ws


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> RewardsKernelEnv:
    cache = tmp_path_factory.mktemp("compile-cache")
    return RewardsKernelEnv(CompilePool(CompileConfig(cache_dir=str(cache), max_parallel=2)), queue=None)


def test_env_implements_the_protocol(env):
    assert isinstance(env, KernelEnv)


@needs_compiler
async def test_compile_builds_the_relu_fixture(env, tmp_path):
    ws = make_workspace(RELU, tmp_path)
    result = await env.compile(ws, task_of(RELU))
    assert result.ok, result.log
    assert env.builds[ws.resolve()].artifact is not None


@needs_compiler
async def test_static_finding_is_a_failed_compile_naming_its_category(env, tmp_path):
    result = await env.compile(make_workspace(CHEAT, tmp_path), task_of(CHEAT))
    assert not result.ok
    assert "output_caching" in result.log


@needs_compiler
async def test_modified_protected_file_fails_compile(env, tmp_path):
    ws = make_workspace(RELU, tmp_path)
    (ws / "binding.cpp").write_text((ws / "binding.cpp").read_text() + "\n// edited\n")
    result = await env.compile(ws, task_of(RELU))
    assert not result.ok
    assert "protected_file" in result.log


@needs_compiler
async def test_verify_reports_a_static_hack_without_a_gpu(env, tmp_path):
    result = await env.verify(make_workspace(CHEAT, tmp_path), task_of(CHEAT))
    assert not result.ok and result.hack == "output_caching"


@needs_compiler
async def test_verify_of_a_buildable_workspace_needs_a_gpu(env, tmp_path):
    with pytest.raises(NoGpuError):
        await env.verify(make_workspace(RELU, tmp_path), task_of(RELU))


def test_snapshot_ignores_symlinks_and_the_workspace_model(tmp_path):
    ws = make_workspace(RELU, tmp_path)
    secret = tmp_path / "secret.cu"
    secret.write_text("__global__ void leak() {}\n")
    os.symlink(secret, ws / "kernels" / "leak.cu")
    (ws / "model.py").write_text("class Model: pass  # the agent's edit\n")
    (ws / "kernels" / "extra.h").write_text("#pragma once\n")
    snap = snapshot_solution(ws, task_of(RELU), tmp_path / "snap")
    assert not (snap / "kernels" / "leak.cu").exists()
    assert not (snap / "kernels" / "extra.h").exists()
    assert (snap / "model.py").read_text() == task_of(RELU).source
    assert (snap / "kernels" / "relu.cu").read_bytes() == (RELU / "kernels" / "relu.cu").read_bytes()
    assert not any(p.is_symlink() for p in snap.rglob("*"))


def test_snapshot_drops_a_symlinked_model_new(tmp_path):
    ws = make_workspace(RELU, tmp_path)
    (ws / "model_new.py").unlink()
    os.symlink(RELU / "model_new.py", ws / "model_new.py")
    snap = snapshot_solution(ws, task_of(RELU), tmp_path / "snap")
    assert not (snap / "model_new.py").exists()


def trajectory_of(task_id: str) -> Trajectory:
    return Trajectory(trajectory_id=f"{task_id}/0", task_id=task_id, group_id=task_id, sample_index=0,
                      prompt_ids=[1], response_ids=[2], logprobs=[-0.5], loss_mask=[1], turns=[],
                      status=Status.COMPLETED, weight_version_min=0, weight_version_max=0, timings=Timings())


class _Tools:
    def __init__(self, path: Path) -> None:
        self.workspace = type("W", (), {"path": path})()


@needs_compiler
async def test_final_evaluator_scores_a_static_cheat_minus_one(env, tmp_path):
    scored = await FinalEvaluator(env).score(trajectory_of(CHEAT.name), _Tools(make_workspace(CHEAT, tmp_path)), task_of(CHEAT))
    assert scored.reward == -1.0
    assert scored.reward_info["hack"] == "output_caching"


def run_eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentcore.cli", "eval", *args], check=False, cwd=REPO,
                          capture_output=True, text=True, timeout=600)


@needs_compiler
def test_eval_of_a_cheat_prints_the_category_and_fails():
    run = run_eval("--task", str(CHEAT / "model.py"), "--solution", str(CHEAT))
    assert run.returncode == 1
    assert "hack: output_caching" in run.stdout
    assert "Traceback" not in run.stderr


def test_eval_with_a_missing_task_is_a_clear_error(tmp_path):
    run = run_eval("--task", str(tmp_path / "missing.py"), "--solution", str(RELU))
    assert run.returncode == 2
    assert "does not exist" in run.stderr
    assert "Traceback" not in run.stderr


def test_eval_of_a_single_file_without_load_inline_is_a_usage_error():
    run = run_eval("--task", str(RELU / "model.py"), "--solution", str(RELU / "model_new.py"))
    assert run.returncode == 2
    assert "load_inline" in run.stderr


@needs_compiler
def test_eval_without_a_gpu_stops_after_the_build_and_says_so(tmp_path):
    from conftest import cuda_available

    if cuda_available():
        pytest.skip("this machine has a GPU")
    ws = make_workspace(RELU, tmp_path)
    run = run_eval("--task", str(RELU / "model.py"), "--solution", str(ws))
    assert run.returncode == 3
    assert "no GPU" in run.stderr and "the build succeeded" in run.stderr
    assert "Traceback" not in run.stderr
