"""`cuda-agent bench --watch RUN_DIR`: benchmark each new checkpoint of a training run while it trains.

What it is: `watch(run_dir, config)` polls `RUN/ckpt/` for complete checkpoints (a `step_N`
directory with its `meta.json`, at or below the step `latest` names: a `.tmp` directory or a
renamed but uncommitted step is never read), exports each one's actor as a Hugging Face model in
a subprocess (`RUN/bench/hf/step_N`; CPU only, so the trainer's GPUs are untouched, and a torn
checkpoint or a crash there is an error line, not a dead watcher), runs
`bench.kernelbench.run.run_benchmark` on it (engine `local`, verification on `config.gpus`: the
spare GPUs; records of every checkpoint in `RUN/bench/kernelbench/records.jsonl`, keyed by step),
rewrites `RUN/bench/kernelbench/report.md` (a row per checkpoint), then appends the checkpoint's
summary to `RUN/bench/metrics.jsonl` and TensorBoard scalars under `bench/` to `RUN/tb/bench` (its
own event directory beside the trainer's, so `tensorboard --logdir RUN/tb` shows both).
Resumable (at `watch`). What it is not: the benchmark (`bench.kernelbench.run`) or the trainer;
it never blocks either.

    cuda-agent bench --watch runs/r1 --gpus 6,7 [--poll-s 60] [--once] [--set max_turns=50]

On the command line the local engine goes to the first of `--gpus` unless
`--set engine_device=cuda:N` says otherwise (give it a GPU of its own for quieter timings).

Example:
    await watch(run_dir, BenchConfig(gpus=(6, 7), ...), poll_s=60.0, once=False)
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import orjson

from agentcore.signals import stop_on_signal
from bench.kernelbench.metrics import scalars, summarize
from bench.system.records import ProblemRecord

log = logging.getLogger("cuda-agent.bench.watch")

BENCH_DIR = "bench"
OUT_SUBDIR = "bench/kernelbench"  # the runner's out_dir, shared by the checkpoints
METRICS_FILE = "metrics.jsonl"
FAILURES_FILE = "failures.jsonl"
TB_SUBDIR = "tb/bench"
_ROOT = Path(__file__).resolve().parents[2]  # the repository: the export child imports from it

RunBenchmark = Callable[[Any], Awaitable[list[ProblemRecord]]]


# ---------------------------------------------------------------------------------------------
# The run directory


def committed_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, dir) of the complete checkpoints up to the one `latest` names, oldest first
    (all complete ones when the pointer is missing or names nothing complete)."""
    # Imported here: it imports torch, which the export child must not pay before its file checks.
    from rl.learner.checkpoint_files import committed_steps

    return committed_steps(run_dir / "ckpt")


def _lines(path: Path) -> list[dict]:
    rows = []
    for raw in path.read_bytes().splitlines() if path.exists() else []:
        try:
            row = orjson.loads(raw)
        except orjson.JSONDecodeError:  # a torn last line of a killed watcher
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def benchmarked_steps(run_dir: Path) -> set[int]:
    return {row["step"] for row in _lines(run_dir / BENCH_DIR / METRICS_FILE)}


def failed_attempts(run_dir: Path) -> dict[int, int]:
    counts: dict[int, int] = {}
    for row in _lines(run_dir / BENCH_DIR / FAILURES_FILE):
        counts[row["step"]] = counts.get(row["step"], 0) + 1
    return counts


def _append(path: Path, row: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(orjson.dumps(row) + b"\n")
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------------------------------------
# Export (in a subprocess)


class ExportFailed(Exception):
    """The export child failed; the message carries the tail of its output."""


async def export_in_subprocess(run_dir: Path, ckpt: Path, out: Path, *, timeout_s: float, dtype: str) -> Path:
    """Export checkpoint `ckpt` of `run_dir` to `out` in a fresh CPU-only process."""
    from rewards.build.subprocesses import run_process

    env = ["env", "CUDA_VISIBLE_DEVICES=", f"PYTHONPATH={_ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"]
    argv = env + [sys.executable, "-m", "bench.kernelbench.watch", "_export", str(run_dir), str(ckpt), str(out),
                  "--dtype", dtype]
    tmp_root = run_dir / BENCH_DIR / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    done = await run_process(argv, cwd=_ROOT, timeout_s=timeout_s, tmp_root=tmp_root)
    if done.returncode != 0 or not (out / "config.json").is_file():
        why = f"timed out after {timeout_s:.0f} s" if done.timed_out else f"exit code {done.returncode}"
        gone = "" if ckpt.is_dir() else " (the checkpoint was removed meanwhile: pruned by the trainer?)"
        tail = "\n".join(done.output.strip().splitlines()[-15:])
        raise ExportFailed(f"export of {ckpt.name} failed: {why}{gone}\n{tail}")
    return out


def export_checkpoint(run_dir: Path, ckpt: Path, out: Path, dtype: str = "bfloat16") -> Path:
    """The child's work: rebuild the run's actor on CPU, load the checkpoint's actor shards
    (any world size: DCP reshards), write the HF directory with the run's tokenizer."""
    import torch

    from rl.config import load_config
    from rl.learner import checkpoint
    from rl.learner.models import build_actor

    cfg = load_config(run_dir)
    tokenizer = cfg.data.tokenizer or cfg.model.path
    if not tokenizer:
        raise SystemExit(f"{run_dir}/config.json names no tokenizer (data.tokenizer) nor model.path")
    actor = build_actor(cfg.model, "cpu", init=False)  # every weight comes from the checkpoint
    checkpoint.load(ckpt, actor=actor)
    return checkpoint.export_hf(actor, tokenizer, out, dtype=getattr(torch, dtype))


# ---------------------------------------------------------------------------------------------
# Results


class _Board:
    """RUN/bench/metrics.jsonl plus the `bench/` scalars in RUN/tb/bench (opened on first use)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self._tb: Any = None

    def write(self, step: int, checkpoint: str, records: list[ProblemRecord], wall_s: float) -> dict:
        mine = [r for r in records if r.checkpoint_step == step] or list(records)
        # One group whatever the runner named its source: this checkpoint's numbers.
        same = [msgspec.structs.replace(r, source=checkpoint, checkpoint_step=step) for r in mine]
        values = {f"bench/{k}": v for s in summarize(same) for k, v in scalars(s).items()}
        values["bench/wall_s"] = wall_s
        row = {"step": step, "time": time.time(), "checkpoint": checkpoint, "records": len(mine)} | values
        _append(self.run_dir / BENCH_DIR / METRICS_FILE, row)
        if self._tb is None:
            # A slow import: paid only once there is a result to write.
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / TB_SUBDIR))
        for name, value in values.items():
            self._tb.add_scalar(name, value, step)
        self._tb.flush()
        return row

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


# ---------------------------------------------------------------------------------------------
# The loop


async def watch(
    run_dir: str | Path,
    config: Any,
    *,
    poll_s: float = 60.0,
    once: bool = False,
    max_attempts: int = 2,
    export_timeout_s: float = 3600.0,
    export_dtype: str = "bfloat16",
    keep_exports: bool = False,
    run_benchmark: RunBenchmark | None = None,
) -> list[dict]:
    """Benchmark every committed checkpoint of `run_dir` not benchmarked yet; with `once`,
    return after one pass, else poll every `poll_s` until cancelled. `config` is the runner's
    BenchConfig; engine (local), model_path, checkpoint_step and out_dir (RUN/bench/kernelbench)
    are set per checkpoint. Returns the metrics lines written by this call.

    Resumable: a step already in `RUN/bench/metrics.jsonl` is skipped; failures go to
    `RUN/bench/failures.jsonl` and a step is retried until it has failed `max_attempts` times.
    Steps are taken oldest first; a checkpoint the trainer prunes (`checkpoint.keep`) before the
    watcher reaches it is reported as a failure."""
    run_dir = Path(run_dir)
    if run_benchmark is None:
        from bench.kernelbench.run import run_benchmark
    board, written = _Board(run_dir), []
    try:
        while True:
            for step, ckpt in _pending(run_dir, max_attempts):
                row = await _one(run_dir, step, ckpt, config, board, run_benchmark,
                                 timeout_s=export_timeout_s, dtype=export_dtype, keep=keep_exports)
                if row is not None:
                    written.append(row)
            if once:
                return written
            await anyio.sleep(poll_s)
    finally:
        board.close()


async def wait_for_run_dir(run_dir: Path, poll_s: float) -> None:
    """Return once `run_dir` exists: a watcher started beside `cuda-agent train` may look before
    the trainer has created its run directory (it does so after its imports, seconds later)."""
    if run_dir.is_dir():
        return
    log.info("waiting for the run directory %s", run_dir)
    while not run_dir.is_dir():
        await anyio.sleep(min(poll_s, 5.0))


def _pending(run_dir: Path, max_attempts: int) -> list[tuple[int, Path]]:
    done, failed = benchmarked_steps(run_dir), failed_attempts(run_dir)
    return [(s, p) for s, p in committed_checkpoints(run_dir) if s not in done and failed.get(s, 0) < max_attempts]


async def _one(run_dir: Path, step: int, ckpt: Path, config: Any, board: _Board, run_benchmark: RunBenchmark,
               *, timeout_s: float, dtype: str, keep: bool) -> dict | None:
    """Export, benchmark and log one checkpoint; a failure is logged and recorded, not raised."""
    hf = run_dir / BENCH_DIR / "hf" / ckpt.name
    t0 = time.monotonic()
    try:
        log.info("step %d: exporting %s", step, ckpt)
        await export_in_subprocess(run_dir, ckpt, hf, timeout_s=timeout_s, dtype=dtype)
        bench = msgspec.structs.replace(config, engine="local", model_path=str(hf), checkpoint_step=step,
                                        out_dir=str(run_dir / OUT_SUBDIR))
        log.info("step %d: benchmarking on GPUs %s", step, getattr(config, "gpus", "?"))
        records = await run_benchmark(bench)
    except Exception as exc:  # noqa: BLE001 - one bad checkpoint must not end the watch
        error = "".join(traceback.format_exception(exc))[-4000:]  # an ExceptionGroup's str hides its cause
        log.error("step %d: %s", step, error)
        _append(run_dir / BENCH_DIR / FAILURES_FILE,
                {"step": step, "time": time.time(), "checkpoint": ckpt.name, "error": error})
        return None
    finally:
        if not keep:
            shutil.rmtree(hf, ignore_errors=True)
    row = board.write(step, ckpt.name, records, time.monotonic() - t0)
    _report(run_dir / OUT_SUBDIR)
    log.info("step %d: pass %s, faster than compile %s", step, row.get("bench/pass_rate"),
             row.get("bench/faster_than_compile_rate"))
    return row


def _report(out: Path) -> None:
    """report.md over every checkpoint benchmarked so far; a drawing failure is only logged."""
    from bench.kernelbench.report import write_report
    from bench.system.records import read_records

    try:
        write_report(out, read_records(out / "records.jsonl"))
    except Exception as exc:  # noqa: BLE001 - the metrics line is written; the report can be redone
        log.error("report of %s failed: %s", out, exc)


# ---------------------------------------------------------------------------------------------
# Command line


def parse_watch_args(argv: list[str]) -> tuple[argparse.Namespace, Any]:
    """`--watch RUN_DIR` plus the watcher's options and BenchConfig fields; (args, BenchConfig)."""
    from bench.kernelbench.run import BenchConfig

    p = argparse.ArgumentParser(prog="cuda-agent bench --watch", description=__doc__.split("\n")[0])
    p.add_argument("--watch", required=True, type=Path, metavar="RUN_DIR", help="the training run to follow")
    p.add_argument("--gpus", help="spare GPUs for the benchmark, e.g. 6,7")
    p.add_argument("--levels", help="KernelBench levels, e.g. 1,2,3")
    p.add_argument("--poll-s", type=float, default=60.0, help="seconds between looks at RUN/ckpt")
    p.add_argument("--once", action="store_true", help="benchmark what is there now, then exit")
    p.add_argument("--max-attempts", type=int, default=2, help="tries per checkpoint before giving up on it")
    p.add_argument("--keep-exports", action="store_true", help="keep RUN/bench/hf/step_N after benchmarking")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a BenchConfig field (JSON value), repeatable")
    args = p.parse_args(argv)
    fields: dict[str, Any] = {}
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep:
            p.error(f"--set {item!r} is not FIELD=VALUE")
        fields[key] = _json_or_str(raw)
    for name in ("gpus", "levels"):
        if getattr(args, name):
            fields[name] = [int(x) for x in getattr(args, name).split(",") if x]
    if "out_dir" in fields:
        p.error(f"the watcher writes to RUN_DIR/{OUT_SUBDIR}; out_dir cannot be set")
    if fields.get("gpus") and "engine_device" not in fields:
        fields["engine_device"] = f"cuda:{fields['gpus'][0]}"  # a spare GPU, never the trainer's cuda:0
    known = {f.name for f in msgspec.structs.fields(BenchConfig)}
    if unknown := sorted(set(fields) - known):
        p.error(f"unknown BenchConfig field(s) {unknown}; have {sorted(known)}")
    try:
        config = msgspec.convert(fields, BenchConfig)
    except msgspec.ValidationError as exc:
        p.error(f"bad BenchConfig value: {exc}")
    return args, config


def _json_or_str(raw: str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw


def main_watch(argv: list[str]) -> int:
    """Entry of `cuda-agent bench --watch RUN_DIR [...]` (argv: everything after `bench`)."""
    from agentcore import runtime

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args, config = parse_watch_args(argv)
    if args.once and not args.watch.is_dir():
        print(f"cuda-agent bench --watch: no run directory at {args.watch}", file=sys.stderr)
        return 2
    from rewards.build.toolchain import MachineError, check_gpu_machine

    try:
        if config.env == "real":
            check_gpu_machine(config.gpus)
    except MachineError as exc:
        print(f"cuda-agent bench --watch: this machine cannot benchmark checkpoints: {exc}", file=sys.stderr)
        return 2

    rows: list[dict] = []

    async def go() -> None:
        async with anyio.create_task_group() as tg:
            # SIGINT/SIGTERM cancel the watch: the export child's process group is killed on the way out.
            tg.start_soon(stop_on_signal, tg.cancel_scope, "cuda-agent bench --watch")
            await wait_for_run_dir(args.watch, args.poll_s)
            rows.extend(await watch(args.watch, config, poll_s=args.poll_s, once=args.once,
                                    max_attempts=args.max_attempts, keep_exports=args.keep_exports))
            tg.cancel_scope.cancel()

    runtime.run(go)
    done = sorted(benchmarked_steps(args.watch))  # a signal leaves `rows` short; the records on disk are whole
    print(f"cuda-agent bench --watch: {len(done)} checkpoint(s) benchmarked in {args.watch / 'bench'}"
          f"{f' (steps {done})' if done else ''}")
    return 0


def _export_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernelbench.watch _export")
    p.add_argument("run_dir", type=Path)
    p.add_argument("ckpt", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--dtype", default="bfloat16")
    a = p.parse_args(argv)
    # Checked before importing torch (seconds): a torn checkpoint fails at once, with its reason.
    for need in (a.run_dir / "config.json", a.ckpt / "meta.json", a.ckpt / "state" / ".metadata"):
        if not need.is_file():
            print(f"torn or incomplete checkpoint: {need} is missing", file=sys.stderr)
            return 3
    print(export_checkpoint(a.run_dir, a.ckpt, a.out, a.dtype))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_export"]:
        sys.exit(_export_main(sys.argv[2:]))
    sys.exit(main_watch(sys.argv[1:]))
