"""Profiling of a candidate, trusted side: the GPU-queue handler `profile` and `profile_workspace`
for the agent's `profile` tool and the final evaluation.

What it is: `run_profile(request, work_dir=)` times the task's eager and torch.compile baselines
in this (trusted) process with `rewards.timing.baselines.measure_baselines` (or reuses the Baselines the
orchestrator sends back, when their key still matches this GPU and stack), then times the
candidate in a fresh child, `python -m rewards.timing.profile_child`, with `candidate_config(baselines,
config)` so that all three timings use one method. The child gets the same `Load` message the
verification child gets (the reference's state_dict as a blob file, the init seed), plus the
timing config; it answers one `Timed` message and exits.

What it is not: no correctness check (`rewards.verify.verifier`) and no reward (`rewards.reward`). The
candidate's time is measured inside the candidate's own process (CUDA events around its forward,
as KernelBench does): a candidate that tampers with the timer can lie about its time, which is
why the final evaluation only profiles candidates that passed verification and the static checks.

How it is used:
    # GpuQueueConfig.handlers["profile"] = "rewards.timing.profile:profile"
    outcome = await profile_workspace(queue, ws, task, build.artifact.so_path)
    tool_result = to_profile_result(outcome)

Importing this module does not import torch; the handler does.
"""

from __future__ import annotations

import ast
import shutil
import uuid
from pathlib import Path

import anyio
import msgspec
from msgspec import Struct

from agentcore.types import ProfileResult, Task
from rewards.timing.baselines import BaselineRequest, Baselines
from rewards.queue.jobs import Job, JobContext, JobStatus, decode, encode
from rewards.verify.precision import DEFAULT_POLICY
from rewards.timing.sampling import Measurement, TimingConfig
from rewards.verdict import Timing
from rewards.verify.verifier import CandidateProcess, Launcher, job_files
from rewards.verify.phases import Phases
from rewards.verify.wire import BlobWriter, ChildGone, Load

HANDLER = "rewards.timing.profile:profile"


class ProfileConfig(Struct, frozen=True, kw_only=True):
    timing: TimingConfig = TimingConfig()
    """Timing config of all three subjects (the candidate gets the baselines' method)."""
    policy: str = DEFAULT_POLICY.name
    """Precision policy of the baselines (rewards.verify.precision.POLICIES)."""
    init_seed: int = 0
    """torch.manual_seed before Model (and, in the child, ModelNew) is built."""
    input_seed: int = 1
    """torch.manual_seed(input_seed + i) before input set i is drawn, on both sides."""
    load_timeout_s: float = 300.0
    """Starting the child and building ModelNew."""
    time_timeout_s: float = 300.0
    """Timing the candidate (warm-up, sampling, the input pool)."""
    child_launcher: Launcher = "zygote"
    """How the profile child starts: "zygote" (rewards.queue.zygote; 0.82 s per profile job of the L1
    matmul demo instead of 6.2 s on an H100) or "spawn" a fresh interpreter."""


class ProfileRequest(Struct, frozen=True, kw_only=True):
    """What the `profile` job times. Paths are relative to the job's scratch dir."""

    task_source: str
    candidate_dir: str = "candidate"
    so_path: str = ""  # relative to candidate_dir; "" for a pure-PyTorch candidate
    device: str = "cuda"
    config: ProfileConfig = ProfileConfig()
    baselines: Baselines | None = None  # from an earlier job; reused when its key matches
    cache_dir: str = ""  # baseline disk cache; "" inside the sandbox (only scratch is writable)


class Profile(Struct, frozen=True, kw_only=True):
    """Outcome of one profile job. `ok=False` is the candidate's failure, with `message`."""

    ok: bool
    message: str = ""
    candidate: Timing | None = None
    eager: Timing | None = None
    compiled: Timing | None = None
    baselines: Baselines | None = None
    phases_ms: dict[str, float] = {}
    """Where the profile job's time went (rewards.verify.phases; "child." from the child)."""


class ProfileInfrastructureError(RuntimeError):
    """The profile job itself failed (not the candidate): a bug or a broken worker."""


# ---------------------------------------------------------------------------------------------
# The child protocol: one request, one answer (rewards.timing.profile_child serves it).


class TimeCandidate(Struct, frozen=True, kw_only=True):
    """Build ModelNew as `load` says, then time its forward with `config`."""

    load: Load
    config: TimingConfig
    input_seed: int


class Timed(Struct, frozen=True, kw_only=True):
    ok: bool
    error: str = ""
    measurement: Measurement | None = None
    phases_ms: dict[str, float] = {}  # the child's own account: start-up, build, warm-up, sampling


time_request_decoder = msgspec.msgpack.Decoder(TimeCandidate)
timed_decoder = msgspec.msgpack.Decoder(Timed)


class ProfileChild(CandidateProcess):
    """A `rewards.timing.profile_child` process: the candidate process of the verifier, other module."""

    module = "rewards.timing.profile_child"

    def time(self, message: TimeCandidate, timeout_s: float) -> Timed:
        self.pipe.send(message)
        return self.pipe.receive(timed_decoder, timeout_s)


# ---------------------------------------------------------------------------------------------
# The handler.


def _baselines(request: ProfileRequest) -> Baselines:
    from rewards.timing.baselines import current_key, measure_baselines

    c = request.config
    sent = request.baselines
    if sent is not None and sent.key == current_key(request.task_source, c.policy, c.timing):
        return sent
    return measure_baselines(BaselineRequest(
        source=request.task_source, init_seed=c.init_seed, input_seed=c.input_seed, policy=c.policy,
        config=c.timing, cache_dir=request.cache_dir,
    ))


def _load_message(request: ProfileRequest, work_dir: Path, transfer: Path) -> Load:
    """The reference's state_dict (built on the CPU, never run) for the child to load."""
    import torch

    from rewards.verify.inputs import load_task

    task = load_task(request.task_source)
    init_inputs = list(task.get_init_inputs())
    text = repr(init_inputs)
    ast.literal_eval(text)  # the task's constructor arguments must be plain literals
    torch.manual_seed(request.config.init_seed)
    model = task.Model(*init_inputs)
    with BlobWriter(transfer, "state.bin") as writer:
        state = {name: writer.add(t) for name, t in model.state_dict().items()}
    return Load(task_source=request.task_source, candidate_dir=str(work_dir / request.candidate_dir),
                so_path=request.so_path, device=request.device, init_inputs=text,
                init_seed=request.config.init_seed, state=state, transfer_dir=str(transfer))


def time_candidate(request: ProfileRequest, config: TimingConfig, work_dir: Path,
                   phases: Phases | None = None) -> Timed:
    """Time the candidate in a fresh child; its failures (crash, timeout, exception) are values.
    `phases` gets "state", "spawn", "child" (and the child's own "child.*") and "close"."""
    phases = phases if phases is not None else Phases()
    transfer = work_dir / f"xfer-{uuid.uuid4().hex[:12]}"
    transfer.mkdir(parents=True)
    c = request.config
    child = ProfileChild(work_dir, launcher=c.child_launcher)
    try:
        with phases.phase("state"):  # the reference's state_dict, built on the CPU
            message = TimeCandidate(load=_load_message(request, work_dir, transfer), config=config,
                                    input_seed=c.input_seed)
        with phases.phase("spawn"):
            child.start()
        with phases.phase("child"):
            timed = child.time(message, c.load_timeout_s + c.time_timeout_s)
        phases.merge(timed.phases_ms)
        return timed
    except TimeoutError:
        return Timed(ok=False, error=f"the candidate was not timed within {c.load_timeout_s + c.time_timeout_s:.0f} s")
    except ChildGone:
        return Timed(ok=False, error=child.describe_death())
    finally:
        with phases.phase("close"):
            child.close()
            shutil.rmtree(transfer, ignore_errors=True)


def run_profile(request: ProfileRequest, *, work_dir: Path) -> Profile:
    """Baselines here, the candidate in a child (module docstring)."""
    phases = Phases()
    with phases.phase("import"):  # torch and rewards.timing.baselines: once per worker process
        from rewards.timing.baselines import candidate_config
    with phases.phase("baselines"):  # a key check when the orchestrator sent them, else measured
        baselines = _baselines(request)
    timed = time_candidate(request, candidate_config(baselines, request.config.timing), Path(work_dir), phases)
    eager, compiled = baselines.eager.measurement.timing, baselines.compiled.measurement.timing
    if not timed.ok or timed.measurement is None:
        return Profile(ok=False, message=f"the candidate could not be timed:\n{timed.error}",
                       eager=eager, compiled=compiled, baselines=baselines, phases_ms=phases.as_dict())
    return Profile(ok=True, candidate=timed.measurement.timing, eager=eager, compiled=compiled, baselines=baselines,
                   phases_ms=phases.as_dict())


def profile(payload: bytes, ctx: JobContext) -> bytes:
    """GPU-queue handler: ProfileRequest (msgpack) in, Profile (msgpack) out."""
    return encode(run_profile(decode(payload, ProfileRequest), work_dir=Path(ctx.scratch_dir)))


# ---------------------------------------------------------------------------------------------
# The orchestrator's side.


def profile_from_job(status: JobStatus, value: bytes, error: str) -> Profile:
    """The handler's Profile; a killed or crashed job is the candidate's failure."""
    if status is JobStatus.OK:
        return decode(value, Profile)
    if status is JobStatus.TIMEOUT:
        return Profile(ok=False, message=f"profiling timed out: {error[-500:]}")
    if status in (JobStatus.CRASHED, JobStatus.CUDA_POISONED):
        return Profile(ok=False, message=f"profiling crashed: {error[-1500:]}")
    raise ProfileInfrastructureError(f"profile job failed: {error[-3000:]}")


async def profile_workspace(queue, workspace_dir: Path, task: Task, artifact_path: str | Path | None, *,
                            config: ProfileConfig = ProfileConfig(), baselines: Baselines | None = None,
                            device: str = "cuda", deadline_s: float | None = None) -> Profile:
    """Profile a workspace on `queue` (a rewards.queue.gpu_queue.GpuQueue): package, submit, decode.
    Pass the `baselines` of an earlier Profile of the same task to skip re-measuring them."""
    files, so_name = await anyio.to_thread.run_sync(job_files, workspace_dir, artifact_path)
    request = ProfileRequest(task_source=task.source, so_path=so_name, device=device, config=config,
                             baselines=baselines)
    job = Job(job_id=f"profile-{task.task_id}-{uuid.uuid4().hex[:8]}", kind="profile", payload=encode(request),
              files=files, deadline_s=deadline_s)
    result = await queue.submit(job)
    return profile_from_job(result.status, result.value, result.error)


def to_profile_result(outcome: Profile) -> ProfileResult:
    """What the agent's `profile` tool shows the model (medians, in ms)."""
    def ms(t: Timing | None) -> float | None:
        return t.median_ms if t is not None else None

    return ProfileResult(ok=outcome.ok, message=outcome.message, candidate_ms=ms(outcome.candidate),
                         eager_ms=ms(outcome.eager), compile_ms=ms(outcome.compiled))


__all__ = [
    "HANDLER", "Profile", "ProfileConfig", "ProfileInfrastructureError", "ProfileRequest", "TimeCandidate", "Timed",
    "profile", "profile_from_job", "profile_workspace", "run_profile", "time_candidate", "to_profile_result",
]
