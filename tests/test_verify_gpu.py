"""Verification on a GPU, end to end: build with the real compile pool, verify in a candidate
child, score.

Every honest workspace in rl/demos (a KernelBench problem verbatim plus kernels)
must pass and earn a reward; every cheat in tests/fixtures/cheats_dynamic must earn -1 with the
HackCategory its cheat.json names. One honest and one cheating workspace also go through the
GPU queue's `verify` handler. The KernelBench sizes are the real ones (ReLU moves 6 GiB per
call), so the module takes minutes: run it with
`python -m pytest -m gpu tests/test_verify_gpu.py` (`-k cheat` or `-k honest` for a part).

cuBLAS/cuDNN workspaces need the compile pool to find cudnn.h and to link -lcublas/-lcudnn;
where it cannot, their tests xfail with the compiler's message instead of failing.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import anyio
import pytest

from agentcore.types import Task
from rewards.build.compile_pool import CompileConfig, CompilePool
from rewards.reward import score
from rewards.verdict import HackCategory, Timing, VerdictStatus
from rewards.verify.verifier import VerifyConfig, VerifyRequest, run_verification, verify_workspace

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
TEMPLATE = REPO / "agentcore" / "assets" / "template"
HONEST = sorted(p for p in (Path(__file__).resolve().parents[1] / "rl" / "demos").glob("*") if p.is_dir())
CHEATS = sorted(p for p in (FIXTURES / "cheats_dynamic").glob("*") if (p / "cheat.json").exists())
VENDOR_BUILD_ERROR = re.compile(r"cudnn\.h|cublas_v2\.h|undefined reference to '?(cublas|cudnn)", re.I)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc"),
]


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> CompilePool:
    return CompilePool(CompileConfig(cache_dir=str(tmp_path_factory.mktemp("compile-cache"))))


def make_workspace(fixture: Path, root: Path) -> Path:
    ws = root / fixture.name
    shutil.copytree(fixture, ws, ignore=shutil.ignore_patterns("cheat.json"))
    for item in TEMPLATE.iterdir():
        shutil.copy(item, ws / item.name)
    return ws


async def build(pool: CompilePool, ws: Path) -> str:
    result = await pool.build(ws)
    if not result.result.ok:
        if VENDOR_BUILD_ERROR.search(result.result.log):
            pytest.xfail(f"the compile pool cannot build cuBLAS/cuDNN code here:\n{result.result.log[:1500]}")
        pytest.fail(f"{ws.name} does not build:\n{result.result.log}")
    return result.artifact.so_path


async def verify(ws: Path, so_path: str, **config):
    request = VerifyRequest(
        task_source=(ws / "model.py").read_text(), device="cuda", candidate_dir=str(ws), so_path=so_path,
        config=VerifyConfig(**config),
    )
    return await anyio.to_thread.run_sync(lambda: run_verification(request, work_dir=ws.parent))


def timing() -> Timing:
    return Timing.from_samples([1.0, 1.0], method="test")


@pytest.mark.parametrize("fixture", HONEST, ids=lambda p: p.name)
async def test_honest_kernelbench_workspace_passes(pool, tmp_path, fixture):
    ws = make_workspace(fixture, tmp_path)
    verdict = await verify(ws, await build(pool, ws))
    assert verdict.ok, verdict
    assert verdict.trials == 5 and verdict.details["own_share"] >= 0.5
    assert score(verdict, timing(), timing(), timing()).reward == 1.0


@pytest.mark.parametrize("fixture", CHEATS, ids=lambda p: p.name)
async def test_dynamic_cheat_earns_no_reward_and_names_its_hack(pool, tmp_path, fixture):
    expected = HackCategory(json.loads((fixture / "cheat.json").read_text())["category"])
    ws = make_workspace(fixture, tmp_path)
    verdict = await verify(ws, await build(pool, ws))
    assert verdict.status is VerdictStatus.HACK and verdict.hack is expected, verdict
    assert score(verdict, None, None, None).reward == -1.0


def idiom_workspace(pair: Path, variant: str, root: Path) -> Path:
    """A variant of an idiom pair (tests/fixtures/idioms) as a workspace: base/, the variant's
    files and the pair's own task."""
    ws = root / f"{pair.name}-{variant}"
    shutil.copytree(FIXTURES / "idioms" / "base", ws)
    shutil.copytree(pair / variant, ws, dirs_exist_ok=True)
    shutil.copy(pair / "model.py", ws / "model.py")
    for item in TEMPLATE.iterdir():
        shutil.copy(item, ws / item.name)
    return ws


@pytest.mark.parametrize("variant", ["honest", "cheat"])
async def test_library_streams_are_excused_and_the_candidates_own_side_stream_is_not(pool, tmp_path, variant):
    """idioms/library_streams under KernelBench's rules: cuDNN's LSTM runs kernels on streams of
    its own for the candidate as for the reference (whose profile then excuses them)."""
    ws = idiom_workspace(FIXTURES / "idioms" / "library_streams", variant, tmp_path)
    verdict = await verify(ws, await build(pool, ws), rules="kernelbench")
    if variant == "cheat":
        assert verdict.hack is HackCategory.SIDE_STREAM, verdict
        return
    assert verdict.ok and "side_stream" not in verdict.details.get("also", ""), verdict
    assert verdict.details.get("library_kernels"), "cuDNN ran this LSTM on the harness stream only"


async def test_pure_torch_candidate_on_the_gpu_is_torch_compute_and_launches_no_kernel_of_its_own(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    shutil.copy(FIXTURES / "cheats_dynamic" / "echo_input" / "model.py", ws / "model.py")
    (ws / "model_new.py").write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, x):\n        return torch.relu(x)\n"
    )
    verdict = await verify(ws, "")
    assert verdict.hack is HackCategory.TORCH_COMPUTE, verdict
    assert "decoy_kernel" in verdict.details["also"] and verdict.details["gpu_us.torch"] > 0


async def test_final_mode_runs_more_trials_and_two_poison_pairs(pool, tmp_path):
    ws = make_workspace(HONEST[0].parent / "l1_2_matmul_tiled", tmp_path)
    request = VerifyRequest(task_source=(ws / "model.py").read_text(), mode="final", candidate_dir=str(ws),
                            so_path=await build(pool, ws))
    verdict = await anyio.to_thread.run_sync(lambda: run_verification(request, work_dir=tmp_path))
    assert verdict.ok, verdict
    assert verdict.trials == 12 and verdict.details["runs"] == 14 and verdict.details["fp64_reference"]


async def test_a_launch_that_cuda_refuses_fails_the_candidate_with_its_error_not_a_harness_traceback(pool, tmp_path):
    """2048 threads per block: the launch fails without a word (the binding checks nothing), and
    CUDA reports it at the harness's next call; the message names the candidate's GPU work."""
    ws = make_workspace(HONEST[0].parent / "l1_2_matmul_tiled", tmp_path)
    cu = ws / "kernels" / "matmul.cu"
    text = cu.read_text()
    assert "<<<grid, 256, 0, stream>>>" in text
    cu.write_text(text.replace("<<<grid, 256, 0, stream>>>", "<<<grid, 2048, 0, stream>>>"))
    verdict = await verify(ws, await build(pool, ws))
    assert verdict.status is VerdictStatus.RUNTIME_ERROR, verdict
    assert "the candidate's GPU work failed" in verdict.message and "Traceback" not in verdict.message, verdict.message


@pytest.mark.parametrize(("name", "honest"), [("l1_2_matmul_tiled", True), ("decoy_memcpy", False)])
async def test_verify_handler_through_the_gpu_queue(pool, tmp_path, name, honest):
    from rewards.queue.gpu_queue import GpuQueue, GpuQueueConfig

    fixture = (HONEST[0].parent if honest else FIXTURES / "cheats_dynamic") / name
    ws = make_workspace(fixture, tmp_path / "ws")
    so_path = await build(pool, ws)
    config = GpuQueueConfig(gpus=(0,), scratch_root=str(tmp_path / "scratch"), job_default_deadline_s=900.0)
    async with GpuQueue(config) as queue:
        verdict = await verify_workspace(queue, ws, Task(task_id=name, source=(ws / "model.py").read_text()), so_path)
    assert verdict.ok if honest else verdict.hack is HackCategory.DECOY_KERNEL, verdict
