"""Profiling of a candidate, trusted side: the GPU-queue handler `profile` and `profile_workspace`
for the agent's `profile` tool and the final evaluation.

What it is: `run_profile(request, work_dir=)` in one of two ways.
- Cached baselines (`paired=False`, the agent's `profile` tool): the task's eager and
  torch.compile baselines are timed in this (trusted) process with
  `rewards.timing.baselines.measure_baselines` (or the Baselines the orchestrator sends back are
  reused, when their key still matches this GPU and stack), then the candidate alone is timed in a
  fresh child, `python -m rewards.timing.profile_child`, with `candidate_config(baselines,
  config)` so that all three timings use one method. The answer says when the baselines were
  cached: on launch-bound tasks times from two processes can differ by up to 2x.
- Paired (`paired=True`, the final evaluation): the child builds the reference Model and its
  torch.compile from the trusted task source before it loads the candidate, and times the three
  together in rotated rounds (`rewards.timing.paired`, `rewards.timing.paired_timer`); the
  speedups are median per-round ratios with intervals. Inductor's cache artifacts of the
  reference's compile are recorded in this trusted process (`compile_cache`; the env keeps them
  per task) and loaded by the child, which then skips Inductor's codegen and Triton builds. The env
  has them recorded before a task's first paired job by a job of kind `COMPILE_KIND`, which times
  nothing and so shares its GPU (`reference_artifacts`); a paired job without them records them.
The child gets the same `Load` message the verification child gets (the reference's state_dict
as a blob file, the init seed), plus the timing config; it answers one `Timed` message and exits.
A staged job (the queue's `staged_kinds`) talks more: the child says `Prepared` once all three are
built, the job asks the queue for its GPU alone and says `Measure`, the child says `Measured` once
it times nothing more, the job gives the GPU back to sharing, and the `Timed` follows after the
child's last check of the candidate's output. A final evaluation starts its paired job beside its
verification (`rewards.evaluate`): when the verification failed, the queue withdraws the job at its
ask (`GpuWithdrawn`), the child is killed, and nothing is timed.

What it is not: no correctness check (`rewards.verify.verifier`) and no reward (`rewards.reward`). The
candidate's time is measured inside the candidate's own process (CUDA events around its forward,
as KernelBench does), and under paired timing the baselines' too: a candidate that tampers with
the timer or the reference there can lie about the speedup, which is why the final evaluation
only profiles candidates that passed verification and the static checks (no patching, threads,
streams or global state). `candidate="reference"` is a timing-only harness mode for benchmarks of
the timer: the task's own Model is timed as the candidate; the env never sets it and
`rewards.evaluate` refuses to score it.

How it is used:
    # GpuQueueConfig.handlers["profile"] = "rewards.timing.profile:profile"
    outcome = await profile_workspace(queue, ws, task, build.artifact.so_path)
    tool_result = to_profile_result(outcome)
    final = await profile_workspace(queue, ws, task, so_path, paired=True, compile_cache=kept)
    final.paired.vs_eager.ci_low, final.compile_cache   # keep a non-empty compile_cache per task

Importing this module does not import torch; the handler does.
"""

from __future__ import annotations

import ast
import contextlib
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Literal

import anyio
import msgspec
from msgspec import Struct

from agentcore.types import ProfileResult, Task
from rewards.queue.jobs import GpuWithdrawn, Job, JobContext, JobStatus, decode, encode
from rewards.timing.baselines import BaselineRequest, Baselines
from rewards.timing.paired import PairedConfig, PairedTiming
from rewards.timing.sampling import Measurement, TimingConfig
from rewards.verdict import Timing
from rewards.verify.phases import Phases
from rewards.verify.precision import DEFAULT_POLICY
from rewards.verify.verifier import CandidateProcess, Launcher, job_files
from rewards.verify.wire import ChildGone, Load, write_state

HANDLER = "rewards.timing.profile:profile"
COMPILE_KIND = "reference_compile"
COMPILE_HANDLER = "rewards.timing.profile:reference_compile"


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
    paired: PairedConfig = PairedConfig()
    """Rounds, interval target and time cap of paired timing (requests with `paired=True`)."""
    compile_cache: bool = True
    """Paired timing: record Inductor's artifacts of the reference's torch.compile in this trusted
    process when the request brings none, for the child to load (False: the child compiles cold)."""


class ProfileRequest(Struct, frozen=True, kw_only=True):
    """What the `profile` job times. Paths are relative to the job's scratch dir."""

    task_source: str
    candidate_dir: str = "candidate"
    so_path: str = ""  # relative to candidate_dir; "" for a pure-PyTorch candidate
    device: str = "cuda"
    config: ProfileConfig = ProfileConfig()
    baselines: Baselines | None = None  # from an earlier job; reused when its key matches
    cache_dir: str = ""  # baseline disk cache; "" inside the sandbox (only scratch is writable)
    paired: bool = False  # time candidate, eager and compile together in the child (final evaluation)
    compile_cache: bytes = b""  # paired: Inductor artifacts of the reference's compile, from an earlier job
    candidate: Literal["model_new", "reference"] = "model_new"
    """ModelNew, or the task's own Model in the timing-only harness mode (module docstring)."""


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
    baselines_cached: bool = False
    """The baselines were measured by an earlier job or read from the disk cache."""
    paired: PairedTiming | None = None
    """Paired timing: the rounds, the speedups with their intervals, each subject's Measurement."""
    compile_cache: bytes = b""
    """Inductor artifacts recorded by this job (empty when none were recorded or the request had them)."""
    reference_candidate: bool = False
    """The timing-only harness mode timed the task's own Model as the candidate: never score it."""
    job_wait_s: float = 0.0
    """Seconds the job waited for its lane and its GPU (stamped by `profile_workspace`)."""
    job_wall_s: float = 0.0
    """Seconds the job held its lane, less a staged job's wait for its GPU alone."""
    job_alone_s: float = 0.0
    """Of `job_wall_s`, the seconds it had its GPU alone (a staged job: from its ask until its child
    said `Measured`)."""
    diverged: str = ""
    """Paired timing: after the timed calls the candidate's forward no longer matched the reference
    (what it computed while timed is not what was verified): why. Scored as output_caching."""


class ProfileInfrastructureError(RuntimeError):
    """The profile job itself failed (not the candidate): a bug or a broken worker."""


# ---------------------------------------------------------------------------------------------
# The child protocol: one request, one answer (rewards.timing.profile_child serves it).


class TimeCandidate(Struct, frozen=True, kw_only=True, tag="candidate"):
    """Build ModelNew as `load` says, then time its forward with `config`."""

    load: Load
    config: TimingConfig
    input_seed: int
    candidate: Literal["model_new", "reference"] = "model_new"


class TimePaired(Struct, frozen=True, kw_only=True, tag="paired"):
    """Build the reference Model and its torch.compile from the task source (before any candidate
    code runs), then ModelNew as `load` says; time the three together in rotated rounds."""

    load: Load
    config: TimingConfig
    paired: PairedConfig
    input_seed: int
    policy: str
    compile_cache_path: str = ""  # Inductor artifacts to load before compiling, "" for none
    candidate: Literal["model_new", "reference"] = "model_new"
    staged: bool = False  # answer `Prepared` once all three are built, wait for `Measure`, say `Measured`


class Timed(Struct, frozen=True, kw_only=True):
    ok: bool
    error: str = ""
    measurement: Measurement | None = None  # the candidate's
    phases_ms: dict[str, float] = {}  # the child's own account: start-up, build, warm-up, sampling
    paired: PairedTiming | None = None
    harness_error: bool = False  # the reference or its compile failed, before any candidate code ran
    diverged: str = ""  # after its timed calls forward no longer computes the task: why (paired timing)


class Prepared(Struct, frozen=True, kw_only=True):
    """A staged child's first answer: built and ready to time (`failed` None), or the `Timed` it
    ends with because it could not be built."""

    failed: Timed | None = None


class Measure(Struct, frozen=True, kw_only=True):
    """The parent's go: the GPU is the job's alone."""


class Measured(Struct, frozen=True, kw_only=True):
    """A staged child's word after `Measure`: it times nothing more (what is left, the last check
    of the candidate's output, may run beside other jobs); its `Timed` follows."""


time_request_decoder = msgspec.msgpack.Decoder(TimeCandidate | TimePaired)
timed_decoder = msgspec.msgpack.Decoder(Timed)
prepared_decoder = msgspec.msgpack.Decoder(Prepared)
measure_decoder = msgspec.msgpack.Decoder(Measure)
measured_decoder = msgspec.msgpack.Decoder(Measured)


class ProfileChild(CandidateProcess):
    """A `rewards.timing.profile_child` process: the candidate process of the verifier, other module."""

    module = "rewards.timing.profile_child"

    def time(self, message: TimeCandidate | TimePaired, timeout_s: float,
             gpu_alone: Callable[[], float] | None = None, gpu_shared: Callable[[], None] | None = None) -> Timed:
        """The child's `Timed`. With `gpu_alone` (a staged message, `TimePaired.staged`): once the
        child has built what it times, `gpu_alone()` (its wait is not counted in `timeout_s`),
        then the go; once it says `Measured`, `gpu_shared()` (when given) while it finishes."""
        self.pipe.send(message)
        if gpu_alone is None:
            return self.pipe.receive(timed_decoder, timeout_s)
        began = time.monotonic()
        prepared = self.pipe.receive(prepared_decoder, timeout_s)
        if prepared.failed is not None:
            return prepared.failed
        spent = time.monotonic() - began
        gpu_alone()
        self.pipe.send(Measure())
        began = time.monotonic()
        self.pipe.receive(measured_decoder, max(timeout_s - spent, 1.0))
        spent += time.monotonic() - began
        if gpu_shared is not None:
            gpu_shared()
        return self.pipe.receive(timed_decoder, max(timeout_s - spent, 1.0))


# ---------------------------------------------------------------------------------------------
# The handler.


def _baselines(request: ProfileRequest) -> tuple[Baselines, bytes]:
    """The request's baselines when their key matches, else measured here (or read from the disk
    cache); with the Inductor artifacts of the compile when one ran."""
    from rewards.timing.baselines import current_key, measure_baselines

    c = request.config
    sent = request.baselines
    if sent is not None and sent.key == current_key(request.task_source, c.policy, c.timing):
        return sent, b""
    with recorded_compiles(c.compile_cache) as artifacts:
        measured = measure_baselines(BaselineRequest(
            source=request.task_source, init_seed=c.init_seed, input_seed=c.input_seed, policy=c.policy,
            config=c.timing, cache_dir=request.cache_dir,
        ))
    return measured, b"".join(artifacts)


@contextlib.contextmanager
def recorded_compiles(enabled: bool = True) -> Iterator[list[bytes]]:
    """Inductor's cache artifacts of the compiles inside the block (`torch.compiler.
    save_cache_artifacts`, scoped to the block): the list gets one blob at the end, none when
    nothing was compiled or this torch cannot scope the recording."""
    out: list[bytes] = []
    try:
        import torch
        from torch.compiler._cache import CacheArtifactManager  # private: the only way to scope it
    except ImportError:
        enabled = False
    if not enabled:
        yield out
        return
    with CacheArtifactManager.with_fresh_cache():
        yield out
        saved = torch.compiler.save_cache_artifacts()
    if saved is not None:
        out.append(saved[0])


def compile_reference(request: ProfileRequest) -> bytes:
    """Compile the task's reference here, in the trusted process, as the paired child will (same
    seeds, backend, mode and math modes), and return Inductor's artifacts of it."""
    import torch

    from rewards.timing.baselines import COMPILE_BACKEND, COMPILE_MODE, compile_warmup, load_task
    from rewards.verify.precision import policy, precision_flags

    c = request.config
    model, make_inputs = load_task(request.task_source, init_seed=c.init_seed, input_seed=c.input_seed,
                                   device=request.device)
    compiled = torch.compile(model, backend=COMPILE_BACKEND, mode=COMPILE_MODE)
    with recorded_compiles() as artifacts:
        for mode in policy(c.policy).baseline_modes:
            with precision_flags(mode):
                compile_warmup(compiled, make_inputs)
    return b"".join(artifacts)


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
    state = write_state(transfer, model.state_dict())
    return Load(task_source=request.task_source, candidate_dir=str(work_dir / request.candidate_dir),
                so_path=request.so_path, device=request.device, init_inputs=text,
                init_seed=request.config.init_seed, state=state, transfer_dir=str(transfer))


ChildMessage = Callable[[Load, Path], TimeCandidate | TimePaired]


def _in_child(request: ProfileRequest, work_dir: Path, phases: Phases | None, message: ChildMessage,
              gpu_alone: Callable[[], float] | None = None, gpu_shared: Callable[[], None] | None = None) -> Timed:
    """Send a fresh child `message(load, transfer_dir)`; its failures (crash, timeout, exception)
    are values. `phases` gets "state", "spawn", "child" (and the child's own "child.*"; a staged
    child's "child.gpu_alone_wait", the wait for the GPU alone, inside "child") and "close".
    `gpu_shared` (a staged job's) is called once nothing more is timed: when a staged child says
    so, else before the child is closed."""
    phases = phases if phases is not None else Phases()
    transfer = work_dir / f"xfer-{uuid.uuid4().hex[:12]}"
    transfer.mkdir(parents=True)
    c = request.config
    child = ProfileChild(work_dir, launcher=c.child_launcher)
    try:
        with phases.phase("state"):  # the reference's state_dict, built on the CPU
            sent = message(_load_message(request, work_dir, transfer), transfer)
        with phases.phase("spawn"):
            child.start()
        with phases.phase("child"):
            timed = child.time(sent, c.load_timeout_s + c.time_timeout_s, _recorded(gpu_alone, phases), gpu_shared)
        phases.merge(timed.phases_ms)
        return timed
    except TimeoutError:
        return Timed(ok=False, error=f"the candidate was not timed within {c.load_timeout_s + c.time_timeout_s:.0f} s")
    except GpuWithdrawn as exc:  # its submitter no longer wants it timed (a failed verification)
        return Timed(ok=False, error=str(exc))
    except ChildGone:
        return Timed(ok=False, error=child.describe_death())
    finally:
        if gpu_shared is not None:  # the child's exit and the clean-up time nothing
            gpu_shared()
        with phases.phase("close"):
            child.close()
            shutil.rmtree(transfer, ignore_errors=True)


def _recorded(gpu_alone: Callable[[], float] | None, phases: Phases) -> Callable[[], float] | None:
    """`gpu_alone` that adds its wait to `phases` as "child.gpu_alone_wait"."""
    if gpu_alone is None:
        return None

    def asked() -> float:
        waited = gpu_alone()
        phases.add("child.gpu_alone_wait", waited * 1e3)
        return waited

    return asked


def time_candidate(request: ProfileRequest, config: TimingConfig, work_dir: Path,
                   phases: Phases | None = None, gpu_shared: Callable[[], None] | None = None) -> Timed:
    """Time the candidate alone in a fresh child with `config` (`gpu_shared`: `_in_child`)."""
    return _in_child(request, work_dir, phases, lambda load, _: TimeCandidate(
        load=load, config=config, input_seed=request.config.input_seed, candidate=request.candidate),
        gpu_shared=gpu_shared)


def time_paired(request: ProfileRequest, work_dir: Path, phases: Phases | None = None,
                compile_cache: bytes = b"", gpu_alone: Callable[[], float] | None = None,
                gpu_shared: Callable[[], None] | None = None) -> Timed:
    """Time candidate, eager and torch.compile together in a fresh child (module docstring); with
    `gpu_alone` (a staged job's), the child builds all three first, then asks through it, and
    `gpu_shared` gives the GPU back to sharing once the child says it times nothing more."""
    c = request.config

    def message(load: Load, transfer: Path) -> TimePaired:
        path = ""
        if compile_cache:
            path = str(transfer / "compile_cache.bin")
            Path(path).write_bytes(compile_cache)
        return TimePaired(load=load, config=c.timing, paired=c.paired, input_seed=c.input_seed, policy=c.policy,
                          compile_cache_path=path, candidate=request.candidate, staged=gpu_alone is not None)

    return _in_child(request, work_dir, phases, message, gpu_alone, gpu_shared)


def run_profile(request: ProfileRequest, *, work_dir: Path, gpu_alone: Callable[[], float] | None = None,
                gpu_shared: Callable[[], None] | None = None) -> Profile:
    """Baselines here and the candidate in a child, or all three paired in a child (module
    docstring). `gpu_alone`: the job started beside verification jobs (a staged job); the paired
    way asks once all three are built, the other at once (its baselines may be timed here).
    `gpu_shared`: the staged job's way back to sharing once nothing more is timed."""
    if request.paired:
        return _run_paired(request, Path(work_dir), gpu_alone, gpu_shared)
    if gpu_alone is not None:
        gpu_alone()
    phases = Phases()
    with phases.phase("import"):  # torch and rewards.timing.baselines: once per worker process
        from rewards.timing.baselines import candidate_config
    with phases.phase("baselines"):  # a key check when the orchestrator sent them, else measured
        baselines, artifacts = _baselines(request)
    cached = baselines.cached or baselines is request.baselines
    timed = time_candidate(request, candidate_config(baselines, request.config.timing), Path(work_dir), phases,
                           gpu_shared)
    eager, compiled = baselines.eager.measurement.timing, baselines.compiled.measurement.timing
    common = dict(eager=eager, compiled=compiled, baselines=baselines, baselines_cached=cached,
                  compile_cache=artifacts, reference_candidate=request.candidate == "reference")
    if not timed.ok or timed.measurement is None:
        return Profile(ok=False, message=f"the candidate could not be timed:\n{timed.error}",
                       phases_ms=phases.as_dict(), **common)
    return Profile(ok=True, candidate=timed.measurement.timing, phases_ms=phases.as_dict(), **common)


def _run_paired(request: ProfileRequest, work_dir: Path, gpu_alone: Callable[[], float] | None,
                gpu_shared: Callable[[], None] | None = None) -> Profile:
    phases = Phases()
    artifacts, recorded = request.compile_cache, b""
    if not artifacts and request.config.compile_cache:
        with phases.phase("compile_cache"):  # once per task and env: later requests bring it
            artifacts = recorded = compile_reference(request)
    timed = time_paired(request, work_dir, phases, artifacts, gpu_alone, gpu_shared)
    if timed.harness_error:
        raise ProfileInfrastructureError(f"the reference could not be built or compiled:\n{timed.error}")
    common = dict(compile_cache=recorded, reference_candidate=request.candidate == "reference")
    if timed.diverged:
        return Profile(ok=False, message=f"the candidate's timed calls diverged: {timed.diverged}",
                       diverged=timed.diverged, phases_ms=phases.as_dict(), **common)
    if not timed.ok or timed.paired is None:
        return Profile(ok=False, message=f"the candidate could not be timed:\n{timed.error}",
                       phases_ms=phases.as_dict(), **common)
    p = timed.paired
    return Profile(ok=True, candidate=p.fastest("candidate").timing, eager=p.fastest("eager").timing,
                   compiled=p.fastest("compile").timing, paired=p, phases_ms=phases.as_dict(), **common)


def profile(payload: bytes, ctx: JobContext) -> bytes:
    """GPU-queue handler: ProfileRequest (msgpack) in, Profile (msgpack) out."""
    return encode(run_profile(decode(payload, ProfileRequest), work_dir=Path(ctx.scratch_dir), gpu_alone=ctx.gpu_alone,
                              gpu_shared=ctx.gpu_shared))


def reference_compile(payload: bytes, ctx: JobContext) -> bytes:
    """GPU-queue handler of kind `COMPILE_KIND`: a ProfileRequest in, Inductor's artifacts of its
    reference's compile out (`compile_reference`, as a paired job would record them). It times
    nothing, so it shares its GPU with verification; the paired job that follows loads them."""
    return compile_reference(decode(payload, ProfileRequest))


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
    if status is JobStatus.WITHDRAWN:
        return Profile(ok=False, message=f"not profiled: {error}")
    raise ProfileInfrastructureError(f"profile job failed: {error[-3000:]}")


async def profile_workspace(queue, workspace_dir: Path, task: Task, artifact_path: str | Path | None, *,
                            config: ProfileConfig = ProfileConfig(), baselines: Baselines | None = None,
                            device: str = "cuda", deadline_s: float | None = None, paired: bool = False,
                            compile_cache: bytes = b"",
                            candidate: Literal["model_new", "reference"] = "model_new",
                            gate: Callable[[], Awaitable[bool]] | None = None) -> Profile:
    """Profile a workspace on `queue` (a rewards.queue.gpu_queue.GpuQueue): package, submit, decode.
    Pass the `baselines` (or, `paired`, the `compile_cache`) of an earlier Profile of the same task
    to skip re-measuring (re-compiling) them. `candidate="reference"`: the timing-only harness
    mode of benchmarks (module docstring). `gate`: the job may prepare before it is wanted and
    times only if the gate says True (`GpuQueue.submit`); else the Profile is not ok, "not profiled"."""
    files, so_name = await anyio.to_thread.run_sync(job_files, workspace_dir, artifact_path)
    request = ProfileRequest(task_source=task.source, so_path=so_name, device=device, config=config,
                             baselines=baselines, paired=paired, compile_cache=compile_cache, candidate=candidate)
    job = Job(job_id=f"profile-{task.task_id}-{uuid.uuid4().hex[:8]}", kind="profile", payload=encode(request),
              files=files, deadline_s=deadline_s)
    result = await queue.submit(job, gate=gate)
    outcome = profile_from_job(result.status, result.value, result.error)
    return msgspec.structs.replace(outcome, job_wait_s=result.wait_s, job_wall_s=result.wall_s, job_alone_s=result.alone_s)


async def reference_artifacts(queue, task: Task, *, config: ProfileConfig = ProfileConfig(), device: str = "cuda",
                              deadline_s: float | None = None) -> bytes:
    """Inductor's artifacts of `task`'s reference compiled by a job that shares its GPU: the first
    paired job of a task then spends none of the time it has the GPU alone on torch.compile (its
    codegen and Triton builds, while every other job of the machine waits). Empty when the job
    failed or recorded nothing: the paired job compiles (and records) them itself, as without it."""
    request = ProfileRequest(task_source=task.source, device=device, config=config, paired=True)
    job = Job(job_id=f"compile-{task.task_id}-{uuid.uuid4().hex[:8]}", kind=COMPILE_KIND, payload=encode(request),
              deadline_s=deadline_s)
    result = await queue.submit(job)
    return result.value if result.status is JobStatus.OK else b""


CACHED_NOTE = ("The eager and torch.compile times are cached from an earlier run in another process; "
               "on launch-bound models (many small kernels) such times can differ by up to 2x between runs. "
               "The final reward times all three together.")


def to_profile_result(outcome: Profile) -> ProfileResult:
    """What the agent's `profile` tool shows the model (medians, in ms), and a note when the
    baselines are cached."""
    def ms(t: Timing | None) -> float | None:
        return t.median_ms if t is not None else None

    message = outcome.message
    if outcome.ok and outcome.baselines_cached:
        message = "\n".join(filter(None, [message, CACHED_NOTE]))
    return ProfileResult(ok=outcome.ok, message=message, candidate_ms=ms(outcome.candidate),
                         eager_ms=ms(outcome.eager), compile_ms=ms(outcome.compiled))


__all__ = [
    "CACHED_NOTE", "COMPILE_HANDLER", "COMPILE_KIND", "HANDLER", "Profile", "ProfileConfig", "ProfileInfrastructureError",
    "ProfileRequest", "TimeCandidate", "TimePaired", "Timed", "compile_reference", "profile", "profile_from_job",
    "profile_workspace", "recorded_compiles", "reference_artifacts", "reference_compile", "run_profile",
    "time_candidate", "time_paired", "to_profile_result",
]
