"""The report of a KernelBench run: Markdown in the paper's layout, PNG plots, summary.json.

What it is: `write_report(out_dir, records)` writes `out_dir/report.md` (our rows beside the
paper's published ones, fast_p, outcomes, hacks by category, verdict statuses, the per-problem
table, infrastructure errors), `summary.json` (every number of the report, from
`bench.kernelbench.metrics.summarize`) and three PNGs drawn on matplotlib's Agg canvas:
`speedup_distribution.png`, `fast_p.png`, `levels.png`. Beside the records it reads, when present,
`run_stats.jsonl` (how the runs used the machine: wall time, problems/hour, GPU-queue busy fraction
per lane, jobs/s, restarts, queue depth; `bench.kernelbench.run_stats`) and
`baseline_recheck.jsonl` (a second measurement of the baselines; `bench.kernelbench.recheck`).
Records judged by the fake kernel environment (`--env fake`) are a plumbing check: the report
says so at its top, and shows them with no rates, no times, no plots and nothing beside the paper.
What it is not: the metrics (they are computed in `bench.kernelbench.metrics`, from the records
alone) or the runner, which calls `write_report` at the end of a run.

Example:
    path = write_report(out_dir, read_records(out_dir / "records.jsonl"))   # -> out_dir/report.md
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import msgspec

from bench.kernelbench.metrics import FAST_P_SHOWN, LevelMetrics, Summary, summarize
from bench.kernelbench.paper import PAPER_ROWS, SOURCE, PaperRow
from bench.kernelbench.recheck import RECHECK_FILE, RecheckRow, RecheckSummary, agrees, read_recheck, summarize_recheck
from bench.kernelbench.run_stats import RUN_STATS_FILE, MachineUse, read_run_stats, summarize_run_stats
from bench.system.records import ProblemRecord

REPORT_FILE = "report.md"
SUMMARY_FILE = "summary.json"
PLOTS = ("speedup_distribution.png", "fast_p.png", "levels.png")
_HEADER = "| | pass | faster than eager | faster than compile | speedup vs eager | vs compile | problems |"


def write_report(out_dir: str | Path, records: Sequence[ProblemRecord], *, faster_margin: float = 0.0) -> Path:
    """Write report.md, summary.json and the PNGs into `out_dir`; returns the report's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = summarize(records, faster_margin=faster_margin)
    real = [s for s in summaries if not s.fake_env]
    machine = summarize_run_stats(read_run_stats(out_dir / RUN_STATS_FILE))
    rechecked = read_recheck(out_dir / RECHECK_FILE)
    summary = {
        "records": len(records),
        "plumbing_check_only": bool(summaries) and not real,
        "faster_margin": faster_margin,
        "paper_source": SOURCE,
        "paper": [msgspec.to_builtins(r) for r in PAPER_ROWS],
        "summaries": [msgspec.to_builtins(s) for s in summaries],
        "machine": [msgspec.to_builtins(m) for m in machine],
        "baseline_recheck": {"summary": msgspec.to_builtins(summarize_recheck(rechecked)),
                             "problems": [msgspec.to_builtins(r) for r in rechecked]} if rechecked else None,
    }
    (out_dir / SUMMARY_FILE).write_bytes(msgspec.json.format(msgspec.json.encode(summary), indent=1))
    plots = draw_plots(out_dir, [r for r in records if r.env != "fake"], real) if real or not summaries else []
    path = out_dir / REPORT_FILE
    text = markdown(records, summaries, [p.name for p in plots], faster_margin)
    path.write_text(text + machine_markdown(machine) + recheck_markdown(rechecked))
    return path


# ---------------------------------------------------------------------------------------------
# Markdown


def markdown(records: Sequence[ProblemRecord], summaries: list[Summary], plots: list[str], margin: float) -> str:
    real = [s for s in summaries if not s.fake_env]
    plumbing_only = bool(summaries) and not real
    parts = [
        "# KernelBench report: fake environment, a plumbing check\n" if plumbing_only else "# KernelBench report\n",
        *([FAKE_ENV_NOTE] if len(real) < len(summaries) else []),
        (f"{len(records)} records in {len(summaries)} group(s). Every number is recomputed from the "
         "per-problem records (`records.jsonl`) by `bench.kernelbench.metrics`.\n"),
        _definitions(margin),
    ]
    if not plumbing_only:
        parts += [
            "## Results beside the paper\n",
            results_table(real),
            f"Paper rows: {SOURCE}; measured on the paper's hardware and evaluator, not ours.\n",
            "## fast_p (share of problems correct with speedup > p)\n",
            _fast_p_table(real),            _inconclusive_line(real),
        ]
    parts += [
        "## Outcomes\n",
        _outcome_table(summaries),
        "## Hacks detected, by category\n",
        _hack_table(summaries),
        "## Verdict statuses of the scored problems\n",
        _status_table(summaries),
    ]
    if plots:
        parts.append("## Plots\n")
        parts.append("".join(f"![{name}]({name})\n" for name in plots))
    parts.append("## Per-problem results\n")
    parts.append(_problem_table(records, len(summaries) > 1))
    errors = [r for r in records if r.outcome in ("error", "skipped")]
    if errors:
        parts.append("## Infrastructure errors and skipped problems (excluded from the rates)\n")
        parts.append(_error_table(errors))
    return "\n".join(parts)


FAKE_ENV_NOTE = (
    "> **Fake environment: a plumbing check, not a result.** Groups marked [fake env] were judged by "
    "the fake kernel environment (`--env fake`), which compiles and runs nothing: it accepts any "
    "workspace with a `kernels/*.cu` and a `ModelNew`, and reports made-up times. They show that "
    "problems went through rollout, scoring and recording; they have no pass rates, times or "
    "plots, and nothing of them is set beside the paper. For results run `cuda-agent bench "
    "--env real` on a GPU machine.\n"
)


def _inconclusive_line(summaries: list[Summary]) -> str:
    """How many correct problems kept a lower milestone because a paired timing interval
    straddled its threshold (rewards.reward.score_paired)."""
    counts = ", ".join(f"{s.label}: {s.overall.inconclusive}" for s in summaries)
    return (f"Inconclusive timings (correct, but a paired speedup interval straddled a milestone "
            f"threshold, so that milestone was not granted): {counts or 'none'}.\n")


def _definitions(margin: float) -> str:
    rule = "speedup > 1" if margin == 0 else f"speedup > {1 + margin:.4g}"
    return (
        "Definitions: a problem counts when it was scored or produced no candidate (no candidate = "
        "not correct); infrastructure errors and skipped problems are excluded and listed apart. "
        f"Correct = passed the final evaluation with no hack flagged; faster = correct and {rule}; "
        "speedups are geometric means over the correct problems that were timed; overall pools all "
        "levels (levels weighted by problem count).\n"
    )


def results_table(summaries: list[Summary]) -> str:
    lines = [_HEADER, "|---|---|---|---|---|---|---|"]
    lines += [_paper_line(row) for row in PAPER_ROWS]
    for s in summaries:
        lines.append(_our_line(f"**{s.label}** overall", s.overall))
        lines += [_our_line(f"{s.label} L{level}", m) for level, m in s.levels.items()]
    return "\n".join(lines) + "\n"


def _paper_line(row: PaperRow) -> str:
    n = {None: 250, 1: 100, 2: 100, 3: 50}.get(row.level, "")
    return (f"| {row.label} | {pct(row.pass_rate)} | {pct(row.faster_than_eager_rate)} | "
            f"{pct(row.faster_than_compile_rate)} | {speed(row.speedup_vs_eager)} | "
            f"{speed(row.speedup_vs_compile)} | {n} |")


def _our_line(label: str, m: LevelMetrics) -> str:
    return (f"| {label} | {pct(m.pass_rate)} | {pct(m.faster_than_eager_rate)} | "
            f"{pct(m.faster_than_compile_rate)} | {speed(m.geomean_speedup_vs_eager)} | "
            f"{speed(m.geomean_speedup_vs_compile)} | {m.problems} |")


def _fast_p_table(summaries: list[Summary]) -> str:
    head = "| | baseline | " + " | ".join(f"fast_{p:g}" for p in FAST_P_SHOWN) + " |"
    lines = [head, "|---|---|" + "---|" * len(FAST_P_SHOWN)]
    for s in summaries:
        for name, m in [("overall", s.overall)] + [(f"L{k}", v) for k, v in s.levels.items()]:
            for baseline in ("eager", "compile"):
                values = " | ".join(pct(m.fast_p.at(p, baseline)) for p in FAST_P_SHOWN)
                lines.append(f"| {s.label} {name} | {baseline} | {values} |")
    return "\n".join(lines) + "\n"


def _outcome_table(summaries: list[Summary]) -> str:
    lines = ["| | counted | correct | no candidate | errors (excluded) | skipped |", "|---|---|---|---|---|---|"]
    for s in summaries:
        for name, m in [("overall", s.overall)] + [(f"L{k}", v) for k, v in s.levels.items()]:
            lines.append(f"| {s.label} {name} | {m.problems} | {m.correct} | {m.no_candidate} | "
                         f"{m.errors} | {m.skipped} |")
    return "\n".join(lines) + "\n"


def _hack_table(summaries: list[Summary]) -> str:
    lines = []
    for s in summaries:
        if not s.overall.hacks:
            lines.append(f"{s.label}: none.\n")
            continue
        levels = list(s.levels)
        lines.append(f"{s.label}:\n")
        lines.append("| category | " + " | ".join(f"L{k}" for k in levels) + " | total |")
        lines.append("|---|" + "---|" * (len(levels) + 1))
        for category, total in sorted(s.overall.hacks.items(), key=lambda kv: (-kv[1], kv[0])):
            per = " | ".join(str(s.levels[k].hacks.get(category, 0)) for k in levels)
            lines.append(f"| {category} | {per} | {total} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _status_table(summaries: list[Summary]) -> str:
    lines = ["| | status | count |", "|---|---|---|"]
    for s in summaries:
        lines += [f"| {s.label} | {status} | {n} |" for status, n in s.overall.statuses.items()]
    return "\n".join(lines) + "\n"


def _problem_table(records: Sequence[ProblemRecord], with_source: bool) -> str:
    head = "| level | problem | outcome | correct | verdict | hack | eager ms | compile ms | ours ms | vs eager | vs compile | turns |"
    lines = [("| source " if with_source else "") + head, ("|---" if with_source else "") + "|---" * 12 + "|"]
    for r in sorted(records, key=lambda r: (r.checkpoint_step or 0, r.source, r.level, r.problem_id)):
        times = [ms(r.eager_ms), ms(r.compile_ms), ms(r.candidate_ms), speed(r.speedup_vs_eager),
                 speed(r.speedup_vs_compile)] if r.env != "fake" else ["-"] * 5  # the fake env's are made up
        cells = [str(r.level), r.name, r.outcome, "yes" if r.correct and r.hack is None else "no",
                 r.status or "-", r.hack or "-", *times, str(r.turns)]
        if with_source:
            label = r.source if r.checkpoint_step is None else f"{r.source} @ {r.checkpoint_step}"
            cells.insert(0, label + (" [fake env]" if r.env == "fake" else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _error_table(records: Sequence[ProblemRecord]) -> str:
    lines = ["| level | problem | outcome | message |", "|---|---|---|---|"]
    for r in sorted(records, key=lambda r: (r.level, r.problem_id)):
        text = (r.error or r.message or "").replace("|", "\\|").replace("\n", " ")[:200]
        lines.append(f"| {r.level} | {r.name} | {r.outcome} | {text} |")
    return "\n".join(lines) + "\n"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def speed(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


# ---------------------------------------------------------------------------------------------
# How the machine was used; whether the baselines reproduce


def machine_markdown(machine: list[MachineUse]) -> str:
    """The run_stats section ('' without run_stats.jsonl)."""
    if not machine:
        return ""
    lines = ["\n## Machine use (`run_stats.jsonl`; resumed runs add up)\n",
             ("| checkpoint | runs | wall | problems | problems/hour | trajectories | GPU busy | jobs | jobs/s "
              "| restarts | timeouts | crashes | queue depth mean / max |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in machine:
        depth = "-" if m.depth_mean is None else f"{m.depth_mean:.1f} / {m.depth_max}"
        lines.append(f"| {_step(m.checkpoint_step)} | {m.runs} | {m.wall_s:.1f} s | {m.problems} | "
                     f"{num(m.problems_per_hour, '.0f')} | {m.trajectories} | {pct(m.busy_fraction)} | "
                     f"{m.jobs_done} | {num(m.jobs_per_s, '.2f')} | {m.restarts} | {m.timeouts} | {m.crashes} | {depth} |")
    lanes = [(m, lane) for m in machine for lane in m.lanes]
    if lanes:
        lines += ["", "| checkpoint | GPU lane | busy fraction | jobs | restarts | timeouts | crashes |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {_step(m.checkpoint_step)} | {lane.gpu} | {pct(lane.busy_fraction)} | {lane.jobs_done} | "
                  f"{lane.restarts} | {lane.timeouts} | {lane.crashes} |" for m, lane in lanes]
    else:
        lines.append("\nNo GPU queue (fake kernel env): no busy fraction.")
    return "\n".join(lines) + "\n"


def recheck_markdown(rows: list[RecheckRow]) -> str:
    """The baseline re-measurement section ('' without baseline_recheck.jsonl)."""
    if not rows:
        return ""
    s = summarize_recheck(rows)
    lines = ["\n## Baseline re-measurement (`baseline_recheck.jsonl`)\n", _recheck_line(s), "",
             "| level | problem | first from | eager ms 1st / 2nd | ratio | compile ms 1st / 2nd | ratio | agree | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        agree = "yes" if agrees(r.eager_ratio, s.agree_ratio) and agrees(r.compile_ratio, s.agree_ratio) else "no"
        last = (r.error or "").strip().splitlines()[-1:]  # a job's error ends with the exception
        error = " ".join(last).replace("|", "\\|")[:160]
        lines.append(f"| {r.level} | {r.name} | {r.first_from} | {ms(r.eager_ms_first)} / {ms(r.eager_ms_second)} | "
                     f"{num(r.eager_ratio, '.3f')} | {ms(r.compile_ms_first)} / {ms(r.compile_ms_second)} | "
                     f"{num(r.compile_ratio, '.3f')} | {agree if r.error is None else '-'} | {error or '-'} |")
    return "\n".join(lines) + "\n"


def _recheck_line(s: RecheckSummary) -> str:
    worst = lambda w: "-" if w is None else f"{w.ratio:.3f} (L{w.level} {w.name})"
    return (f"{s.problems} problems timed twice ({s.first_from_run} first timed by the run, the rest by two "
            f"baseline jobs), {s.errors} failed. Within {100 * (s.agree_ratio - 1):.0f}% (max / min): "
            f"eager {pct(s.eager_within)}, compile {pct(s.compile_within)}, **both {pct(s.both_within)}**. "
            f"Worst ratio second / first: eager {worst(s.worst_eager)}, compile {worst(s.worst_compile)}.")


def _step(step: int | None) -> str:
    return "final" if step is None else f"step {step}"


def num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


# ---------------------------------------------------------------------------------------------
# Plots


def draw_plots(out_dir: Path, records: Sequence[ProblemRecord], summaries: list[Summary]) -> list[Path]:
    """The three PNGs; each is written even with no data (an empty axes says so). The constrained
    layout keeps titles, axis labels and a legend outside the axes inside the canvas."""
    from matplotlib.figure import Figure  # Agg canvas on save, no pyplot state

    written = []
    for name, draw in zip(PLOTS, (_speedups, _fast_p, _levels)):
        fig = Figure(figsize=(7, 4), layout="constrained")
        ax = fig.add_subplot(1, 1, 1)
        draw(ax, records, summaries)
        ax.grid(alpha=0.3)
        path = out_dir / name
        fig.savefig(path, dpi=100)
        written.append(path)
    return written


def _speedups(ax, records: Sequence[ProblemRecord], summaries: list[Summary]) -> None:
    correct = [r for r in records if r.outcome == "scored" and r.correct and r.hack is None]
    series = {
        "vs eager": [r.speedup_vs_eager for r in correct if r.speedup_vs_eager],
        "vs compile": [r.speedup_vs_compile for r in correct if r.speedup_vs_compile],
    }
    values = [v for vs in series.values() for v in vs]
    ax.set_title("Speedup of the correct solutions (log scale)")
    if not values:
        ax.text(0.5, 0.5, "no correct, timed solutions", ha="center", transform=ax.transAxes)
        return
    lo, hi = math.log10(min(values + [0.5])), math.log10(max(values + [2.0]))
    bins = [10 ** (lo + (hi - lo) * i / 30) for i in range(31)]
    for label, vs in series.items():
        if vs:
            ax.hist(vs, bins=bins, alpha=0.55, label=f"{label} (n={len(vs)})")
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts of problems
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=2))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xlabel("speedup (baseline time / ours)")
    ax.set_ylabel("problems")
    ax.legend(fontsize="small")


def _fast_p(ax, records: Sequence[ProblemRecord], summaries: list[Summary]) -> None:
    ax.set_title("fast_p: share correct with speedup > p")
    for s in summaries:
        fp = s.overall.fast_p
        ax.plot(fp.p, fp.vs_eager, label=f"{s.label} vs eager")
        ax.plot(fp.p, fp.vs_compile, ls="--", label=f"{s.label} vs compile")
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xlabel("p (speedup threshold)")
    ax.set_ylabel("fast_p (share of problems)")
    ax.set_ylim(0, 1)
    if summaries:
        ax.legend(fontsize="x-small")


def _levels(ax, records: Sequence[ProblemRecord], summaries: list[Summary]) -> None:
    """Our per-level rates (last group) as bars; the paper's CUDA Agent per level as black marks,
    named in the legend (below the axes, so it hides no bar)."""
    ax.set_title("Per level: ours (bars) and the CUDA Agent paper (black marks)")
    names = ("pass_rate", "faster_than_eager_rate", "faster_than_compile_rate")
    paper = {row.level: row for row in PAPER_ROWS if row.model == "CUDA Agent" and row.level}
    levels = sorted(summaries[-1].levels) if summaries else sorted(paper)
    width = 0.27
    for i, name in enumerate(names):
        xs = [k + (i - 1) * width for k in levels]
        if summaries:
            ours = [getattr(summaries[-1].levels[k], name) or 0.0 for k in levels]
            ax.bar(xs, ours, width=width, label=f"{name.removesuffix('_rate').replace('_', ' ')} (ours)")
        marks = [(x, getattr(paper[k], name)) for x, k in zip(xs, levels) if k in paper]
        if marks:  # clip_on=False: a mark at 1.0 sits on the top edge, whole
            ax.plot(*zip(*marks), "k_", ms=14, mew=2.5, ls="none", clip_on=False,
                    label="CUDA Agent (paper), each rate" if i == 0 else None)
    ax.set_xticks(levels, [f"L{k}" for k in levels])
    ax.set_xlabel("KernelBench level")
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of problems")
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
