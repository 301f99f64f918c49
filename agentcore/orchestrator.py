"""The orchestrator: many trajectories at once in one anyio task-group tree.

    feed (WorkItem: task, group_id, n samples)
      │  feeder: expands items into samples, skips (group_id, index) already stored
      ▼
    samples ── bounded stream (size = workers) ─────────────────────────────┐
      │                                                                     │
      ▼  W rollout workers, each:                                           │ backpressure:
         open workspace+tools ─► RolloutRunner.run ─► scorer ─► store       │ every stream is
      │                (engine via `model_slots`; kernel tools via          │ bounded, workers
      │                 `compile_slots` and `gpu_slots` limiters)           │ are a fixed count
      ▼                                                                     │
    results ── bounded stream ──► assembler: n samples per group_id ────────┘
                                      │
                                      ▼
                       sink: bounded stream of TrajectoryGroup ──► consumer (learner, bench)

As each group's samples go out, the scorer's `warm(task)` starts in the background (a reference
compile the group's scores will need, begun while its rollouts run; cancelled once every group is
done).

What it is: scheduling, isolation and accounting. One failing trajectory becomes a trajectory
with status FAILED (logged with its traceback), never a cancelled sibling. Aborted trajectories
(shutdown, stragglers) are passed on but not stored, so a resumed run redoes them.
What it is not: the turn loop (`agentcore.rollout`), tools or scoring.

Example:
    orch = Orchestrator(runner=runner, tools=tools_factory, store=store, config=cfg)
    send, recv = anyio.create_memory_object_stream[TrajectoryGroup](4)
    async with anyio.create_task_group() as tg:
        tg.start_soon(orch.run, feed, send)
        async with recv:
            async for group in recv: ...
"""

from __future__ import annotations

import logging
import time
import traceback
import uuid
from collections import Counter
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import AsyncIterable, Iterable, Protocol

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream, TaskGroup
from msgspec import Struct

from agentcore.engine import Engine, Generation, SamplingParams
from agentcore.kernel_env import KernelEnv
from agentcore.rollout import RolloutIds, RolloutRunner, Tools
from agentcore.store import TrajectoryStore
from agentcore.types import (
    CompileResult,
    ProfileResult,
    Status,
    Task,
    Timings,
    Trajectory,
    TrajectoryGroup,
    VerifyResult,
)

log = logging.getLogger(__name__)


class OrchestratorConfig(Struct, frozen=True, kw_only=True):
    workers: int = 256
    """Concurrent trajectories (rollout workers)."""
    model_slots: int = 256
    """Concurrent requests to the model server(s)."""
    compile_slots: int = 16
    """Concurrent compile tool calls."""
    gpu_slots: int = 8
    """Concurrent verify/profile tool calls (one per verification GPU)."""
    results_buffer: int = 64
    """Finished trajectories waiting for the group assembler."""
    progress_every_s: float = 30.0
    """`cuda-agent train` logs a batch's progress (trajectories, turns, limiters, GPU queue) this
    often; 0: never."""


class WorkItem(Struct, frozen=True, kw_only=True):
    task: Task
    group_id: str
    samples: int = 1


class Sample(Struct, frozen=True, kw_only=True):
    task: Task
    group_id: str
    index: int


class ToolsFactory(Protocol):
    """Opens a fresh workspace and its tools for one trajectory; closing it cleans up."""

    def open(self, task: Task, trajectory_id: str) -> AbstractAsyncContextManager[Tools]: ...


class Scorer(Protocol):
    """The trusted final evaluation of a finished trajectory's workspace (rewards)."""

    async def score(self, trajectory: Trajectory, tools: Tools, task: Task) -> Trajectory: ...

    async def warm(self, task: Task) -> None:
        """Called once as each group of `task` starts, in the background, while its rollouts run:
        work every score of the task needs (such as its reference's compile), begun early. It may
        be cancelled once the run's groups are all done; its failures are logged, never raised."""
        ...


class LimiterStats(Struct, frozen=True, kw_only=True):
    borrowed: int
    total: int
    waiting: int


class OrchestratorStats(Struct, frozen=True, kw_only=True):
    started: int
    finished: int
    in_flight: int
    by_status: dict[str, int]
    turns: int
    generated_tokens: int
    groups_emitted: int
    samples_waiting: int
    results_waiting: int
    limiters: dict[str, LimiterStats]
    elapsed_s: float


class _LimitedEngine:
    """The engine behind the `model_slots` limiter."""

    def __init__(self, engine: Engine, limiter: anyio.CapacityLimiter):
        self.engine, self.limiter = engine, limiter
        self.requests = self.tokens = 0

    async def generate(self, input_ids, params: SamplingParams, *, session_id: str) -> Generation:
        async with self.limiter:
            gen = await self.engine.generate(input_ids, params, session_id=session_id)
        self.requests += 1
        self.tokens += len(gen.token_ids)
        return gen


class LimitedKernelEnv:
    """A KernelEnv whose compile calls go through `compile_slots` and verify/profile calls
    through `gpu_slots`."""

    def __init__(self, env: KernelEnv, compile_slots: anyio.CapacityLimiter, gpus: anyio.CapacityLimiter):
        self.env, self.compile_slots, self.gpus = env, compile_slots, gpus

    async def compile(self, workspace: Path, task: Task) -> CompileResult:
        async with self.compile_slots:
            return await self.env.compile(workspace, task)

    async def verify(self, workspace: Path, task: Task) -> VerifyResult:
        async with self.gpus:
            return await self.env.verify(workspace, task)

    async def profile(self, workspace: Path, task: Task) -> ProfileResult:
        async with self.gpus:
            return await self.env.profile(workspace, task)


def _limiter_stats(limiter: anyio.CapacityLimiter) -> LimiterStats:
    s = limiter.statistics()
    return LimiterStats(borrowed=s.borrowed_tokens, total=int(s.total_tokens), waiting=s.tasks_waiting)


class Resources:
    """The named CapacityLimiters of one run: model-server slots, compile slots, GPUs."""

    def __init__(self, config: OrchestratorConfig):
        self.model_slots = anyio.CapacityLimiter(config.model_slots)
        self.compile_slots = anyio.CapacityLimiter(config.compile_slots)
        self.gpu_slots = anyio.CapacityLimiter(config.gpu_slots)

    def kernel_env(self, env: KernelEnv) -> LimitedKernelEnv:
        """Wrap a kernel environment so its calls go through these limiters."""
        return LimitedKernelEnv(env, self.compile_slots, self.gpu_slots)

    def statistics(self) -> dict[str, LimiterStats]:
        names = ("model_slots", "compile_slots", "gpu_slots")
        return {name: _limiter_stats(getattr(self, name)) for name in names}


class Orchestrator:
    """Runs WorkItems through rollout workers into TrajectoryGroups (see module docstring)."""

    def __init__(
        self,
        *,
        runner: RolloutRunner,
        tools: ToolsFactory,
        config: OrchestratorConfig = OrchestratorConfig(),
        resources: Resources | None = None,
        store: TrajectoryStore | None = None,
        scorer: Scorer | None = None,
    ):
        self.config, self.tools, self.store, self.scorer = config, tools, store, scorer
        self.resources = resources or Resources(config)
        self._engine = _LimitedEngine(runner.engine, self.resources.model_slots)
        self.runner = RolloutRunner(
            engine=self._engine,
            renderer=runner.renderer,
            parser=runner.parser,
            config=runner.config,
            opening=runner.opening,
        )
        self._aborts: dict[str, anyio.CancelScope] = {}
        self._status: Counter[str] = Counter()
        self._started = self._groups = 0
        self._samples_recv: ObjectReceiveStream | None = None
        self._results_recv: ObjectReceiveStream | None = None
        self._t0 = time.monotonic()

    # -- the task-group tree ----------------------------------------------------------------

    async def run(self, feed: AsyncIterable[WorkItem] | Iterable[WorkItem], sink: ObjectSendStream[TrajectoryGroup]) -> None:
        """Run every item of `feed` and send each finished group to `sink`; closes `sink`."""
        self._t0 = time.monotonic()
        done = self.store.keys() if self.store else set()
        prior = self.store.existing() if self.store else []
        samples_send, samples_recv = anyio.create_memory_object_stream[Sample](self.config.workers)
        results_send, results_recv = anyio.create_memory_object_stream[Trajectory](self.config.results_buffer)
        self._samples_recv, self._results_recv = samples_recv, results_recv
        sizes: dict[str, int] = {}
        async with sink, anyio.create_task_group() as tg, anyio.create_task_group() as warming:
            tg.start_soon(self._feeder, feed, samples_send, done, sizes, warming)
            async with samples_recv, results_send:
                for _ in range(self.config.workers):
                    tg.start_soon(self._worker, samples_recv.clone(), results_send.clone())
            await self._assembler(results_recv, sink, sizes, prior)
            warming.cancel_scope.cancel()  # every group is done: what a warm-up still waits for is not needed

    async def _feeder(self, feed, send: ObjectSendStream[Sample], done: set, sizes: dict[str, int],
                      warming: TaskGroup) -> None:
        async with send:
            async for item in _aiter(feed):
                sizes[item.group_id] = item.samples
                todo = [index for index in range(item.samples) if (item.group_id, index) not in done]
                if todo and self.scorer is not None:
                    warming.start_soon(self._warm, item.task)
                for index in todo:
                    await send.send(Sample(task=item.task, group_id=item.group_id, index=index))

    async def _warm(self, task: Task) -> None:
        try:
            await self.scorer.warm(task)
        except Exception as exc:  # noqa: BLE001 - the scores themselves do the work again and say why
            log.warning("warming the scorer for %s failed: %s", task.task_id, str(exc)[:300])

    async def _worker(self, recv: ObjectReceiveStream[Sample], send: ObjectSendStream[Trajectory]) -> None:
        async with recv, send:
            async for sample in recv:
                traj = await self._one(sample)
                self._account(traj)
                if self.store is not None and traj.status is not Status.ABORTED:
                    await self.store.append(traj)
                await send.send(traj)

    async def _one(self, sample: Sample) -> Trajectory:
        traj_id = f"{sample.group_id}/{sample.index}/{uuid.uuid4().hex[:8]}"
        ids = RolloutIds(trajectory_id=traj_id, group_id=sample.group_id, sample_index=sample.index)
        self._started += 1
        scope = self._aborts[traj_id] = anyio.CancelScope()
        try:
            async with self.tools.open(sample.task, traj_id) as tools:
                traj = await self.runner.run(sample.task, tools, ids, abort=scope)
                if self.scorer is not None and traj.status is not Status.ABORTED:
                    traj = await self.scorer.score(traj, tools, sample.task)
                return traj
        except Exception:
            log.exception("trajectory %s failed", traj_id)
            return _failed(ids, sample.task, traceback.format_exc(limit=8))
        finally:
            del self._aborts[traj_id]

    async def _assembler(self, recv, sink: ObjectSendStream[TrajectoryGroup], sizes: dict[str, int], prior: list[Trajectory]) -> None:
        pending: dict[str, list[Trajectory]] = {}
        for traj in prior:  # a resumed run completes groups started before the stop
            pending.setdefault(traj.group_id, []).append(traj)
        async with recv:
            async for traj in recv:
                members = pending.setdefault(traj.group_id, [])
                members.append(traj)
                if len(members) >= sizes.get(traj.group_id, 1):
                    del pending[traj.group_id]
                    members.sort(key=lambda t: t.sample_index)
                    group = TrajectoryGroup(group_id=traj.group_id, task_id=traj.task_id, trajectories=members)
                    self._groups += 1
                    await sink.send(group)

    # -- control and accounting -------------------------------------------------------------

    def abort(self, trajectory_id: str) -> bool:
        """End one running trajectory as ABORTED (a straggler); False if it is not running."""
        scope = self._aborts.get(trajectory_id)
        if scope is not None:
            scope.cancel()
        return scope is not None

    def abort_all(self) -> int:
        for scope in self._aborts.values():
            scope.cancel()
        return len(self._aborts)

    def _account(self, traj: Trajectory) -> None:
        self._status[traj.status.value] += 1

    def statistics(self) -> OrchestratorStats:
        finished = sum(self._status.values())
        return OrchestratorStats(
            started=self._started,
            finished=finished,
            in_flight=len(self._aborts),
            by_status=dict(self._status),
            turns=self._engine.requests,
            generated_tokens=self._engine.tokens,
            groups_emitted=self._groups,
            samples_waiting=_waiting(self._samples_recv),
            results_waiting=_waiting(self._results_recv),
            limiters=self.resources.statistics(),
            elapsed_s=time.monotonic() - self._t0,
        )


def _waiting(stream: ObjectReceiveStream | None) -> int:
    return 0 if stream is None else stream.statistics().current_buffer_used


async def _aiter(feed):
    if hasattr(feed, "__aiter__"):
        async for item in feed:
            yield item
    else:
        for item in feed:
            yield item


def _failed(ids: RolloutIds, task: Task, error: str) -> Trajectory:
    return Trajectory(
        trajectory_id=ids.trajectory_id,
        task_id=task.task_id,
        group_id=ids.group_id,
        sample_index=ids.sample_index,
        prompt_ids=[],
        response_ids=[],
        logprobs=[],
        loss_mask=[],
        turns=[],
        status=Status.FAILED,
        weight_version_min=-1,
        weight_version_max=-1,
        timings=Timings(),
        error=error,
    )


async def collect(orch: Orchestrator, items: Iterable[WorkItem], buffer: int = 16) -> list[TrajectoryGroup]:
    """Run `items` to completion and return their groups (tests, small runs)."""
    send, recv = anyio.create_memory_object_stream[TrajectoryGroup](buffer)
    groups: list[TrajectoryGroup] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(orch.run, items, send)
        async with recv:
            async for group in recv:
                groups.append(group)
    return groups
