"""Benchmark of the GPU job queue: throughput, busy fraction under saturation, per-job overhead
and worker restart time, printed as one JSON object.

What it is: `python -m bench.system.gpu_queue` starts a `GpuQueue`, keeps it saturated with `--jobs`
jobs of one kind (default: a CPU `sleep` of 50 ms), then measures a null job's round trip and
the time to replace a crashed worker. What it is not: a benchmark of the handlers themselves.
`--real-jobs` hands over to `bench.system.gpu_queue_real`: real verify and profile jobs over demos of
`rl/demos/` built through the compile pool, against per-job time and busy-fraction targets.

How it is used, on a CPU machine and later on GPUs with the real handlers:

    python -m bench.system.gpu_queue --gpus 0,1 --jobs 400
    python -m bench.system.gpu_queue --gpus 0,1 --fork-per-job --preload torch
    python -m bench.system.gpu_queue --real-jobs --gpus 0 --jobs 200 --demo l1_1_matmul_cublas --sandbox
    python -m bench.system.gpu_queue --gpus 0,1,2,3 --kind verify --handler verify=rewards.verify.verifier:handle_job \\
        --payload-file verify.msgpack --files workspace/ --preload torch --sandbox

`--payload` is JSON, sent as msgpack (the handlers' convention); `--payload-file` is sent as is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import anyio
import msgspec

from rewards.queue.gpu_queue import GpuQueue, GpuQueueConfig
from rewards.queue.jobs import Job, JobResult, QueueStatistics, SleepArgs, encode


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.system.gpu_queue", description=__doc__.split("\n")[0])
    p.add_argument("--gpus", default="0,1", help="lane indices; on a CPU machine they are just processes")
    p.add_argument("--jobs", type=_positive, default=200, help="jobs in the saturation run")
    p.add_argument("--concurrency", type=int, default=0, help="submitters at once; 0: 4 per lane")
    p.add_argument("--kind", default="sleep", help="job kind of the saturation run")
    p.add_argument("--payload", default='{"seconds": 0.05}', help="JSON payload, sent as msgpack")
    p.add_argument("--payload-file", type=Path, help="payload bytes, sent as they are")
    p.add_argument("--files", type=Path, help="a directory whose files every job carries")
    p.add_argument("--handler", action="append", default=[], help="extra KIND=module:function")
    p.add_argument("--deadline-s", type=float, default=600.0, help="watchdog deadline per job")
    p.add_argument("--fork-per-job", action="store_true", help="zygote worker: a fresh child per job")
    p.add_argument("--preload", action="append", default=[], help="module the worker imports at start")
    p.add_argument("--sandbox", action="store_true", help="run the workers inside bubblewrap")
    p.add_argument("--pings", type=int, default=200, help="sequential null jobs for the round trip")
    p.add_argument("--restarts", type=int, default=5, help="watchdog kills for the restart time")
    real = p.add_argument_group("real jobs", "verify + profile jobs over built demos (bench.system.gpu_queue_real)")
    real.add_argument("--real-jobs", action="store_true", help="--jobs verify and --jobs profile jobs; "
                      "--kind, --payload*, --files, --pings and --restarts do not apply")
    real.add_argument("--demo", action="append", default=[], help="a demo of rl/demos/ or a directory in "
                      "its layout (repeatable); default l1_1_matmul_cublas")
    real.add_argument("--verify-mode", choices=("quick", "final"), default="quick", help="verification mode")
    real.add_argument("--compile-cache-dir", default="", help="compile pool cache; '' its default")
    real.add_argument("--child-launcher", choices=("spawn", "zygote"), default="zygote",
                      help="candidate/profile children: a fresh interpreter, or forked by a pre-loaded zygote")
    real.add_argument("--lanes-per-gpu", type=_positive, default=1, help="lanes per GPU (verification shares a GPU)")
    real.add_argument("--paired", action="store_true", help="the profile jobs are the final evaluation's paired timing")
    real.add_argument("--unstaged", dest="staged", action="store_false",
                      help="profile jobs have their GPU alone from the start (not staged: GpuQueueConfig.staged_kinds)")
    return p.parse_args(argv)


def _config(args: argparse.Namespace) -> GpuQueueConfig:
    handlers = dict(h.split("=", 1) for h in args.handler)
    return GpuQueueConfig(
        gpus=tuple(int(g) for g in args.gpus.split(",")),
        sandbox=args.sandbox,
        fork_per_job=args.fork_per_job,
        preload=tuple(args.preload),
        handlers=handlers,
        job_default_deadline_s=args.deadline_s,
    )


def _job_template(args: argparse.Namespace) -> Job:
    if args.payload_file:
        payload = args.payload_file.read_bytes()
    else:
        payload = encode(msgspec.json.decode(args.payload)) if args.payload else b""
    files = {}
    if args.files:
        paths = [p for p in args.files.rglob("*") if p.is_file()]
        files = {str(p.relative_to(args.files)): p.read_bytes() for p in paths}
    return Job(job_id="", kind=args.kind, payload=payload, files=files)


def _ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    values = sorted(values)

    def pick(q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    return {"mean": 1e3 * statistics.fmean(values), "p50": 1e3 * pick(0.5), "p99": 1e3 * pick(0.99)}


def _busy_s(stats: QueueStatistics) -> dict[int, float]:
    return {lane.gpu: lane.busy_fraction * stats.uptime_s for lane in stats.lanes}


async def _saturate(queue: GpuQueue, template: Job, jobs: int, concurrency: int) -> dict:
    """`jobs` jobs through `concurrency` submitters; busy fraction over this window only."""
    results: list[JobResult] = []
    todo = iter(range(jobs))

    async def submitter() -> None:
        for i in todo:
            results.append(await queue.submit(msgspec.structs.replace(template, job_id=f"sat-{i}")))

    before, start = queue.statistics(), time.monotonic()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(submitter)
    seconds, after = time.monotonic() - start, queue.statistics()
    busy = {gpu: (_busy_s(after)[gpu] - s) / seconds for gpu, s in _busy_s(before).items()}
    per_lane = Counter(r.gpu for r in results)
    return {
        "jobs": len(results),
        "seconds": seconds,
        "jobs_per_s": len(results) / seconds,
        "jobs_per_s_per_lane": {str(g): n / seconds for g, n in sorted(per_lane.items())},
        "busy_fraction": statistics.fmean(busy.values()),
        "busy_fraction_per_lane": {str(g): b for g, b in sorted(busy.items())},
        "statuses": dict(Counter(r.status.value for r in results)),
        "run_ms": _ms([r.run_s for r in results]),
        "overhead_ms": _ms([r.wall_s - r.run_s for r in results]),  # channel, codecs, fork
    }


async def _round_trip(queue: GpuQueue, pings: int) -> dict:
    """A null job submitted and awaited one at a time: the queue's own per-job cost."""
    walls, totals = [], []
    for i in range(pings):
        start = time.perf_counter()
        result = await queue.submit(Job(job_id=f"ping-{i}", kind="ping"), gpu=queue.gpus[0])
        totals.append(time.perf_counter() - start)
        walls.append(result.wall_s - result.run_s)
    return {"submit_to_result_ms": _ms(totals), "overhead_ms": _ms(walls)}


async def _restart(queue: GpuQueue, kills: int) -> dict:
    """Kill a worker at a job's deadline (the one failure that replaces a worker in every mode),
    then time until the next job on that lane is answered."""
    gpu, recoveries = queue.gpus[0], []
    hang = Job(job_id="", kind="sleep", payload=encode(SleepArgs(seconds=600)), deadline_s=0.05)
    before = queue.statistics()
    for i in range(kills):
        await queue.submit(msgspec.structs.replace(hang, job_id=f"hang-{i}"), gpu=gpu)
        start = time.perf_counter()
        await queue.submit(Job(job_id=f"after-{i}", kind="ping"), gpu=gpu)
        recoveries.append(time.perf_counter() - start)
    after = queue.statistics()
    restarts = after.restarts - before.restarts
    restart_s = sum(lane.restart_s for lane in after.lanes) - sum(lane.restart_s for lane in before.lanes)
    return {
        "restarts": restarts,
        "worker_start_ms_mean": 1e3 * restart_s / max(restarts, 1),
        "kill_to_next_result_ms": _ms(recoveries),
    }


async def run(args: argparse.Namespace) -> dict:
    config = _config(args)
    started = time.monotonic()
    async with GpuQueue(config) as queue:
        start_s = time.monotonic() - started
        concurrency = args.concurrency or 4 * len(queue.gpus)
        report = {
            "config": msgspec.to_builtins(config),
            "kind": args.kind,
            "queue_start_s": start_s,
            "saturation": await _saturate(queue, _job_template(args), args.jobs, concurrency),
            "round_trip": await _round_trip(queue, args.pings),
            "restart": await _restart(queue, args.restarts) if args.restarts else {},
            "statistics": msgspec.to_builtins(queue.statistics()),
        }
    return report


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.real_jobs:  # imported here: the env, the compile pool and the demos only for this mode
        from bench.system.gpu_queue_real import main as real_main

        return real_main(args)
    report = anyio.run(run, args, backend_options={"use_uvloop": True})
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
