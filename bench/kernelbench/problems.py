"""The KernelBench problems a benchmark run covers: `problems.jsonl` rows as `Problem` values.

What it is: `load_problems(path, levels)` reads KernelBench's `problems.jsonl` (level,
problem_id, name, code; see shared/kernelbench/README.md) and keeps the requested levels. Level 4
is never run: its Models load HuggingFace hub weights, which our machines cannot fetch; asking
for it yields a `skipped` entry with that message instead. `default_problems_path()` is
$KERNELBENCH_PROBLEMS, else the shared checkout's copy.
What it is not: the training-task loaders (`rl.data.loaders`), or a runner.

Example:
    selection = load_problems(default_problems_path(), levels=(1, 2, 3))
    tasks = [p.task for p in selection.problems]
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
from msgspec import Struct

from agentcore.types import Task

REPO = Path(__file__).resolve().parents[2]
CANDIDATE_PATHS = (REPO / "shared/kernelbench/problems.jsonl", REPO.parent / "shared/kernelbench/problems.jsonl")
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


def default_problems_path() -> Path:
    """$KERNELBENCH_PROBLEMS, else shared/kernelbench/problems.jsonl inside or beside the repo."""
    if env := os.environ.get("KERNELBENCH_PROBLEMS"):
        return Path(env)
    for path in CANDIDATE_PATHS:
        if path.exists():
            return path
    return CANDIDATE_PATHS[-1]


def read_problems(path: str | Path) -> list[Problem]:
    """Every row of a problems.jsonl file, sorted by (level, problem_id)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"KernelBench problems not found: {path} (set $KERNELBENCH_PROBLEMS)")
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    problems = [Problem(level=int(r["level"]), problem_id=int(r["problem_id"]), name=str(r["name"]),
                        code=str(r["code"])) for r in rows]
    return sorted(problems, key=lambda p: (p.level, p.problem_id))


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


__all__ = ["LEVEL4_MESSAGE", "Problem", "Selection", "default_problems_path", "load_problems",
           "parse_levels", "read_problems"]
