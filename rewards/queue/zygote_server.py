"""The zygote process itself: pre-load, then fork one child per request.

What it is: the process side of rewards.queue.zygote, started by `Zygote.start` as
`python -P -s -m rewards.queue.zygote --socket-fd N --parent-pid P` (that module's `__main__` hands over
to `main` here). It imports PRELOAD once and pays the one-time imports and source hashes of a first
torch.compile (rewards.queue.compile_warmup), all WITHOUT initialising CUDA, says `Ready`, then
serves the socket. Should the warm-up have touched the CUDA driver after all, the zygote re-executes
itself (same pid, same socket) without it and says so in `Ready.warm_up_error`: it never ends up
worse than without the warm-up. It serves thus: for each `Fork` (module, argv, cwd, environment,
resource limits; the log and channel fds attached with SCM_RIGHTS) it forks a fresh child, which
puts those fds at the numbers the worker gave them, takes its own process group, chdirs, applies the
limits and runs the module's `main(argv)`, exactly what `python -m <module> <argv>` runs; each
child's exit is reported back as `Exited`. This module also owns that wire protocol (the Structs
below), which both sides share.

With CUDA_AGENT_SPARE_CHILD=1 in its environment the zygote keeps one spare: a child forked
ahead of the next request, which makes its CUDA context (`_spare_warm_up`, part of each job's
child otherwise) and then waits for a `Fork`; the next request is handed to it instead of forked.
The next spare is forked when a child exits, not while one runs: its context is not made beside
a child's timed calls. A spare runs no code of any job before its own, and its pid travels in
`Ready.spare_pid` and `Exited.spare_pid` so that the sandboxed worker's stray reaper spares it. A
spare that died waiting is reaped and the request forked as without one.

What it is not: the trusted client (`launch`, `Zygote`, `ForkedProcess` live in rewards.queue.zygote),
and it never sees candidate code, the hidden seed or trusted tensors: it only holds imported
modules. It never initialises CUDA and refuses to fork if something has.

How it is used: never imported by hand. rewards.queue.zygote imports the protocol from here; the zygote
process runs `main`; forked children run `_run_child` and exit without returning.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import functools
import gc
import importlib
import os
import resource
import select
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Sequence

import msgspec
from msgspec import Struct

from rewards.queue.process_state import (
    count_devices_in_a_child,
    cuda_touched,
    library,
    mapped,
    release_nvml,
    thread_count,
    thread_ids,
    thread_names,
)

WARM_UP = True
"""Run rewards.queue.compile_warmup before the first fork. Its imports may ask whether CUDA is
there (`torch.cuda.is_available()`, at module level in torch 2.11's Inductor benchmarking); `preload`
answers from a count taken in a forked child (`count_devices_in_a_child`), and a warm-up that
touches the driver anyway costs a restart without it (`main`), never a zygote that cannot fork.
`python -m bench.system.compile_warmup --device cuda` measures what it saves."""
NVML_CHECK = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
"""Where the zygote's own torch asks whether CUDA is there anyway (a caller outside the answered
`torch.cuda` functions), it counts devices with NVML instead of cudaGetDeviceCount, which
initialises the CUDA driver (cuInit) and so spoils every later fork. NVML's initialisation starts a
driver thread that outlives nvmlShutdown, which the warm-up's thread check then reports; torch
falls back to cudaGetDeviceCount only where NVML fails (no libnvidia-ml, MIG UUIDs in
CUDA_VISIBLE_DEVICES), which `main` then catches."""
WARM_UP_TOUCHED_CUDA = "the compile warm-up touched the CUDA driver; restarted without it"
SPARE_ENV = "CUDA_AGENT_SPARE_CHILD"
"""Set to 1 in the worker's environment (and so the zygote's), the zygote keeps a spare child. Off
by default: each lane then holds an idle CUDA context (a few hundred MiB of GPU memory) between
jobs; `python -m bench.system.gpu_queue --real-jobs` measures what it saves."""
PRELOAD = ("torch", "torch._dynamo", "torch.profiler", "rewards.verify.candidate", "rewards.timing.profile_child")
CHILD_MODULES = ("rewards.verify.candidate", "rewards.timing.profile_child")
_WORKER_NVML: dict[str, str | None] = {}  # NVML_CHECK's names as the worker's environment had them
MAX_MESSAGE = 1 << 18  # one Fork: argv, env, limits (a few KiB)
MAX_FDS = 16
SPARE_LOW_FDS = 256
"""A spare makes its CUDA context with every free fd number below this taken, so the driver's
device fds lie above it; a request whose fd numbers are all below it may go to the spare."""


# ---------------------------------------------------------------------------------------------
# The protocol on the socket (SOCK_SEQPACKET: one message per send, fds attached to a Fork).


class Fork(Struct, frozen=True, kw_only=True, tag="fork"):
    module: str
    args: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    pass_fds: tuple[int, ...]  # the numbers the attached fds (after the log) get in the child
    rlimits: dict[str, tuple[int, int]]


class Ready(Struct, frozen=True, kw_only=True, tag="ready"):
    pid: int
    threads: int
    cuda_initialized: bool
    warm_up_ms: float = 0.0
    warm_up_error: str = ""  # the warm-up failed, left threads or touched CUDA: children compile cold
    spare_pid: int = 0  # the spare child waiting for the first request; 0: none


class Forked(Struct, frozen=True, kw_only=True, tag="forked"):
    pid: int


class Failed(Struct, frozen=True, kw_only=True, tag="failed"):
    error: str


class Exited(Struct, frozen=True, kw_only=True, tag="exited"):
    pid: int
    code: int  # as Popen.returncode: negative for a signal
    spare_pid: int = 0  # a spare forked on this exit; 0: none


encode = msgspec.msgpack.encode
request_decoder = msgspec.msgpack.Decoder(Fork)
reply_decoder = msgspec.msgpack.Decoder(Ready | Forked | Failed | Exited)


# ---------------------------------------------------------------------------------------------
# The zygote.


def _die_with(parent_pid: int) -> None:
    """SIGKILL when our parent dies (PR_SET_PDEATHSIG); exit now if it already has."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(1)


class Spare:
    """A child forked ahead of its request: it makes its CUDA context, then waits on its own
    socket for the `Fork` that `hand` passes it with its fds."""

    def __init__(self, sock: socket.socket) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        zygote_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            ours.close()
            _run_spare(theirs, sock, zygote_pid)
        theirs.close()
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        self.pid, self.sock, self.reaped = pid, ours, False

    def waiting(self) -> bool:
        """Alive and not yet handed a request; a spare that died is reaped here."""
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            done = self.pid
        self.reaped = done != 0
        return not self.reaped

    def hand(self, data: bytes, fds: list[int]) -> bool:
        """Pass the request on; False when the spare is gone (the caller forks instead)."""
        try:
            socket.send_fds(self.sock, [data], fds)
            return True
        except OSError:
            return False
        finally:
            self.sock.close()

    def discard(self) -> None:
        self.sock.close()
        if self.reaped:  # its pid may be another process's by now
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (OSError, ChildProcessError):
            pass


def serve(sock: socket.socket, spare: Spare | None = None, keep_spare: bool = False) -> int:
    """Fork on each request (or hand it to the spare), report each child's exit (forking the
    next spare then, with `keep_spare`); return when the worker closes the socket."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        for fd, _ in poller.poll():
            if fd != sock.fileno():
                pid = children.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                if spare is None and keep_spare:
                    spare = Spare(sock)
                    fresh = spare.pid
                else:
                    fresh = 0
                sock.send(encode(Exited(pid=pid, code=os.waitstatus_to_exitcode(status), spare_pid=fresh)))
                continue
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
            except OSError:
                data, fds = b"", []
            if not data:
                if spare is not None:
                    spare.discard()
                return 0
            if (spare is not None and spare.waiting() and _acceptable(data, fds, below=SPARE_LOW_FDS)
                    and spare.hand(data, fds)):
                for fd in fds:
                    os.close(fd)
                reply, spare = Forked(pid=spare.pid), None
            else:
                if spare is not None:
                    spare.discard()
                    spare = None
                reply = _fork(data, fds, sock)
            if isinstance(reply, Forked):
                pidfd = os.pidfd_open(reply.pid)
                children[pidfd] = reply.pid
                poller.register(pidfd, select.POLLIN)
            sock.send(encode(reply))


def _acceptable(data: bytes, fds: list[int], below: int = 0) -> bool:
    """A request a child may run: one of CHILD_MODULES, its fds all there (and, with `below`,
    each to be placed at a number under it)."""
    try:
        request = request_decoder.decode(data)
    except msgspec.DecodeError:
        return False
    placed = not below or all(target < below for target in request.pass_fds)
    return request.module in CHILD_MODULES and len(fds) == 1 + len(request.pass_fds) and placed


def _fork(data: bytes, fds: list[int], sock: socket.socket) -> Forked | Failed:
    try:
        request = request_decoder.decode(data)
        if not _acceptable(data, fds):
            return Failed(error=f"bad request: {request.module}, {len(fds)} fds")
        if cuda_touched():  # a forked child would share the context, or could not make its own
            return Failed(error="CUDA is initialised in the zygote")
        for stream in (sys.stdout, sys.stderr):  # nothing of ours may reach the child's log
            stream.flush()
        zygote_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            _run_child(request, fds, sock, zygote_pid)
        try:
            os.setpgid(pid, pid)  # also here: the worker may killpg before the child has run
        except OSError:
            pass
        return Forked(pid=pid)
    except Exception as exc:  # noqa: BLE001 - a bad request is answered, the zygote lives on
        return Failed(error="".join(traceback.format_exception_only(exc)))
    finally:
        for fd in fds:
            os.close(fd)


# ---------------------------------------------------------------------------------------------
# The forked child.


def _run_spare(sock: socket.socket, zygote_sock: socket.socket, zygote_pid: int) -> None:
    """In a spare: its own group, dying with the zygote; make the CUDA context, then wait for
    the request and run it as a forked child would; exit without a request (the zygote closed
    the socket, or is gone)."""
    try:
        os.setpgid(0, 0)
        _die_with(zygote_pid)
        zygote_sock.detach()  # closed with the rest once the request's fds are placed
        with _opened_above(SPARE_LOW_FDS) as driver_fds:
            warm_ms = _spare_warm_up()
        data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
        if not data:
            os._exit(0)
        startup = {"interpreter": 0.0, "import": 0.0, "spare_warm_up": warm_ms}
        _run_child(request_decoder.decode(data), fds, sock, zygote_pid, startup=startup, keep=driver_fds)
    except BaseException:  # noqa: BLE001 - a spare that failed before its request ends here
        traceback.print_exc()
    os._exit(1)


@contextlib.contextmanager
def _opened_above(low: int):
    """Every free fd number below `low` taken for the block, so what it opens lands at `low` or
    above; yields the set that receives, on exit, the fds the block opened and left open (the
    CUDA driver's device fds, which the child must keep: closing them breaks its context)."""
    null = os.open(os.devnull, os.O_RDONLY)
    taken = [null]
    while taken[-1] < low:
        taken.append(os.dup(null))
    os.close(taken.pop())  # the first number at or above `low`: free again
    before = _open_fds()
    opened: set[int] = set()
    try:
        yield opened
    finally:
        opened.update(_open_fds() - before)
        for fd in taken:
            os.close(fd)


def _open_fds() -> set[int]:
    """This process's open fds (the listing's own directory fd, closed by then, left out)."""
    listed = [int(name) for name in os.listdir("/proc/self/fd")]
    return {fd for fd in listed if _is_open(fd)}


def _is_open(fd: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
        return True
    except OSError:
        return False


def _spare_warm_up() -> float:
    """The CUDA context a child would make first, made ahead (nothing where torch sees no GPU);
    milliseconds. Its environment is the worker's again first (`preload` added NVML_CHECK), as a
    forked child's is when it initialises CUDA."""
    start = time.perf_counter()
    for name, value in _WORKER_NVML.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    torch = sys.modules["torch"]
    try:
        if torch.cuda.is_available():
            torch.zeros(1, device="cuda")
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - the job's child makes its context itself then
        traceback.print_exc()
    return (time.perf_counter() - start) * 1e3


def _run_child(request: Fork, fds: list[int], sock: socket.socket, zygote_pid: int,
               startup: dict[str, float] | None = None, keep: set[int] | frozenset[int] = frozenset()) -> None:
    """In the forked child: become what `python -m module args` would be, run it, exit.
    `startup`: the child's own account of its start (a spare's: what it paid ahead); `keep`: fds
    it opened itself that stay open (a spare's CUDA driver fds)."""
    code = 1
    try:
        os.setpgid(0, 0)
        _die_with(zygote_pid)
        sock.detach()  # its fd is closed below with the rest; the object must not close a reused number
        _place_fds(fds[0], fds[1:], request.pass_fds, keep)
        for name, (soft, hard) in request.rlimits.items():  # the worker's limits as they are now
            if resource.getrlimit(getattr(resource, name)) != (soft, hard):
                resource.setrlimit(getattr(resource, name), (soft, hard))
        os.chdir(request.cwd)
        os.environ.clear()
        os.environ.update(request.env)
        _reseed()
        module = sys.modules[request.module]
        from rewards.verify.phases import process_age_ms

        # The child's own account (rewards.verify.phases): its process is new, its imports free.
        module._STARTUP_MS.clear()
        module._STARTUP_MS.update(startup or {"interpreter": process_age_ms(), "import": 0.0})
        sys.argv = [module.__file__, *request.args]
        code = module.main(list(request.args))
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - as an uncaught exception at the top of `python -m`
        traceback.print_exc()
        code = 1
    finally:
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code or 0)


def _place_fds(log_fd: int, received: Sequence[int], targets: Sequence[int],
               keep: set[int] | frozenset[int] = frozenset()) -> None:
    """stdin /dev/null, stdout and stderr the log, each received fd at its target number (as
    Popen's pass_fds), every other fd closed (as close_fds=True) but those in `keep`, which no
    target may be."""
    if clash := sorted(keep & {0, 1, 2, *targets}):
        raise ValueError(f"fd {clash[0]} is both kept and a target")
    high = max([log_fd, *received, *targets, 2]) + 1
    # F_DUPFD: the lowest free number from `high` up, so no kept fd is overwritten.
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, high) for fd in [log_fd, *received]]
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(moved[0], 1)
    os.dup2(moved[0], 2)
    for fd, target in zip(moved[1:], targets):
        os.dup2(fd, target, inheritable=True)
    kept = sorted({0, 1, 2, *targets, *keep})
    for low, up in zip(kept, [*kept[1:], resource.getrlimit(resource.RLIMIT_NOFILE)[0]]):
        os.closerange(low + 1, up)


def _reseed() -> None:
    """A spawned child draws fresh entropy at start; forked ones would share the zygote's state
    (Python's `random` reseeds itself after fork; numpy's legacy global state does not)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _warm_up(settle: Callable[[], object] = lambda: None) -> tuple[float, str]:
    """rewards.queue.compile_warmup.warm_up, timed. Its failure is a message, never the end of the
    zygote: the children then import and hash on their first compile, as without it. `settle` runs
    after it and before the threads are counted: the threads that count are those the first fork
    would find (`preload` shuts NVML down there). The message names each such thread with the
    warm-up step after which it was first seen, and says which step loaded the CUDA driver's library
    (libcuda.so.1), if any did."""
    before, start = thread_ids(), time.perf_counter()
    seen: dict[str, str] = {}
    driver = ["before the warm-up"] if mapped("libcuda.so") else []  # the step that loaded it

    def done(step: str) -> None:
        for tid in thread_ids() - before - seen.keys():
            seen[tid] = step
        if not driver and mapped("libcuda.so"):
            driver.append(f"by {step}")

    try:
        from rewards.queue.compile_warmup import warm_up

        warm_up(done)
    except Exception as exc:  # noqa: BLE001 - an optimisation that failed; the zygote serves on
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    else:
        done("end")
        settle()
        extra = thread_ids() - before  # a fork copies only the forking thread
        names = ", ".join(f"{name} after {seen.get(tid, 'end')}" for tid, name in thread_names(extra))
        loaded = f"; libcuda.so.1 was loaded {driver[0]}" if driver else "; libcuda.so.1 is not loaded"
        error = f"the warm-up left {len(extra)} thread(s) running ({names}){loaded}" if extra else ""
    return (time.perf_counter() - start) * 1e3, error


def preload(warm_up: bool = True) -> tuple[float, str]:
    """What the zygote holds before its first fork: NVML_CHECK in its environment (torch reads it
    at each `is_available()`), PRELOAD imported and the compile warm-up paid (unless `warm_up` is
    False) with torch.cuda's device questions answered from a forked child's count
    (`devices_answered`), NVML shut down again (`release_nvml`), the collector's view frozen. Returns the
    warm-up's ms and error. The forked children do not keep NVML_CHECK: `_run_child` gives each
    exactly the worker's environment, as a spawned child has, and a child initialises CUDA anyway."""
    _WORKER_NVML.update({name: os.environ.get(name) for name in NVML_CHECK})
    os.environ.update(NVML_CHECK)
    torch = importlib.import_module("torch")
    release = functools.partial(release_nvml, library("libnvidia-ml.so.1"))
    with devices_answered(torch.cuda, count_devices_in_a_child()):
        for name in PRELOAD:
            importlib.import_module(name)
        warmed = _warm_up(settle=release) if warm_up else (0.0, "")
    release()  # again where the warm-up failed or did not run (a released NVML stays released)
    gc.freeze()  # children copy fewer pages: the collector leaves the preloaded objects alone
    return warmed


@contextlib.contextmanager
def devices_answered(cuda, count: int):
    """Within it, torch.cuda's `is_available()` and `device_count()` answer from `count` (what
    `count_devices_in_a_child` saw) and ask neither NVML nor the driver. The zygote's imports and
    warm-up run inside it; the children it forks find torch.cuda's own functions again."""
    saved = cuda.is_available, cuda.device_count
    cuda.is_available, cuda.device_count = (lambda: count > 0), (lambda: count)
    try:
        yield
    finally:
        cuda.is_available, cuda.device_count = saved


def main(argv: list[str] | None = None) -> int:
    """The zygote process: `python -P -s -m rewards.queue.zygote --socket-fd N --parent-pid P`."""
    parser = argparse.ArgumentParser(prog="python -m rewards.queue.zygote", description=__doc__.split("\n")[0])
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--warm-up-failed", default="", help="skip the warm-up; Ready reports this as its error")
    args = parser.parse_args(argv)
    _die_with(args.parent_pid)
    warm_up = WARM_UP and not args.warm_up_failed
    warm_up_ms, warm_up_error = preload(warm_up=warm_up)
    cuda_initialized = cuda_touched()
    if cuda_initialized and warm_up:  # the warm-up may be to blame: try once without it
        _restart(args.socket_fd, args.parent_pid, WARM_UP_TOUCHED_CUDA)
    sock = socket.socket(fileno=args.socket_fd)
    threads = thread_count()
    keep_spare = os.environ.get(SPARE_ENV) == "1" and not cuda_initialized
    spare = Spare(sock) if keep_spare else None
    sock.send(encode(Ready(pid=os.getpid(), threads=threads, cuda_initialized=cuda_initialized,
                           warm_up_ms=warm_up_ms, warm_up_error=warm_up_error or args.warm_up_failed,
                           spare_pid=spare.pid if spare is not None else 0)))
    return serve(sock, spare, keep_spare)


def _restart(socket_fd: int, parent_pid: int, reason: str) -> None:
    """Replace this process by a fresh zygote that skips the warm-up (`--warm-up-failed reason`):
    same pid (the worker's Popen and PR_SET_PDEATHSIG hold), same socket, nothing of this
    process's imports or CUDA state. A zygote that finds CUDA touched without the warm-up reports
    it in Ready instead, and the worker spawns its children."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.set_inheritable(socket_fd, True)
    os.execv(sys.executable, [sys.executable, "-P", "-s", "-m", "rewards.queue.zygote", "--socket-fd", str(socket_fd),
                              "--parent-pid", str(parent_pid), "--warm-up-failed", reason])

