"""A final evaluation whose paired profile job starts beside its verification, through the real
env, GPU queue and workers on a CPU machine. Only the GPU edge is faked: the `verify` and
`profile` handlers written here sleep where the real ones would judge and time, and say when."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from agentcore.types import CompileResult, Task
from rewards.build.compile_pool import Build, BuildArtifact, CompilePool
from rewards.env import EnvConfig, Prepared, RewardsKernelEnv
from rewards.evaluate import EvaluateConfig, FinalEvaluator
from rewards.queue.gpu_queue import GpuQueue, GpuQueueConfig
from rewards.verdict import VerdictStatus

HANDLERS = '''
import time

from rewards.queue.jobs import GpuWithdrawn, decode, encode
from rewards.timing.profile import Profile
from rewards.verdict import Verdict, VerdictStatus
from rewards.verify.verifier import VerifyRequest


def verify(payload, ctx):
    """Judges for 0.6 s: wrong when the task's source says so."""
    request = decode(payload, VerifyRequest)
    began = time.time()
    time.sleep(0.6)
    status = VerdictStatus.WRONG_OUTPUT if "WRONG" in request.task_source else VerdictStatus.OK
    return encode(Verdict(status=status, message="judged", phases_ms={"began": began * 1e3, "ended": time.time() * 1e3}))


def profile(payload, ctx):
    """Prepares for 0.3 s (the reference compile and the build), then asks for its GPU alone."""
    began = time.time()
    time.sleep(0.3)
    try:
        ctx.gpu_alone()
    except GpuWithdrawn as exc:
        return encode(Profile(ok=False, message=str(exc)))
    return encode(Profile(ok=False, message=f"timed {began} {time.time()}"))


def compile_reference(payload, ctx):
    return b"inductor artifacts"
'''


@pytest.fixture
def queue_config(tmp_path, monkeypatch) -> GpuQueueConfig:
    handlers = Path(tempfile.mkdtemp(prefix="final-overlap-", dir="/var/tmp" if Path("/var/tmp").is_dir() else None))
    (handlers / "final_overlap_handlers.py").write_text(HANDLERS)
    monkeypatch.setenv("PYTHONPATH", str(handlers))
    yield GpuQueueConfig(gpus=(0,), lanes_per_gpu=2, scratch_root=str(tmp_path / "scratch"),
                         gpu_lock_dir=str(tmp_path / "locks"), worker_start_timeout_s=30.0,
                         handlers={"verify": "final_overlap_handlers:verify", "profile": "final_overlap_handlers:profile",
                                   "reference_compile": "final_overlap_handlers:compile_reference"})
    shutil.rmtree(handlers, ignore_errors=True)


def workspace(tmp_path: Path) -> tuple[Path, Build]:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "model_new.py").write_text("# faked: the handlers never load it\n")
    (tmp_path / "module.so").write_bytes(b"\0")
    return ws, Build(result=CompileResult(ok=True), artifact=BuildArtifact(so_path=str(tmp_path / "module.so"), key="k"))


@pytest.mark.parametrize("passes", [True, False])
async def test_the_profile_job_prepares_while_the_verification_runs_and_times_only_a_pass(
        tmp_path, queue_config, passes):
    ws, build = workspace(tmp_path)
    task = Task(task_id="t", source="# the reference" if passes else "# WRONG")
    async with GpuQueue(queue_config) as queue:
        env = RewardsKernelEnv(CompilePool(), queue, EnvConfig(gpus=(0,)))
        scored = await FinalEvaluator(env).evaluate_prepared(ws, task, Prepared(build=build))
        profiles = queue.statistics().kinds["profile"].jobs
    judged = scored.breakdown
    if passes:  # the profile's failure stands for its timing: its message says when it ran
        assert scored.verdict.status is VerdictStatus.RUNTIME_ERROR and scored.verdict.message.startswith("timed ")
        began, timed = (float(x) * 1e3 for x in scored.verdict.message.split()[1:])  # ms, as the phases
        assert began < judged["verify_ms.ended"] < timed + 0.1  # prepared beside the verification, timed after it
    else:
        assert scored.verdict.status is VerdictStatus.WRONG_OUTPUT and scored.reward == -1.0
        assert "profile_held_s" not in judged
    assert profiles == 1  # started either way; withdrawn when the verification failed


@pytest.mark.parametrize("passes", [True, False])
async def test_with_one_lane_the_profile_job_waits_for_the_verifications_lane(tmp_path, queue_config, passes):
    """No deadlock when the gated job cannot start beside its verification: it (and the task's
    reference compile job before it) take the lane once the verify job is done."""
    from msgspec.structs import replace

    ws, build = workspace(tmp_path)
    task = Task(task_id="t", source="# the reference" if passes else "# WRONG")
    async with GpuQueue(replace(queue_config, lanes_per_gpu=1)) as queue:
        env = RewardsKernelEnv(CompilePool(), queue, EnvConfig(gpus=(0,)))
        scored = await FinalEvaluator(env).evaluate_prepared(ws, task, Prepared(build=build))
    if passes:
        began = float(scored.verdict.message.split()[1]) * 1e3
        assert scored.verdict.message.startswith("timed ") and began > scored.breakdown["verify_ms.ended"]
    else:
        assert scored.verdict.status is VerdictStatus.WRONG_OUTPUT


async def test_without_overlap_a_failed_verification_starts_no_profile_job(tmp_path, queue_config):
    ws, build = workspace(tmp_path)
    async with GpuQueue(queue_config) as queue:
        env = RewardsKernelEnv(CompilePool(), queue, EnvConfig(gpus=(0,)))
        scored = await FinalEvaluator(env, EvaluateConfig(overlap=False)).evaluate_prepared(
            ws, Task(task_id="t", source="# WRONG"), Prepared(build=build))
        kinds = queue.statistics().kinds
    assert scored.verdict.status is VerdictStatus.WRONG_OUTPUT and "profile" not in kinds


async def test_warming_a_task_compiles_its_reference_once_before_its_final_evaluations(tmp_path, queue_config):
    """`FinalEvaluator.warm`, which the orchestrator calls as a group starts: the task's reference
    compile job runs then, and the group's final evaluations find its artifacts."""
    ws, build = workspace(tmp_path)
    task = Task(task_id="t", source="# the reference")
    async with GpuQueue(queue_config) as queue:
        env = RewardsKernelEnv(CompilePool(), queue, EnvConfig(gpus=(0,)))
        evaluator = FinalEvaluator(env)
        await evaluator.warm(task)
        compiled = queue.statistics().kinds["reference_compile"].jobs
        for _ in range(2):
            await evaluator.evaluate_prepared(ws, task, Prepared(build=build))
        kinds = queue.statistics().kinds
        await FinalEvaluator(env, EvaluateConfig(timed=False)).warm(Task(task_id="u", source="# another"))
    assert compiled == 1 and kinds["reference_compile"].jobs == 1 and kinds["profile"].jobs == 2
    assert queue.statistics().kinds["reference_compile"].jobs == 1  # an untimed evaluator warms nothing


async def test_warming_without_a_gpu_queue_does_nothing(tmp_path):
    await RewardsKernelEnv(CompilePool(), None, EnvConfig()).warm_reference(Task(task_id="t", source="# x"))
