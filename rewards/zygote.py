"""A pre-loaded launcher of candidate and profile children: `python -P -s -m rewards.zygote`.

What it is: one process per GPU worker, started lazily at the first job exactly as the children
are started today (`subprocess.Popen` from the worker: same sandbox, same environment, same
CUDA_VISIBLE_DEVICES, its own process group, dies with the worker). It imports torch,
torch._dynamo, torch.profiler, `rewards.candidate` and `rewards.profile_child` once, WITHOUT
initialising CUDA, then waits on a unix socket. For each job the worker sends a `Fork` (module,
argv, cwd, environment, resource limits) with the child's fds attached (SCM_RIGHTS: the log for
stdout/stderr, the two channel pipes); the zygote forks one fresh child, which puts those fds at
the numbers the worker gave them, takes its own process group, chdirs, applies the limits and
runs the module's `main(argv)`, exactly what `python -m <module> <argv>` runs. CUDA
initialisation and everything after it happen in the forked child. Issue 3: this saves the
child's interpreter start and imports (1.5-2.5 s of a verify job, ~2 s of a profile job).

What it is not: it never sees candidate code, the hidden seed or trusted tensors (it only holds
imported modules), and it never initialises CUDA (it refuses to fork if it has). It is not the
worker's `--fork-per-job` zygote: that one forks handlers from the worker, which is trusted; in
fork-per-job mode the job process dies after each job and takes this zygote with it (no gain).

How it is used (trusted side, `rewards.verify.CandidateProcess` with `launcher="zygote"`):
    process = launch("rewards.candidate", ["--read-fd", "5", "--write-fd", "8"], cwd=work_dir,
                     env=env, log_fd=log.fileno(), pass_fds=(5, 8))   # Popen-like: pid, poll, wait
    os.killpg(process.pid, signal.SIGKILL); process.wait()
A zygote that died or was killed is restarted at the next `launch`; if it cannot be (re)started,
`launch` raises ZygoteError and the caller spawns the child as before. `spared_pids()` lists the
live zygote so the sandboxed worker's stray reaper leaves it alone.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import logging
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping, Sequence

import msgspec
from msgspec import Struct

PRELOAD = ("torch", "torch._dynamo", "torch.profiler", "rewards.candidate", "rewards.profile_child")
CHILD_MODULES = ("rewards.candidate", "rewards.profile_child")
MAX_MESSAGE = 1 << 18  # one Fork: argv, env, limits (a few KiB)
MAX_FDS = 16
START_TIMEOUT_S = 120.0  # the imports: a few seconds, more on a loaded machine
REPLY_TIMEOUT_S = 30.0
logger = logging.getLogger(__name__)
RLIMITS = tuple(name for name in dir(resource) if name.startswith("RLIMIT_"))


class ZygoteError(RuntimeError):
    """The zygote could not be started or could not fork: the caller spawns instead."""


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


class Forked(Struct, frozen=True, kw_only=True, tag="forked"):
    pid: int


class Failed(Struct, frozen=True, kw_only=True, tag="failed"):
    error: str


class Exited(Struct, frozen=True, kw_only=True, tag="exited"):
    pid: int
    code: int  # as Popen.returncode: negative for a signal


_encode = msgspec.msgpack.encode
_request_decoder = msgspec.msgpack.Decoder(Fork)
_reply_decoder = msgspec.msgpack.Decoder(Ready | Forked | Failed | Exited)


# ---------------------------------------------------------------------------------------------
# The worker's side.


class ForkedProcess:
    """A child forked by the zygote, with the part of Popen's interface CandidateProcess uses.
    Its exit status comes from the zygote (its parent); a zygote that is gone took it along."""

    def __init__(self, zygote: Zygote, pid: int, args: Sequence[str]) -> None:
        self.zygote, self.pid, self.args = zygote, pid, list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, 0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode


class Zygote:
    """The zygote process and its socket; one per worker, shared by its jobs one at a time.

    Example:
        zygote = Zygote(sys.executable, env, cwd)
        zygote.start()
        process = zygote.fork("rewards.candidate", args, cwd=cwd, env=env, log_fd=fd, pass_fds=fds)
    """

    def __init__(self, python: str, env: Mapping[str, str], cwd: str) -> None:
        self.python, self.env, self.cwd = python, dict(env), cwd
        self.process: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.exits: dict[int, int] = {}
        self.live: set[int] = set()  # forked children without an exit status yet

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Ready:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [self.python, "-P", "-s", "-m", "rewards.zygote", "--socket-fd", str(theirs.fileno()),
                "--parent-pid", str(os.getpid())]
        try:
            self.process = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                            cwd=self.cwd, env=self.env, process_group=0)
        finally:
            theirs.close()
        self.sock = ours
        ready = self._receive(timeout_s)
        if not isinstance(ready, Ready) or ready.cuda_initialized:
            self.close()
            raise ZygoteError(f"the zygote did not come up clean: {ready}")
        return ready

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def fork(self, module: str, args: Sequence[str], *, cwd: str, env: Mapping[str, str], log_fd: int,
             pass_fds: Sequence[int]) -> ForkedProcess:
        limits = {name: resource.getrlimit(getattr(resource, name)) for name in RLIMITS}
        request = Fork(module=module, args=tuple(args), cwd=str(cwd), env=dict(env), pass_fds=tuple(pass_fds),
                       rlimits=limits)
        try:
            socket.send_fds(self.sock, [_encode(request)], [log_fd, *pass_fds])
            reply = self._receive(REPLY_TIMEOUT_S, until=(Forked, Failed))
        except OSError as exc:
            self.close()
            raise ZygoteError(f"the zygote is gone: {exc}") from exc
        if isinstance(reply, Failed):
            raise ZygoteError(f"the zygote could not fork: {reply.error}")
        self.live.add(reply.pid)
        return ForkedProcess(self, reply.pid, [module, *args])

    def exit_code(self, pid: int, timeout_s: float | None) -> int | None:
        """The child's exit status once the zygote reports it; None if still running after
        `timeout_s`. A zygote that is gone killed its children (PR_SET_PDEATHSIG): -SIGKILL."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while pid not in self.exits:
            if pid not in self.live or self.sock is None:
                return -signal.SIGKILL
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                if self._receive(remaining, until=(Exited,)) is None:
                    return None
            except OSError:
                self.close()
        self.live.discard(pid)
        return self.exits.pop(pid)

    def _receive(self, timeout_s: float | None, until: tuple[type, ...] = (Ready,)):
        """The next reply of a kind in `until`, recording exit statuses on the way; None at the
        timeout. OSError (ConnectionResetError) when the zygote is gone."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.sock], [], [], remaining)[0]:
                if Exited in until:
                    return None
                raise ConnectionResetError("the zygote did not answer in time")
            data = self.sock.recv(MAX_MESSAGE)
            if not data:
                raise ConnectionResetError("the zygote closed its socket")
            reply = _reply_decoder.decode(data)
            if isinstance(reply, Exited):
                self.exits[reply.pid] = reply.code
            if isinstance(reply, until):
                return reply

    def close(self) -> None:
        """Kill the zygote (its children die with it) and forget it."""
        if self.process is not None:
            try:
                self.process.kill()
            except OSError:
                pass
            self.process.wait()
        if self.sock is not None:
            self.sock.close()
        self.process, self.sock = None, None
        self.exits.update({pid: -signal.SIGKILL for pid in self.live})
        self.live.clear()


_lock = threading.Lock()
_current: Zygote | None = None


def launch(module: str, args: Sequence[str], *, cwd, env: Mapping[str, str], log_fd: int,
           pass_fds: Sequence[int], python: str = sys.executable) -> ForkedProcess:
    """A fresh child of the worker's zygote running `python -m module *args`; the zygote is
    (re)started when there is none, it died, or the environment or interpreter changed (modules
    read the environment when imported). ZygoteError after one failed restart."""
    global _current
    with _lock:
        for attempt in range(2):
            zygote = _current
            if zygote is None or not zygote.alive or zygote.env != dict(env) or zygote.python != python:
                if zygote is not None:
                    zygote.close()
                zygote = _current = Zygote(python, env, str(cwd))
                try:
                    ready = zygote.start()
                    logger.info("zygote %d started (%d threads after its imports)", ready.pid, ready.threads)
                except (OSError, ConnectionResetError, msgspec.DecodeError) as exc:
                    zygote.close()
                    _current = None
                    if attempt:
                        raise ZygoteError(f"the zygote did not start: {exc}") from exc
                    continue
            try:
                return zygote.fork(module, args, cwd=str(cwd), env=env, log_fd=log_fd, pass_fds=pass_fds)
            except ZygoteError:
                zygote.close()
                _current = None
                if attempt:
                    raise
    raise ZygoteError("unreachable")


def spared_pids() -> set[int]:
    """The live zygote's pid, for the sandboxed worker's stray reaper."""
    zygote = _current
    return {zygote.process.pid} if zygote is not None and zygote.alive else set()


def shutdown() -> None:
    """Kill the zygote, if any (tests; the worker's exit kills it anyway)."""
    global _current
    with _lock:
        if _current is not None:
            _current.close()
        _current = None


# ---------------------------------------------------------------------------------------------
# The zygote's side.


def _die_with(parent_pid: int) -> None:
    """SIGKILL when our parent dies (PR_SET_PDEATHSIG); exit now if it already has."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(1)


def serve(sock: socket.socket) -> int:
    """Fork on each request, report each child's exit; return when the worker closes the socket."""
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
                sock.send(_encode(Exited(pid=pid, code=os.waitstatus_to_exitcode(status))))
                continue
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
            except OSError:
                data, fds = b"", []
            if not data:
                return 0
            reply = _fork(data, fds, sock)
            if isinstance(reply, Forked):
                pidfd = os.pidfd_open(reply.pid)
                children[pidfd] = reply.pid
                poller.register(pidfd, select.POLLIN)
            sock.send(_encode(reply))


def _fork(data: bytes, fds: list[int], sock: socket.socket) -> Forked | Failed:
    try:
        request = _request_decoder.decode(data)
        if request.module not in CHILD_MODULES or len(fds) != 1 + len(request.pass_fds):
            return Failed(error=f"bad request: {request.module}, {len(fds)} fds")
        if sys.modules["torch"].cuda.is_initialized():  # a forked child would share the context
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


def _run_child(request: Fork, fds: list[int], sock: socket.socket, zygote_pid: int) -> None:
    """In the forked child: become what `python -m module args` would be, run it, exit."""
    code = 1
    try:
        os.setpgid(0, 0)
        _die_with(zygote_pid)
        sock.detach()  # its fd is closed below with the rest; the object must not close a reused number
        _place_fds(fds[0], fds[1:], request.pass_fds)
        for name, (soft, hard) in request.rlimits.items():  # the worker's limits as they are now
            if resource.getrlimit(getattr(resource, name)) != (soft, hard):
                resource.setrlimit(getattr(resource, name), (soft, hard))
        os.chdir(request.cwd)
        os.environ.clear()
        os.environ.update(request.env)
        _reseed()
        module = sys.modules[request.module]
        from rewards.verify_phases import process_age_ms

        # The child's own account (rewards.verify_phases): its process is new, its imports free.
        module._STARTUP_MS.clear()
        module._STARTUP_MS.update({"interpreter": process_age_ms(), "import": 0.0})
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


def _place_fds(log_fd: int, received: Sequence[int], targets: Sequence[int]) -> None:
    """stdin /dev/null, stdout and stderr the log, each received fd at its target number (as
    Popen's pass_fds), every other fd closed (as close_fds=True)."""
    high = max([log_fd, *received, *targets, 2]) + 1
    moved = [os.dup2(fd, high + i, inheritable=True) for i, fd in enumerate([log_fd, *received])]
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(moved[0], 1)
    os.dup2(moved[0], 2)
    for fd, target in zip(moved[1:], targets):
        os.dup2(fd, target, inheritable=True)
    keep = sorted({0, 1, 2, *targets})
    for low, up in zip(keep, [*keep[1:], resource.getrlimit(resource.RLIMIT_NOFILE)[0]]):
        os.closerange(low + 1, up)


def _reseed() -> None:
    """A spawned child draws fresh entropy at start; forked ones would share the zygote's state
    (Python's `random` reseeds itself after fork; numpy's legacy global state does not)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rewards.zygote", description=__doc__.split("\n")[0])
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with(args.parent_pid)
    sock = socket.socket(fileno=args.socket_fd)
    for name in PRELOAD:
        importlib.import_module(name)
    torch = sys.modules["torch"]
    gc.freeze()  # children copy fewer pages: the collector leaves the preloaded objects alone
    sock.send(_encode(Ready(pid=os.getpid(), threads=_threads(), cuda_initialized=torch.cuda.is_initialized())))
    return serve(sock)


if __name__ == "__main__":
    sys.exit(main())
