"""The messages of the GPU job queue, its handler registry, and the built-in handlers.

What it is: `Job` (what to run) and `JobResult` (what came of it) cross the process boundary
between `rewards.queue.gpu_queue.GpuQueue` and a `rewards.queue.worker` process as length-prefixed msgpack
frames; `WorkerReady` is a worker's first frame; `QueueStatistics` reports the queue. A job names
its handler by `kind`; the worker resolves the kind through `HANDLERS` plus the queue config's
`handlers`, lazily, so verify, profile and baseline handlers in other modules plug in without
editing the queue.

What it is not: no I/O loop and no process management (those are `rewards.queue.worker` and
`rewards.queue.gpu_queue`). The built-in handlers (`ping`, `sleep`, `crash`, `cuda_poison`, `print`,
`echo_env`) exist for tests, health checks and benchmarks; they never touch a GPU.

How it is used: a handler is `fn(payload: bytes, ctx: JobContext) -> bytes`, registered as
"module:function". Payloads and values are msgpack by convention:

    job = Job(job_id="t7-verify-3", kind="sleep", payload=encode(SleepArgs(seconds=0.05)))
    result = await queue.submit(job)
    value = decode(result.value, SleepValue)

A handler module must not initialise CUDA when imported: the fork-per-job worker imports it
before forking, and CUDA does not survive a fork. A handler raises for a broken job; a candidate
that fails (wrong answer, detected hack) is a value it returns, not an exception.
"""

from __future__ import annotations

import ctypes
import enum
import os
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import msgspec
from msgspec import Struct

T = TypeVar("T")

HEADER = struct.Struct(">I")  # every frame: 4-byte big-endian length, then msgpack
MAX_FRAME_BYTES = 256 << 20  # a longer header means a corrupted channel, not a big result


class Job(Struct, frozen=True, kw_only=True):
    """One unit of GPU work. `files` (relative path -> bytes) are written into the job's scratch
    dir before the handler runs: the sandbox shows a job nothing else of the trajectory."""

    job_id: str
    kind: str
    payload: bytes = b""
    files: dict[str, bytes] = {}
    deadline_s: float | None = None
    staged: bool = False  # set by the queue: the job starts beside others and asks for its GPU alone (JobContext.gpu_alone)


class GpuAsk(Struct, frozen=True, kw_only=True):
    """A staged job's frame to the queue, mid-job: "gpu_alone", it is ready to time and wants its
    GPU alone; "gpu_shared", it times nothing more and its GPU may be shared again. `wants` has no
    default: a `JobResult` frame never decodes as one."""

    wants: Literal["gpu_alone", "gpu_shared"]


class GpuGiven(Struct, frozen=True, kw_only=True):
    """The queue's answer: the GPU is now as the job asked (alone until it ends, or asks again),
    or, `withdrawn`, the job is no longer wanted: its submitter's gate said no (`GpuQueue.submit`),
    and it should end without timing anything."""

    waited_s: float  # from the ask until now; for "gpu_alone", not counted in the job's deadline
    withdrawn: bool = False


class GpuWithdrawn(Exception):
    """Raised by a staged job's `JobContext.gpu_alone` when its submitter no longer wants it timed
    (`GpuGiven.withdrawn`); its handler ends with what it has, its GPU never had alone."""


class JobStatus(enum.Enum):
    OK = "ok"  # the handler returned a value (which may say the candidate failed)
    ERROR = "error"  # the handler raised, or the kind is unknown; the worker lives on
    TIMEOUT = "timeout"  # killed by the watchdog at its deadline; the lane got a fresh worker
    CRASHED = "crashed"  # the process running the job died (segfault, os._exit, abort)
    CUDA_POISONED = "cuda_poisoned"  # a sticky CUDA error: the context is unusable, process replaced
    WITHDRAWN = "withdrawn"  # its submitter's gate said no before it timed anything (GpuQueue.submit)


class JobResult(Struct, frozen=True, kw_only=True):
    """What came of a Job. `worker_pid` is the worker as the orchestrator sees it (bwrap's pid
    when sandboxed); it, `gpu`, `wall_s` and `wait_s` are stamped by the queue, not the worker."""

    job_id: str
    status: JobStatus
    value: bytes = b""
    error: str = ""
    run_s: float = 0.0  # in the handler, by the worker's clock
    wall_s: float = 0.0  # the lane was held: sending, running, receiving
    wait_s: float = 0.0  # waiting for a free lane, and a staged job's wait for its GPU alone
    alone_s: float = 0.0  # of wall_s, the GPU was this job's alone (all of it for a timing job)
    worker_pid: int = 0
    gpu: int = -1


class WorkerReady(Struct, frozen=True, kw_only=True):
    """A worker's first frame: it has imported what it preloads and waits for jobs."""

    pid: int
    gpu: int
    preloaded: tuple[str, ...] = ()
    fork_per_job: bool = False


class JobContext(Struct, frozen=True, kw_only=True):
    """What a handler knows besides its payload. `scratch_dir` is empty at the start of every
    job and is the only writable place in the sandbox; the GPU is device 0 in the process."""

    job_id: str
    gpu: int
    scratch_dir: str
    deadline_s: float | None
    gpu_alone: Callable[[], float] | None = None
    """A staged job's way to its GPU alone: blocks until the queue gives it, returns the seconds
    waited; raises GpuWithdrawn when its submitter's gate says the job is no longer wanted. None:
    the job has its GPU as its kind says from the start."""
    gpu_shared: Callable[[], None] | None = None
    """A staged job's way back to sharing once it times nothing more (what is left of it, such as
    checks and clean-up, runs beside other jobs); nothing if it never had the GPU alone."""


class LaneStatistics(Struct, frozen=True, kw_only=True):
    """One lane (one worker on a GPU) since the queue started."""

    gpu: int
    slot: int = 0  # which of its GPU's lanes
    worker_pid: int
    busy: bool  # a job holds this lane
    depth: int  # submitters waiting for this lane's GPU in particular (pinned)
    busy_fraction: float  # seconds holding a job / seconds since start
    exclusive_busy_fraction: float = 0.0  # of busy_fraction, jobs that had the GPU to themselves
    lock_wait_fraction: float = 0.0  # seconds a submitter held the lane waiting for the GPU's machine-wide lock
    jobs_done: int
    exclusive_jobs: int = 0  # of `jobs_done`, those that had the GPU to themselves (`SHARED_KINDS`)
    jobs_per_s: float
    restarts: int
    restart_s: float  # total seconds spent starting replacement workers
    timeouts: int
    crashes: int
    poisoned: int


class KindStatistics(Struct, frozen=True, kw_only=True):
    """The finished jobs of one `Job.kind` since the queue started, with their mean times: where a
    slow kind's time goes (waiting for a lane, for other queues' jobs on the GPU, or running)."""

    jobs: int
    wait_s: float  # mean seconds from submit until a lane was free
    lock_s: float  # mean seconds holding the lane while waiting for the GPU's machine-wide lock
    run_s: float  # mean seconds running: the lane held, less the lock wait (`JobResult.wall_s`)


class QueueStatistics(Struct, frozen=True, kw_only=True):
    """The whole queue: sums over lanes, `depth` counts every waiting submitter."""

    lanes: tuple[LaneStatistics, ...]
    depth: int
    exclusive_depth: int = 0  # of `depth`, submitters whose job will have its GPU to itself
    busy_fraction: float  # the lanes' mean
    exclusive_busy_fraction: float = 0.0  # the lanes' mean: of busy_fraction, jobs with the GPU alone
    lock_wait_fraction: float = 0.0  # the lanes' mean: waiting for other queues' jobs (`gpu_lock`)
    jobs_done: int
    jobs_per_s: float
    restarts: int
    timeouts: int
    crashes: int
    poisoned: int
    uptime_s: float
    kinds: dict[str, KindStatistics] = {}
    """Per `Job.kind`, the jobs finished and their mean wait, lock wait and run time."""


# ---------------------------------------------------------------------------------------------
# Codecs and framing, built once.

_encoder = msgspec.msgpack.Encoder()
job_decoder = msgspec.msgpack.Decoder(Job)
result_decoder = msgspec.msgpack.Decoder(JobResult)
ready_decoder = msgspec.msgpack.Decoder(WorkerReady)
ask_decoder = msgspec.msgpack.Decoder(GpuAsk)
given_decoder = msgspec.msgpack.Decoder(GpuGiven)


def encode(obj: Any) -> bytes:
    """msgpack bytes of a Struct (or any msgpack-able value): payloads, values, frames."""
    return _encoder.encode(obj)


def decode(data: bytes, type: type[T]) -> T:
    """A handler payload or value back as its Struct."""
    return msgspec.msgpack.decode(data, type=type)


def frame(message: bytes) -> bytes:
    return HEADER.pack(len(message)) + message


# ---------------------------------------------------------------------------------------------
# The registry: kind -> "module:function", resolved in the worker.

HANDLERS: dict[str, str] = {
    "ping": "rewards.queue.jobs:ping",
    "sleep": "rewards.queue.jobs:sleep",
    "crash": "rewards.queue.jobs:crash",
    "cuda_poison": "rewards.queue.jobs:cuda_poison",
    "print": "rewards.queue.jobs:print_noise",
    "echo_env": "rewards.queue.jobs:echo_env",
    "cuda_probe": "rewards.queue.jobs:cuda_probe",
    "verify": "rewards.verify.verifier:verify",  # candidate verification and dynamic anti-hacking checks
}

Handler = Callable[[bytes, JobContext], bytes]

SHARED_KINDS: tuple[str, ...] = ("ping", "sleep", "crash", "cuda_poison", "print", "echo_env", "cuda_probe", "verify",
                                 "reference_compile")
"""Kinds that time nothing, so on a GPU with several lanes they run beside each other (verify
judges outputs; its timeouts are budgets, not measurements; reference_compile records a task's
torch.compile artifacts for the paired timing that follows, `rewards.timing.profile`). Every other kind has its GPU to
itself while it runs (a staged kind, `STAGED_KINDS`, from its handler's ask): `profile` (the agent's
tool, the baselines it measures once per task, and the final evaluation's paired timing), `baseline` (the KernelBench recheck's), `synth_filter`
(the data filters' runtime filter), and any kind a config adds, unless listed in
`GpuQueueConfig.shared_kinds`."""

STAGED_KINDS: tuple[str, ...] = ("profile",)
"""Timing kinds whose handler asks for its GPU alone once it has built what it times
(`JobContext.gpu_alone`): a paired final evaluation compiles the reference and loads the
candidate (about 1 s of a 2-3 s job) beside the verification jobs, then has the GPU alone for its
warm-ups and rounds."""


# ---------------------------------------------------------------------------------------------
# Built-in handlers: tests, health checks, benchmarks. CPU only.


class SleepArgs(Struct, frozen=True, kw_only=True):
    seconds: float


class SleepValue(Struct, frozen=True, kw_only=True):
    """Wall-clock interval of the sleep (time.time), to check that jobs never overlapped."""

    started: float
    ended: float
    pid: int


class CrashArgs(Struct, frozen=True, kw_only=True):
    how: Literal["exit", "segfault", "abort"] = "exit"


class PrintArgs(Struct, frozen=True, kw_only=True):
    text: str = "noise"
    times: int = 1


class EchoEnvArgs(Struct, frozen=True, kw_only=True):
    connect: str = ""  # "host:port" to try a TCP connection to
    write_paths: tuple[str, ...] = ()  # files to try to create (removed again on success)
    read_paths: tuple[str, ...] = ()  # files to try to read
    env_names: tuple[str, ...] = ()  # environment variables to report


class EchoEnvValue(Struct, frozen=True, kw_only=True):
    cuda_visible_devices: str | None
    uid: int
    pid: int
    cwd: str
    scratch_dir: str
    connect_ok: bool | None  # None: nothing to connect to was given
    writable: dict[str, bool]
    read_bytes: dict[str, int]  # -1 when the file could not be read
    env: dict[str, str]  # those of `env_names` that are set


def ping(payload: bytes, ctx: JobContext) -> bytes:
    return b"pong" + payload


def sleep(payload: bytes, ctx: JobContext) -> bytes:
    args = decode(payload, SleepArgs)
    started = time.time()
    time.sleep(args.seconds)
    return encode(SleepValue(started=started, ended=time.time(), pid=os.getpid()))


def crash(payload: bytes, ctx: JobContext) -> bytes:
    how = decode(payload, CrashArgs).how if payload else "exit"
    sys.stderr.write(f"crash handler: dying by {how}\n")
    sys.stderr.flush()
    if how == "segfault":
        ctypes.string_at(0)
    elif how == "abort":
        os.abort()
    os._exit(13)


def cuda_poison(payload: bytes, ctx: JobContext) -> bytes:
    """What torch raises after a kernel reads out of bounds; simulated, no GPU needed."""
    raise RuntimeError(
        "CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call."
    )


def print_noise(payload: bytes, ctx: JobContext) -> bytes:
    """Writes to stdout every way a candidate might (print, raw fd 1, C stdio); returns b"done"."""
    args = decode(payload, PrintArgs) if payload else PrintArgs()
    libc = ctypes.CDLL(None)
    for _ in range(args.times):
        print(args.text)
        os.write(1, (args.text + "\n").encode())
        libc.printf(b"%s\n", args.text.encode())
    sys.stdout.flush()
    libc.fflush(None)
    return b"done"


def echo_env(payload: bytes, ctx: JobContext) -> bytes:
    args = decode(payload, EchoEnvArgs) if payload else EchoEnvArgs()
    value = EchoEnvValue(
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        uid=os.getuid(),
        pid=os.getpid(),
        cwd=os.getcwd(),
        scratch_dir=ctx.scratch_dir,
        connect_ok=_can_connect(args.connect) if args.connect else None,
        writable={path: _can_create(path) for path in args.write_paths},
        read_bytes={path: _read_size(path) for path in args.read_paths},
        env={name: os.environ[name] for name in args.env_names if name in os.environ},
    )
    return encode(value)


def _can_connect(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2.0):
            return True
    except OSError:
        return False


def _can_create(path: str) -> bool:
    try:
        with open(path, "xb") as f:
            f.write(b"x")
    except OSError:
        return False
    os.unlink(path)
    return True


def _read_size(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return len(f.read())
    except OSError:
        return -1


class CudaProbeValue(Struct, frozen=True, kw_only=True):
    device_count: int
    device_name: str
    total: float


def cuda_probe(payload: bytes, ctx: JobContext) -> bytes:
    """Health check of a lane's GPU: runs one reduction on the device the lane is pinned to."""
    import torch

    total = float(torch.ones(1 << 20, device="cuda").sum().item())
    return encode(CudaProbeValue(device_count=torch.cuda.device_count(), device_name=torch.cuda.get_device_name(), total=total))
