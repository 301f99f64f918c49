"""Do the eager and torch.compile baselines reproduce? A second, independent measurement per problem.

What it is: `recheck_baselines(config)` (behind `cuda-agent bench --recheck-baselines`) times the
baselines of every selected problem again with rewards' own "baseline" GPU-queue job
(`rewards.timing.baselines.measure_baselines`, with the request the profile job builds from
`rewards.env.EnvConfig().profile`, the disk cache bypassed) on a GPU queue of its own that forks a
fresh process per job (`fork_per_job`): no timing state of the first measurement survives into the
second (the compile caches do, `CACHE_DIR`: both time the same compiled kernels).
The first measurement is the run's own (the problem's record has eager_ms and compile_ms) or, where
the run timed nothing (no candidate reached profiling, e.g. rejected hacks), one more baseline job.
One `RecheckRow` per problem goes to `OUT/baseline_recheck.jsonl` (fsynced; a rerun measures only
problems without a good row) with both times and the ratios second / first; `summarize_recheck`
gives the share within 10% (KernelBench's tolerance for a reproducible time, as `bench.system.timing`:
max / min <= 1.10) and the worst problem, for the report.

What it is not: new timing code (it reuses the baseline job) or a check of the candidates' times.

Example:
    rows = await recheck_baselines(BenchConfig(levels=(1,), problem_ids=(19, 21), out_dir="runs/b"))
    summarize_recheck(rows).both_within
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import anyio
import msgspec
from msgspec import Struct

from bench.kernelbench.config import BenchConfig
from bench.kernelbench.problems import Problem, default_problems_path, load_problems
from bench.system.records import read_records

if TYPE_CHECKING:
    from rewards.queue.gpu_queue import GpuQueue, GpuQueueConfig

log = logging.getLogger("cuda-agent.bench")

RECHECK_FILE = "baseline_recheck.jsonl"
CACHE_DIR = "recheck-compile-cache"
"""Inductor's and Triton's caches of the recheck queue, under OUT: written by the reference code
only (no candidate runs in this queue), so a fresh process reuses the compiled kernels, the
launchers built with gcc and the FX graphs instead of compiling them again. What is timed is the
same compiled code either way; the caches only save compile time."""
PRELOAD = ("torch", "torch._dynamo")
"""Imported once by the zygote, not by every job's process (~2-3 s each). Not Inductor: a zygote
that imported `torch._inductor.compile_fx` left every forked job "Cannot re-initialize CUDA in
forked subprocess" (H200, torch 2.11)."""
MAX_COMPILE_THREADS = 8
"""Inductor compile processes per job at most (the machine's cores shared among the lanes): the
16 L3 problems of one recheck took 13-54 s each with 8 on one H200, 20-150 s with 1 on four."""
AGREE_RATIO = 1.10
"""Two times agree when the larger is at most 10% above the smaller."""
BASELINE_HANDLER = "rewards.timing.baselines:baseline"


class NoGpuError(RuntimeError):
    """A recheck was asked for where torch sees no GPU."""


class RecheckRow(Struct, frozen=True, kw_only=True):
    """One problem's two baseline measurements (ms) and their ratios (second / first)."""

    level: int
    problem_id: int
    name: str
    first_from: Literal["run", "recheck"]
    """run: the first times are the benchmark record's; recheck: a baseline job measured them too."""
    eager_ms_first: float | None = None
    compile_ms_first: float | None = None
    eager_ms_second: float | None = None
    compile_ms_second: float | None = None
    eager_ratio: float | None = None
    compile_ratio: float | None = None
    method: str = ""
    """Timing method of the recheck's measurements (cuda_graph, cuda_event+l2_flush)."""
    eager_cv_first: float | None = None
    eager_cv_second: float | None = None
    compile_cv_first: float | None = None
    compile_cv_second: float | None = None
    """std / mean of each measurement's samples (None for the run's first): small spreads with
    medians far apart say the process, not the noise, made the difference."""
    gpu: int = -1
    """GPU lane of the second measurement."""
    gpu_first: int = -1
    """GPU lane of the first one when the recheck made it (-1: the run's)."""
    wall_s: float = 0.0
    """Seconds the recheck's job(s) of this problem took, compile included."""
    error: str | None = None
    """Why a measurement failed (job status and stderr tail); None when both exist."""

    @property
    def key(self) -> tuple[int, int]:
        return (self.level, self.problem_id)


class Worst(Struct, frozen=True, kw_only=True):
    name: str
    level: int
    ratio: float


class RecheckSummary(Struct, frozen=True, kw_only=True):
    """Agreement of the two measurements over the problems measured twice."""

    problems: int
    """Problems with both measurements."""
    errors: int
    first_from_run: int
    agree_ratio: float = AGREE_RATIO
    eager_within: float | None = None
    """Share of problems whose eager times agree (max / min <= agree_ratio)."""
    compile_within: float | None = None
    both_within: float | None = None
    """Share whose eager and compile times both agree: the issue's figure."""
    worst_eager: Worst | None = None
    """The problem whose ratio is farthest from 1 (either direction)."""
    worst_compile: Worst | None = None


def agrees(ratio: float | None, limit: float = AGREE_RATIO) -> bool:
    return ratio is not None and ratio > 0 and max(ratio, 1 / ratio) <= limit


def _ratio(second: float | None, first: float | None) -> float | None:
    return second / first if second and first else None


# ---------------------------------------------------------------------------------------------
# The file


_row_decoder = msgspec.json.Decoder(RecheckRow)


def append_row(path: Path, row: RecheckRow) -> None:
    """Append one line and fsync it (a killed recheck loses at most the problems in flight)."""
    with open(path, "ab") as f:
        f.write(msgspec.json.encode(row) + b"\n")
        f.flush()
        os.fsync(f.fileno())


def read_recheck(path: str | Path) -> list[RecheckRow]:
    """The rows of `path`, the last per problem; a torn line is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    latest: dict[tuple[int, int], RecheckRow] = {}
    for line in path.read_bytes().splitlines():
        try:
            row = _row_decoder.decode(line)
        except msgspec.DecodeError:
            continue
        latest[row.key] = row
    return sorted(latest.values(), key=lambda r: r.key)


def summarize_recheck(rows: Sequence[RecheckRow], limit: float = AGREE_RATIO) -> RecheckSummary:
    good = [r for r in rows if r.error is None and r.eager_ratio and r.compile_ratio]
    share = lambda ok: sum(ok) / len(good) if good else None
    worst = lambda field: max(
        (Worst(name=r.name, level=r.level, ratio=getattr(r, field)) for r in good),
        key=lambda w: abs(math.log(w.ratio)), default=None)
    return RecheckSummary(
        problems=len(good), errors=sum(r.error is not None for r in rows),
        first_from_run=sum(r.first_from == "run" for r in good), agree_ratio=limit,
        eager_within=share([agrees(r.eager_ratio, limit) for r in good]),
        compile_within=share([agrees(r.compile_ratio, limit) for r in good]),
        both_within=share([agrees(r.eager_ratio, limit) and agrees(r.compile_ratio, limit) for r in good]),
        worst_eager=worst("eager_ratio"), worst_compile=worst("compile_ratio"))


# ---------------------------------------------------------------------------------------------
# Measuring


class _Times(Struct, frozen=True, kw_only=True):
    eager_ms: float | None = None
    compile_ms: float | None = None
    eager_cv: float | None = None
    compile_cv: float | None = None
    method: str = ""
    gpu: int = -1
    error: str | None = None


async def default_queue_config(config: BenchConfig) -> GpuQueueConfig:
    """The benchmark's GPU queue config (GPUs, sandbox) with the baseline handler and a fresh
    process per job. Raises when no GPU is seen: a recheck has nothing to measure on."""
    from msgspec.structs import replace

    from rewards.env import EnvConfig, detect_gpus, queue_config

    env = EnvConfig(gpus=config.gpus)
    gpus = await detect_gpus(env)
    if not gpus:
        raise NoGpuError("--recheck-baselines needs a GPU (torch sees none)")
    queue = queue_config(env, gpus)
    cache = Path(config.out_dir).resolve() / CACHE_DIR
    # Cold Inductor compiles of L3 models take minutes in one thread; a job's child owns its pool.
    threads = max(1, min(MAX_COMPILE_THREADS, (os.cpu_count() or 1) // len(gpus)))
    return replace(queue, fork_per_job=True, handlers={**queue.handlers, "baseline": BASELINE_HANDLER},
                   preload=PRELOAD, writable_paths=(str(cache),), compile_threads=threads,
                   env={"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton")})


def _job(problem: Problem, attempt: int):
    from rewards.env import EnvConfig
    from rewards.queue.jobs import Job, encode
    from rewards.timing.baselines import BaselineRequest

    env = EnvConfig()
    c = env.profile  # the request the profile job builds: the run's baselines were timed with it
    request = BaselineRequest(source=problem.code, name=problem.task_id, init_seed=c.init_seed,
                              input_seed=c.input_seed, policy=c.policy, config=c.timing, cache_dir="")
    return Job(job_id=f"baseline-{problem.task_id}-{attempt}-{uuid.uuid4().hex[:8]}", kind="baseline",
               payload=encode(request), deadline_s=env.job_deadline_s)


async def _measure(queue: GpuQueue, problem: Problem, attempt: int) -> _Times:
    from rewards.queue.jobs import JobStatus, decode
    from rewards.timing.baselines import Baselines

    result = await queue.submit(_job(problem, attempt))
    if result.status is not JobStatus.OK:
        return _Times(gpu=result.gpu, error=f"baseline job {result.status.value}: {result.error[-1500:]}")
    b = decode(result.value, Baselines)
    eager, compiled = b.eager.measurement.timing, b.compiled.measurement.timing
    return _Times(eager_ms=eager.median_ms, compile_ms=compiled.median_ms, eager_cv=_cv(eager),
                  compile_cv=_cv(compiled), method=b.method, gpu=result.gpu)


def _cv(timing) -> float | None:
    return round(timing.std_ms / timing.mean_ms, 5) if timing.mean_ms > 0 else None


async def _recheck_one(queue: GpuQueue, problem: Problem, first: tuple[float, float] | None) -> RecheckRow:
    started = time.monotonic()
    base = dict(level=problem.level, problem_id=problem.problem_id, name=problem.name)
    if first is None:
        one = await _measure(queue, problem, 1)
        if one.error:
            return RecheckRow(**base, first_from="recheck", gpu=one.gpu, error=one.error,
                              wall_s=round(time.monotonic() - started, 3))
        first = (one.eager_ms, one.compile_ms)
        first_from, gpu_first, cv_first = "recheck", one.gpu, (one.eager_cv, one.compile_cv)
    else:
        first_from, gpu_first, cv_first = "run", -1, (None, None)
    two = await _measure(queue, problem, 2)
    return RecheckRow(**base, first_from=first_from, eager_ms_first=first[0], compile_ms_first=first[1],
                      eager_ms_second=two.eager_ms, compile_ms_second=two.compile_ms,
                      eager_ratio=_ratio(two.eager_ms, first[0]), compile_ratio=_ratio(two.compile_ms, first[1]),
                      eager_cv_first=cv_first[0], compile_cv_first=cv_first[1], eager_cv_second=two.eager_cv,
                      compile_cv_second=two.compile_cv, method=two.method, gpu=two.gpu, gpu_first=gpu_first,
                      error=two.error,
                      wall_s=round(time.monotonic() - started, 3))


def _firsts(config: BenchConfig, out: Path) -> dict[tuple[int, int], tuple[float, float]]:
    """The run's baseline times per problem (records of this checkpoint that have both)."""
    return {(r.level, r.problem_id): (r.eager_ms, r.compile_ms) for r in read_records(out / "records.jsonl")
            if r.checkpoint_step == config.checkpoint_step and r.eager_ms and r.compile_ms}


async def recheck_baselines(config: BenchConfig, *, queue_config: GpuQueueConfig | None = None) -> list[RecheckRow]:
    """Measure what is missing from OUT/baseline_recheck.jsonl; returns the selected problems'
    rows. `queue_config` replaces `default_queue_config` (tests fake the baseline handler)."""
    from rewards.queue.gpu_queue import GpuQueue

    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RECHECK_FILE
    problems = load_problems(config.problems_path or default_problems_path(), config.levels,
                             config.problem_ids).problems
    done = {r.key for r in read_recheck(path) if r.error is None}
    todo = [p for p in problems if (p.level, p.problem_id) not in done]
    if todo:
        firsts = _firsts(config, out)
        queue_config = queue_config or await default_queue_config(config)
        async with GpuQueue(queue_config) as queue:
            await _measure_all(queue, todo, firsts, path, lanes=len(queue.statistics().lanes))
    selected = {(p.level, p.problem_id) for p in problems}
    return [r for r in read_recheck(path) if r.key in selected]


async def _measure_all(queue: GpuQueue, todo: list[Problem], firsts: dict, path: Path, lanes: int) -> None:
    """One measuring task per GPU lane, fed from a bounded stream of problems."""
    send, recv = anyio.create_memory_object_stream[Problem](lanes)

    async def measurer(problems) -> None:
        async with problems:
            async for problem in problems:
                row = await _recheck_one(queue, problem, firsts.get((problem.level, problem.problem_id)))
                append_row(path, row)
                log.info("recheck %s: eager %s compile %s%s", problem.task_id, _fmt(row.eager_ratio),
                         _fmt(row.compile_ratio), f" ({row.error[:200]})" if row.error else "")

    async with anyio.create_task_group() as tg:
        for _ in range(max(lanes, 1)):
            tg.start_soon(measurer, recv.clone())
        recv.close()
        async with send:
            for problem in todo:
                await send.send(problem)


def _fmt(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.3f}"


__all__ = ["AGREE_RATIO", "RECHECK_FILE", "NoGpuError", "RecheckRow", "RecheckSummary", "Worst", "agrees", "append_row",
           "default_queue_config", "read_recheck", "recheck_baselines", "summarize_recheck"]
