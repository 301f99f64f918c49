"""The sandbox the agent's `bash` tool runs in: bubblewrap, resource limits, a wall timeout and
bounded output.

What it is: `Sandbox.run(command, workspace, timeout_s)` runs `bash -c command` inside `bwrap`
with the host filesystem read-only, a private /tmp, the workspace bound read-write (its
protected files bound read-only over themselves, its sibling workspaces hidden), no network, a
private pid namespace and a clean environment. `prlimit` inside caps CPU seconds, address space,
file size, open files and processes. Run as root, the sandbox first drops to an unprivileged uid:
RLIMIT_NPROC does not bind root. Each bwrap gets its own user namespace, so the process cap
counts one sandbox's processes, not every sandbox running as that uid.

What it is not: a limiter or a pool. `run` keeps no per-call state, so callers bound concurrency
with their own `CapacityLimiter` around it. Nor is it a container for GPU jobs yet:
`extra_dev_binds` only passes device nodes through.

How it is used: the ToolBox calls `await sandbox.run(call.command, workspace, call.timeout_s)`
and shows the model `SandboxResult.output`, already cut to its token budget. Without bwrap the
sandbox refuses (`unavailable_reason()`) unless `allow_unsandboxed=True`, which runs plain bash
with the same limits, timeout and output cap, but with the host filesystem and network open.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.abc
from msgspec import Struct

from agentcore.interpreter import bind_back, interpreter_dirs
from agentcore.workspace import can_traverse

if TYPE_CHECKING:
    from agentcore.workspace import Workspace

TokenCounter = Callable[[str], int]
_READ_CHUNK = 1 << 20
_DEFAULT_PATH = "/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SandboxConfig(Struct, frozen=True, kw_only=True):
    timeout_s: float = 300.0
    """Wall-clock cap of one command; a call may ask for less, never more."""
    cpu_s: int = 300
    """CPU seconds per process (RLIMIT_CPU)."""
    mem_gib: float | None = 8.0
    """Address space per process in GiB (RLIMIT_AS); None for no cap (CUDA needs that)."""
    file_size_mib: int = 256
    """Largest file a process may write, in MiB (RLIMIT_FSIZE)."""
    tmp_size_mib: int = 1024
    """Size of the private /tmp tmpfs in MiB."""
    max_open_files: int = 1024
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    max_procs: int = 256
    """Processes and threads of the sandbox user (RLIMIT_NPROC)."""
    output_bytes: int = 256 * 1024
    """Bytes of merged stdout+stderr kept while streaming (head and tail halves)."""
    output_tokens: int = 4096
    """Token budget of the output the model sees."""
    max_output_mib: int = 256
    """A command that writes more is killed: draining a flood costs the event loop CPU."""
    sandbox_uid: int | None = 65534
    """Uid (and gid) to run as when started as root; None keeps root, without a process cap."""
    allow_unsandboxed: bool = False
    """Run plain bash when bwrap is missing: same limits, but host files and network are open."""
    extra_dev_binds: tuple[str, ...] = ()
    """Device nodes passed through with --dev-bind-try, e.g. ("/dev/nvidia0", "/dev/nvidiactl")."""
    hide_paths: tuple[str, ...] = ()
    """Host directories covered by an empty tmpfs (the project's sources, data, other runs)."""
    extra_env: dict[str, str] = {}
    """Variables added to the sandbox's clean environment."""
    bwrap_path: str = "bwrap"
    """The bubblewrap binary, a name looked up on PATH or a path."""


class SandboxResult(Struct, frozen=True, kw_only=True):
    """One command's outcome; `output` is merged stdout+stderr, already truncated."""

    exit_code: int
    output: str
    timed_out: bool
    truncated_bytes: int
    seconds: float


class SandboxStats(Struct, frozen=True, kw_only=True):
    runs: int
    running: int
    timeouts: int
    truncated: int
    seconds_total: float


class SandboxUnavailable(RuntimeError):
    """Raised by `run` when the sandbox cannot run at all (bwrap missing, not opted out)."""


# ---------------------------------------------------------------------------------------------
# Output: a bounded capture while streaming, then a token budget.


def approx_tokens(text: str) -> int:
    """About four bytes of UTF-8 per token: cheap and close enough for code and logs."""
    return (len(text.encode("utf-8", "replace")) + 3) // 4


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "replace"))


class OutputCapture:
    """Keeps the first and last `limit // 2` bytes of a stream and counts the bytes between."""

    def __init__(self, limit: int) -> None:
        self.half = max(1, limit // 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.half:  # trim rarely: amortised O(1) per byte
                del self.tail[: len(self.tail) - self.half]

    def parts(self) -> tuple[bytes, bytes, int]:
        """(head, tail, dropped bytes between them)."""
        tail = bytes(self.tail[-self.half :]) if self.tail else b""
        return bytes(self.head), tail, self.total - len(self.head) - len(tail)


def truncate_marker(dropped_bytes: int) -> str:
    return f"\n[... {dropped_bytes} bytes truncated ...]\n"


def fit_tokens(
    head: str, tail: str, dropped_bytes: int, max_tokens: int, count: TokenCounter | None = None
) -> tuple[str, int]:
    """Join `head` and `tail` into at most `max_tokens` tokens, cutting from the middle.

    `dropped_bytes` were already cut between them; returns (text, all bytes dropped)."""
    count = count or approx_tokens
    before = _utf8_len(head) + _utf8_len(tail)
    # Few tokens span more than 16 characters: cut to that first, so that a real tokenizer
    # never counts a whole capture on the event loop.
    head, tail = head[: 16 * max_tokens], tail[max(0, len(tail) - 16 * max_tokens) :]
    intact = dropped_bytes == 0 and _utf8_len(head) + _utf8_len(tail) == before
    if intact and count(head + tail) <= max_tokens:
        return head + tail, 0
    budget = max(0, max_tokens - count(truncate_marker(10**12)))
    while head or tail:
        used = count(head) + count(tail)
        if used <= budget:
            break
        keep = budget / used * 0.95
        head = head[: int(len(head) * keep)]
        tail = tail[len(tail) - int(len(tail) * keep) :]
    dropped_bytes += before - _utf8_len(head) - _utf8_len(tail)
    return head + truncate_marker(dropped_bytes) + tail, dropped_bytes


def truncate_middle(
    text: str, max_tokens: int, count: TokenCounter | None = None
) -> tuple[str, int]:
    """Cut `text` to `max_tokens` from the middle; returns (text, bytes dropped)."""
    half = len(text) // 2
    return fit_tokens(text[:half], text[half:], 0, max_tokens, count)


# ---------------------------------------------------------------------------------------------
# Command lines.


def _limits_argv(prlimit: str, c: SandboxConfig) -> list[str]:
    argv = [
        prlimit,
        f"--cpu={c.cpu_s}",
        f"--fsize={c.file_size_mib << 20}",
        f"--nofile={c.max_open_files}",
        f"--nproc={c.max_procs}",
        "--core=0",
    ]
    if c.mem_gib is not None:
        argv.append(f"--as={int(c.mem_gib * (1 << 30))}")
    return argv + ["--"]


def sandbox_env(c: SandboxConfig) -> dict[str, str]:
    """The whole environment of a sandboxed command: nothing is inherited from the host."""
    path = os.path.dirname(sys.executable) + ":" + _DEFAULT_PATH
    env = {"PATH": path, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb"}
    return env | dict(c.extra_env)


def _can_enter(path: str, uid: int | None) -> bool:
    """Whether the sandbox's user (`uid`; None: ours) may reach `path` through every folder."""
    if uid is None:
        return True
    try:
        return all(can_traverse(p, uid) for p in (Path(path), *Path(path).parents))
    except OSError:
        return False


def run_uid(c: SandboxConfig) -> int | None:
    """The uid commands run as when it differs from ours (we are root), else None."""
    return c.sandbox_uid if os.geteuid() == 0 else None


@cache
def bwrap_options(bwrap: str) -> frozenset[str]:
    """The options this bwrap knows: --size came in 0.7, --disable-userns in 0.8."""
    out = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10)
    words = (out.stdout + out.stderr).split()
    return frozenset(w for w in words if w.startswith("--"))


def bwrap_argv(bwrap: str, workspace: Workspace, c: SandboxConfig) -> list[str]:
    """Mount order matters: later mounts cover earlier ones, so the workspace comes after the
    tmpfs that may hold it, and the read-only binds of protected files come after it."""
    ws = str(workspace.path)
    known = bwrap_options(bwrap)
    argv = [bwrap, "--ro-bind", "/", "/"]
    if "--size" in known:
        argv += ["--size", str(c.tmp_size_mib << 20)]
    argv += ["--tmpfs", "/tmp"]
    parent = os.path.dirname(ws)
    if parent not in ("/", "/tmp"):  # hide sibling workspaces (other trajectories' solutions)
        argv += ["--tmpfs", parent]
    for hidden in c.hide_paths:
        argv += ["--tmpfs", hidden]
    hidden = [parent, *c.hide_paths] if parent not in ("/", "/tmp") else list(c.hide_paths)
    for path in bind_back(interpreter_dirs(), ["/tmp", *hidden], keep_hidden=hidden):
        # its python, where the sandbox's user may enter it (under a 0700 temp dir it may not, and
        # bwrap would refuse the bind: PATH's later entries then give the system's python3)
        if _can_enter(path, run_uid(c)):
            argv += ["--ro-bind", path, path]
    argv += ["--bind", ws, ws]
    for path in sorted(workspace.protected_paths()):
        argv += ["--ro-bind", str(path), str(path)]
    argv += ["--dev", "/dev"]
    for node in c.extra_dev_binds:
        argv += ["--dev-bind-try", node, node]
    argv += ["--proc", "/proc", "--unshare-all", "--unshare-user"]
    if "--disable-userns" in known:  # no nested user namespace to undo the limits from inside
        argv.append("--disable-userns")
    argv += ["--die-with-parent", "--new-session", "--chdir", ws, "--clearenv"]
    for key, value in sandbox_env(c).items():
        argv += ["--setenv", key, value]
    return argv + ["--"]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def _drain(stream: anyio.abc.ByteReceiveStream, capture: OutputCapture, stop_at: int) -> bool:
    """Read to EOF; True if the stream passed `stop_at` bytes first."""
    try:
        while capture.total <= stop_at:
            capture.feed(await stream.receive(_READ_CHUNK))
    except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
        return False
    return True


# ---------------------------------------------------------------------------------------------


class Sandbox:
    """Runs agent commands under bwrap with limits, a wall timeout and capped output.

    Example:
        sandbox = Sandbox(SandboxConfig(timeout_s=60))
        workspace = await Workspace.create(task, root, owner_uid=sandbox.run_uid)
        result = await sandbox.run("nvcc --version", workspace, timeout_s=30)
        print(result.exit_code, result.output)
    """

    def __init__(
        self, config: SandboxConfig = SandboxConfig(), count_tokens: TokenCounter | None = None
    ):
        self.config = config
        self.count_tokens = count_tokens
        self.bwrap = shutil.which(config.bwrap_path)
        if self.bwrap is not None:
            bwrap_options(self.bwrap)  # asked once, here, not on the event loop later
        self.prlimit = shutil.which("prlimit")
        self._runs = self._running = self._timeouts = self._truncated = 0
        self._seconds = 0.0

    @property
    def run_uid(self) -> int | None:
        """The uid commands run as when it differs from ours (we are root), else None."""
        return run_uid(self.config)

    def unavailable_reason(self) -> str | None:
        """Why `run` would refuse, in words for the model; None when it can run."""
        if self.prlimit is None:
            return "bash is unavailable: `prlimit` (util-linux) is not installed on the host."
        if self.bwrap is None and not self.config.allow_unsandboxed:
            return (
                "bash is unavailable: the sandbox needs bubblewrap (`bwrap`), which is not "
                "installed on the host. Use the file tools (read_file, write_file, edit_file, "
                "glob, grep) and compile/verify/profile instead."
            )
        return None

    def argv(self, command: str, workspace: Workspace) -> list[str]:
        inner = _limits_argv(self.prlimit or "prlimit", self.config) + ["bash", "-c", command]
        if self.bwrap is None:
            return inner
        return bwrap_argv(self.bwrap, workspace, self.config) + inner

    async def run(
        self, command: str, workspace: Workspace, timeout_s: float | None = None
    ) -> SandboxResult:
        reason = self.unavailable_reason()
        if reason is not None:
            raise SandboxUnavailable(reason)
        limit = (
            self.config.timeout_s if timeout_s is None else min(timeout_s, self.config.timeout_s)
        )
        capture = OutputCapture(self.config.output_bytes)
        self._runs += 1
        self._running += 1
        start = time.monotonic()
        try:
            exit_code, timed_out, flooded = await self._execute(command, workspace, limit, capture)
        finally:
            self._running -= 1
        return self._result(capture, exit_code, timed_out, flooded, time.monotonic() - start)

    async def _execute(
        self, command: str, workspace: Workspace, limit: float, capture: OutputCapture
    ) -> tuple[int, bool, bool]:
        """(exit code, timed out, killed for flooding its output)."""
        uid = self.run_uid
        drop = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
        proc = await anyio.open_process(
            self.argv(command, workspace),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=workspace.path,
            env=sandbox_env(self.config),
            start_new_session=True,  # its own process group: one killpg ends it all
            umask=0o022,
            **drop,
        )
        timed_out = flooded = False
        try:
            with anyio.move_on_after(limit) as scope:
                flooded = await _drain(proc.stdout, capture, self.config.max_output_mib << 20)
                if flooded:
                    _kill_group(proc.pid)
                await proc.wait()
            timed_out = scope.cancelled_caught
        finally:
            # bwrap's pid namespace dies with its init (--die-with-parent); unsandboxed, the
            # group kill reaches what bash left behind unless it escaped with setsid.
            _kill_group(proc.pid)
            with anyio.CancelScope(shield=True):
                await proc.aclose()
        code = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        return code, timed_out, flooded

    def _result(
        self, capture: OutputCapture, exit_code: int, timed_out: bool, flooded: bool, seconds: float
    ) -> SandboxResult:
        head, tail, dropped = capture.parts()
        if dropped == 0:  # contiguous: decode together so no character is split in two
            head, tail = head + tail, b""
        text, dropped = fit_tokens(
            head.decode("utf-8", "replace"),
            tail.decode("utf-8", "replace"),
            dropped,
            self.config.output_tokens,
            self.count_tokens,
        )
        if flooded:
            text += f"\n[output passed {self.config.max_output_mib} MiB: the command was killed]"
        self._timeouts += timed_out
        self._truncated += dropped > 0
        self._seconds += seconds
        return SandboxResult(
            exit_code=exit_code,
            output=text,
            timed_out=timed_out,
            truncated_bytes=dropped,
            seconds=seconds,
        )

    def statistics(self) -> SandboxStats:
        return SandboxStats(
            runs=self._runs,
            running=self._running,
            timeouts=self._timeouts,
            truncated=self._truncated,
            seconds_total=self._seconds,
        )
