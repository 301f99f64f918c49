"""`python -m bench.system`: run the system benchmarks and gather their figures into one Markdown report.

What it is: each benchmark module of `bench/` (orchestrator, compile, timing, gpu_queue, learner,
weight_sync) runs as its own subprocess (its own session, killed as a group at the timeout),
with a quick configuration (`--quick`) or its defaults; its JSON (stdout, or the file given to
its `--out`) is saved as `OUT/<name>.json` inside an envelope that also holds the status, the
command and the wall time. A failure is a row, not a crash: a GPU benchmark on a machine without
CUDA is `skipped: no CUDA`, a non-zero exit or a timeout is `failed` with the tail of its output.
`OUT/machine.json` records the machine (GPU, driver, CPUs, memory, torch and its CUDA, nvcc,
the git commit), and `OUT/system_report.md` is the report. `--from DIR` assembles the report
from saved files only (envelopes, or a module's raw `--out` JSON named `<name>.json`).
What it is not: a benchmark itself, nor a test (nothing is asserted, STYLE.md).

    python -m bench.system --quick --out runs/system              # everything, small configs
    python -m bench.system --only orchestrator,gpu_queue --out /tmp/sys
    python -m bench.system --skip compile --args learner="--sizes 1.5b --tokens 16384"
    python -m bench.system --from runs/system                      # report from saved JSON
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import os
import platform
import re
import shlex
import shutil
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

ROOT = Path(__file__).resolve().parents[1]
REPORT_FILE = "system_report.md"
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
    Bench(name="orchestrator", module="bench.orchestrator",
          quick=("--trajectories", "64", "--turns", "5", "--latency-s", "0.2", "--tool-latency-s", "0.05")),
    Bench(name="compile", module="bench.compile", quick=("--edits", "1", "--full-rebuilds", "1")),
    Bench(name="timing", module="bench.timing", out_flag=True, needs_cuda=True,
          quick=("--runs", "2", "--problems", "19_ReLU", "--baseline-runs", "2")),
    Bench(name="gpu_queue", module="bench.gpu_queue",
          quick=("--gpus", "0", "--jobs", "40", "--pings", "40", "--restarts", "1")),
    Bench(name="learner", module="bench.learner", out_flag=True, needs_cuda=True,
          quick=("--sizes", "0.5b", "--tokens", "8192", "--steps", "2", "--warmup", "1")),
    Bench(name="weight_sync", module="bench.weight_sync", out_flag=True, needs_cuda=True,
          quick=("--sizes", "0.5b", "--repeats", "2")),
)


class Machine(Struct, frozen=True, kw_only=True):
    """Where the figures were taken."""

    gpus: tuple[str, ...] = ()
    """One entry per GPU: name and memory, as nvidia-smi reports them."""
    driver: str = ""
    cpu_model: str = ""
    cpus: int = 0
    cpus_usable: int = 0
    mem_gib: float = 0.0
    torch: str = ""
    torch_cuda: str = ""
    nvcc: str = ""
    python: str = ""
    platform: str = ""
    commit: str = ""
    date: str = ""


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


# ---------------------------------------------------------------------------------------------
# The machine


def _cmd(argv: list[str]) -> str:
    if not shutil.which(argv[0]):
        return ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=ROOT, check=False)
        if done.returncode == 0:
            return done.stdout.strip()
    return ""


def _torch_cuda() -> str:
    """torch's CUDA version read from its version.py: importing torch would cost seconds."""
    with contextlib.suppress(Exception):
        for path in importlib.metadata.files("torch") or ():
            if str(path).replace("\\", "/") == "torch/version.py":
                match = re.search(r"^cuda\s*(?::.*)?=\s*['\"]([^'\"]+)", path.read_text(), re.MULTILINE)
                return match.group(1) if match else "none (CPU build)"
    return ""


def machine() -> Machine:
    smi = _cmd(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
    rows = [[c.strip() for c in line.split(",")] for line in smi.splitlines() if line.strip()]
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    mem = re.search(r"^MemTotal:\s*(\d+) kB", meminfo, re.MULTILINE)
    nvcc = re.search(r"release ([\d.]+)", _cmd(["nvcc", "--version"]))
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = ""
    return Machine(
        gpus=tuple(f"{r[0]} ({r[1]})" for r in rows if len(r) >= 2),
        driver=rows[0][2] if rows and len(rows[0]) > 2 else "",
        cpu_model=model.group(1).strip() if model else platform.processor(),
        cpus=os.cpu_count() or 0,
        cpus_usable=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0,
        mem_gib=round(int(mem.group(1)) / 2**20, 1) if mem else 0.0,
        torch=torch_version,
        torch_cuda=_torch_cuda(),
        nvcc=nvcc.group(1) if nvcc else "",
        python=platform.python_version(),
        platform=platform.platform(),
        commit=_cmd(["git", "rev-parse", "--short", "HEAD"]),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )


# ---------------------------------------------------------------------------------------------
# Running one benchmark


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


# ---------------------------------------------------------------------------------------------
# Saving and loading


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


# ---------------------------------------------------------------------------------------------
# Figures: the few numbers of each result the report shows (name, value, target)

Figure = tuple[str, str, str]


def _f(x: Any, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x, fmt)


def _orchestrator(r: dict) -> list[Figure]:
    return [("trajectories x turns", f"{r['trajectories']} x {r['turns_per_trajectory']}", ""),
            ("wall / ideal", _f(r["wall_over_ideal"], ".3f"), "<= 1.05"),
            ("CPU ms per turn", _f(r["cpu_ms_per_turn"]), "<= 2"),
            ("event-loop lag p99 ms", _f(r["loop_lag_p99_ms"]), "<= 20"),
            ("RSS KiB per trajectory", _f(r["rss_kib_per_trajectory"]), "")]


def _compile(r: dict) -> list[Figure]:
    return [("cold build s (CPU s)", f"{_f(r['cold_s'])} ({_f(r['cold_cpu_s'])})", ""),
            ("no-op rebuild s", _f(r["noop_rebuild_s"]), ""),
            ("one-kernel edit rebuild s, median", _f(r["edit_rebuild_median_s"]), ""),
            ("full cpp_extension.load rebuild s", _f(r["full_rebuild_s"]), ""),
            ("full / edit (wall, CPU)", f"{_f(r['ratio'])}, {_f(r['ratio_cpu'])}", ""),
            ("precompiled header build s", _f(r.get("pch_build_s")), ""),
            ("load + first call s", _f(r.get("load_s")), ""),
            ("toolchain", f"nvcc {r.get('nvcc', '-')}, {r.get('arch', '-')}", "")]


def _timing(r: dict) -> list[Figure]:
    out = [(f"{name} median ms (spread)", f"{_f(k.get('median_ms'), '.4g')} ({_f(k.get('spread'), '.2%')})",
            "spread <= 1% (>= 50 us)") for name, k in r["kernels"].items()]
    out += [(f"{b['problem']} {s}: two processes differ by", _f(b[s]["rel_diff"], ".1%"), "<= 10%")
            for b in r["baselines"] if "error" not in b for s in ("eager", "compile")]
    t = r["targets"]
    out.append(("targets: spread, do_bench, baselines share",
                f"{t['spread_le_1pct']}, {t['do_bench_within_3pct']}, {_f(t['baselines_within_10pct_share'])}", ""))
    return out


def _gpu_queue(r: dict) -> list[Figure]:
    sat, trip, restart = r["saturation"], r["round_trip"], r.get("restart", {})
    return [("lanes, job kind", f"{len(r['config'].get('gpus', []))}, {r['kind']}", ""),
            ("saturated jobs/s", _f(sat["jobs_per_s"], ".1f"), ""),
            ("busy fraction", _f(sat["busy_fraction"], ".3f"), ""),
            ("per-job overhead ms p50 / p99", f"{_f(sat['overhead_ms'].get('p50'))} / {_f(sat['overhead_ms'].get('p99'))}", ""),
            ("null job round trip ms p50", _f(trip["submit_to_result_ms"].get("p50")), ""),
            ("worker restart ms (mean)", _f(restart.get("worker_start_ms_mean"), ".0f"), "")]


def _learner(r: dict) -> list[Figure]:
    return [(f"{x['model']}, {x['tokens_per_micro_batch']} tokens x {x['micro_batches']} mb, {x['world_size']} GPU",
             (f"{_f(x['step_s_median'])} s/step, {_f(x['tokens_per_s_per_gpu'], '.0f')} tok/s/GPU, "
              f"MFU {_f(x['mfu'], '.1%')}, peak {_f(x['peak_mem_gib'], '.1f')} GiB"), "") for x in r["rows"]]


def _weight_sync(r: list) -> list[Figure]:
    return [(f"{x['size']} ({x['params'] / 1e6:.0f}M params, {x['bytes'] / 1e9:.2f} GB)",
             f"{x['sync_s_median'] * 1e3:.1f} ms, {x['gb_per_s']:.1f} GB/s", "") for x in r]


_FIGURES = {"orchestrator": _orchestrator, "compile": _compile, "timing": _timing, "gpu_queue": _gpu_queue,
            "learner": _learner, "weight_sync": _weight_sync}


def figures(name: str, result: Any) -> list[Figure]:
    """The figures of one result; a result of another shape falls back to its top-level numbers."""
    with contextlib.suppress(KeyError, TypeError, IndexError, ValueError, AttributeError):
        if rows := _FIGURES[name](result):
            return rows
    items = result.items() if isinstance(result, dict) else enumerate(result if isinstance(result, list) else [])
    return [(str(k), _f(v) if isinstance(v, (int, float)) else str(v), "") for k, v in items
            if isinstance(v, (int, float, str, bool))]


# ---------------------------------------------------------------------------------------------
# The report


def report(host: Machine | None, outcomes: list[Outcome], *, mode: str) -> str:
    lines = ["# System benchmarks\n", _machine_text(host), f"Mode: {mode}.\n",
             "| benchmark | status | wall s | command |", "|---|---|---|---|"]
    for o in outcomes:
        status = o.status + (f": {o.reason}" if o.reason and o.status != "ok" else "")
        wall = "-" if o.wall_s is None else f"{o.wall_s:.1f}"
        command = f"`python -m {' '.join(shlex.quote(a) for a in o.argv[1:])}`" if o.argv else "-"
        lines.append(f"| {o.bench} | {status} | {wall} | {command} |")
    lines.append("")
    for o in outcomes:
        lines.append(f"## {o.bench}\n")
        if o.status != "ok":
            lines.append(f"{o.status}: {o.reason}\n")
            if o.output_tail:
                lines += ["```", o.output_tail, "```", ""]
            continue
        lines += ["| figure | value | target |", "|---|---|---|"]
        lines += [f"| {name} | {value} | {target} |" for name, value, target in figures(o.bench, o.result)]
        lines.append("")
    return "\n".join(lines)


def _machine_text(host: Machine | None) -> str:
    if host is None:
        return "Machine: not recorded with these results.\n"
    gpus = ", ".join(host.gpus) if host.gpus else "no GPU"
    return (f"Machine: {gpus}; driver {host.driver or '-'}; {host.cpu_model}, {host.cpus} CPUs "
            f"({host.cpus_usable} usable), {host.mem_gib} GiB RAM; torch {host.torch or '-'} "
            f"(CUDA {host.torch_cuda or '-'}), nvcc {host.nvcc or '-'}, Python {host.python}; "
            f"{host.platform}; commit {host.commit or '-'}; {host.date}.\n")


# ---------------------------------------------------------------------------------------------
# Command line


def select(only: str, skip: str) -> list[Bench]:
    names = [b.name for b in BENCHES]
    wanted = [n for n in (only.split(",") if only else names) if n]
    dropped = {n for n in skip.split(",") if n}
    if unknown := sorted((set(wanted) | dropped) - set(names)):
        raise ValueError(f"unknown benchmark(s) {unknown}; have {names}")
    return [b for b in BENCHES if b.name in wanted and b.name not in dropped]


def run_all(benches: list[Bench], *, quick: bool, out_dir: Path, extra: dict[str, list[str]],
            host: Machine | None = None, timeout_s: float | None = None) -> Path:
    """Run `benches`, save their envelopes and the machine, write the report; returns its path."""
    host = host or machine()
    outcomes = []
    for bench in benches:
        argv = extra.get(bench.name, list(bench.quick) if quick else [])
        print(f"bench.system: {bench.name} {' '.join(argv)}", file=sys.stderr, flush=True)
        outcomes.append(run_bench(bench, argv, host, timeout_s=timeout_s))
        print(f"bench.system: {bench.name}: {outcomes[-1].status} {outcomes[-1].reason}", file=sys.stderr, flush=True)
        save(out_dir, host, outcomes)  # after each: a later crash keeps what ran
    path = out_dir / REPORT_FILE
    path.write_text(report(host, outcomes, mode="quick" if quick else "full"))
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.system", description=__doc__.split("\n")[0])
    p.add_argument("--only", default="", help="comma list of benchmarks (default: all)")
    p.add_argument("--skip", default="", help="comma list of benchmarks to leave out")
    p.add_argument("--quick", action="store_true", help="small configurations (default: each module's own)")
    p.add_argument("--args", action="append", default=[], metavar="NAME=ARGS", help="a module's argv, repeatable")
    p.add_argument("--out", type=Path, help="where JSON and the report go (runs/system; with --from: DIR)")
    p.add_argument("--from", dest="from_dir", type=Path, help="assemble the report from saved JSON only")
    p.add_argument("--timeout-s", type=float, help="per benchmark (default: its own)")
    a = p.parse_args(argv)
    if a.from_dir:
        host, outcomes = load(a.from_dir)
        path = (a.out or a.from_dir) / REPORT_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report(host, outcomes, mode=f"assembled from {a.from_dir}"))
    else:
        try:
            benches = select(a.only, a.skip)
        except ValueError as exc:
            p.error(str(exc))
        extra = {}
        for item in a.args:
            name, sep, rest = item.partition("=")
            if not sep:
                p.error(f"--args {item!r} is not NAME=ARGS")
            extra[name] = shlex.split(rest)
        path = run_all(benches, quick=a.quick, out_dir=a.out or Path("runs/system"), extra=extra,
                       timeout_s=a.timeout_s)
    print(path.read_text())
    print(f"report: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
