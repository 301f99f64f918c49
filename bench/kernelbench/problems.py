"""The KernelBench problems a benchmark run covers: `problems.jsonl` rows as `Problem` values.

What it is: `load_problems(path, levels)` reads KernelBench's `problems.jsonl` (level,
problem_id, name, code; see rl/data/kernelbench/README.md) and keeps the requested levels.
Level 4 is never run: its Models load HuggingFace hub weights, which our machines cannot fetch;
asking for it yields a `skipped` entry with that message instead. `default_problems_path()` is
$KERNELBENCH_PROBLEMS, else the copy shipped with the package.
What it is not: the training-task loaders (`rl.data.loaders`), or a runner.

Example:
    selection = load_problems(default_problems_path(), levels=(1, 2, 3))
    tasks = [p.task for p in selection.problems]
"""

from __future__ import annotations

from pathlib import Path

import orjson
from msgspec import Struct

from agentcore.types import Task
from rl.data.kernelbench import PROBLEMS, default_problems_path

RUNNABLE_LEVELS = (1, 2, 3)
LEVEL4_MESSAGE = ("level 4 skipped: its Models load HuggingFace hub weights "
                  "(AutoModelForCausalLM.from_pretrained), which need network access")


class Problem(Struct, frozen=True, kw_only=True):
    """One KernelBench problem: `name` is the file stem, e.g. '19_ReLU'."""

    level: int
    problem_id: int
    name: str
    code: str

    @property
    def task_id(self) -> str:
        return f"L{self.level}/{self.name}"  # agentcore.tasks' id for problems.jsonl rows

    @property
    def task(self) -> Task:
        return Task(task_id=self.task_id, source=self.code, name=self.name, level=self.level,
                    metadata={"problem_id": self.problem_id})


class Selection(Struct, frozen=True, kw_only=True):
    """The problems to run, and those asked for but not run, with why."""

    problems: tuple[Problem, ...]
    skipped: tuple[tuple[Problem, str], ...] = ()


class ProblemsError(ValueError):
    """A problems file that is missing or not KernelBench's layout; the message is one line."""


def read_problems(path: str | Path) -> list[Problem]:
    """Every row of a problems.jsonl file, sorted by (level, problem_id)."""
    path = Path(path)
    if not path.is_file():
        raise ProblemsError(f"KernelBench problems not found: {path} (pass --problems FILE or set "
                            "$KERNELBENCH_PROBLEMS; the package ships rl/data/kernelbench/problems.jsonl)")
    problems = [_problem(path, n, line) for n, line in enumerate(path.read_bytes().splitlines(), 1)
                if line.strip()]
    if not problems:
        raise ProblemsError(f"{path}: no problems in it")
    return sorted(problems, key=lambda p: (p.level, p.problem_id))


def _problem(path: Path, n: int, line: bytes) -> Problem:
    try:
        r = orjson.loads(line)
        return Problem(level=int(r["level"]), problem_id=int(r["problem_id"]), name=str(r["name"]),
                       code=str(r["code"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc).splitlines()[0]
        raise ProblemsError(f"{path}:{n}: not a KernelBench problem row "
                            f"(level, problem_id, name, code): {what}") from None


def load_problems(path: str | Path, levels: tuple[int, ...] = RUNNABLE_LEVELS,
                  problem_ids: tuple[int, ...] = ()) -> Selection:
    """The problems of `levels` (and `problem_ids`, when given); level 4 comes back skipped."""
    keep, skipped = [], []
    for p in read_problems(path):
        if p.level not in levels or (problem_ids and p.problem_id not in problem_ids):
            continue
        if p.level in RUNNABLE_LEVELS:
            keep.append(p)
        else:
            skipped.append((p, LEVEL4_MESSAGE if p.level == 4 else f"level {p.level} is not runnable"))
    return Selection(problems=tuple(keep), skipped=tuple(skipped))


def parse_levels(text: str) -> tuple[int, ...]:
    """'1,2,3' -> (1, 2, 3); raises ValueError on anything else."""
    levels = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    if not levels or any(lv < 1 for lv in levels):
        raise ValueError(f"levels must be positive integers like 1,2,3, got {text!r}")
    return levels


__all__ = ["LEVEL4_MESSAGE", "PROBLEMS", "Problem", "ProblemsError", "Selection", "default_problems_path", "load_problems",
           "parse_levels", "read_problems"]
