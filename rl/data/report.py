"""The synthesis report: what a dataset file and its rejects say, as numbers, Markdown and PNGs.

What it is: `summarize(accepted, rejected)` turns the rows of `synth`'s two files into one dict
(candidates, acceptance overall and per filter stage, rejection reasons, operator histogram,
depth and runtime distributions, similarity to KernelBench, exact signature matches);
`write_report(out_dir, summary, accepted, rejected)` writes `report.md` and five PNG plots
(matplotlib's Agg backend, no display). Per-filter acceptance: a candidate rejected at a stage
passed every earlier stage, so a stage's `entered` counts the rows rejected there or later plus
the accepted ones.
What it is not: the pipeline (`rl.data.synth`); it reads rows, so it reports any finished or
interrupted run, and resumed runs as a whole.

Example:
    accepted, rejected = read_rows(out), read_rows(rejects_path(out))
    summary = summarize(accepted, rejected)
    write_report(Path("report/"), summary, accepted, rejected)
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from rl.data.filters import STAGES
from rl.data.synth import PIPELINE_STAGES

ORDER = (*PIPELINE_STAGES, *STAGES)
SIMILARITY_BINS = tuple(round(0.1 * k, 1) for k in range(11))


def flat(row: dict) -> dict:
    """A row's fields at one level: dataset rows keep provenance in `metadata`, rejects at top level."""
    return {**(row.get("metadata") or {}), **{k: v for k, v in row.items() if k != "metadata"}}


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    values = sorted(values)

    def q(p: float) -> float:
        return values[min(len(values) - 1, int(p * len(values)))]

    return {"n": len(values), "min": values[0], "p10": q(0.1), "p50": q(0.5), "p90": q(0.9), "max": values[-1],
            "mean": statistics.fmean(values)}


def _per_stage(accepted: int, stages: list[str]) -> dict[str, dict[str, Any]]:
    rejected_at = Counter(stages)
    out, remaining = {}, accepted + len(stages)
    for stage in ORDER:
        entered, dropped = remaining, rejected_at.get(stage, 0)
        if entered:
            out[stage] = {"entered": entered, "passed": entered - dropped, "rate": round((entered - dropped) / entered, 4)}
        remaining -= dropped
    return out


def summarize(accepted: list[dict], rejected: list[dict]) -> dict[str, Any]:
    """The numbers of the report (module docstring)."""
    good, bad = [flat(r) for r in accepted], [flat(r) for r in rejected]
    candidates = len(good) + len(bad)
    similarity = [float(r["kernelbench_similarity"]) for r in good + bad if isinstance(r.get("kernelbench_similarity"), (int, float))]
    ops = Counter(op for r in good for op in str(r.get("ops", "")).split(",") if op)
    hist = Counter(min(int(s * 10), 9) for s in similarity)
    return {
        "candidates": candidates,
        "accepted": len(good),
        "acceptance_rate": round(len(good) / candidates, 4) if candidates else 0.0,
        "by_kind": dict(Counter(str(r.get("kind", "")) for r in good)),
        "per_filter": _per_stage(len(good), [str(r.get("stage", "")) for r in bad]),
        "rejections": dict(Counter(str(r.get("reason", "")) for r in bad).most_common()),
        "operators": dict(ops.most_common()),
        "depth": {str(k): v for k, v in sorted(Counter(r["depth"] for r in good if isinstance(r.get("depth"), int)).items())},
        "eager_ms": _quantiles([float(r["eager_ms"]) for r in good if isinstance(r.get("eager_ms"), (int, float))]),
        "similarity": {**_quantiles(similarity),
                       "histogram": {f"{SIMILARITY_BINS[k]:.1f}-{SIMILARITY_BINS[k + 1]:.1f}": hist.get(k, 0) for k in range(10)}},
        "similarity_accepted": _quantiles([float(r["kernelbench_similarity"]) for r in good if "kernelbench_similarity" in r]),
        "signature_matches": {"candidates": sum(1 for r in good + bad if r.get("signature_match")),
                              "accepted": sum(1 for r in good if r.get("signature_match"))},
    }


# ---------------------------------------------------------------------------------------------
# Output.


def _bar(path: Path, title: str, labels: list[str], values: list[float], *, xlabel: str = "", horizontal: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, max(3.0, 0.22 * len(labels)) if horizontal else 4))
    if horizontal:
        ax.barh(labels[::-1], values[::-1])
    else:
        ax.bar(labels, values)
        ax.tick_params(axis="x", labelrotation=45)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _hist(path: Path, title: str, values: list[float], *, log: bool, xlabel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 4))
    if values:
        positive = [v for v in values if v > 0] if log else values
        bins = np.logspace(np.log10(min(positive)), np.log10(max(positive)) + 1e-9, 30) if log and positive else 20
        ax.hist(positive, bins=bins)
        if log:
            ax.set_xscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _table(rows: list[tuple], header: tuple[str, ...]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def _markdown(summary: dict[str, Any], extra: dict[str, Any] | None) -> str:
    s = summary
    lines = ["# Task synthesis report", "",
             f"{s['candidates']} candidates, {s['accepted']} accepted ({100 * s['acceptance_rate']:.1f}%).", ""]
    if extra:
        lines += ["## This run", "", "```json", orjson.dumps(extra, option=orjson.OPT_INDENT_2).decode(), "```", ""]
    lines += ["## Acceptance per filter", "",
              *_table([(k, v["entered"], v["passed"], f"{100 * v['rate']:.1f}%") for k, v in s["per_filter"].items()],
                      ("stage", "entered", "passed", "rate")), "", "![rejections](rejections.png)", ""]
    lines += ["## Rejection reasons", "", *_table(list(s["rejections"].items()), ("reason", "count")), ""]
    lines += ["## Operators (accepted tasks)", "", *_table(list(s["operators"].items()), ("operator", "tasks")), "",
              "![operators](operators.png)", ""]
    lines += ["## Depth", "", *_table(list(s["depth"].items()), ("depth", "tasks")), "", "![depth](depth.png)", ""]
    lines += ["## Eager runtime (ms, accepted)", "", *_table(list(s["eager_ms"].items()), ("statistic", "value")), "",
              "![runtime](runtime.png)", ""]
    sim = {k: v for k, v in s["similarity"].items() if k != "histogram"}
    lines += ["## Similarity to KernelBench L1-3 (all candidates that reached decontamination)", "",
              *_table(list(sim.items()), ("statistic", "value")), "",
              *_table(list(s["similarity"]["histogram"].items()), ("similarity", "candidates")), "",
              (f"Exact operator-signature matches: {s['signature_matches']['candidates']} candidates, "
               f"{s['signature_matches']['accepted']} accepted."), "", "![similarity](similarity.png)", ""]
    return "\n".join(lines)


def write_report(out_dir: Path, summary: dict[str, Any], accepted: list[dict], rejected: list[dict],
                 extra: dict[str, Any] | None = None) -> list[Path]:
    """report.md and the PNGs in `out_dir`; returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    good, bad = [flat(r) for r in accepted], [flat(r) for r in rejected]
    paths = {name: out_dir / f"{name}.png" for name in ("operators", "depth", "runtime", "rejections", "similarity")}
    ops = list(summary["operators"].items())
    _bar(paths["operators"], "Operators in accepted tasks", [k for k, _ in ops], [v for _, v in ops], horizontal=True)
    _bar(paths["depth"], "Composition depth (accepted)", [str(k) for k in summary["depth"]], list(summary["depth"].values()))
    _hist(paths["runtime"], "Eager runtime of accepted tasks", [float(r["eager_ms"]) for r in good if isinstance(r.get("eager_ms"), (int, float))],
          log=True, xlabel="ms")
    reasons = list(summary["rejections"].items())
    _bar(paths["rejections"], "Rejection reasons", [k for k, _ in reasons], [v for _, v in reasons], horizontal=True)
    sims = [float(r["kernelbench_similarity"]) for r in good + bad if isinstance(r.get("kernelbench_similarity"), (int, float))]
    _hist(paths["similarity"], "Similarity to the nearest KernelBench problem", sims, log=False, xlabel="similarity")
    md = out_dir / "report.md"
    md.write_text(_markdown(summary, extra))
    return [md, *paths.values()]
