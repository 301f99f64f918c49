"""Running one system benchmark in a subprocess, and saving / loading the outcomes as JSON.

What it is: the benchmark table (`Bench`, `BENCHES`), `run_bench(bench, argv, host) -> Outcome`
(its own session, the whole process group killed at the timeout; its JSON from stdout or from
`--out FILE`; a failure, a timeout or a missing GPU is an `Outcome` with a status, never an
exception), and `save` / `load` of the envelopes `OUT/<name>.json` and `OUT/machine.json`.
What it is not: the command line or the report (`bench.system.suite`, `bench.system.report`);
`bench.system.suite` re-exports every public name here.

Example:
    outcome = run_bench(BENCHES[0], list(BENCHES[0].quick), machine())
    save(Path("runs/system"), machine(), [outcome])
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import orjson
from msgspec import Struct

from bench.system.machine import ROOT, Machine

MACHINE_FILE = "machine.json"


class Bench(Struct, frozen=True, kw_only=True):
    """One benchmark module and how to run it."""

    name: str
    module: str
    quick: tuple[str, ...] = ()
    """Arguments of the quick configuration (the full run uses the module's defaults)."""
    out_flag: bool = False
    """The module writes its JSON to `--out FILE`; else the JSON is its stdout."""
    needs_cuda: bool = False
    timeout_s: float = 1800.0


BENCHES: tuple[Bench, ...] = (
    Bench(name="orchestrator", module="bench.system.orchestrator",
          quick=("--trajectories", "64", "--turns", "5", "--latency-s", "0.2", "--tool-latency-s", "0.05")),
    Bench(name="compile", module="bench.system.compile", quick=("--edits", "1", "--full-rebuilds", "1")),
    Bench(name="timing", module="bench.system.timing", out_flag=True, needs_cuda=True,
          quick=("--runs", "2", "--problems", "19_ReLU", "--baseline-runs", "2")),
    Bench(name="gpu_queue", module="bench.system.gpu_queue",
          quick=("--gpus", "0", "--jobs", "40", "--pings", "40", "--restarts", "1")),
    Bench(name="learner", module="bench.system.learner", out_flag=True, needs_cuda=True,
          quick=("--sizes", "0.5b", "--tokens", "8192", "--steps", "2", "--warmup", "1")),
    Bench(name="weight_sync", module="bench.system.weight_sync", out_flag=True, needs_cuda=True,
          quick=("--sizes", "0.5b", "--repeats", "2")),
)


class Outcome(Struct, frozen=True, kw_only=True):
    """The envelope saved as OUT/<name>.json."""

    bench: str
    status: str
    """ok | failed | skipped"""
    reason: str = ""
    argv: tuple[str, ...] = ()
    wall_s: float | None = None
    result: Any = None
    output_tail: str = ""


def run_bench(bench: Bench, argv: list[str], host: Machine, *, timeout_s: float | None = None) -> Outcome:
    """Run `bench` in a subprocess and capture its JSON; never raises for the bench's failures."""
    shown = ("-m", bench.module, *argv)
    if bench.needs_cuda and not host.gpus:
        return Outcome(bench=bench.name, status="skipped", reason="no CUDA", argv=shown)
    with tempfile.TemporaryDirectory(prefix=f"bench-{bench.name}-") as tmp:
        out_file = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", bench.module, *argv] + (["--out", str(out_file)] if bench.out_flag else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        t0 = time.perf_counter()
        with open(Path(tmp) / "stdout", "w+b") as out, open(Path(tmp) / "stderr", "w+b") as err:
            code = _wait(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                          start_new_session=True), timeout_s or bench.timeout_s)
            wall = round(time.perf_counter() - t0, 2)
            stdout, stderr = _read(out), _read(err)
        tail = "\n".join((stderr or stdout).strip().splitlines()[-20:])
        if code != 0:
            reason = "timed out" if code is None else f"exit code {code}"
            return Outcome(bench=bench.name, status="failed", reason=reason, argv=shown, wall_s=wall, output_tail=tail)
        try:
            result = orjson.loads(out_file.read_bytes()) if bench.out_flag else _json_of(stdout)
        except (OSError, ValueError) as exc:
            return Outcome(bench=bench.name, status="failed", reason=f"no JSON result: {exc}", argv=shown,
                           wall_s=wall, output_tail=tail)
    return Outcome(bench=bench.name, status="ok", argv=shown, wall_s=wall, result=result)


def _wait(process: subprocess.Popen, timeout_s: float) -> int | None:
    """The exit code, or None at the timeout; the process group is killed either way."""
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # stray children (workers, compilers) too
        process.wait()


def _read(f: Any) -> str:
    f.seek(0)
    return f.read(4 << 20).decode("utf-8", errors="replace")


def _json_of(stdout: str) -> Any:
    """The JSON a module printed: all of stdout, or from the last line that opens an object."""
    try:
        return orjson.loads(stdout)
    except orjson.JSONDecodeError:
        lines = stdout.splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith("{")]
        for i in reversed(starts):
            with contextlib.suppress(orjson.JSONDecodeError):
                return orjson.loads("\n".join(lines[i:]))
        raise ValueError("stdout holds no JSON object") from None


def save(out_dir: Path, host: Machine, outcomes: list[Outcome]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MACHINE_FILE).write_bytes(orjson.dumps(_builtins(host), option=orjson.OPT_INDENT_2))
    for o in outcomes:
        (out_dir / f"{o.bench}.json").write_bytes(orjson.dumps(_builtins(o), option=orjson.OPT_INDENT_2))


def _builtins(obj: Struct) -> dict:
    return msgspec.to_builtins(obj)


def load(from_dir: Path) -> tuple[Machine | None, list[Outcome]]:
    """Machine and outcomes saved in `from_dir`: envelopes, or raw module JSON named by bench."""
    host = None
    if (from_dir / MACHINE_FILE).is_file():
        host = msgspec.convert(orjson.loads((from_dir / MACHINE_FILE).read_bytes()), Machine)
    known = {b.name for b in BENCHES}
    outcomes = []
    for path in sorted(from_dir.glob("*.json")):
        if path.name == MACHINE_FILE:
            continue
        data = orjson.loads(path.read_bytes())
        if isinstance(data, dict) and {"bench", "status"} <= set(data):
            outcomes.append(msgspec.convert(data, Outcome))
        elif path.stem in known:
            outcomes.append(Outcome(bench=path.stem, status="ok", reason="saved result", result=data))
    order = {name: i for i, name in enumerate(b.name for b in BENCHES)}
    return host, sorted(outcomes, key=lambda o: (order.get(o.bench, len(order)), o.bench))
