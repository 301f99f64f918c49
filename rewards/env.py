"""The real KernelEnv: what the agent's `compile`, `verify` and `profile` tools call.

What it is: `RewardsKernelEnv` implements `agentcore.kernel_env.KernelEnv` with the static checks
(`rewards.static.checks`), the compile pool (`rewards.build.compile_pool`) and the GPU queue's `verify`
and `profile` handlers (`rewards.verify.verifier`, `rewards.timing.profile`). `open_kernel_env(config)` opens the
pool and the queue and yields the env; `agentcore.rollout_cmd` enters it as REAL_ENV.

What it is not: the final evaluation (`rewards.evaluate` snapshots the workspace and scores it,
timing through `time(..., paired=True)`); this env works on the agent's live workspace and its
results are only what the model sees. The `profile` tool times the candidate against baselines
measured once per task and says so in its answer (`rewards.timing.profile.CACHED_NOTE`). With
`lanes_per_gpu` above 1 the queue runs verify jobs side by side on a GPU and gives each profile
job its GPU alone (`rewards.queue.lanes.Dispatcher`).

A blocking static finding is a failed compile whose log lists the findings, so the agent sees
the category; `verify` and `profile` rebuild first (the pool's cache makes an unchanged
workspace a lookup) and refuse a workspace that does not build. A machine without a GPU can
compile; `verify` and `profile` raise NoGpuError there (broken infrastructure, not the model).

Example:
    async with open_kernel_env(EnvConfig(gpus=(0,))) as env:
        compiled = await env.compile(workspace_dir, task)
        checked = await env.verify(workspace_dir, task)
        timed = await env.profile(workspace_dir, task)
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import anyio
import msgspec
from msgspec import Struct

from agentcore.types import CompileResult, ProfileResult, Task, VerifyResult
from rewards.build.compile_pool import Build, CompileConfig, CompilePool
from rewards.build.plan import FIXED_FILES, TEMPLATE_DIR
from rewards.queue.gpu_queue import GpuQueue, GpuQueueConfig, count_gpus
from rewards.static.checks import check_workspace, file_digest
from rewards.timing.baselines import Baselines, task_sha256
from rewards.timing.profile import COMPILE_HANDLER, COMPILE_KIND
from rewards.timing.profile import HANDLER as PROFILE_HANDLER
from rewards.timing.profile import (
    Profile,
    ProfileConfig,
    profile_workspace,
    reference_artifacts,
    to_profile_result,
)
from rewards.verdict import Rules, Verdict, VerdictStatus, hack_verdict
from rewards.verify.verifier import VerifyConfig, to_verify_result, verify_workspace

log = logging.getLogger(__name__)

SKILL_PATH = TEMPLATE_DIR.parent / "SKILL.md"


class EnvConfig(Struct, frozen=True, kw_only=True):
    gpus: tuple[int, ...] = ()
    """GPU indices for the queue; empty: every GPU torch sees (none: compile-only env)."""
    sandbox: Literal["auto", "on", "off"] = "auto"
    """Run GPU workers in bubblewrap; auto: when `bwrap` is on PATH."""
    lanes_per_gpu: int = 1
    """GPU worker processes per GPU (`GpuQueueConfig.lanes_per_gpu`): above 1, verify jobs run
    side by side on a GPU while profile jobs (the tool's and the final evaluation's timing) wait
    to have it alone. Verifications of GiB-sized inputs at once may not fit in GPU memory."""
    compile: CompileConfig = CompileConfig()
    """The compile pool."""
    queue: GpuQueueConfig = GpuQueueConfig()
    """The GPU queue; `gpus`, `sandbox`, `lanes_per_gpu` and the verify/profile handlers are filled
    in here."""
    verify: VerifyConfig = VerifyConfig()
    """Trials, tolerances and timeouts of the verify handler."""
    profile: ProfileConfig = ProfileConfig()
    """Timing config and timeouts of the profile handler."""
    job_deadline_s: float = 900.0
    """Watchdog deadline of one verify or profile job."""
    rules: Rules = "paper"
    """The rule set of the static checks and the verifier (rewards.verdict.Rules): "paper" (the
    training rule) or "kernelbench" (torch may do part of the work); named in every verdict."""
    warm_compile: bool = False
    """Build the compile pool's precompiled header and fixed binding in the background as the env
    opens (`CompilePool.warm`), while a training run starts its model: the first builds of a
    fresh machine then do not wait ~50 s of one core for them."""
    compile_cache_tasks: int = 64
    """Tasks whose reference's Inductor artifacts (a few MB each) the env keeps for paired
    profile jobs; the least recently used are dropped."""


class NoGpuError(RuntimeError):
    """verify or profile on an env opened without a GPU."""


def pristine_files(task: Task) -> dict[str, bytes]:
    """The files of a workspace the agent may not change: model.py from the task, SKILL.md and
    the fixed template files from agentcore's assets."""
    files = {"model.py": task.source.encode(), "SKILL.md": SKILL_PATH.read_bytes()}
    for name in FIXED_FILES:
        files[name] = (TEMPLATE_DIR / name).read_bytes()
    return files


def static_verdict(workspace: Path, task: Task, rules: Rules = "paper") -> Verdict | None:
    """A HACK verdict for blocking static findings (protected files included), else None."""
    originals = {name: file_digest(data) for name, data in pristine_files(task).items()}
    return hack_verdict(check_workspace(workspace, reference=task.source, originals=originals), rules)


class Prepared(Struct, frozen=True, kw_only=True):
    """A workspace checked and built: `verdict` is set when it must not run (hack or no build)."""

    build: Build | None = None
    verdict: Verdict | None = None
    inline: bool = False
    """A single-file load_inline solution (rewards.inline.prepare): verified on the default stream."""
    notes: tuple[str, ...] = ()
    """What the preparation read but did not build with (rewards.inline.prepare.with_notes)."""


class RewardsKernelEnv:
    """KernelEnv over a CompilePool and (optionally) a GpuQueue; see the module docstring.

    Example:
        env = RewardsKernelEnv(CompilePool(), queue=None)   # compile only, e.g. on a CPU box
        result = await env.compile(workspace_dir, task)
    """

    def __init__(self, pool: CompilePool, queue: GpuQueue | None, config: EnvConfig = EnvConfig()) -> None:
        self.pool, self.queue, self.config = pool, queue, config
        self.builds: dict[Path, Build] = {}  # last build per workspace path
        self.baselines: dict[str, Baselines] = {}  # per task source sha256; one entry per task
        self.compile_caches: OrderedDict[str, bytes] = OrderedDict()  # the reference's Inductor artifacts
        self._compiling: dict[str, anyio.Lock] = {}  # per task: its one reference compile job

    async def prepare(self, workspace: Path, task: Task) -> Prepared:
        """Static checks, then the build; remembers the build's artifact for the workspace."""
        hack = await anyio.to_thread.run_sync(static_verdict, workspace, task, self.config.rules)
        if hack is not None:
            return Prepared(verdict=hack)
        build = await self.pool.build(workspace)
        self.builds[Path(workspace).resolve()] = build
        if not build.result.ok:
            failed = Verdict(status=VerdictStatus.COMPILE_ERROR, message=build.result.log, rules=self.config.rules)
            return Prepared(build=build, verdict=failed)
        return Prepared(build=build)

    async def compile(self, workspace: Path, task: Task) -> CompileResult:
        prepared = await self.prepare(workspace, task)
        if prepared.build is None:
            return CompileResult(ok=False, log=_findings_log(prepared.verdict))
        return prepared.build.result

    async def verify(self, workspace: Path, task: Task) -> VerifyResult:
        prepared = await self.prepare(workspace, task)
        if prepared.verdict is not None:
            return to_verify_result(_before_run(prepared.verdict))
        verdict = await verify_workspace(self._queue(), workspace, task, prepared.build.artifact.so_path, "quick",
                                         config=self._verify_config(), deadline_s=self.config.job_deadline_s)
        return to_verify_result(verdict)

    async def profile(self, workspace: Path, task: Task) -> ProfileResult:
        prepared = await self.prepare(workspace, task)
        if prepared.verdict is not None:
            return ProfileResult(ok=False, message=_before_run(prepared.verdict).message)
        outcome = await self.time(workspace, task, prepared.build)
        return to_profile_result(outcome)

    async def time(self, workspace: Path, task: Task, build: Build, *, paired: bool = False,
                   gate: Callable[[], Awaitable[bool]] | None = None) -> Profile:
        """A profile job for a built workspace. Unpaired (the agent's tool): the task's baselines
        are measured once per env and sent back after. Paired (the final evaluation): all three
        timed together in the candidate's process; the reference's Inductor artifacts, recorded
        by the first job of the task that compiled it, go with later requests. `gate`: the job
        prepares beside other jobs and times only if it says True (`GpuQueue.submit`)."""
        key = task_sha256(task.source)
        if paired:
            await self.warm_reference(task)
        outcome = await profile_workspace(self._queue(), workspace, task, build.artifact.so_path,
                                          config=self.config.profile, deadline_s=self.config.job_deadline_s,
                                          baselines=None if paired else self.baselines.get(key), paired=paired,
                                          compile_cache=self._compile_cache(key) if paired else b"", gate=gate)
        if outcome.baselines is not None:
            self.baselines[key] = outcome.baselines
        if outcome.compile_cache:
            self._keep_compile_cache(key, outcome.compile_cache)
        return outcome

    async def warm_reference(self, task: Task) -> None:
        """The task's reference artifacts for paired timing, if this env keeps them and does not
        have them yet (`_compile_reference`); nothing without a GPU queue."""
        if self.queue is not None and self.config.profile.compile_cache:
            await self._compile_reference(task, task_sha256(task.source))

    async def _compile_reference(self, task: Task, key: str) -> None:
        """The task's reference artifacts from a job that shares its GPU, one job per task (the
        trajectories of a group that end together wait for it): the paired job has the GPU alone,
        and every other job of the machine waits while it compiles. A task whose job failed or
        recorded nothing (no generated kernel) is left to its paired jobs, as without this job."""
        first = key not in self._compiling
        async with self._compiling.setdefault(key, anyio.Lock()):
            if not first or self._compile_cache(key):
                return
            artifacts = await reference_artifacts(self._queue(), task, config=self.config.profile,
                                                  deadline_s=self.config.job_deadline_s)
            if artifacts:
                self._keep_compile_cache(key, artifacts)

    def _keep_compile_cache(self, key: str, artifacts: bytes) -> None:
        self.compile_caches[key] = artifacts
        self.compile_caches.move_to_end(key)
        while len(self.compile_caches) > self.config.compile_cache_tasks:
            self.compile_caches.popitem(last=False)

    def _compile_cache(self, key: str) -> bytes:
        if key in self.compile_caches:
            self.compile_caches.move_to_end(key)
        return self.compile_caches.get(key, b"")

    def spare_lane(self) -> bool:
        """Whether the GPU queue has a free lane no job waits for (`GpuQueue.spare_lane`)."""
        return self.queue is not None and self.queue.spare_lane()

    async def final_verdict(self, workspace: Path, task: Task, build: Build, *, inline: bool = False,
                            running: anyio.Event | None = None) -> Verdict:
        """Final-mode verification of a built workspace (rewards.evaluate); `inline`: a
        single-file solution, run on the default stream (VerifyConfig.harness_stream). `running`
        is set once its job has a lane."""
        config = self._verify_config(harness_stream="default") if inline else self._verify_config()
        verdict = await verify_workspace(self._queue(), workspace, task, build.artifact.so_path, "final",
                                         config=config, deadline_s=self.config.job_deadline_s, running=running)
        return msgspec.structs.replace(verdict, rules=self.config.rules)  # crashes and timeouts too

    def _verify_config(self, **changes) -> VerifyConfig:
        return msgspec.structs.replace(self.config.verify, rules=self.config.rules, **changes)

    def _queue(self) -> GpuQueue:
        if self.queue is None:
            raise NoGpuError("this machine has no GPU: verify and profile need one (compile works)")
        return self.queue


def _findings_log(verdict: Verdict) -> str:
    lines = [str(f) for f in verdict.findings if f.blocking]
    head = f"static checks rejected the workspace ({verdict.hack.value}); fix these before compiling:"
    return "\n".join([head, *lines])


def _before_run(verdict: Verdict) -> Verdict:
    """The verdict of a workspace that never reached the GPU, with a message for the agent."""
    if verdict.status is VerdictStatus.HACK:
        return Verdict(status=verdict.status, hack=verdict.hack, message=_findings_log(verdict),
                       findings=verdict.findings)
    return Verdict(status=verdict.status, message=f"the workspace does not build; run compile:\n{verdict.message}")


async def detect_gpus(config: EnvConfig) -> tuple[int, ...]:
    if config.gpus:
        return config.gpus
    try:
        return tuple(range(await count_gpus(config.queue.python)))
    except (OSError, ValueError, IndexError, subprocess.CalledProcessError):
        return ()


def queue_config(config: EnvConfig, gpus: tuple[int, ...]) -> GpuQueueConfig:
    sandbox = config.sandbox == "on" or (config.sandbox == "auto" and shutil.which(config.queue.bwrap_path) is not None)
    handlers = {"profile": PROFILE_HANDLER, COMPILE_KIND: COMPILE_HANDLER, **config.queue.handlers}
    return GpuQueueConfig(**{**_fields(config.queue), "gpus": gpus, "sandbox": sandbox, "handlers": handlers,
                             "lanes_per_gpu": config.lanes_per_gpu})


def _fields(struct: Struct) -> dict:
    return {name: getattr(struct, name) for name in struct.__struct_fields__}


@asynccontextmanager
async def open_kernel_env(config: EnvConfig = EnvConfig()) -> AsyncIterator[RewardsKernelEnv]:
    """The compile pool and, where GPUs exist, the GPU queue, for the lifetime of the block."""
    pool = await anyio.to_thread.run_sync(CompilePool, config.compile)
    async with anyio.create_task_group() as tg:
        if config.warm_compile:
            tg.start_soon(_warm, pool)
        gpus = await detect_gpus(config)
        if not gpus:
            yield RewardsKernelEnv(pool, None, config)
        else:
            async with GpuQueue(queue_config(config, gpus)) as queue:
                yield RewardsKernelEnv(pool, queue, config)
        tg.cancel_scope.cancel()  # a warm-up still running is not waited for


async def _warm(pool: CompilePool) -> None:
    """The pool's warm-up, whose failure is only logged: the build that needs the header reports
    the same error to whoever asked for it."""
    try:
        await pool.warm()
    except Exception as exc:  # noqa: BLE001 - a machine fault here belongs to the first build
        log.warning("compile warm-up failed (the first build will say why): %s", str(exc)[:300])


__all__ = ["EnvConfig", "NoGpuError", "Prepared", "RewardsKernelEnv", "open_kernel_env", "pristine_files",
           "static_verdict"]
