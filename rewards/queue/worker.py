"""The process behind one GPU lane: `python -P -s -m rewards.queue.worker --gpu 0 --scratch DIR`.

What it is: a loop that reads `Job` frames from the queue, runs each job's handler (resolved
from `rewards.queue.jobs.HANDLERS` plus `--handlers`) and writes back `JobResult` frames. The queue
starts it with CUDA_VISIBLE_DEVICES pinned to its GPU, often inside bubblewrap.

The channel: at start the queue's stdin/stdout pipes move to private fds; fd 0 becomes /dev/null
and fd 1 a copy of stderr, so whatever a candidate prints (Python, raw fd 1, C stdio, a kernel's
printf) lands in the lane's log and never in the channel.

Two modes. In process mode jobs run in the worker itself: cheapest, but state and threads
persist from job to job. In fork-per-job mode (a zygote) the worker imports `--preload` modules
once, without initialising CUDA, then forks a fresh child per job; the child drops the channel,
runs the handler and reports through a private pipe, so a crash or a poisoned CUDA context ends
only the child. Use it for untrusted code.

CUDA errors: a handler exception naming a sticky CUDA error (illegal address, launch failure,
misaligned address, device-side assert, ...) is reported as `cuda_poisoned`; in process mode the
worker then exits (code 3) so the queue starts a fresh one, since the context stays broken.

A staged job (`Job.staged`, process mode) gets `JobContext.gpu_alone` and `gpu_shared`: each
writes a `GpuAsk` on the channel and blocks until the queue's `GpuGiven` comes back, the GPU then
the job's alone, or shared again once it times nothing more; a `GpuGiven` that says withdrawn makes
`gpu_alone` raise GpuWithdrawn (the submitter no longer wants the job timed).

What it is not: no watchdog (the queue kills the whole process group at a job's deadline) and no
sandbox of its own (the queue wraps it in bubblewrap; `--reap-strays` only cleans up inside it).
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import functools
import gc
import importlib
import json
import os
import resource
import shutil
import signal
import stat
import sys
import time
import traceback
from typing import Literal

import msgspec

from rewards.queue.jobs import (
    HANDLERS,
    HEADER,
    MAX_FRAME_BYTES,
    GpuAsk,
    GpuWithdrawn,
    Handler,
    Job,
    JobContext,
    JobResult,
    JobStatus,
    WorkerReady,
    encode,
    frame,
    given_decoder,
    job_decoder,
    result_decoder,
)

# Sticky errors: after one of these every CUDA call in the process fails (CUDA runtime API,
# cudaError_t docs). Matched lowercase against the exception messages of the chain.
POISON_MARKERS = (
    "illegal memory access",  # cudaErrorIllegalAddress
    "unspecified launch failure",  # cudaErrorLaunchFailure
    "misaligned address",  # cudaErrorMisalignedAddress
    "device-side assert",  # cudaErrorAssert
    "illegal instruction",  # cudaErrorIllegalInstruction
    "invalid program counter",  # cudaErrorInvalidPc
    "hardware stack error",  # cudaErrorHardwareStackError
    "the launch timed out",  # cudaErrorLaunchTimeout
    "uncorrectable ecc error",  # cudaErrorECCUncorrectable
    "not supported on global/shared address space",  # cudaErrorInvalidAddressSpace
)
ERROR_CHARS = 8000  # the end of a traceback is where its message is
EXIT_POISONED = 3


def is_cuda_poison(exc: BaseException) -> bool:
    seen = 0
    while exc is not None and seen < 8:
        text = f"{type(exc).__name__}: {exc}".lower()
        if any(marker in text for marker in POISON_MARKERS):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


# ---------------------------------------------------------------------------------------------
# The channel: length-prefixed msgpack frames on two private fds.


def _read_exactly(fd: int, size: int) -> bytes | None:
    """`size` bytes, or None at end of file."""
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(fd: int) -> bytes | None:
    header = _read_exactly(fd, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {size} bytes: the channel is corrupted")
    return _read_exactly(fd, size)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Channel:
    """The two fds that carry frames to and from the queue."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd

    @classmethod
    def from_stdio(cls) -> Channel:
        channel = cls(os.dup(0), os.dup(1))  # dup'ed fds are not inherited across exec
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)  # prints go to the lane's log
        return channel

    def read(self) -> bytes | None:
        return _read_frame(self.read_fd)

    def write(self, message: bytes) -> None:
        _write_all(self.write_fd, frame(message))

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)


# ---------------------------------------------------------------------------------------------
# Running one job.


@functools.cache
def _import_target(target: str) -> Handler:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def resolve(kind: str, registry: dict[str, str]) -> Handler:
    target = registry.get(kind)
    if target is None:
        raise KeyError(f"no handler registered for job kind {kind!r}; known: {sorted(registry)}")
    return _import_target(target)


def _failed(job: Job, status: JobStatus, exc: BaseException, run_s: float = 0.0) -> JobResult:
    """The exception as a result; its text may carry anything (a file name the candidate made is
    not UTF-8): escaped, so the result always encodes."""
    text = "".join(traceback.format_exception(exc))[-ERROR_CHARS:]
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return JobResult(job_id=job.job_id, status=status, error=text, run_s=run_s)


def run_inline(job: Job, handler: Handler, ctx: JobContext) -> JobResult:
    start = time.perf_counter()
    try:
        value = handler(job.payload, ctx)
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"handler of {job.kind!r} returned {type(value).__name__}, not bytes")
    except BaseException as exc:  # noqa: BLE001 - a candidate's sys.exit() is a failed job
        status = JobStatus.CUDA_POISONED if is_cuda_poison(exc) else JobStatus.ERROR
        return _failed(job, status, exc, time.perf_counter() - start)
    run_s = time.perf_counter() - start
    return JobResult(job_id=job.job_id, status=JobStatus.OK, value=bytes(value), run_s=run_s)


def _describe_exit(wait_status: int) -> str:
    code = os.waitstatus_to_exitcode(wait_status)
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code} without a result"


def _run_forked(job: Job, handler: Handler, ctx: JobContext, channel: Channel) -> JobResult:
    """Runs the job in a fresh child. The child stays in our process group, so the queue's
    group kill at a deadline reaches it and whatever it started."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        _child(job, handler, ctx, channel, read_fd, write_fd)
    os.close(write_fd)
    try:
        message = _read_frame(read_fd)
    except ValueError:
        message = None
    finally:
        os.close(read_fd)
    _, wait_status = os.waitpid(pid, 0)
    try:
        return result_decoder.decode(message)
    except (TypeError, msgspec.DecodeError):  # None, or what the candidate wrote into the pipe
        error = f"job process {pid} {_describe_exit(wait_status)}"
        return JobResult(job_id=job.job_id, status=JobStatus.CRASHED, error=error)


def _child(job: Job, handler: Handler, ctx: JobContext, channel: Channel, read_fd: int, write_fd: int):
    code = 70
    try:
        os.close(read_fd)
        channel.close()  # the child cannot reach the queue's channel, only its own pipe
        result = run_inline(job, handler, ctx)
        _write_all(write_fd, frame(encode(result)))
        code = 0
    finally:
        _flush_stdio()
        os._exit(code)


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


# ---------------------------------------------------------------------------------------------
# The scratch dir and the sandbox's leftovers.


def _reset_dir(path: str) -> None:
    """Empty `path`, keeping the directory itself (it is a mount point in the sandbox), or make
    it again: a job may have removed it, and the next job must still find its scratch dir."""

    def make_writable_and_retry(function, target, _exc_info):
        os.chmod(os.path.dirname(target), 0o700)
        function(target)

    try:  # a job may have taken our permissions away
        os.chmod(path, stat.S_IMODE(os.stat(path).st_mode) | stat.S_IRWXU)
    except OSError:
        pass
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        os.makedirs(path, exist_ok=True)
        return
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, onerror=make_writable_and_retry)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


def _write_files(scratch: str, files: dict[str, bytes]) -> None:
    root = os.path.realpath(scratch)
    for name, data in files.items():
        path = os.path.realpath(os.path.join(root, name))
        if os.path.isabs(name) or not path.startswith(root + os.sep):
            raise ValueError(f"job file {name!r} is not a relative path inside the scratch dir")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def _in_private_pid_namespace() -> bool:
    try:
        with open("/proc/1/comm") as f:
            return f.read().strip() == "bwrap" and os.getpid() != 1
    except OSError:
        return False


def _reap_strays() -> None:
    """Inside the sandbox's own pid namespace, kill every process but bwrap's init and us:
    background processes a candidate left must not outlive its job (rewards/README.md, hack 8)."""
    zygote = sys.modules.get("rewards.queue.zygote")  # the candidate children's launcher stays
    keep = {1, os.getpid(), *(zygote.spared_pids() if zygote is not None else ())}
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in keep:
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass


class _GpuAsks:
    """A staged job's `JobContext.gpu_alone` and `gpu_shared`, asked over the worker's channel:
    alone once (later calls return 0 at once), shared only after alone and only once; a withdrawn
    ask (GpuWithdrawn) leaves nothing to share."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.state: Literal["shared", "alone", "done"] = "shared"

    def alone(self) -> float:
        if self.state != "shared":
            return 0.0
        self.state = "alone"
        return self._ask("gpu_alone")

    def shared(self) -> None:
        if self.state == "alone":
            self.state = "done"
            self._ask("gpu_shared")

    def _ask(self, wants: Literal["gpu_alone", "gpu_shared"]) -> float:
        self.channel.write(encode(GpuAsk(wants=wants)))
        message = self.channel.read()
        if message is None:
            raise SystemExit("the queue went away while the job waited for its GPU")
        given = given_decoder.decode(message)
        if given.withdrawn:  # never alone: nothing to give back
            self.state = "done"
            raise GpuWithdrawn(f"withdrawn by its submitter after {given.waited_s:.2f} s: nothing was timed")
        return given.waited_s


class Worker:
    """Runs jobs one after another in one lane's scratch dir."""

    def __init__(self, args: argparse.Namespace, channel: Channel) -> None:
        self.args = args
        self.channel = channel
        self.registry = {**HANDLERS, **json.loads(args.handlers)}

    def run(self, job: Job) -> JobResult:
        scratch = self.args.scratch
        staged = job.staged and not self.args.fork_per_job  # a forked child has no channel
        asks = _GpuAsks(self.channel) if staged else None
        ctx = JobContext(job_id=job.job_id, gpu=self.args.gpu, scratch_dir=scratch, deadline_s=job.deadline_s,
                         gpu_alone=asks.alone if asks else None, gpu_shared=asks.shared if asks else None)
        try:
            _reset_dir(scratch)
            os.chdir(scratch)
            _write_files(scratch, job.files)
            handler = resolve(job.kind, self.registry)
        except Exception as exc:  # noqa: BLE001 - a bad job (unknown kind, bad file name) is a result
            return _failed(job, JobStatus.ERROR, exc)
        try:
            if self.args.fork_per_job:
                return _run_forked(job, handler, ctx, self.channel)
            return run_inline(job, handler, ctx)
        finally:
            self._clean_up()

    def _clean_up(self) -> None:
        if self.args.reap_strays:
            _reap_strays()
            _reset_dir("/dev/shm")
        _reset_dir(self.args.scratch)
        _forget_compiled_files()


def _forget_compiled_files() -> None:
    """Inductor keeps compiled modules and Triton kernels in memory by the paths of their files
    in its cache dir, which is under the scratch dir just emptied: a later compile of the same
    kernel source (the same op at another shape) would load a deleted cubin. Clear those caches
    so that it writes them again."""
    utils = sys.modules.get("torch._inductor.utils")
    clear = getattr(utils, "clear_caches", None) or getattr(utils, "clear_inductor_caches", None)
    if clear is not None:
        clear()


def _die_with_parent() -> None:
    """If the orchestrator dies, even by SIGKILL, the kernel kills us too (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _limit_file_size(limit: int) -> None:
    """The lane's RLIMIT_FSIZE, as the soft limit only: trusted code lifts it to write what a task
    needs (the reference's weights, `rewards.verify.wire.write_state`); every child that runs
    candidate code makes it its hard limit before loading any (`lock_file_size`)."""
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rewards.queue.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", type=int, required=True, help="lane's GPU index (for reports)")
    parser.add_argument("--scratch", required=True, help="the lane's scratch dir, emptied per job")
    parser.add_argument("--fork-per-job", action="store_true", help="zygote: fork a child per job")
    parser.add_argument("--preload", action="append", default=[], help="module to import at start")
    parser.add_argument("--handlers", default="{}", help='JSON {"kind": "module:function"}')
    parser.add_argument("--reap-strays", action="store_true", help="sandbox only: kill leftovers")
    parser.add_argument("--max-file-mib", type=int, default=0, help="RLIMIT_FSIZE soft limit; 0: none")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    channel = Channel.from_stdio()
    _die_with_parent()
    faulthandler.enable()  # a segfault leaves a Python traceback in the lane's log
    sys.stdout.reconfigure(line_buffering=True)
    if args.max_file_mib:
        _limit_file_size(args.max_file_mib << 20)
    if args.reap_strays and not _in_private_pid_namespace():
        raise SystemExit("--reap-strays outside a bwrap pid namespace would kill the host's processes")
    for name in args.preload:
        importlib.import_module(name)
    torch = sys.modules.get("torch")
    if args.fork_per_job and torch is not None and torch.cuda.is_initialized():
        raise SystemExit(f"preloading {args.preload} initialised CUDA: no forked job could use the GPU")
    if args.fork_per_job:
        gc.freeze()  # children then copy fewer pages: the collector leaves preloaded objects alone
    worker = Worker(args, channel)
    ready = WorkerReady(
        pid=os.getpid(), gpu=args.gpu, preloaded=tuple(args.preload), fork_per_job=args.fork_per_job
    )
    channel.write(encode(ready))
    while (message := channel.read()) is not None:
        result = worker.run(job_decoder.decode(message))
        channel.write(encode(result))
        if result.status is JobStatus.CUDA_POISONED and not args.fork_per_job:
            return EXIT_POISONED
    return 0


if __name__ == "__main__":
    sys.exit(main())
