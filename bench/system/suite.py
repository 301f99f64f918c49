"""`python -m bench.system.suite`: run the system benchmarks and gather their figures into one Markdown report.

What it is: each benchmark module of `bench/` (orchestrator, compile, timing, gpu_queue, learner,
weight_sync) runs as its own subprocess (its own session, killed as a group at the timeout),
with a quick configuration (`--quick`) or its defaults; its JSON (stdout, or the file given to
its `--out`) is saved as `OUT/<name>.json` inside an envelope that also holds the status, the
command and the wall time. A failure is a row, not a crash: a GPU benchmark on a machine without
CUDA is `skipped: no CUDA`, a non-zero exit or a timeout is `failed` with the tail of its output.
`OUT/machine.json` records the machine (GPU, driver, CPUs, memory, torch and its CUDA, nvcc,
the git commit), and `OUT/system_report.md` is the report. `--from DIR` assembles the report
from saved files only (envelopes, or a module's raw `--out` JSON named `<name>.json`).
The parts: `bench.system.run` (the table of benchmarks, one subprocess run, save/load),
`bench.system.machine` (the machine record), `bench.system.report` (figures and Markdown); this
module is the command line and `run_all`, and re-exports the parts' public names.
What it is not: a benchmark itself, nor a test (nothing is asserted).

    python -m bench.system.suite --quick --out runs/system              # everything, small configs
    python -m bench.system.suite --only orchestrator,gpu_queue --out /tmp/sys
    python -m bench.system.suite --skip compile --args learner="--sizes 1.5b --tokens 16384"
    python -m bench.system.suite --from runs/system                      # report from saved JSON
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from bench.system.machine import ROOT, Machine, machine
from bench.system.report import Figure, figures, report
from bench.system.run import (
    BENCHES,
    MACHINE_FILE,
    Bench,
    Outcome,
    load,
    run_bench,
    save,
)

REPORT_FILE = "system_report.md"

__all__ = ["BENCHES", "MACHINE_FILE", "REPORT_FILE", "ROOT", "Bench", "Figure", "Machine", "Outcome", "figures",
           "load", "machine", "main", "report", "run_all", "run_bench", "save", "select"]


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
        print(f"bench.system.suite: {bench.name} {' '.join(argv)}", file=sys.stderr, flush=True)
        outcomes.append(run_bench(bench, argv, host, timeout_s=timeout_s))
        print(f"bench.system.suite: {bench.name}: {outcomes[-1].status} {outcomes[-1].reason}", file=sys.stderr, flush=True)
        save(out_dir, host, outcomes)  # after each: a later crash keeps what ran
    path = out_dir / REPORT_FILE
    path.write_text(report(host, outcomes, mode="quick" if quick else "full"))
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.system.suite", description=__doc__.split("\n")[0])
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
