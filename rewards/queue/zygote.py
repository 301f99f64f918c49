"""A pre-loaded launcher of candidate and profile children, the worker's side.

What it is: the trusted client of one zygote process per GPU worker (rewards.queue.zygote_server),
started lazily at the first job exactly as spawned children are started (`subprocess.Popen`
from the worker: same sandbox, same environment, same CUDA_VISIBLE_DEVICES, its own process
group, dies with the worker) as `python -P -s -m rewards.queue.zygote`. The zygote imports torch,
torch._dynamo, torch.profiler, `rewards.verify.candidate` and `rewards.timing.profile_child` once
and pays a first torch.compile's imports and source hashes (rewards.queue.compile_warmup), without
initialising CUDA; for each job `launch` sends it a `Fork` with the child's fds attached and gets
back a fresh child running `python -m <module> <argv>`, as a Popen-like `ForkedProcess`. CUDA
initialisation and everything after it happen in the forked child. This saves the child's
interpreter start and imports (1.5-2.5 s of a verify job, ~2 s of a profile job).

What it is not: the zygote process itself (its serve loop, the fork, the child's fd placement and
the wire protocol are rewards.queue.zygote_server, which also restarts the zygote without its
warm-up should that touch CUDA, and says so in Ready; this module's `__main__` only hands over to it). It is
not the worker's `--fork-per-job` zygote: that one forks handlers from the worker, which is
trusted; in fork-per-job mode the job process dies after each job and takes this zygote with it.

How it is used (trusted side, `rewards.verify.verifier.CandidateProcess` with `launcher="zygote"`):
    process = launch("rewards.verify.candidate", ["--read-fd", "5", "--write-fd", "8"], cwd=work_dir,
                     env=env, log_fd=log.fileno(), pass_fds=(5, 8))   # Popen-like: pid, poll, wait
    os.killpg(process.pid, signal.SIGKILL); process.wait()
A zygote that died or was killed is restarted at the next `launch`; if it cannot be (re)started,
`launch` raises ZygoteError and the caller spawns the child instead. `spared_pids()` lists the
live zygote and its spare child (rewards.queue.zygote_server) so that the sandboxed worker's stray
reaper leaves them alone.
"""

from __future__ import annotations

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
from collections.abc import Mapping, Sequence

import msgspec

from rewards.queue.zygote_server import (
    MAX_MESSAGE,
    Exited,
    Failed,
    Fork,
    Forked,
    Ready,
    encode,
    main,
    reply_decoder,
)

START_TIMEOUT_S = 120.0  # the imports: a few seconds, more on a loaded machine
REPLY_TIMEOUT_S = 30.0
logger = logging.getLogger(__name__)
RLIMITS = tuple(name for name in dir(resource) if name.startswith("RLIMIT_"))


class ZygoteError(RuntimeError):
    """The zygote could not be started or could not fork: the caller spawns instead."""


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
        process = zygote.fork("rewards.verify.candidate", args, cwd=cwd, env=env, log_fd=fd, pass_fds=fds)
    """

    def __init__(self, python: str, env: Mapping[str, str], cwd: str) -> None:
        self.python, self.env, self.cwd = python, dict(env), cwd
        self.process: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.exits: dict[int, int] = {}
        self.live: set[int] = set()  # forked children without an exit status yet
        self.spare = 0  # the zygote's spare child waiting for a request (rewards.queue.zygote_server); 0: none

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Ready:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [self.python, "-P", "-s", "-m", "rewards.queue.zygote", "--socket-fd", str(theirs.fileno()),
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
        self.spare = ready.spare_pid
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
            socket.send_fds(self.sock, [encode(request)], [log_fd, *pass_fds])
            reply = self._receive(REPLY_TIMEOUT_S, until=(Forked, Failed))
        except OSError as exc:
            self.close()
            raise ZygoteError(f"the zygote is gone: {exc}") from exc
        if isinstance(reply, Failed):
            raise ZygoteError(f"the zygote could not fork: {reply.error}")
        self.live.add(reply.pid)
        if reply.pid == self.spare:  # the spare took the request: no longer one to spare
            self.spare = 0
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
            reply = reply_decoder.decode(data)
            if isinstance(reply, Exited):
                self.exits[reply.pid] = reply.code
                self.spare = reply.spare_pid or self.spare
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
        self.process, self.sock, self.spare = None, None, 0
        self.exits.update({pid: -signal.SIGKILL for pid in self.live})
        self.live.clear()


_lock = threading.Lock()
_current: Zygote | None = None
_warm_up_errors: set[str] = set()  # those logged


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
                    logger.info("zygote %d started (%d threads after its imports, compile warm-up %.0f ms)",
                                ready.pid, ready.threads, ready.warm_up_ms)
                    if ready.warm_up_error and ready.warm_up_error not in _warm_up_errors:
                        _warm_up_errors.add(ready.warm_up_error)  # once per worker, not per restart
                        logger.warning("zygote %d: compile warm-up failed, children compile cold: %s",
                                       ready.pid, ready.warm_up_error)
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
    """The live zygote's pid and its spare child's, for the sandboxed worker's stray reaper."""
    zygote = _current
    if zygote is None or not zygote.alive:
        return set()
    return {zygote.process.pid} | ({zygote.spare} if zygote.spare else set())


def shutdown() -> None:
    """Kill the zygote, if any (tests; the worker's exit kills it anyway)."""
    global _current
    with _lock:
        if _current is not None:
            _current.close()
        _current = None


if __name__ == "__main__":  # the zygote process: rewards.queue.zygote_server
    sys.exit(main())
