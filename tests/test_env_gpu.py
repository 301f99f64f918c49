"""The real KernelEnv and the final evaluation on a GPU, through `open_kernel_env` (compile pool
plus GPU queue with the verify and profile handlers): an honest demo compiles, verifies and is
timed with positive times and earns a reward of at least 1; a dynamic cheat earns -1.

KernelBench sizes are the real ones, so this takes minutes:
`python -m pytest -m gpu tests/test_env_gpu.py`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agentcore.types import Task
from rewards.build.compile_pool import CompileConfig
from rewards.env import EnvConfig, open_kernel_env, pristine_files
from rewards.evaluate import FinalEvaluator
from rewards.timing.baselines import task_sha256

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "rl" / "demos" / "l1_47_sum_dim"
LARGE = REPO / "rl" / "demos" / "l1_19_relu"  # 1.6e9-element input and output (6.4 GB each)
ZEROS = REPO / "tests" / "fixtures" / "cheats_dynamic" / "zeros_output"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"),
]


def task_of(fixture: Path) -> Task:
    return Task(task_id=fixture.name, source=(fixture / "model.py").read_text())


def make_workspace(fixture: Path, root: Path) -> Path:
    ws = root / fixture.name
    shutil.copytree(fixture, ws, ignore=shutil.ignore_patterns("cheat.json"))
    for rel, data in pristine_files(task_of(fixture)).items():
        (ws / rel).write_bytes(data)
    return ws


def env_config(tmp_path: Path) -> EnvConfig:
    return EnvConfig(gpus=(0,), compile=CompileConfig(cache_dir=str(tmp_path / "compile-cache")))


async def test_demo_compiles_verifies_and_profiles(tmp_path):
    ws, task = make_workspace(DEMO, tmp_path), task_of(DEMO)
    async with open_kernel_env(env_config(tmp_path)) as env:
        compiled = await env.compile(ws, task)
        assert compiled.ok, compiled.log
        verified = await env.verify(ws, task)
        assert verified.ok, verified.message
        timed = await env.profile(ws, task)
    assert timed.ok, timed.message
    assert timed.candidate_ms > 0 and timed.eager_ms > 0 and timed.compile_ms > 0


async def test_final_evaluator_rewards_the_honest_demo(tmp_path):
    ws, task = make_workspace(DEMO, tmp_path), task_of(DEMO)
    async with open_kernel_env(env_config(tmp_path)) as env:
        result = await FinalEvaluator(env).evaluate(ws, task)
        stats = env.queue.statistics()
        artifacts = env.compile_caches.get(task_sha256(task.source))
    assert result.verdict.ok, result.verdict.message
    assert result.reward >= 1
    # The reference was compiled by a shared job first: the paired job, alone on the GPU, compiled nothing
    assert artifacts and "profile_ms.compile_cache" not in result.breakdown, result.breakdown
    assert sum(lane.exclusive_jobs for lane in stats.lanes) == 1 and result.breakdown["profile_held_s"] > 0


async def test_final_evaluator_gives_a_dynamic_cheat_minus_one(tmp_path):
    ws, task = make_workspace(ZEROS, tmp_path), task_of(ZEROS)
    async with open_kernel_env(env_config(tmp_path)) as env:
        result = await FinalEvaluator(env).evaluate(ws, task)
    assert result.reward == -1
    assert not result.verdict.ok


TIMED = REPO / "tests" / "fixtures" / "cheats_timed"


@pytest.mark.parametrize("cheat", ["binding_call_counter", "device_call_counter"])
async def test_a_candidate_that_computes_less_once_timed_gets_minus_one(tmp_path, cheat):
    """It passes verification (its first calls do the task); the paired timing's check after the
    rounds finds its outputs wrong."""
    ws, task = make_workspace(TIMED / cheat, tmp_path), task_of(TIMED / cheat)
    async with open_kernel_env(env_config(tmp_path)) as env:
        assert (await env.compile(ws, task)).ok
        assert (await env.verify(ws, task)).ok
        result = await FinalEvaluator(env).evaluate(ws, task)
    assert result.reward == -1 and result.verdict.hack is not None, result.verdict
    assert result.verdict.hack.value == "output_caching" and "diverged" in result.verdict.message


async def test_a_candidate_that_starves_its_baselines_of_memory_earns_no_speedup(tmp_path):
    """It computes the task, but its binding keeps all but 160 MiB of the GPU from its first call:
    the paired timing sees the baselines' headroom gone and decides no speedup."""
    ws, task = make_workspace(TIMED / "memory_hog", tmp_path), task_of(TIMED / "memory_hog")
    async with open_kernel_env(env_config(tmp_path)) as env:
        assert (await env.compile(ws, task)).ok
        verified = await env.verify(ws, task)
        assert verified.ok, verified  # verification runs beside the memory it leaves (a poison block, inputs)
        result = await FinalEvaluator(env).evaluate(ws, task)
    assert result.verdict.ok and result.milestone == 1, result.verdict
    assert result.breakdown["baselines_starved"] and "starved" in result.breakdown["inconclusive_note"]


async def test_large_task_verifies_through_the_queue(tmp_path):
    """Once judged PROBLEM_SHRINKING: the sandbox's 4 GiB RLIMIT_FSIZE broke the 6.4 GB output
    blob; CUDA outputs now travel by IPC (rewards.verify.wire.CudaShare)."""
    ws, task = make_workspace(LARGE, tmp_path), task_of(LARGE)
    async with open_kernel_env(env_config(tmp_path)) as env:
        assert (await env.compile(ws, task)).ok
        verified = await env.verify(ws, task)
    assert verified.ok, verified.message


INLINE = REPO / "tests" / "fixtures" / "inline"
RELU_TASK = REPO / "tests" / "fixtures" / "build" / "relu"


def single_file_workspace(fixture: Path, root: Path) -> Path:
    ws = root / fixture.stem
    ws.mkdir()
    shutil.copy(fixture, ws / "model_new.py")
    return ws


async def test_single_file_load_inline_solution_passes_and_is_timed(tmp_path):
    ws, task = single_file_workspace(INLINE / "relu_honest.py", tmp_path), task_of(RELU_TASK)
    async with open_kernel_env(env_config(tmp_path)) as env:
        result = await FinalEvaluator(env).evaluate(ws, task)
    assert result.verdict.ok, result.verdict.message
    assert result.candidate is not None and result.eager is not None
    assert result.reward > -1


@pytest.mark.parametrize("cheat, category", [("relu_echo_input", None), ("relu_torch_in_wrapper", "torch_compute")])
async def test_single_file_cheats_get_minus_one(tmp_path, cheat, category):
    ws, task = single_file_workspace(INLINE / f"{cheat}.py", tmp_path), task_of(RELU_TASK)
    async with open_kernel_env(env_config(tmp_path)) as env:
        result = await FinalEvaluator(env).evaluate(ws, task)
    assert result.reward == -1 and not result.verdict.ok, result.verdict
    if category is not None:
        assert result.verdict.hack.value == category
