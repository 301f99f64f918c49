"""Start, watch and stop one SGLang server as a managed subprocess.

What it is: `SGLangServer` runs `python -m sglang.launch_server ...` in its own session (so its
whole process group, schedulers and detokenizer included, can be signalled at once), logs to a
file, waits until `/health_generate` answers, and on exit (also on cancellation, shielded)
sends SIGTERM to the group, then SIGKILL after a grace period: no orphans. `supervise()` restarts
a server that died on its own, up to `max_restarts` times, then raises.
What it is not: a client (`client.py`) nor a pool of servers; it never imports sglang or torch
itself, and `module` can name a fake (tests use `tests.fakes.fake_sglang_launch`).

    async with SGLangServer(SGLangServerConfig(model_path="Qwen/Qwen3-8B", port=30000)) as server:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.supervise)
            ...  # SGLangClient(SGLangClientConfig(base_url=server.base_url))
"""

from __future__ import annotations

import glob
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile

import anyio
from anyio.abc import Process
from msgspec import Struct

from agentcore.lifeline import lifeline_argv
from agentcore.sglang.client import SGLangClient, SGLangClientConfig


class SGLangServerError(RuntimeError):
    """The server could not be started, or kept crashing."""


class SGLangServerConfig(Struct, frozen=True, kw_only=True):
    """One SGLang server: launch flags, environment, log and time budgets."""

    model_path: str
    """Hugging Face id or local checkpoint directory (`--model-path`)."""
    port: int = 30000
    """HTTP port (`--port`)."""
    host: str = "127.0.0.1"
    """Interface to bind (`--host`); loopback unless remote clients need it."""
    tp_size: int = 1
    """Tensor-parallel GPUs (`--tp-size`); one server per TP group for tensor weight updates."""
    base_gpu_id: int = 0
    """First GPU index the server uses (`--base-gpu-id`)."""
    mem_fraction_static: float = 0.5
    """GPU memory share for weights and KV cache (`--mem-fraction-static`)."""
    enable_memory_saver: bool = True
    """Allow release/resume of memory occupation (`--enable-memory-saver`)."""
    skip_tokenizer_init: bool = True
    """Token ids in and out only (`--skip-tokenizer-init`)."""
    attention_backend: str = "auto"
    """`--attention-backend`: "auto" passes `triton` when the sgl_kernel the server will import
    has no FA3 ops (the offline build strips them, and FA3 is SGLang's default on Hopper), else
    leaves SGLang's choice; "" never passes one; any other value is passed as given. A flag in
    `extra_args` wins."""
    extra_args: tuple[str, ...] = ()
    """Further launch_server flags, passed as given."""
    module: str = "sglang.launch_server"
    """Module run with `python -m`."""
    cuda_visible_devices: str | None = None
    """CUDA_VISIBLE_DEVICES for the server; None keeps the parent's."""
    env: dict[str, str] = {}
    """Extra environment variables, applied last."""
    log_path: str = ""
    """Server stdout+stderr (appended); empty: <tmpdir>/sglang_<port>.log."""
    startup_timeout_s: float = 1200.0
    """Bound on launch until /health_generate answers 200."""
    health_poll_interval_s: float = 2.0
    """Pause between health probes during startup."""
    health_timeout_s: float = 30.0
    """Bound on one health probe."""
    shutdown_grace_s: float = 30.0
    """Wait after SIGTERM before SIGKILL."""
    max_restarts: int = 3
    """Restarts `supervise()` makes after crashes before it gives up."""
    log_tail_bytes: int = 4000
    """How much of the log an error message quotes."""


class SGLangLaunch(Struct, frozen=True, kw_only=True):
    """How a training run or a benchmark starts SGLang servers of its own (when it was given no
    urls): the settings every such server shares; `server()` makes one server's config."""

    mem_fraction_static: float = 0.4
    """`--mem-fraction-static`: the server's share of its GPU (a learner rank or the verification
    queue needs the rest)."""
    extra_args: tuple[str, ...] = ("--dtype", "bfloat16", "--grammar-backend", "none")
    """Further launch_server flags (the launcher adds its own: tokenizer off, memory saver, an
    attention backend where FA3 is missing)."""
    pythonpath: str = ""
    """Where sglang is installed, for the servers only; "" takes CUDA_AGENT_SGLANG_PYTHONPATH, else
    the trainer's own packages."""
    startup_timeout_s: float = 1200.0
    """Bound on a server's start until it generates."""
    module: str = "sglang.launch_server"
    """Module run with `python -m` (tests name a fake)."""

    def server(self, model_path: str, gpu: int, log_path: str, extra_args: tuple[str, ...] = ()) -> SGLangServerConfig:
        """The launcher's config of one such server on `gpu`, on a free port."""
        where = self.pythonpath or os.environ.get("CUDA_AGENT_SGLANG_PYTHONPATH", "")
        env = {"PYTHONPATH": os.pathsep.join(p for p in (where, os.environ.get("PYTHONPATH", "")) if p)}
        return SGLangServerConfig(
            model_path=model_path, port=free_port(), base_gpu_id=gpu, mem_fraction_static=self.mem_fraction_static,
            module=self.module, env=env, log_path=log_path, startup_timeout_s=self.startup_timeout_s,
            extra_args=(*self.extra_args, *extra_args),
        )


def free_port() -> int:
    """A TCP port free on loopback now, picked by the kernel: processes asking at the same moment
    (a benchmark's parallel runs) get different ones."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerStatistics(Struct, frozen=True, kw_only=True):
    """Process state and counters since the object was made."""

    running: bool
    pid: int | None
    starts: int
    restarts: int
    crashes: int


class _Run:
    """One launched process; `stopping` tells a deliberate exit from a crash."""

    __slots__ = ("process", "stopping")

    def __init__(self, process: Process) -> None:
        self.process = process
        self.stopping = False


class SGLangServer:
    """A managed SGLang server process.

    Example:
        server = SGLangServer(SGLangServerConfig(model_path=m, port=30001, base_gpu_id=1))
        async with server:                 # returns once /health_generate answers
            print(server.base_url, server.pid)
            await server.restart()         # same flags, new process
        # here the whole process group is gone
    """

    def __init__(self, config: SGLangServerConfig) -> None:
        self.config = config
        self.log_path = config.log_path or os.path.join(
            tempfile.gettempdir(), f"sglang_{config.port}.log"
        )
        self._run: _Run | None = None
        self._lock = anyio.Lock()
        self._starts = self._restarts = self._crashes = 0

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def pid(self) -> int | None:
        return self._run.process.pid if self._run else None

    @property
    def command(self) -> list[str]:
        c = self.config
        cmd = [sys.executable, "-m", c.module, "--model-path", c.model_path]
        cmd += ["--host", c.host, "--port", str(c.port), "--tp-size", str(c.tp_size)]
        cmd += ["--base-gpu-id", str(c.base_gpu_id)]
        cmd += ["--mem-fraction-static", str(c.mem_fraction_static)]
        if c.enable_memory_saver:
            cmd.append("--enable-memory-saver")
        if c.skip_tokenizer_init:
            cmd.append("--skip-tokenizer-init")
        backend = self.attention_backend()
        if backend:
            cmd += ["--attention-backend", backend]
        return cmd + list(c.extra_args)

    def attention_backend(self) -> str:
        """The `--attention-backend` to pass, "" for none (see `SGLangServerConfig.attention_backend`)."""
        c = self.config
        if c.attention_backend != "auto" or any(a.split("=")[0] == "--attention-backend" for a in c.extra_args):
            return "" if c.attention_backend == "auto" else c.attention_backend
        python_path = c.env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        for folder in [*python_path.split(os.pathsep), *sys.path]:
            kernel = os.path.join(folder or ".", "sgl_kernel")
            if os.path.isfile(os.path.join(kernel, "__init__.py")):
                return "" if glob.glob(os.path.join(kernel, "flash_ops*")) else "triton"
        return ""

    def statistics(self) -> ServerStatistics:
        running = self._run is not None and self._run.process.returncode is None
        return ServerStatistics(
            running=running,
            pid=self.pid,
            starts=self._starts,
            restarts=self._restarts,
            crashes=self._crashes,
        )

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - self.config.log_tail_bytes))
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return "(no log)"

    async def __aenter__(self) -> SGLangServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with anyio.CancelScope(shield=True):
            await self.stop()

    async def start(self) -> None:
        """Launch and return once healthy; on any failure the process group is killed."""
        async with self._lock:
            await self._start_locked()

    async def stop(self) -> None:
        """SIGTERM the process group, SIGKILL after the grace period; shielded from cancellation."""
        with anyio.CancelScope(shield=True):
            async with self._lock:
                await self._stop_locked()

    async def restart(self) -> None:
        async with self._lock:
            await self._stop_locked()
            self._restarts += 1
            await self._start_locked()

    async def supervise(self) -> None:
        """Watch the server; restart it when it exits on its own, up to `max_restarts` times in
        all, then raise `SGLangServerError` (which cancels the caller's task group). Returns when
        the server is stopped on purpose."""
        while True:
            run = self._run
            if run is None:
                return
            await run.process.wait()
            async with self._lock:
                if self._run is not run:
                    continue  # restarted or stopped by someone else meanwhile
                await self._recover_locked(run)

    # ------------------------------------------------------------------------------------------

    async def _start_locked(self) -> None:
        if self._run is not None:
            raise SGLangServerError(f"server on port {self.config.port} is already running")
        if not port_free(self.config.host, self.config.port):
            # Otherwise a stale server on the port would answer our health probes.
            raise SGLangServerError(f"port {self.config.port} on {self.config.host} is in use")
        self._run = _Run(await self._spawn())
        self._starts += 1
        try:
            await self._wait_healthy(self._run.process)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._stop_locked()
            raise

    async def _spawn(self) -> Process:
        env = dict(os.environ)
        if self.config.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.config.cuda_visible_devices
        env.update(self.config.env)
        os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== launching: {shlex.join(self.command)}\n".encode())
            log.flush()
            return await anyio.open_process(
                lifeline_argv(self.command),  # a kill -9 of this process must not leave the server on its GPUs
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: one signal reaches every child
            )

    async def _wait_healthy(self, process: Process) -> None:
        config = SGLangClientConfig(
            base_url=self.base_url,
            health_timeout_s=self.config.health_timeout_s,
            connect_timeout_s=min(5.0, self.config.health_timeout_s),
        )
        async with SGLangClient(config) as client:
            with anyio.move_on_after(self.config.startup_timeout_s):
                while process.returncode is None:
                    if await client.health_generate():
                        return
                    await anyio.sleep(self.config.health_poll_interval_s)
                raise SGLangServerError(
                    f"SGLang server on port {self.config.port} exited with code "
                    f"{process.returncode} before it became healthy; log {self.log_path} "
                    f"ends with:\n{self.log_tail()}"
                )
        raise SGLangServerError(
            f"SGLang server on port {self.config.port} did not answer /health_generate within "
            f"{self.config.startup_timeout_s:.0f}s; log {self.log_path} ends with:\n"
            f"{self.log_tail()}"
        )

    async def _stop_locked(self) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        run.stopping = True
        with anyio.CancelScope(shield=True):
            await terminate_group(run.process, self.config.shutdown_grace_s)

    async def _recover_locked(self, run: _Run) -> None:
        """The current process exited without being asked: restart it, or give up."""
        self._crashes += 1
        code = run.process.returncode
        await self._stop_locked()  # members of the group may have outlived the leader
        last = f"exited with code {code}"
        while self._crashes <= self.config.max_restarts:
            self._restarts += 1
            try:
                await self._start_locked()
                return
            except SGLangServerError as exc:
                self._crashes += 1
                last = str(exc)
        raise SGLangServerError(
            f"SGLang server on port {self.config.port} crashed {self._crashes} times "
            f"(max_restarts={self.config.max_restarts}); last: {last}\n"
            f"log {self.log_path} ends with:\n{self.log_tail()}"
        )


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


async def terminate_group(process: Process, grace_s: float) -> None:
    """SIGTERM the process group, wait up to `grace_s` for the leader, then SIGKILL the group
    (also members that outlived a leader that exited) and wait, bounded, until it is gone."""
    pgid = process.pid  # start_new_session: the leader's pid is the group id
    _signal_group(pgid, signal.SIGTERM)
    with anyio.move_on_after(grace_s):
        await process.wait()
    _signal_group(pgid, signal.SIGKILL)
    await process.wait()
    with anyio.move_on_after(_GROUP_GONE_WAIT_S):
        while _signal_group(pgid, 0) and _group_has_live_member(pgid):
            await anyio.sleep(0.02)


_GROUP_GONE_WAIT_S = 5.0


def _group_has_live_member(pgid: int) -> bool:
    """Whether a non-zombie process is in the group (zombies hold no memory; init reaps them
    when it gets to it). Without /proc, assume yes."""
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return True
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def _signal_group(pgid: int, signum: int) -> bool:
    """Signal every process of the group; False once the group no longer exists."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):  # PermissionError: id reused by another user
        return False
    return True
