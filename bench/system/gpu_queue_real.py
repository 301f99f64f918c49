"""Benchmark of the GPU job queue with real verify and profile jobs (targets: each job under 3 s,
busy fraction at least 90% under saturation), printed as one JSON object.

What it is: `python -m bench.system.gpu_queue --real-jobs --demo NAME` (`bench.system.gpu_queue` parses the
flags and hands over to `run` here) builds each hand-written demo of `rl/demos/` once, as
`rewards.env.RewardsKernelEnv.prepare` does (static checks, then the real compile pool), opens
the queue the env opens (`rewards.env.queue_config`: verify and profile handlers, sandbox by
flag), warms every lane with one verify and one profile job per demo (the profile job measures
the eager and torch.compile baselines), then keeps the queue saturated with `--jobs` verify and
`--jobs` profile jobs over the built workspaces, the profile jobs reusing the cached baselines,
as the env does after its first profile of a task.

What it is not: a benchmark of the build (`bench.system.compile`) or of the timing method
(`bench.system.timing`). Jobs go through `verify_workspace` / `profile_workspace`, the env's own calls;
only the queue handed to them is wrapped, to keep each JobResult for the report.

How it is used, on the GPU machine (a machine without one stops with "needs a CUDA GPU", exit 3:
the demos' bindings need the CUDA build of torch to compile). `--demo` takes a name of rl/demos/
or a directory in its layout (model.py plus the solution), repeatable:

    python -m bench.system.gpu_queue --real-jobs --gpus 0 --jobs 200 --demo l1_1_matmul_cublas --sandbox
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import msgspec
from msgspec import Struct

from agentcore.types import Task
from rewards.build.compile_pool import CompileConfig, CompilePool
from rewards.env import EnvConfig, RewardsKernelEnv, pristine_files, queue_config
from rewards.queue.gpu_queue import GpuQueue, GpuQueueConfig, count_gpus
from rewards.queue.jobs import Job, JobResult, QueueStatistics
from rewards.timing.baselines import Baselines
from rewards.timing.profile import (
    Profile,
    ProfileConfig,
    ProfileInfrastructureError,
    profile_workspace,
)
from rewards.verify.phases import top_level_ms
from rewards.verify.verifier import VerifyConfig, VerifyInfrastructureError, verify_workspace
from rl.demonstrations import DemoTask, demo_tasks

# A level-1 problem of small tensors (4096^2 fp32 GEMM): the 6-7 GiB elementwise demos take a
# minute per verify (NOTES.md) and measure the verifier, not the queue.
DEFAULT_DEMOS = ("l1_1_matmul_cublas",)
KINDS = ("verify", "profile")
TARGET_JOB_S = 3.0  # each job under 3 s
TARGET_BUSY_FRACTION = 0.9  # busy fraction under saturation at least 90%


class NeedsGpu(RuntimeError):
    """The demos built, but this machine has no GPU (or fewer than `--gpus` names)."""


class DemoBuildError(RuntimeError):
    """A hand-written demo failed its static checks or its build: broken bench input."""


class BuiltDemo(Struct, frozen=True, kw_only=True):
    """A demo workspace built once through the real compile pool."""

    name: str
    task: Task
    workspace: str
    so_path: str
    build_s: float
    built_units: int
    cached_units: int


class JobRecord(Struct, frozen=True, kw_only=True):
    """One verify or profile job: its JobResult's times plus whether the candidate passed."""

    kind: str
    demo: str
    ok: bool
    status: str
    message: str = ""
    run_s: float = 0.0
    wall_s: float = 0.0
    wait_s: float = 0.0
    alone_s: float = 0.0  # of wall_s, with the GPU alone
    gpu: int = -1
    phases_ms: dict[str, float] = {}
    """The job's own breakdown (rewards.verify.phases), plus "queue.outside_handler" (wall - run)
    and "handler.unaccounted" (run - the trusted side's top-level phases)."""


# ---------------------------------------------------------------------------------------------
# Build: each demo once, the way RewardsKernelEnv.prepare builds an agent's workspace.


def load_demos(specs: list[str] | tuple[str, ...]) -> list[DemoTask]:
    """Each spec a demo name of rl/demos/ or a directory in its layout (model.py plus the
    solution's files); ValueError names the demos there are."""
    out = []
    for spec in dict.fromkeys(specs or DEFAULT_DEMOS):
        path = Path(spec)
        if (path / "model.py").is_file():
            files = {str(f.relative_to(path)): f.read_text() for f in sorted(path.rglob("*"))
                     if f.is_file() and f.name != "model.py" and "__pycache__" not in f.parts}
            task = Task(task_id=path.name, source=(path / "model.py").read_text(), name=path.name)
            out.append(DemoTask(task, files))
        else:
            out.extend(demo_tasks(names=(spec,)))
    return out


async def build_demos(demos: list[DemoTask], root: Path, compile_config: CompileConfig) -> list[BuiltDemo]:
    """Each demo written out with the pristine files and built once; DemoBuildError if one fails."""
    pool = await anyio.to_thread.run_sync(CompilePool, compile_config)
    env = RewardsKernelEnv(pool, queue=None)
    built = []
    for demo in demos:
        ws = root / demo.task.task_id
        files = {**{rel: text.encode() for rel, text in demo.files.items()}, **pristine_files(demo.task)}
        for rel, data in files.items():
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            (ws / rel).write_bytes(data)
        prepared = await env.prepare(ws, demo.task)
        if prepared.verdict is not None:
            raise DemoBuildError(f"demo {demo.task.task_id} does not build: {prepared.verdict.message[-2000:]}")
        result = prepared.build.result
        built.append(BuiltDemo(name=demo.task.task_id, task=demo.task, workspace=str(ws),
                               so_path=prepared.build.artifact.so_path, build_s=result.seconds,
                               built_units=result.built_units, cached_units=result.cached_units))
    return built


# ---------------------------------------------------------------------------------------------
# Jobs: through the env's own verify_workspace / profile_workspace.


class _Recorded:
    """Stands in for the GpuQueue in verify_workspace / profile_workspace (they only submit):
    pins the lane when asked and keeps the JobResult, which those functions do not return."""

    def __init__(self, queue: GpuQueue, gpu: int | None) -> None:
        self.queue, self.gpu = queue, gpu
        self.result: JobResult | None = None

    async def submit(self, job: Job, **hooks) -> JobResult:
        self.result = await self.queue.submit(job, gpu=self.gpu, **hooks)
        return self.result


async def run_job(queue: GpuQueue, kind: str, demo: BuiltDemo, config: EnvConfig, *, mode: str = "quick",
                  baselines: Baselines | None = None, gpu: int | None = None, paired: bool = False,
                  compile_cache: bytes = b"") -> tuple[JobRecord, Profile | None]:
    """One job; a failing candidate or a handler error is a record with ok=False, not a raise.
    `paired`: a profile job times candidate, eager and compile together (the final evaluation's)."""
    via, ws, outcome, phases = _Recorded(queue, gpu), Path(demo.workspace), None, {}
    try:
        if kind == "verify":
            verdict = await verify_workspace(via, ws, demo.task, demo.so_path, mode, config=config.verify,
                                             deadline_s=config.job_deadline_s)
            ok, message, phases = verdict.ok, verdict.message, verdict.phases_ms
        else:
            way = {"paired": True, "compile_cache": compile_cache} if paired else {"baselines": baselines}
            outcome = await profile_workspace(via, ws, demo.task, demo.so_path, config=config.profile,
                                              deadline_s=config.job_deadline_s, **way)
            ok, message, phases = outcome.ok, outcome.message, outcome.phases_ms
    except (VerifyInfrastructureError, ProfileInfrastructureError) as error:
        ok, message = False, str(error)
    r = via.result
    record = JobRecord(kind=kind, demo=demo.name, ok=ok, status=r.status.value, message=message[-1000:],
                       run_s=r.run_s, wall_s=r.wall_s, wait_s=r.wait_s, alone_s=r.alone_s, gpu=r.gpu,
                       phases_ms=job_phases(r, phases))
    return record, outcome


def job_phases(result: JobResult, phases_ms: dict[str, float]) -> dict[str, float]:
    """The handler's phases plus what lies around them: the queue's share of the wall time
    (files, channel, codecs, scratch reset) and the handler's time no phase covers."""
    if not phases_ms:
        return {}
    around = {"queue.outside_handler": 1e3 * (result.wall_s - result.run_s),
              "handler.unaccounted": 1e3 * result.run_s - top_level_ms(phases_ms)}
    return {**phases_ms, **around}


async def warm_up(queue: GpuQueue, demos: list[BuiltDemo], config: EnvConfig, mode: str) -> dict:
    """Every lane: one verify and one profile job per demo (imports, baselines, CUDA contexts)."""
    records: list[JobRecord] = []
    baselines: dict[str, Baselines] = {}
    times: dict[str, dict] = {}

    async def lane(gpu: int) -> None:
        for demo in demos:
            for kind in KINDS:
                record, outcome = await run_job(queue, kind, demo, config, mode=mode, gpu=gpu)
                records.append(record)
                if outcome is not None and outcome.baselines is not None:
                    baselines.setdefault(demo.name, outcome.baselines)
                if outcome is not None and outcome.ok:
                    times.setdefault(demo.name, _profile_ms(outcome))

    start = time.monotonic()
    async with anyio.create_task_group() as tg:
        for gpu in queue.gpus:
            tg.start_soon(lane, gpu)
    return {"seconds": time.monotonic() - start, "records": records, "baselines": baselines, "profiles": times}


def _profile_ms(outcome: Profile) -> dict[str, float | None]:
    def ms(timing) -> float | None:
        return timing.median_ms if timing is not None else None

    return {"candidate_ms": ms(outcome.candidate), "eager_ms": ms(outcome.eager), "compile_ms": ms(outcome.compiled)}


async def saturate(queue: GpuQueue, demos: list[BuiltDemo], config: EnvConfig, *, jobs: int, concurrency: int,
                   mode: str, baselines: dict[str, Baselines], paired: bool = False) -> dict:
    """`jobs` verify and `jobs` profile jobs, interleaved over the demos, through `concurrency`
    submitters; busy fraction and restarts over this window only. `paired`: the profile jobs are
    the final evaluation's (each demo's first records its task's compile artifacts for the rest)."""
    work = iter([(kind, demos[i % len(demos)]) for i in range(jobs) for kind in KINDS])
    records: list[JobRecord] = []
    caches: dict[str, bytes] = {}

    async def submitter() -> None:
        for kind, demo in work:
            record, outcome = await run_job(queue, kind, demo, config, mode=mode, baselines=baselines.get(demo.name),
                                            paired=paired, compile_cache=caches.get(demo.name, b""))
            if outcome is not None and outcome.compile_cache:
                caches.setdefault(demo.name, outcome.compile_cache)
            records.append(record)

    before, start = queue.statistics(), time.monotonic()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(submitter)
    seconds, after = time.monotonic() - start, queue.statistics()
    busy = {gpu: (s - _busy_s(before)[gpu]) / seconds for gpu, s in _busy_s(after).items()}
    report = {"jobs": len(records), "seconds": seconds, "jobs_per_s": len(records) / seconds,
              "jobs_per_gpu_minute": 60.0 * len(records) / seconds / len(busy),
              "busy_fraction": statistics.fmean(busy.values()),
              "busy_fraction_per_lane": {str(g): b for g, b in sorted(busy.items())},
              **_deltas(before, after)}
    return report | {"all_ok": all(r.ok for r in records), **summarize(records)}


def _busy_s(stats: QueueStatistics) -> dict[int, float]:
    return {lane.gpu: lane.busy_fraction * stats.uptime_s for lane in stats.lanes}


def _deltas(before: QueueStatistics, after: QueueStatistics) -> dict[str, int]:
    names = ("restarts", "timeouts", "crashes", "poisoned")
    return {name: getattr(after, name) - getattr(before, name) for name in names}


# ---------------------------------------------------------------------------------------------
# The report.


def latency_ms(values: list[float]) -> dict[str, float]:
    """mean, p50, p90 and max of seconds, in ms (nearest-rank percentiles)."""
    if not values:
        return {}
    values = sorted(values)

    def pick(q: float) -> float:
        return values[max(0, math.ceil(q * len(values)) - 1)]

    return {"mean": 1e3 * statistics.fmean(values), "p50": 1e3 * pick(0.5), "p90": 1e3 * pick(0.9),
            "max": 1e3 * values[-1]}


def phase_summary(records: list[JobRecord]) -> dict[str, dict[str, float]]:
    """Per phase name: mean, p50 and max in ms over the jobs that have it, largest mean first
    (a phase a job lacks, e.g. "baselines" measured only in the warm-up, is left out of it)."""
    names = {name for r in records for name in r.phases_ms}
    out = {}
    for name in names:
        values = sorted(r.phases_ms[name] for r in records if name in r.phases_ms)
        out[name] = {"mean": statistics.fmean(values), "p50": values[max(0, math.ceil(0.5 * len(values)) - 1)],
                     "max": values[-1], "jobs": len(values)}
    return dict(sorted(out.items(), key=lambda item: -item[1]["mean"]))


def summarize(records: list[JobRecord]) -> dict:
    """Per kind: count, passed, statuses, latencies (wall: the lane held; run: in the handler;
    wait: for a lane), jobs under the target, where the time went (`phases_ms`, see
    `phase_summary`); the first failures with their messages."""
    kinds = {}
    for kind in KINDS:
        mine = [r for r in records if r.kind == kind]
        kinds[kind] = {
            "jobs": len(mine), "ok": sum(r.ok for r in mine), "statuses": dict(Counter(r.status for r in mine)),
            "wall_ms": latency_ms([r.wall_s for r in mine]), "run_ms": latency_ms([r.run_s for r in mine]),
            "wait_ms": latency_ms([r.wait_s for r in mine]), "alone_ms": latency_ms([r.alone_s for r in mine]),
            "under_target_fraction": sum(r.wall_s < TARGET_JOB_S for r in mine) / max(len(mine), 1),
            "phases_ms": phase_summary(mine),
        }
    failures = [msgspec.to_builtins(r) for r in records if not r.ok][:5]
    return {"kinds": kinds, "failures": failures}


def targets(saturation: dict) -> dict:
    worst_s = max((k["wall_ms"].get("max", 0.0) for k in saturation["kinds"].values()), default=0.0) / 1e3
    return {"job_s": TARGET_JOB_S, "worst_job_s": worst_s, "jobs_met": worst_s < TARGET_JOB_S,
            "busy_fraction": TARGET_BUSY_FRACTION,
            "busy_met": saturation["busy_fraction"] >= TARGET_BUSY_FRACTION}


# ---------------------------------------------------------------------------------------------
# The run.


def env_config(args: argparse.Namespace) -> EnvConfig:
    """The env's config from the flags; ValueError names a malformed --gpus or --handler."""
    if not all(g.strip().isdigit() for g in args.gpus.split(",")):
        raise ValueError(f"--gpus wants comma-separated GPU indices, got {args.gpus!r}")
    if not all("=" in h for h in args.handler):
        raise ValueError(f"--handler wants KIND=module:function, got {args.handler}")
    handlers = dict(h.split("=", 1) for h in args.handler)
    staged = {} if args.staged else {"staged_kinds": ()}
    queue = GpuQueueConfig(fork_per_job=args.fork_per_job, preload=tuple(args.preload), handlers=handlers,
                           job_default_deadline_s=args.deadline_s, **staged)
    launcher = args.child_launcher  # rewards.queue.zygote
    return EnvConfig(gpus=tuple(int(g) for g in args.gpus.split(",")), sandbox="on" if args.sandbox else "off",
                     lanes_per_gpu=args.lanes_per_gpu,
                     compile=CompileConfig(cache_dir=args.compile_cache_dir), queue=queue,
                     verify=VerifyConfig(child_launcher=launcher), profile=ProfileConfig(child_launcher=launcher),
                     job_deadline_s=args.deadline_s)


async def _visible_gpus(python: str) -> int:
    try:
        return await count_gpus(python)
    except (OSError, ValueError, IndexError, subprocess.CalledProcessError):
        return 0  # no torch that can say: no GPU either


async def run(args: argparse.Namespace, *, gpu_count: Callable[[str], Awaitable[int]] = _visible_gpus) -> dict:
    """Check for GPUs (NeedsGpu: every demo's binding needs the CUDA build of torch, so a CPU
    machine could not link one), build, warm up, saturate; the report as plain data."""
    config, demos = env_config(args), load_demos(args.demo)
    seen = await gpu_count(config.queue.python)
    if seen <= max(config.gpus):
        raise NeedsGpu(f"needs a CUDA GPU: --gpus {args.gpus} but torch sees {seen} GPU(s); "
                       "--real-jobs builds its demos against the CUDA build of torch, then verifies and profiles them")
    with tempfile.TemporaryDirectory(prefix="bench-gpu-queue-") as root:
        built = await build_demos(demos, Path(root), config.compile)
        _progress(f"built {[d.name for d in built]}")
        queue_cfg = queue_config(config, config.gpus)
        started = time.monotonic()
        async with GpuQueue(queue_cfg) as queue:
            start_s = time.monotonic() - started
            warm = await warm_up(queue, built, config, args.verify_mode)
            _progress(f"queue up in {start_s:.1f} s, warm-up done in {warm['seconds']:.1f} s; saturating")
            concurrency = args.concurrency or 4 * len(queue.gpus)
            sat = await saturate(queue, built, config, jobs=args.jobs, concurrency=concurrency,
                                 mode=args.verify_mode, baselines=warm["baselines"], paired=args.paired)
            final = queue.statistics()
    return {
        "mode": "real_jobs",
        "config": {"demos": [d.name for d in built], "jobs_per_kind": args.jobs, "verify_mode": args.verify_mode,
                   "paired": args.paired,
                   "concurrency": concurrency, "queue": msgspec.to_builtins(queue_cfg)},
        "queue_start_s": start_s,
        "builds": {d.name: {"build_s": d.build_s, "built_units": d.built_units, "cached_units": d.cached_units}
                   for d in built},
        "warmup": {"seconds": warm["seconds"], "profiles": warm["profiles"],
                   "cached_baselines": sorted(warm["baselines"]), **summarize(warm["records"])},
        "saturation": sat,
        "targets": targets(sat),
        "statistics": msgspec.to_builtins(final),
    }


def _progress(line: str) -> None:
    """A phase line on stderr (stdout carries only the JSON report)."""
    print(f"bench.system.gpu_queue --real-jobs: {line}", file=sys.stderr, flush=True)


def main(args: argparse.Namespace) -> int:
    """`bench.system.gpu_queue --real-jobs`: the report on stdout; a clear line and exit 2 (bad demo
    name), 1 (a demo does not build) or 3 (no GPU) instead of a traceback."""
    prog = "python -m bench.system.gpu_queue --real-jobs"
    try:
        load_demos(args.demo)
        env_config(args)
    except ValueError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    try:
        report = anyio.run(run, args, backend_options={"use_uvloop": True})
    except DemoBuildError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 1
    except NeedsGpu as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 3
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


__all__ = [
    "DEFAULT_DEMOS", "BuiltDemo", "DemoBuildError", "JobRecord", "NeedsGpu", "build_demos", "env_config", "job_phases",
    "latency_ms", "load_demos", "main", "phase_summary", "run", "run_job", "saturate", "summarize", "targets", "warm_up",
]
