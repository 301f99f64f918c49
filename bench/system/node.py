"""One training run on a GPU node, with its figures: `python -m bench.system.node`.

What it is: a driver that starts `cuda-agent train --recipe R --run-dir RUN` (the node layout:
learner + engines on `layout.learner_gpus`, verification exclusive on `layout.verify_gpus`), the
checkpoint watcher `cuda-agent bench --watch RUN --gpus G` beside it (optional), and an
`nvidia-smi` sampler of every GPU's utilisation, all in one task group with a time limit. When the
run ends (or the limit is reached: SIGINT, then SIGKILL after a grace period) the watcher gets
`--watch-grace-s` to finish the checkpoint it is on, then `RUN/node_report.md` and
`RUN/node_report.json` are written from `RUN/metrics.jsonl`, `RUN/config.json`, the samples and
`RUN/bench/metrics.jsonl`:
  per step   stage, rollout / train / weight-sync seconds, tokens/s per learner GPU, MFU, GPU-queue
             busy fraction;
  per group  mean and p90 SM utilisation and peak memory of the learner and of the verification
             GPUs over the run;
  scaling    tokens/s per learner GPU of the PPO steps against a single-GPU figure (a
             `bench.system.learner` JSON report, `--single-gpu-json`), when given.
What it is not: the trainer or the watcher (it runs the real commands), or a test.

    python -m bench.system.node --recipe node_2gpu --run-dir runs/n2 --time-limit-s 540 --watch-gpus 1 \\
        --set data.tasks=tasks.jsonl --set steps.ppo=3 --watch-set problem_ids=[47]
    python -m bench.system.node --report-only --run-dir runs/n2     # redo the report of a finished run
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from pathlib import Path

import anyio
import orjson
from anyio.abc import Process

from bench.system.node_report import GpuSample, parse_smi_line, write_report

SMI_QUERY = ["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits"]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.system.node", description=__doc__.split("\n")[0])
    p.add_argument("--recipe", default="node_2gpu", help="cuda-agent train recipe")
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="train override, repeatable")
    p.add_argument("--time-limit-s", type=float, default=540.0, help="stop the run after this long")
    p.add_argument("--grace-s", type=float, default=20.0, help="SIGINT -> SIGKILL grace of a stopped process")
    p.add_argument("--watch-gpus", default="", help="run the checkpoint watcher on these GPUs (e.g. 1)")
    p.add_argument("--watch-set", action="append", default=[], metavar="FIELD=VALUE", help="watcher BenchConfig field")
    p.add_argument("--watch-grace-s", type=float, default=60.0, help="time the watcher gets after training ends")
    p.add_argument("--sample-ms", type=int, default=1000, help="nvidia-smi sampling period")
    p.add_argument("--single-gpu-json", type=Path, help="bench.system.learner report: the single-GPU tokens/s figure")
    p.add_argument("--report-only", action="store_true", help="only (re)write the report of RUN_DIR")
    return p.parse_args(argv)


def train_argv(args: argparse.Namespace) -> list[str]:
    sets = [x for item in args.set for x in ("--set", item)]
    return [sys.executable, "-m", "agentcore.cli", "train", "--recipe", args.recipe, "--out", str(args.run_dir),
            "--force", *sets]  # --force: this driver writes its own logs into the run directory first


def watch_argv(args: argparse.Namespace) -> list[str]:
    sets = [x for item in args.watch_set for x in ("--set", item)]
    return [sys.executable, "-m", "agentcore.cli", "bench", "--watch", str(args.run_dir), "--gpus", args.watch_gpus,
            "--poll-s", "5", *sets]


async def _stop(proc: Process, grace_s: float) -> None:
    """SIGINT (the commands stop cleanly on it), then SIGKILL after `grace_s`."""
    if proc.returncode is not None:
        return
    proc.send_signal(signal.SIGINT)
    with anyio.move_on_after(grace_s):
        await proc.wait()
        return
    proc.kill()
    await proc.wait()


async def _drain(proc: Process, log_path: Path) -> None:
    """Copy a child's combined output to its log file as it comes."""
    with log_path.open("ab") as log:
        async for chunk in proc.stdout:
            log.write(chunk)
            log.flush()


async def _sample_gpus(samples: list[GpuSample], period_ms: int, t0: float) -> None:
    """Append one sample per GPU per period until cancelled; no nvidia-smi: no samples."""
    try:
        proc = await anyio.open_process([*SMI_QUERY, f"-lms={period_ms}"], stderr=None)
    except OSError:
        return
    try:
        buf = b""
        async for chunk in proc.stdout:
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if (s := parse_smi_line(line.decode(errors="replace"), time.monotonic() - t0)) is not None:
                    samples.append(s)
    finally:
        with anyio.CancelScope(shield=True):
            await _stop(proc, 2.0)


async def run_node(args: argparse.Namespace) -> dict:
    """Run training (+ watcher, + sampler) under the time limit; the report as data."""
    args.run_dir.mkdir(parents=True, exist_ok=True)
    samples: list[GpuSample] = []
    t0 = time.monotonic()
    outcome: dict = {"train_rc": None, "stopped_by_limit": False}
    async with anyio.create_task_group() as tg:
        tg.start_soon(_sample_gpus, samples, args.sample_ms, t0)
        train = await anyio.open_process(train_argv(args), stderr=-2)  # STDOUT
        tg.start_soon(_drain, train, args.run_dir / "node_train.log")
        watcher = None
        if args.watch_gpus:
            watcher = await anyio.open_process(watch_argv(args), stderr=-2)
            tg.start_soon(_drain, watcher, args.run_dir / "node_watch.log")
        with anyio.move_on_after(args.time_limit_s) as limit:
            await train.wait()
        if limit.cancelled_caught:
            outcome["stopped_by_limit"] = True
            await _stop(train, args.grace_s)
        outcome["train_rc"] = train.returncode
        outcome["train_s"] = time.monotonic() - t0
        if watcher is not None:
            with anyio.move_on_after(args.watch_grace_s):
                await watcher.wait()
            await _stop(watcher, args.grace_s)
            outcome["watch_rc"] = watcher.returncode
        tg.cancel_scope.cancel()  # the sampler
    outcome["wall_s"] = time.monotonic() - t0
    return write_report(args.run_dir, samples, outcome, single_gpu_json=args.single_gpu_json)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.report_only:
        old = args.run_dir / "node_report.json"
        prior = orjson.loads(old.read_bytes()) if old.is_file() else {}
        samples = [GpuSample(**s) for s in prior.get("samples", [])]
        report = write_report(args.run_dir, samples, prior.get("outcome", {}), single_gpu_json=args.single_gpu_json)
    else:
        report = anyio.run(run_node, args, backend_options={"use_uvloop": True})
    print((args.run_dir / "node_report.md").read_text())
    ppo = [s for s in report["steps"] if s["stage"] == "ppo"]
    print(f"bench.system.node: {len(report['steps'])} steps ({len(ppo)} PPO) in {report['outcome'].get('wall_s', 0):.0f} s; "
          f"median train s {statistics.median([s['train_s'] for s in ppo]) if ppo else float('nan'):.2f}")
    return 0 if report["outcome"].get("train_rc") in (0, None) else 1


if __name__ == "__main__":
    sys.exit(main())
