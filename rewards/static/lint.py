"""`cuda-agent eval --static-only`: the static rules over one solution or a folder of them, in
seconds, with no compiler and no GPU.

What it is: `lint(path, reference=, rules=) -> Verdict` runs what the evaluator runs before it
builds anything. A single-file `load_inline` solution goes through `rewards.inline.prepare.
check_source` (extraction, rewrite, the static rules on the rewritten file and its source
strings); a workspace in our layout through the static rules on its solution files (as
`rewards.evaluate.snapshot_solution` copies them); any other Python file through the Python
rules alone (a pure-PyTorch rewrite is a decoy there). The verdict is HACK (the first blocking finding),
COMPILE_ERROR (an unsupported load_inline form) or OK with the notes ("partial: torch does ..."
under kernelbench rules). `lint_tree` lints every `*.py` under a folder of solutions, each against
its task when `Problems` finds one by its KernelBench path (`level1/19_ReLU.py`).

What it is not: a verdict on correctness or speed; nothing is built, imported or run.

Example:
    problems = Problems.load("problems.jsonl")
    for path, verdict in lint_tree(Path(".corpus"), problems, rules="kernelbench"):
        print(line(path, verdict))
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import msgspec
from msgspec import Struct

from agentcore.types import Task
from rewards.evaluate import solution_files
from rewards.inline.prepare import (
    check_source,
    is_inline_solution,
    static_findings,
    with_notes,
)
from rewards.static.checks import check_sources
from rewards.verdict import (
    Finding,
    Rules,
    Verdict,
    VerdictStatus,
    apply_rules,
    hack_verdict,
    partial_work,
)

_KERNELBENCH_PATH = re.compile(r"level(\d+)/(\d+)_[^/]*\.py$")
_LOAD_INLINE = re.compile(r"\bload_inline\s*\(")


class Problem(Struct, frozen=True, kw_only=True):
    """One row of a KernelBench problems.jsonl (the fields lint reads)."""

    level: int
    problem_id: int
    code: str


class Problems:
    """Task sources by (level, problem id), from a problems.jsonl."""

    def __init__(self, rows: list[Problem]) -> None:
        self.by_id = {(p.level, p.problem_id): p.code for p in rows}

    @staticmethod
    def row(level: int, problem_id: int, code: str) -> Problem:
        return Problem(level=level, problem_id=problem_id, code=code)

    @classmethod
    def load(cls, path: str | Path) -> Problems:
        decoder = msgspec.json.Decoder(Problem)
        return cls([decoder.decode(line) for line in Path(path).read_bytes().splitlines() if line.strip()])

    def reference_for(self, path: Path) -> str | None:
        m = _KERNELBENCH_PATH.search(path.as_posix())
        return self.by_id.get((int(m.group(1)), int(m.group(2)))) if m else None


def lint(path: Path, *, reference: str | None, rules: Rules = "paper") -> Verdict:
    """The static verdict of the solution at `path` (a .py file or a workspace directory)."""
    if path.is_dir():
        if is_inline_solution(path):
            return _lint_inline((path / "model_new.py").read_text(errors="replace"), reference, rules)
        files = {rel: data.decode("utf-8", "replace") for rel, data in solution_files(path).items()}
        return _verdict(check_sources(files, reference=reference), rules)
    source = path.read_text(errors="replace")
    if _LOAD_INLINE.search(source):
        return _lint_inline(source, reference, rules)
    return _verdict(check_sources({"model_new.py": source}, reference=reference), rules)


def _lint_inline(source: str, reference: str | None, rules: Rules) -> Verdict:
    converted = check_source(source, Task(task_id="lint", source=reference or ""), rules)
    if converted.verdict is not None:
        return converted.verdict
    notes = static_findings(converted.spec, converted.model_new, reference or "")
    return with_notes(_verdict(notes, rules), converted.notes)


def _verdict(findings: list[Finding], rules: Rules) -> Verdict:
    hack = hack_verdict(findings, rules)
    if hack is not None:
        return hack
    notes = tuple(apply_rules(findings, rules))
    return Verdict(status=VerdictStatus.OK, message="static checks passed (nothing was built or run)",
                   findings=notes, rules=rules)


def lint_tree(root: Path, problems: Problems | None, *, reference: str | None = None,
              rules: Rules = "paper") -> Iterator[tuple[Path, Verdict]]:
    """(path, verdict) for every solution under `root`: workspaces (a folder with model_new.py)
    and single files; each against its task from `problems`, else against `reference`."""
    for path in _solutions(root):
        found = problems.reference_for(path) if problems is not None else None
        yield path, lint(path, reference=found or reference, rules=rules)


def _solutions(root: Path) -> Iterator[Path]:
    if (root / "model_new.py").is_file():
        yield root
        return
    for path in sorted(root.iterdir()):
        if path.is_dir():
            yield from _solutions(path)
        elif path.suffix == ".py":
            yield path


def first_finding(verdict: Verdict) -> str:
    blocking = [f for f in verdict.findings if f.blocking]
    if blocking:
        return str(blocking[0])
    return verdict.message if not verdict.ok else ""


def line(path: Path, verdict: Verdict) -> str:
    """One line per solution: path, verdict, rules, first finding (or what torch does)."""
    status = verdict.hack.value if verdict.hack is not None else verdict.status.value
    partial = partial_work(verdict)
    if verdict.ok and partial:
        status, detail = "partial", f"torch does {partial}"
    else:
        detail = first_finding(verdict)
    return "\t".join([str(path), status, verdict.rules, " ".join(detail.split())[:300]])


__all__ = ["Problems", "first_finding", "line", "lint", "lint_tree"]
