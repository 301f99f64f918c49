"""The driver's handle on the learner ranks: starts them, sends each command to every rank, and
stops them.

What it is: `LearnerGroup`, an async context manager owned by `cuda-agent train`. It launches
the ranks as one process group (`torchrun` over the learner GPUs, or a single `python -m
rl.learner.rank` for one rank), waits until every rank's HTTP server answers `/health` with this
start's launch id (a random token passed on the command line: another run's learner on the same
ports answers with its own, and the start fails at once), and then exposes the learner commands
(`step`, `sync_weights`, `save`, `load`, `release`, `resume`) and the ranks' engine URLs (each
rank serves SGLang's native API for its embedded engine).
What it is not: the training loop (`rl/train.py`), the rank itself (`rl/learner/rank.py`) or the
messages (`rl/learner/protocol.py`).

A command goes to all ranks at once and returns rank 0's reply; a rank that errs, or a
process group that dies, raises `LearnerError` with the rank's message and the log tail.

Example:
    async with LearnerGroup(cfg, run_dir) as learner:
        reply = await learner.step("ppo", samples, step=3)      # reply.metrics
        version = (await learner.sync_weights()).version
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import sys
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
import httpx
import msgspec
from anyio.abc import Process

from agentcore.lifeline import lifeline_argv
from agentcore.sglang.launcher import free_port, port_free, terminate_group
from rl.config import TrainConfig
from rl.learner.protocol import (
    HEALTH,
    INFO,
    LOAD,
    RELEASE,
    RESUME,
    SAVE,
    SHUTDOWN,
    STEP,
    SYNC,
    WAIT,
    Empty,
    InfoReply,
    LoadReply,
    LoadRequest,
    ReleaseRequest,
    Route,
    SaveReply,
    SaveRequest,
    StepReply,
    StepRequest,
    SyncReply,
    encode,
    encode_samples,
    failure_message,
)
from rl.samples import Sample

log = logging.getLogger("cuda-agent.learner")

STARTUP_TIMEOUT_S = 1800.0  # a 1.5B model on a cold machine: imports, init, FSDP, first compile
COMMAND_TIMEOUT_S = 7200.0

Reply = TypeVar("Reply")


class LearnerError(RuntimeError):
    """A learner rank failed a command or the rank processes died."""


class LearnerGroup:
    """The learner ranks of a run (see module docstring)."""

    def __init__(self, cfg: TrainConfig, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.world_size = max(1, len(cfg.layout.learner_gpus))
        self.port_base = cfg.layout.port_base or free_port_run(self.world_size)
        self.urls = [f"http://127.0.0.1:{self.port_base + r}" for r in range(self.world_size)]
        self.log_path = run_dir / "learner.log"
        self.launch_id = secrets.token_hex(8)  # names this start's ranks in their /health
        self._log_start = 0  # the log's size when these ranks started (a resumed run appends to it)
        self._process: Process | None = None
        self._ready = False  # every rank answered as ours: only then may aclose send them shutdown
        self._http: httpx.AsyncClient | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> LearnerGroup:
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(COMMAND_TIMEOUT_S, connect=10.0))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            self._log_start = logf.tell()
            self._process = await anyio.open_process(  # ranks die with this process, even on kill -9
                lifeline_argv(self.command()), env=self.environment(), stdout=logf, stderr=logf,
                start_new_session=True,
            )
        try:
            await self._wait_ready()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            if self._process is not None and self._process.returncode is None:
                if self._ready:  # before that a port may be another run's learner, not to be shut down
                    with anyio.move_on_after(10):
                        await self._post_all(SHUTDOWN, Empty(), check=False)
                await terminate_group(self._process, grace_s=20.0)
            if self._http is not None:
                await self._http.aclose()
            self._process = self._http = None
            self._ready = False

    def command(self) -> list[str]:
        args = ["-m", "rl.learner.rank", "--run-dir", str(self.run_dir), "--port-base", str(self.port_base),
                "--launch-id", self.launch_id]
        if self.world_size == 1:
            return [sys.executable, *args]
        master = free_port()
        return [
            sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={self.world_size}",
            "--master-addr=127.0.0.1", f"--master-port={master}", *args,
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.cfg.layout.cpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        else:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            env["CUDA_VISIBLE_DEVICES"] = learner_devices(self.cfg.layout.learner_gpus, visible)
        if self.world_size == 1:
            env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(free_port()))
        return env

    async def _wait_ready(self) -> None:
        with anyio.fail_after(STARTUP_TIMEOUT_S):
            pending = set(range(self.world_size))
            while pending:
                if self._process.returncode is not None:
                    raise LearnerError(f"learner ranks exited with {self._process.returncode}: {self.rank_errors()}\n"
                                       f"{self.log_tail()}")
                for rank in list(pending):
                    if await self._answers_as_ours(rank):
                        pending.discard(rank)
                if pending:
                    await anyio.sleep(0.5)
        self._ready = True
        log.info("learner: %d rank(s) ready at %s", self.world_size, ", ".join(self.urls))

    async def _answers_as_ours(self, rank: int) -> bool:
        """Whether `rank`'s port answers `/health` with this start's launch id. Another run's
        learner there raises at once; anything else (nothing listening yet, a server that is no
        learner) is not ready, and a rank that cannot bind exits saying so."""
        try:
            r = await self._http.get(self.urls[rank] + HEALTH.path, timeout=2.0)
            if r.status_code != 200:
                return False
            health = HEALTH.decode_reply(r.content)
        except (httpx.HTTPError, msgspec.DecodeError):
            return False
        if health.launch_id != self.launch_id:
            raise LearnerError(f"learner rank {rank}'s port {self.port_base + rank} is served by another run's learner "
                               f"(run dir {health.run_dir}): set layout.port_base to a free range (0 picks one)")
        return True

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self._log_lines()[-lines:]) or "(no learner log)"

    def rank_errors(self, last: int = 3) -> str:
        """This start's last ERROR lines of the ranks (`rl/learner/rank.py` logs them as "... ERROR
        rank: ..."), without their time stamps: torchrun's failure summary alone fills the log's tail."""
        marker = " ERROR rank: "
        errors = [line.split(marker, 1)[1] for line in self._log_lines(self._log_start) if marker in line]
        return "; ".join(errors[-last:]) or "no rank logged an error (see the log's tail)"

    def _log_lines(self, start: int = 0) -> list[str]:
        """The learner log's lines from byte `start` on."""
        try:
            with open(self.log_path, "rb") as log_file:
                log_file.seek(start)
                return log_file.read().decode(errors="replace").splitlines()
        except OSError:
            return []

    # -- commands -----------------------------------------------------------------------------

    async def step(self, kind: Literal["ppo", "sft", "value"], samples: list[Sample], *, step: int,
                   lr_scale: float = 1.0) -> StepReply:
        """One `kind` update (ppo | sft | value) on the global batch `samples`, learning rates
        times `lr_scale`."""
        batches = self.run_dir / "batches"
        batches.mkdir(exist_ok=True)
        path = batches / f"{kind}_{step:06d}.msgpack"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(encode_samples(samples))
        tmp.replace(path)
        reply = await self._post_all(STEP, StepRequest(kind=kind, batch_path=str(path), lr_scale=lr_scale))
        path.unlink(missing_ok=True)
        return reply

    async def sync_weights(self) -> SyncReply:
        """Push the actor's weights to the engines: every rank's embedded engine, or (with
        `weight_sync.mode=sglang_tensor`) every rank's colocated SGLang server, or else export
        them for `update_weights_from_disk` (the reply then names the directory as `path`)."""
        return await self._post_all(SYNC, Empty())

    async def save(self, step: int, extra: dict[str, Any], *, export: bool) -> SaveReply:
        """Save (and export) on every rank; with `checkpoint.background` this returns once the
        state is staged. Seconds of the blocking part and of the previous background write."""
        return await self._post_all(SAVE, SaveRequest(step=step, extra=extra, export=export))

    async def wait_saved(self) -> SaveReply:
        """Wait until a background save in flight is committed (raises if it failed)."""
        return await self._post_all(WAIT, Empty())

    async def load(self, source: Path | None = None) -> LoadReply:
        """Restore the latest checkpoint of `source` (default: this run); `found` is false when there is none."""
        return await self._post_all(LOAD, LoadRequest(run_dir=str(source or self.run_dir)))

    async def release(self, *, weights: bool = False) -> None:
        """Colocated engines free their memory for training: KV cache (and CUDA graphs); with
        `weights` a colocated SGLang server frees its weights too (the next sync restores them)."""
        await self._post_all(RELEASE, ReleaseRequest(weights=weights))

    async def resume(self) -> None:
        """Give back whatever `release` freed and the weight sync did not restore."""
        await self._post_all(RESUME, Empty())

    async def info(self) -> InfoReply:
        return await self._request(self.urls[0], INFO, Empty(), check=True)

    async def _post_all(self, route: Route[Any, Reply], request: Any, *, check: bool = True) -> Reply:
        answers: list[Reply | None] = [None] * self.world_size
        failed: list[LearnerError] = []

        async def one(rank: int, scope: anyio.CancelScope) -> None:
            try:
                answers[rank] = await self._request(self.urls[rank], route, request, check=check)
            except LearnerError as exc:
                failed.append(exc)
                scope.cancel()  # the other ranks may wait forever in the failed collective

        async with anyio.create_task_group() as tg:
            for rank in range(self.world_size):
                tg.start_soon(one, rank, tg.cancel_scope)
        if failed:  # one LearnerError for the caller to catch, not an exception group
            raise failed[0]
        return answers[0]

    async def _request(self, url: str, route: Route[Any, Reply], request: Any, *, check: bool) -> Reply | None:
        """`request` to one rank; its reply, or None for a failure when not `check`."""
        body = encode(request) if route.method == "POST" else None
        try:
            r = await self._http.request(route.method, url + route.path, content=body,
                                         headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            if not check:
                return None
            raise LearnerError(f"{route.path} on {url}: {exc!r}\n{self.log_tail()}") from None
        if r.status_code != 200:
            if not check:
                return None
            raise LearnerError(f"{route.path} on {url} failed ({r.status_code}): {failure_message(r.content)}\n"
                               f"{self.log_tail()}")
        return route.decode_reply(r.content)


def learner_devices(gpus: tuple[int, ...], visible: str | None) -> str:
    """CUDA_VISIBLE_DEVICES of the ranks: `gpus` index the GPUs this process sees, through its own
    CUDA_VISIBLE_DEVICES when set (a benchmark's child pinned to one GPU, Slurm)."""
    devices = [d.strip() for d in visible.split(",")] if visible else None
    return ",".join(devices[g] if devices else str(g) for g in gpus)


def free_port_run(n: int, start: int | None = None) -> int:
    """First port p >= start with p .. p+n-1 all free on loopback. The ranks bind later, so two
    runs started at once could both find the same ports free: `start` is drawn at random (20000 to
    50000) unless given, and the search wraps around once."""
    start = random.SystemRandom().randrange(20000, 50000) if start is None else start
    step = max(n, 1)
    for base in [*range(start, 60000 - step, step), *range(20000, start, step)]:
        if all(port_free("127.0.0.1", base + i) for i in range(n)):
            return base
    raise LearnerError("no free loopback ports for the learner ranks")

