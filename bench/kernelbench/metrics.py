"""The KernelBench numbers of a benchmark run, computed from its per-problem records alone.

What it is: `summarize(records)` turns `bench.system.records.ProblemRecord`s into a `Summary` per
(source, checkpoint, kernel env): per level and overall, the pass rate, the faster-than-eager and
faster-than-compile rates, the geometric-mean speedups over eager and over torch.compile, and
KernelBench's fast_p curves; plus the outcome, verdict-status and hack-category counts.
What it is not: the runner (`bench.kernelbench.run` writes the records) or the report
(`bench.kernelbench.report` lays these out beside the paper's rows).

Definitions (the results table of the CUDA Agent paper, arXiv 2602.24286; KernelBench's fast_p):
- counted problems: outcome `scored` or `no_candidate` (never produced a candidate: not correct).
  `error` (infrastructure failure) and `skipped` are excluded from every rate and counted apart.
- correct: `scored`, `correct`, and no hack named (a flagged hack never counts as a pass).
- faster than a baseline: correct and speedup > 1 + `faster_margin` (default 0: KernelBench's
  fast_1 rule; the training reward's "more than 5% faster" is `faster_margin=1/0.95-1`).
- geomean speedup: exp(mean log speedup) over the correct problems that have a speedup.
- fast_p: share of counted problems that are correct with speedup > p (p = 0: the pass rate).
- overall = the pooled problems of all levels, i.e. levels weighted by their problem count.
- inconclusive: correct problems whose paired timing could not decide a milestone (an interval
  straddled the 5% threshold; the lower milestone was given).
- records judged by the fake kernel environment form their own Summary (`fake_env`): it checks
  the plumbing and measures nothing, so its rates are not results.

Example:
    for s in summarize(read_records(out_dir / "records.jsonl")):
        print(s.label, s.overall.pass_rate, s.levels[1].geomean_speedup_vs_eager)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from msgspec import Struct

from bench.system.records import ProblemRecord

COUNTED = ("scored", "no_candidate")
FAST_P_GRID: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(61))  # 0, 0.05, ..., 3.0
"""The thresholds p of the fast_p curves."""
FAST_P_SHOWN: tuple[float, ...] = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
"""The fast_p points the report's table prints."""


class FastP(Struct, frozen=True, kw_only=True):
    """KernelBench's fast_p at each threshold of `p`, against eager and against torch.compile."""

    p: tuple[float, ...]
    vs_eager: tuple[float, ...]
    vs_compile: tuple[float, ...]

    def at(self, p: float, baseline: str = "eager") -> float:
        values = self.vs_eager if baseline == "eager" else self.vs_compile
        return values[self.p.index(p)]


class LevelMetrics(Struct, frozen=True, kw_only=True):
    """The numbers of one set of problems (a level, or all of them). Rates are None when no
    problem was counted; geomeans are None when no correct problem has a speedup."""

    problems: int
    """Counted problems (scored + no_candidate): the denominator of every rate."""
    correct: int
    faster_than_eager: int
    faster_than_compile: int
    pass_rate: float | None
    faster_than_eager_rate: float | None
    faster_than_compile_rate: float | None
    geomean_speedup_vs_eager: float | None
    geomean_speedup_vs_compile: float | None
    timed_vs_eager: int
    """Correct problems with a speedup over eager: the count behind its geomean."""
    timed_vs_compile: int
    no_candidate: int
    errors: int
    """Records with outcome `error`: excluded from the rates."""
    skipped: int
    hacks: dict[str, int]
    """Counted problems whose final evaluation named a hack, by category."""
    statuses: dict[str, int]
    """Verdict statuses of the scored problems."""
    inconclusive: int
    """Correct problems whose paired timing withheld a milestone (an interval straddled 5%)."""
    fast_p: FastP


class Summary(Struct, frozen=True, kw_only=True):
    """All numbers of one (source, checkpoint, kernel env) group of records."""

    label: str
    source: str
    checkpoint_step: int | None
    faster_margin: float
    overall: LevelMetrics
    levels: dict[int, LevelMetrics]
    fake_env: bool = False
    """Judged by the fake kernel environment: a plumbing check, not a result."""


def is_correct(r: ProblemRecord) -> bool:
    return r.outcome == "scored" and r.correct and r.hack is None


def is_faster(speedup: float | None, margin: float = 0.0) -> bool:
    return speedup is not None and speedup > 1.0 + margin


def geomean(values: Iterable[float]) -> float | None:
    """exp(mean(log x)); None for no values. Non-positive speedups are a runner bug: raise."""
    logs = []
    for v in values:
        if not v > 0 or not math.isfinite(v):
            raise ValueError(f"speedup {v!r} is not a positive finite number")
        logs.append(math.log(v))
    return math.exp(math.fsum(logs) / len(logs)) if logs else None


def fast_p(counted: Sequence[ProblemRecord], p: float, baseline: str = "eager") -> float | None:
    """Share of `counted` that is correct with speedup > p (p <= 0: correct)."""
    if not counted:
        return None
    field = "speedup_vs_eager" if baseline == "eager" else "speedup_vs_compile"
    hits = 0
    for r in counted:
        speedup = getattr(r, field)
        hits += is_correct(r) and (p <= 0 or (speedup is not None and speedup > p))
    return hits / len(counted)


def level_metrics(records: Sequence[ProblemRecord], *, faster_margin: float = 0.0) -> LevelMetrics:
    """The numbers of `records` taken as one pool (see the module docstring)."""
    counted = [r for r in records if r.outcome in COUNTED]
    correct = [r for r in counted if is_correct(r)]
    eager = [r.speedup_vs_eager for r in correct if r.speedup_vs_eager is not None]
    compiled = [r.speedup_vs_compile for r in correct if r.speedup_vs_compile is not None]
    n_eager = sum(is_faster(s, faster_margin) for s in eager)
    n_compile = sum(is_faster(s, faster_margin) for s in compiled)
    return LevelMetrics(
        problems=len(counted),
        correct=len(correct),
        faster_than_eager=n_eager,
        faster_than_compile=n_compile,
        pass_rate=_rate(len(correct), len(counted)),
        faster_than_eager_rate=_rate(n_eager, len(counted)),
        faster_than_compile_rate=_rate(n_compile, len(counted)),
        geomean_speedup_vs_eager=geomean(eager),
        geomean_speedup_vs_compile=geomean(compiled),
        timed_vs_eager=len(eager),
        timed_vs_compile=len(compiled),
        no_candidate=sum(r.outcome == "no_candidate" for r in records),
        errors=sum(r.outcome == "error" for r in records),
        skipped=sum(r.outcome == "skipped" for r in records),
        hacks=dict(sorted(Counter(r.hack for r in counted if r.hack).items())),
        statuses=dict(sorted(Counter(r.status for r in counted if r.outcome == "scored" and r.status).items())),
        inconclusive=sum(r.inconclusive for r in correct),
        fast_p=FastP(
            p=FAST_P_GRID,
            vs_eager=tuple(fast_p(counted, p, "eager") or 0.0 for p in FAST_P_GRID),
            vs_compile=tuple(fast_p(counted, p, "compile") or 0.0 for p in FAST_P_GRID),
        ),
    )


def _rate(k: int, n: int) -> float | None:
    return k / n if n else None


def summarize(records: Iterable[ProblemRecord], *, faster_margin: float = 0.0) -> list[Summary]:
    """One Summary per (source, checkpoint_step, env), ordered by checkpoint step, source, env."""
    groups: dict[tuple[str, int | None, str], list[ProblemRecord]] = {}
    for r in records:
        groups.setdefault((r.source, r.checkpoint_step, r.env), []).append(r)
    order = sorted(groups, key=lambda k: (k[1] is not None, k[1] or 0, k[0], k[2]))
    return [_summary(*key, groups[key], faster_margin) for key in order]


def _summary(source: str, step: int | None, env: str, records: list[ProblemRecord], margin: float) -> Summary:
    by_level: dict[int, list[ProblemRecord]] = {}
    for r in records:
        by_level.setdefault(r.level, []).append(r)
    label = source if step is None else f"{source} @ step {step}"
    return Summary(
        label=label + (" [fake env]" if env == "fake" else ""),
        source=source,
        checkpoint_step=step,
        faster_margin=margin,
        overall=level_metrics(records, faster_margin=margin),
        levels={level: level_metrics(rs, faster_margin=margin) for level, rs in sorted(by_level.items())},
        fake_env=env == "fake",
    )


def scalars(summary: Summary) -> dict[str, float]:
    """Flat `name -> number` of one summary (overall and `l{level}/...`), for TensorBoard and
    metrics.jsonl; rates and geomeans that are None are left out."""
    out: dict[str, float] = {}
    for prefix, m in [("", summary.overall)] + [(f"l{k}/", v) for k, v in summary.levels.items()]:
        for name in ("pass_rate", "faster_than_eager_rate", "faster_than_compile_rate",
                     "geomean_speedup_vs_eager", "geomean_speedup_vs_compile"):
            value = getattr(m, name)
            if value is not None:
                out[prefix + name] = float(value)
        out[prefix + "problems"] = float(m.problems)
        out[prefix + "errors"] = float(m.errors)
        out[prefix + "inconclusive"] = float(m.inconclusive)
        for p in FAST_P_SHOWN:
            out[f"{prefix}fast_{p:g}_eager"] = m.fast_p.at(p, "eager")
            out[f"{prefix}fast_{p:g}_compile"] = m.fast_p.at(p, "compile")
    for category, count in summary.overall.hacks.items():
        out[f"hacks/{category}"] = float(count)
    return out
