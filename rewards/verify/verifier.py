"""Verification of a candidate, trusted side: the GPU-queue handler `verify`, the candidate
child's process handle, and `verify_workspace` for the agent's tool and the final evaluation.

What it is: `run_verification(request, work_dir=)` starts the candidate child (`python -m
rewards.verify.candidate`, a fresh process: no candidate code ever runs here) and runs the trial
loop of `rewards.verify.trials` against it: the reference in exact fp32, hidden per-trial seeds,
the child's outputs handed to `rewards.verify.judge`. Quick mode (the agent's `verify` tool): 5
trials, one poison pair; final mode: 12 trials, two pairs.

What it is not: no compiling (`rewards.build.compile_pool`), no timing (the profile handler). The
child's crashes, exceptions, CUDA errors and timeouts are Verdict values; only broken
infrastructure raises. Importing this module does not import torch; `run_verification` does.

How it is used:
    # in the GPU worker: jobs.HANDLERS["verify"] = "rewards.verify.verifier:verify"
    verdict = await verify_workspace(queue, ws, task, build.artifact.so_path, mode="quick")
    tool_result = to_verify_result(verdict)
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import anyio
import msgspec
from msgspec import Struct

from agentcore.types import Task, VerifyResult
from rewards.queue.jobs import Job, JobContext, JobStatus, decode, encode
from rewards.verdict import Rules, Verdict, VerdictStatus
from rewards.verify.phases import Phases
from rewards.verify.wire import Pipe, child_decoder

if TYPE_CHECKING:
    from rewards.queue.zygote import ForkedProcess

logger = logging.getLogger(__name__)
Launcher = Literal["spawn", "zygote"]
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the child imports `rewards` from here
SOURCE_SUFFIXES = (".cu", ".cuh", ".cpp", ".h", ".hpp")


class VerifyConfig(Struct, frozen=True, kw_only=True):
    quick_trials: int = 5
    """Input sets in quick mode (the agent's in-loop verify)."""
    final_trials: int = 12
    """Input sets in final mode."""
    quick_pairs: int = 1
    """Trials run twice under different allocator poison, quick mode."""
    final_pairs: int = 2
    """Trials run twice under different allocator poison, final mode."""
    atol: float | None = None
    """Override of the dtype-tied absolute tolerance (rewards.verify.compare)."""
    rtol: float | None = None
    """Override of the dtype-tied relative tolerance."""
    precision_factor: float = 8.0
    """Passing outputs may be this many times less precise than fp32 vs float64."""
    fp64_max_mib: int = 2048
    """Float64 reference only when inputs + outputs (fp32) fit in this many MiB."""
    fp64_trials: int = 2
    """How many trials get a float64 reference."""
    min_own_share: float = 0.5
    """Fraction of the profiled GPU time the candidate's own kernels must carry."""
    profile: bool = True
    """Profile the last trial on CUDA (kernel attribution, streams)."""
    poison: bool = True
    """Poison the caching allocator before each forward (CUDA)."""
    allow_torch_compute: bool = False
    """Tests of pure-PyTorch candidates only: skip the op audit and the kernel attribution."""
    allow_aten_gemm_conv: bool = False
    """Let aten GEMM/convolution ops pass the op audit (the SKILL forbids them)."""
    rules: Rules = "paper"
    """"paper": torch ops and torch kernels in forward are TORCH_COMPUTE; "kernelbench": they are
    partial work (`details["partial"]`), but own kernels must still run, torch must leave some
    call of a reference op to them, and they must carry `partial_min_own_share` of the GPU time
    unless torch runs only the reference's ops."""
    partial_min_own_share: float = 0.005
    """Under kernelbench rules: below this share of the GPU time own kernels are a decoy (a fused
    epilogue after a torch GEMM of 1024x8192x8192 carries about 1%), unless torch runs only the
    reference's ops and leaves some call of one to them: then they pass at any share."""
    load_timeout_s: float = 300.0
    """Starting the child and building ModelNew."""
    trial_timeout_s: float = 180.0
    """One forward call with its input draw and output transfer."""
    # Inputs are drawn on both sides rather than shipped: the parent sends (seed, variant, scale)
    # only after the child has loaded the candidate, the child draws with the same code and the
    # parent checks the child's input fingerprints bit for bit. KernelBench inputs reach 16 GiB;
    # shipping them through files would cost seconds per trial. Outputs come back by CUDA IPC
    # (the parent maps the child's allocation and copies it on the device: no file, so the
    # sandbox's 4 GiB file-size limit never meets a 6.4 GB output); CPU outputs and the
    # state_dict travel as blob files.
    share_cuda: bool = True
    """CUDA outputs reach the verifier by CUDA IPC (one device copy); False: blob files through
    host memory and disk (seconds per GB, and bound by the sandbox's file-size limit)."""
    harness_stream: Literal["side", "default"] = "side"
    """The stream the candidate's forward runs on: a fresh side stream (our layout: kernels must
    launch on c10::cuda::getCurrentCUDAStream()), or the default stream, for single-file
    KernelBench solutions, which launch with <<<grid, block>>> as KernelBench's evaluator expects.
    Kernels on any other stream are SIDE_STREAM either way."""
    child_launcher: Launcher = "zygote"
    """How the candidate child starts: "zygote": forked from the worker's pre-loaded launcher
    (rewards.queue.zygote; no interpreter start, torch already imported: a verify job of the L1 matmul
    demo 0.68 s instead of 12.8 s on an H100), or "spawn" a fresh interpreter (the fallback when
    the zygote cannot start)."""


class VerifyRequest(Struct, frozen=True, kw_only=True):
    """What the `verify` job verifies. Paths are relative to the job's scratch dir."""

    task_source: str
    mode: Literal["quick", "final"] = "quick"
    seed: int | None = None  # hidden; None: drawn from os.urandom here
    device: str = "cuda"
    candidate_dir: str = "candidate"  # holds model_new.py, kernels/ and the extension
    so_path: str = ""  # relative to candidate_dir; "" for a pure-PyTorch candidate
    config: VerifyConfig = VerifyConfig()


class VerifyInfrastructureError(RuntimeError):
    """The verify job itself failed (not the candidate): a bug or a broken worker."""


# ---------------------------------------------------------------------------------------------
# The child process.


class CandidateProcess:
    """A `rewards.verify.candidate` child: start (spawned, or forked by the zygote), ask with a timeout,
    close (killing its group).

    Example:
        with CandidateProcess(work_dir) as child:
            loaded = child.call(load_msg, timeout_s=300)
    """

    module = "rewards.verify.candidate"

    def __init__(self, work_dir: Path, *, python: str = sys.executable, launcher: Launcher = "spawn") -> None:
        self.work_dir, self.python, self.launcher = Path(work_dir), python, launcher
        self.process: subprocess.Popen | ForkedProcess | None = None
        self.pipe: Pipe | None = None
        self.log_path = self.work_dir / f"candidate-{uuid.uuid4().hex[:8]}.log"

    def start(self) -> None:
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
        args = ["--read-fd", str(down_r), "--write-fd", str(up_w)]
        with open(self.log_path, "ab") as log:
            self.process = self._launch(args, env, log.fileno(), (down_r, up_w))
        os.close(down_r)
        os.close(up_w)
        self.pipe = Pipe(up_r, down_w)

    def _launch(self, args: list[str], env: dict[str, str], log_fd: int, fds: tuple[int, int]):
        """`python -m self.module args`: forked by the worker's zygote (rewards.queue.zygote), or
        spawned, as always when the zygote cannot be had (a job never fails for its sake)."""
        if self.launcher == "zygote":
            from rewards.queue import zygote

            try:
                return zygote.launch(self.module, args, cwd=self.work_dir, env=env, log_fd=log_fd, pass_fds=fds,
                                     python=self.python)
            except zygote.ZygoteError as exc:
                logger.warning("no zygote, spawning %s instead: %s", self.module, exc)
        argv = [self.python, "-P", "-s", "-m", self.module, *args]
        return subprocess.Popen(argv, pass_fds=fds, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT,
                                cwd=self.work_dir, env=env, process_group=0)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def call(self, message, timeout_s: float):
        """The child's answer; raises ChildGone (it died) or TimeoutError."""
        if not self.alive:
            self.close()
            self.start()
        self.pipe.send(message)
        return self.pipe.receive(child_decoder, timeout_s)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-chars:].decode("utf-8", "replace")
        except OSError:
            return ""

    def describe_death(self) -> str:
        """Why the pipe closed: the exit status (the process is killed if it lingers)."""
        try:
            code = self.process.wait(timeout=5) if self.process else None
        except subprocess.TimeoutExpired:
            self.kill()
            return f"the candidate process closed its channel; its output ends with:\n{self.log_tail()}"
        how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit status {code}"
        return f"the candidate process died ({how}); its output ends with:\n{self.log_tail()}"

    def close(self) -> None:
        """Kill the child's process group (strays of the candidate too) at once. By now the
        verdict is decided: a graceful exit (Bye) would only add the child's interpreter, torch,
        profiler and CUDA teardown to the job (measured 1.6 s of a 6.1 s CPU verification), and
        it would run candidate atexit code. Timeouts end children this way too."""
        self.kill()

    def kill(self) -> None:
        """SIGKILL the child's process group at once (a hung forward never reads Bye)."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()
        self.pipe.close()
        self.process, self.pipe = None, None

    def __enter__(self) -> CandidateProcess:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# The verification loop.


def run_verification(request: VerifyRequest, *, work_dir: Path, process: CandidateProcess | None = None,
                     deadline: float | None = None) -> Verdict:
    """Verify the candidate under `work_dir / request.candidate_dir`. `process` lets tests share
    one child between pure-PyTorch candidates; production starts a fresh one per request.
    `deadline` is a time.monotonic() value past which the verdict is TIMEOUT. The verdict's
    `phases_ms` says where the time went (rewards.verify.phases)."""
    phases = Phases()
    with phases.phase("import"):  # torch and the trusted modules: once per worker process
        from rewards.verify.trials import Verification

    transfer = Path(work_dir) / f"xfer-{uuid.uuid4().hex[:12]}"
    transfer.mkdir(parents=True)
    own = process is None
    child = process or CandidateProcess(Path(work_dir), launcher=request.config.child_launcher)
    try:
        if own:
            with phases.phase("spawn"):
                child.start()
        verdict = Verification(request, Path(work_dir), transfer, child, deadline, phases).run()
    finally:
        with phases.phase("close"):
            if own:
                child.close()
            shutil.rmtree(transfer, ignore_errors=True)
            _release_cuda_cache()
    return msgspec.structs.replace(verdict, phases_ms=phases.as_dict())


def _release_cuda_cache() -> None:
    """A worker that verifies in-process keeps its CUDA context; the next job's candidate child
    needs the memory this one's references left in the caching allocator."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def verify(payload: bytes, ctx: JobContext) -> bytes:
    """GPU-queue handler: VerifyRequest (msgpack) in, Verdict (msgpack) out."""
    request = decode(payload, VerifyRequest)
    deadline = time.monotonic() + 0.9 * ctx.deadline_s - 5.0 if ctx.deadline_s else None
    return encode(run_verification(request, work_dir=Path(ctx.scratch_dir), deadline=deadline))


# ---------------------------------------------------------------------------------------------
# The orchestrator's side.


def job_files(workspace: Path, artifact_path: str | Path | None) -> tuple[dict[str, bytes], str]:
    """model_new.py, the kernel sources and the built module, under candidate/."""
    workspace = Path(workspace)
    files = {"candidate/model_new.py": (workspace / "model_new.py").read_bytes()}
    kernels = workspace / "kernels"
    if kernels.is_dir():
        for path in sorted(kernels.rglob("*")):
            if path.is_file() and path.suffix in SOURCE_SUFFIXES:
                files[f"candidate/{path.relative_to(workspace).as_posix()}"] = path.read_bytes()
    so_name = ""
    if artifact_path:
        so_name = "cuda_extension" + "".join(Path(artifact_path).suffixes[-2:])
        files[f"candidate/{so_name}"] = Path(artifact_path).read_bytes()
    return files, so_name


def verdict_from_job(status: JobStatus, value: bytes, error: str) -> Verdict:
    """The handler's Verdict; a killed or crashed job is the candidate's failure."""
    if status is JobStatus.OK:
        return decode(value, Verdict)
    if status is JobStatus.TIMEOUT:
        return Verdict(status=VerdictStatus.TIMEOUT, message=f"verification timed out: {error[-500:]}")
    if status in (JobStatus.CRASHED, JobStatus.CUDA_POISONED):
        return Verdict(status=VerdictStatus.RUNTIME_ERROR, message=f"verification crashed: {error[-1500:]}")
    raise VerifyInfrastructureError(f"verify job failed: {error[-3000:]}")


async def verify_workspace(queue, workspace_dir: Path, task: Task, artifact_path: str | Path | None,
                           mode: Literal["quick", "final"] = "quick", *, config: VerifyConfig = VerifyConfig(),
                           device: str = "cuda", seed: int | None = None, deadline_s: float | None = None,
                           running: anyio.Event | None = None) -> Verdict:
    """Verify a workspace on `queue` (a rewards.queue.gpu_queue.GpuQueue): package, submit, decode.
    The verdict carries the job's wait for a lane and how long it held it (`job_wait_s`, `job_wall_s`).
    `running` is set once the job has its lane (`GpuQueue.submit`)."""
    files, so_name = await anyio.to_thread.run_sync(job_files, workspace_dir, artifact_path)
    request = VerifyRequest(task_source=task.source, mode=mode, seed=seed, device=device, so_path=so_name, config=config)
    job = Job(job_id=f"verify-{task.task_id}-{uuid.uuid4().hex[:8]}", kind="verify", payload=encode(request),
              files=files, deadline_s=deadline_s)
    result = await queue.submit(job, running=running)
    verdict = verdict_from_job(result.status, result.value, result.error)
    return msgspec.structs.replace(verdict, job_wait_s=result.wait_s, job_wall_s=result.wall_s)


def to_verify_result(verdict: Verdict) -> VerifyResult:
    """What the agent's `verify` tool shows the model."""
    return VerifyResult(
        ok=verdict.ok,
        message=verdict.message if verdict.message else verdict.status.value,
        trials=verdict.trials,
        max_abs_err=verdict.max_abs_err,
        hack=verdict.hack.value if verdict.hack is not None else None,
    )


__all__ = [
    "CandidateProcess", "VerifyConfig", "VerifyInfrastructureError", "VerifyRequest",
    "job_files", "run_verification", "to_verify_result", "verdict_from_job", "verify", "verify_workspace",
]
