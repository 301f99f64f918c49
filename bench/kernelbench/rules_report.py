"""`cuda-agent bench --rules both`: one benchmark per rule set, and their results side by side.

What it is: `main_both(argv, main)` runs the ordinary `cuda-agent bench` command once per rule set
(`rewards.verdict.RULES`), into OUT/paper and OUT/kernelbench, then `write_rules_report(OUT)`
reads both records.jsonl and writes OUT/rules_report.md: per solution set (`ProblemRecord.source`)
the pass rate and fast_1 under each rule set, "partial" (correct, with torch doing part of the
work: never a hack) as its own row, hacks by category, refusals for the solution's form,
other failures and infrastructure errors. Each run resumes on its own, as a single run does.

What it is not: the single-run report (`bench.kernelbench.report`) or the metrics
(`bench.kernelbench.metrics`, whose definitions it uses).

Example:
    cuda-agent bench --replay .corpus/cuda-l1/h100 --rules both --out runs/corpus/cuda-l1
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.kernelbench.metrics import COUNTED, fast_p, is_correct
from bench.kernelbench.run import NOT_IN_SET
from bench.system.records import ProblemRecord, read_records
from rewards.verdict import RULES

FORM_REFUSAL = "unsupported load_inline form"
REPORT_FILE = "rules_report.md"


def main_both(argv: list[str], main: Callable[[list[str]], int], out_dir: str) -> int:
    """Run `main` once per rule set (OUT/<rules>), then write the side-by-side report."""
    rest = _without_rules(argv)
    code = 0
    for rules in RULES:
        print(f"cuda-agent bench: --rules {rules} into {Path(out_dir) / rules}", file=sys.stderr)
        code = max(code, main([*rest, "--rules", rules, "--out", str(Path(out_dir) / rules)]))
        if code in (2, 130):  # the machine, or a signal: the next rule set would stop the same way
            return code
    print(f"rules report: {write_rules_report(out_dir)}")
    return code


def _without_rules(argv: list[str]) -> list[str]:
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg in ("--rules", "--out"):
            skip = i + 1 < len(argv)
        elif not arg.startswith(("--rules=", "--out=")):
            out.append(arg)
    return out


def outcome_of(r: ProblemRecord) -> str:
    """One row label per record: ok, partial, hack:<category>, form, failed:<status>, or the outcome."""
    if r.outcome != "scored":
        return r.outcome
    if r.hack:
        return f"hack:{r.hack}"
    if is_correct(r):
        return "partial" if r.partial else "ok"
    if r.status == "compile_error" and FORM_REFUSAL in r.message:
        return "form"
    return f"failed:{r.status or 'unknown'}"


def rules_table(by_rules: dict[str, Sequence[ProblemRecord]]) -> list[str]:
    """Markdown lines: per solution set, one column per rule set."""
    rules = list(by_rules)
    sources = sorted({r.source for records in by_rules.values() for r in records})
    lines = []
    for source in sources:
        own = {k: [r for r in v if r.source == source] for k, v in by_rules.items()}
        counted = {k: [r for r in v if r.outcome in COUNTED] for k, v in own.items()}
        outcomes = {k: Counter(outcome_of(r) for r in v) for k, v in own.items()}
        labels = sorted(set().union(*outcomes.values()) - {"ok", "partial"}, key=_label_order)
        lines += [f"### {source}", "", "| | " + " | ".join(rules) + " |", "|---|" + "---|" * len(rules)]
        lines.append("| problems | " + " | ".join(str(len(own[k])) for k in rules) + " |")
        submitted = {k: [r for r in v if r.message != NOT_IN_SET] for k, v in counted.items()}
        if any(len(submitted[k]) != len(counted[k]) for k in rules):  # a replayed set: rates over its files too
            lines.append("| in the set | " + " | ".join(str(len(submitted[k])) for k in rules) + " |")
            lines.append("| pass rate of the set | " + " | ".join(_pct(fast_p(submitted[k], 0.0)) for k in rules)
                         + " |")
            lines.append("| fast_1 vs eager of the set | "
                         + " | ".join(_pct(fast_p(submitted[k], 1.0)) for k in rules) + " |")
        lines.append("| pass rate | " + " | ".join(_pct(fast_p(counted[k], 0.0)) for k in rules) + " |")
        lines.append("| fast_1 vs eager | " + " | ".join(_pct(fast_p(counted[k], 1.0)) for k in rules) + " |")
        lines.append("| fast_1 vs compile | " + " | ".join(_pct(fast_p(counted[k], 1.0, "compile")) for k in rules)
                     + " |")
        for label in ["ok", "partial", *labels]:
            lines.append(f"| {label} | " + " | ".join(str(outcomes[k][label]) for k in rules) + " |")
        lines.append("")
    return lines


def _label_order(label: str) -> tuple[int, str]:
    kinds = ("hack:", "form", "failed:", "no_candidate", "error", "skipped")
    return next((i for i, k in enumerate(kinds) if label.startswith(k)), len(kinds)), label


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def write_rules_report(out_dir: str | Path) -> Path:
    """OUT/rules_report.md from OUT/<rules>/records.jsonl."""
    out = Path(out_dir)
    by_rules = {rules: read_records(out / rules / "records.jsonl") for rules in RULES}
    head = [
        "# Results under each rule set",
        "",
        "paper: the candidate's own kernels do all the work (cuBLAS/cuDNN only from its own C++). "
        "kernelbench: torch may do part of it (\"partial\": correct and honest, never a hack); own "
        "kernels that do none of the work are still a decoy. pass rate = fast_0 over problems with a "
        "candidate or none (a replayed set: also over the problems it holds); form = refused as an unsupported load_inline form; error = infrastructure.",
        "",
    ]
    path = out / REPORT_FILE
    path.write_text("\n".join(head + rules_table(by_rules)) + "\n")
    return path


__all__ = ["main_both", "outcome_of", "rules_table", "write_rules_report"]
