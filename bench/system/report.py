"""The Markdown report of the system benchmarks: the machine, one row per benchmark, its figures.

What it is: `report(host, outcomes, mode=...) -> str`, and `figures(name, result)`, the few
numbers of each benchmark's JSON the report shows as (name, value, target) rows; a result of
another shape falls back to its top-level numbers.
What it is not: running or loading anything (`bench.system.run`); `bench.system.suite` writes the
report to `OUT/system_report.md` and re-exports `report` and `figures`.
"""

from __future__ import annotations

import contextlib
import shlex
from typing import Any

from bench.system.machine import Machine
from bench.system.run import Outcome

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
