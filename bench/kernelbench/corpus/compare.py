"""Our verdicts beside the sources' own, per solution set of the corpus:
`python -m bench.kernelbench.corpus.compare RUNS [--rules kernelbench]`.

What it is: for every set of `manifest.jsonl`, the files its source calls correct, a hack, or
unknown, against what a replay under one rule set made of them. RUNS holds one folder per set,
`<source>_<set>/<rules>/records.jsonl` (the layout `bench/device/corpus_replay.sh` writes). Per
source verdict: accepted (ok), partial (correct, torch doing part), rejected as a hack, failed
(wrong, crashed, did not build), refused for its form, infrastructure error, not judged (no
record). Prints Markdown. `--static FILE` (the JSON lines of `cuda-agent eval --static-only --json
--rules R` over `.corpus/...`) fills files without a GPU record: a static rejection is already the
verdict a replay would give (the replay runs the same checks first), a static pass still needs the
GPU and stays "not judged".
What it is not: a replay (it reads records only) or a judgement of who is right: a "correct" is
the source's, on its hardware and its version of the problem.

Example:
    python -m bench.kernelbench.corpus.compare /tmp/corpus --rules kernelbench
    cuda-agent eval --static-only --solution .corpus --rules paper --json > paper_static.jsonl
    python -m bench.kernelbench.corpus.compare /tmp/corpus --rules paper --static paper_static.jsonl
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import msgspec

from bench.kernelbench.corpus.fetch import MANIFEST, Entry, read_manifest
from bench.kernelbench.rules_report import FORM_REFUSAL, outcome_of
from bench.system.records import ProblemRecord, read_records

COLUMNS = ("files", "accepted", "partial", "hack", "failed", "form", "error", "not judged")


def ours(record: ProblemRecord | None) -> str:
    """The column a record falls in."""
    if record is None or record.outcome in ("no_candidate", "skipped"):
        return "not judged"
    if record.outcome == "error":
        return "error"
    label = outcome_of(record)
    if label == "ok":
        return "accepted"
    if label in ("partial", "form"):
        return label
    return "hack" if label.startswith("hack:") else "failed"


class StaticVerdict(msgspec.Struct, kw_only=True):
    """One line of `cuda-agent eval --static-only --json`."""

    path: str
    status: str
    rules: str
    hack: str | None = None
    message: str = ""


def read_static(path: Path, rules: str) -> dict[str, str]:
    """The file's path under `.corpus/` (the manifest's `file`) -> our column, for each file the
    static checks reject under `rules`; files they pass are left out (the GPU decides those)."""
    out: dict[str, str] = {}
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            v = msgspec.json.decode(line, type=StaticVerdict)
        except msgspec.DecodeError as exc:
            raise SystemExit(f"compare: {path}:{n} is not a line of `cuda-agent eval --static-only --json`: {exc}")
        _, corpus, file = v.path.partition(".corpus/")
        if v.rules != rules or v.status == "ok" or not corpus:
            continue
        form = v.status == "compile_error" and FORM_REFUSAL in v.message
        out[file] = "hack" if v.status == "hack" else "form" if form else "failed"
    return out


def compare(entries: list[Entry], runs: Path, rules: str,
            static: dict[str, str] | None = None) -> dict[tuple[str, str], Counter[str]]:
    """(set, source verdict) -> counts of our columns; `static` fills files without a record."""
    records: dict[str, dict[tuple[int, int], ProblemRecord]] = {}
    table: dict[tuple[str, str], Counter[str]] = {}
    for e in entries:
        name = f"{e.source}/{e.set}"
        if name not in records:
            path = runs / f"{e.source}_{e.set.replace('/', '_')}" / rules / "records.jsonl"
            records[name] = {(r.level, r.problem_id): r for r in read_records(path)} if path.exists() else {}
        row = table.setdefault((name, e.verdict or "unknown"), Counter())
        row["files"] += 1
        column = ours(records[name].get((e.level, e.problem_id)))
        if column == "not judged" and static:
            column = static.get(e.file, column)
        row[column] += 1
    return table


def markdown(table: dict[tuple[str, str], Counter[str]], rules: str) -> str:
    lines = [f"Under `{rules}` rules; accepted counts ok only, partial is correct with torch doing part.\n",
             "| set | source says | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---|" * len(COLUMNS)]
    for (name, verdict), row in sorted(table.items()):
        lines.append(f"| {name} | {verdict} | " + " | ".join(str(row[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernelbench.corpus.compare", description=__doc__.split("\n")[0])
    p.add_argument("runs", help="folder of replays: <source>_<set>/<rules>/records.jsonl")
    p.add_argument("--rules", default="kernelbench", choices=["paper", "kernelbench"])
    p.add_argument("--manifest", default=str(MANIFEST))
    p.add_argument("--static", help="`cuda-agent eval --static-only --json` lines: fill files without a record")
    a = p.parse_args(argv)
    runs = Path(a.runs)
    if not runs.is_dir():
        print(f"compare: {runs} is not a folder of replays", file=sys.stderr)
        return 2
    static = read_static(Path(a.static), a.rules) if a.static else None
    print(markdown(compare(read_manifest(Path(a.manifest)), runs, a.rules, static), a.rules))
    return 0


if __name__ == "__main__":
    sys.exit(main())
