"""torch.compile in a sandboxed GPU-queue worker, job after job, on the CPU.

The sandboxed worker SIGKILLs every other process in its pid namespace after each job
(`--reap-strays`). Inductor's subprocess compile pool is such a process, and torch keeps the
pool's pipes open in the parent, so the next compile through a reaped pool waited forever (a
profile job hung on an H100). `worker_env` sets TORCHINDUCTOR_COMPILE_THREADS=1, so Inductor
compiles in the worker and no pool exists; these tests hold it to that even when the host asks
for a pool. The handler is tests/fakes/compile_handler.py; the queue, bubblewrap, the reaper and
Inductor's C++ compiles are real.
"""

from __future__ import annotations

import functools
import shutil
import subprocess

import pytest

from rewards.queue.gpu_queue import GpuQueue, GpuQueueConfig, worker_env
from rewards.queue.jobs import Job, JobStatus, decode, encode
from tests.fakes.compile_handler import CompileArgs, CompileValue, expected_total

HANDLER = {"inductor_compile": "tests.fakes.compile_handler:inductor_compile"}
SIZES = (37, 53, 71)  # one shape and one code object per job: each job compiles afresh


@functools.cache
def bwrap_unavailable() -> str | None:
    path = shutil.which("bwrap")
    if path is None:
        return "bwrap is not installed"
    probe = [path, "--unshare-all", "--unshare-user", "--disable-userns", "--ro-bind", "/", "/", "true"]
    result = subprocess.run(probe, check=False, capture_output=True, text=True)
    return f"bwrap cannot make namespaces here: {result.stderr.strip()}" if result.returncode else None


needs_bwrap = pytest.mark.skipif(bwrap_unavailable() is not None, reason=str(bwrap_unavailable()))


def compile_job(size: int) -> Job:
    return Job(job_id=f"compile-{size}", kind="inductor_compile", payload=encode(CompileArgs(size=size)))


@pytest.fixture
def host_asks_for_a_pool(monkeypatch):
    """The orchestrator's environment asks Inductor for a 4-process compile pool."""
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "4")


@pytest.mark.parametrize("sandbox", [True, False])
def test_worker_env_makes_inductor_compile_in_process(sandbox, host_asks_for_a_pool, tmp_path):
    env = worker_env(GpuQueueConfig(gpus=(0,), sandbox=sandbox), 0, tmp_path)
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"


@needs_bwrap
async def test_sandboxed_worker_compiles_job_after_job(host_asks_for_a_pool, tmp_path):
    config = GpuQueueConfig(
        gpus=(0,),
        sandbox=True,
        scratch_root=str(tmp_path / "scratch"),
        job_default_deadline_s=120.0,  # a hung compile is a TIMEOUT result, not a stuck test
        worker_start_timeout_s=60.0,
        handlers=HANDLER,
    )
    async with GpuQueue(config) as queue:
        results = [await queue.submit(compile_job(size)) for size in SIZES]
    assert [r.status for r in results] == [JobStatus.OK] * 3, [r.error for r in results]
    assert len({r.worker_pid for r in results}) == 1  # one worker, reaped between jobs
    values = [decode(r.value, CompileValue) for r in results]
    assert [v.total for v in values] == pytest.approx([expected_total(s) for s in SIZES], rel=1e-4)
    assert [(v.compile_threads, v.pool_used) for v in values] == [(1, False)] * 3
