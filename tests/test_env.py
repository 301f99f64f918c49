"""The real KernelEnv and the final evaluation on a CPU machine: the static checks and the build
run for real (nvcc, g++), verify and profile need a GPU and are covered by test_env_gpu.py.

Also `cuda-agent eval` as a subprocess: a cheat prints its category and exits non-zero, a
missing task is a one-line error, neither with a traceback. And environment errors: a header
missing under torch's includes (this CPU machine's torch lacks the CUDA ones) is the machine's
fault, raised as MachineError with its fix, never a compile_error verdict.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from agentcore.kernel_env import KernelEnv
from agentcore.types import Status, Task, Timings, Trajectory
from rewards.build.compile_pool import CompileConfig, CompilePool
from rewards.build.toolchain import (
    TORCH_CUDA_FIX,
    MachineError,
    Toolchain,
    ToolchainError,
    check_gpu_machine,
    machine_fault,
)
from rewards.env import (
    EnvConfig,
    NoGpuError,
    RewardsKernelEnv,
    open_kernel_env,
    pristine_files,
    queue_config,
)
from rewards.evaluate import FinalEvaluator, snapshot_solution
from rewards.timing.profile import COMPILE_KIND

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
def test_the_queue_gets_the_envs_lanes_per_gpu_and_the_profile_handler():
    queue = queue_config(EnvConfig(lanes_per_gpu=3, sandbox="off"), (0, 1))
    assert (queue.gpus, queue.lanes_per_gpu, "profile" in queue.handlers) == ((0, 1), 3, True)
    assert "verify" in queue.shared_kinds and "profile" not in queue.shared_kinds
    assert COMPILE_KIND in queue.handlers and COMPILE_KIND in queue.shared_kinds  # it times nothing


async def test_a_tasks_reference_compile_is_one_job_however_many_trajectories_end_at_once(tmp_path):
    """Before a task's first paired timing the env has its reference compiled by a shared job,
    once: trajectories of a group that end together wait for that one job, and a later one finds
    it done. (On this CPU machine the job fails, for want of CUDA: the paired job compiles, as
    without it.)"""
    import anyio
    import msgspec

    from rewards.queue.gpu_queue import GpuQueue
    from rewards.timing.baselines import task_sha256

    config = EnvConfig(sandbox="off")
    lanes = msgspec.structs.replace(queue_config(config, (0,)), scratch_root=str(tmp_path / "scratch"),
                                    gpu_locks=False)
    task = task_of(RELU)
    async with GpuQueue(lanes) as queue:
        env = RewardsKernelEnv(CompilePool(CompileConfig(cache_dir=str(tmp_path / "cache"))), queue, config)
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(env._compile_reference, task, task_sha256(task.source))
        await env._compile_reference(task, task_sha256(task.source))
        stats = queue.statistics()
    assert stats.jobs_done == 1 and sum(lane.exclusive_jobs for lane in stats.lanes) == 0


@needs_compiler
@pytest.mark.parametrize("asked", [True, False])
async def test_the_env_warms_its_compile_pool_only_when_asked_and_never_waits_for_it(asked, monkeypatch, tmp_path):
    """The pool's warm-up (faked: its compilers are CompilePool.warm's own test) starts as the env
    opens with `warm_compile`, does not hold up the block or its exit, and a failing one is logged."""
    started, cancelled = anyio.Event(), []

    async def warm(self):
        started.set()
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            cancelled.append(True)
            raise

    monkeypatch.setattr(CompilePool, "warm", warm)
    config = EnvConfig(gpus=(), warm_compile=asked, compile=CompileConfig(cache_dir=str(tmp_path)))
    monkeypatch.setattr("rewards.env.detect_gpus", _no_gpus)
    with anyio.fail_after(30):
        async with open_kernel_env(config) as env:
            assert env.queue is None
            await anyio.sleep(0.1)
            assert started.is_set() is asked
    assert cancelled == ([True] if asked else [])


async def _no_gpus(config) -> tuple[int, ...]:
    return ()


@needs_compiler
async def test_a_failed_warm_up_is_logged_not_raised(monkeypatch, tmp_path, caplog):
    async def warm(self):
        raise ToolchainError("precompiled header failed: no space left on device")

    monkeypatch.setattr(CompilePool, "warm", warm)
    monkeypatch.setattr("rewards.env.detect_gpus", _no_gpus)
    config = EnvConfig(gpus=(), warm_compile=True, compile=CompileConfig(cache_dir=str(tmp_path)))
    async with open_kernel_env(config):
        await anyio.sleep(0.1)
    assert "compile warm-up failed (the first build will say why): precompiled header failed" in caplog.text


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


# ---------------------------------------------------------------------------------------------
# The machine's fault, not the candidate's: an environment error, never a verdict

DEMO = REPO / "rl" / "demos" / "l1_19_relu"  # its binding includes c10/cuda/CUDAStream.h


def torch_has_cuda_headers() -> bool:
    import torch

    return (Path(torch.__file__).parent / "include" / "c10/cuda/impl/cuda_cmake_macros.h").exists()


cpu_torch = pytest.mark.skipif(torch_has_cuda_headers(), reason="this torch is a CUDA build")


def toolchain_at(root: Path, *, torch_has_cuda: bool) -> Toolchain:
    include = root / "torch" / "include"
    return Toolchain(nvcc="nvcc", nvcc_version="13.0.48", cxx="g++", cxx_version="13.3.0", linker="", arch="sm_90",
                     cuda_include_dir=str(root / "cuda" / "include"), cuda_lib_dir=str(root / "cuda" / "lib64"),
                     torch_version="2.13.0+cpu+0123456789ab", torch_include_dirs=(str(include), str(include / "api")),
                     torch_lib_dir=str(root / "torch" / "lib"), torch_libs=(), torch_has_cuda=torch_has_cuda,
                     python_include_dir=str(root / "python"), pybind11_include_dir=str(include),
                     ext_suffix=".so", defines=())


def test_a_header_missing_under_torchs_includes_is_the_machines_fault(tmp_path):
    tc = toolchain_at(tmp_path, torch_has_cuda=False)
    inc = tc.torch_include_dirs[0]
    log = (f"In file included from {inc}/c10/cuda/CUDAStream.h:8,\n                 from kernels/relu_binding.cpp:4:\n"
           f"{inc}/c10/cuda/CUDAMacros.h:9:10: fatal error: c10/cuda/impl/cuda_cmake_macros.h: No such file or "
           "directory\ncompilation terminated.\n")
    fault = machine_fault(log, tc)
    assert isinstance(fault, MachineError) and "\n" not in str(fault)
    assert str(fault) == ("this torch build (2.13.0+cpu) has no CUDA headers (c10/cuda/impl/cuda_cmake_macros.h is "
                          f"missing): {TORCH_CUDA_FIX}")
    cuda = f"{tc.cuda_include_dir}/cuda_fp16.h(12): catastrophic error: cannot open source file \"nv/target\"\n"
    assert "CUDA toolkit" in str(machine_fault(cuda, tc))
    python = f"{inc}/pybind11/detail/common.h:274:10: fatal error: Python.h: No such file or directory\n"
    assert "Python's development headers" in str(machine_fault(python, tc))


def test_a_header_missing_from_the_candidates_own_files_is_its_compile_error(tmp_path):
    tc = toolchain_at(tmp_path, torch_has_cuda=False)
    own = "kernels/relu_binding.cpp:4:10: fatal error: helpers.h: No such file or directory\n"
    assert machine_fault(own, tc) is None
    assert machine_fault('kernels/relu.cu(3): catastrophic error: cannot open source file "helpers.cuh"\n', tc) is None
    direct = "kernels/relu_binding.cpp:4:10: fatal error: c10/cuda/impl/cuda_cmake_macros.h: No such file or directory"
    assert machine_fault(direct, tc) is not None  # a CUDA build of torch has it: this torch is the problem
    assert machine_fault(direct, toolchain_at(tmp_path, torch_has_cuda=True)) is None


@cpu_torch
def test_gpu_machine_check_names_a_cpu_build_of_torch_and_its_fix():
    with pytest.raises(MachineError, match=r"this torch build \(.*\) has no CUDA headers .*download\.pytorch\.org"):
        check_gpu_machine()


def test_gpu_machine_check_with_torchs_cuda_headers_goes_on_to_nvcc_and_the_gpus(tmp_path, monkeypatch):
    import torch

    from rewards.build import toolchain

    headers = tmp_path / "torch" / "include" / "c10" / "cuda" / "impl"
    headers.mkdir(parents=True)
    (headers / "cuda_cmake_macros.h").write_text("#pragma once\n")
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "torch" / "__init__.py"))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: None if name == "nvcc" else f"/usr/bin/{name}")
    with pytest.raises(MachineError, match="nvcc is not on PATH"):
        check_gpu_machine()
    monkeypatch.setattr(toolchain.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(MachineError, match="torch sees no GPU"):
        check_gpu_machine()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(MachineError, match=r"GPU\(s\) \[3\] requested but torch sees 2"):
        check_gpu_machine((0, 3))
    check_gpu_machine((0, 1))


@needs_compiler
@cpu_torch
async def test_final_evaluation_on_a_machine_without_torchs_cuda_headers_raises_not_scores(env, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(DEMO, ws)
    for rel, data in pristine_files(task_of(DEMO)).items():
        (ws / rel).write_bytes(data)
    with pytest.raises(MachineError, match="no CUDA headers"):  # infrastructure: the trainer drops it, no reward -1
        await FinalEvaluator(env).score(trajectory_of(DEMO.name), _Tools(ws), task_of(DEMO))


@needs_compiler
@cpu_torch
def test_eval_of_a_correct_solution_on_such_a_machine_is_an_environment_error_not_a_verdict():
    run = run_eval("--task", str(DEMO / "model.py"), "--solution", str(DEMO))
    assert run.returncode == 4
    assert run.stdout == ""  # no verdict, no reward
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert run.stderr.startswith("cuda-agent eval: environment error (this machine, not the solution; no verdict): ")
    assert "pip install torch --index-url" in run.stderr
