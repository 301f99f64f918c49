"""Reading task files: KernelBench-format sources into `Task` values, with clear errors.

Accepts a JSON-lines file (rows of our `Task` layout, or KernelBench's `problems.jsonl` rows
with `level`, `problem_id`, `name`, `code`), one problem `.py` file, or a directory of them.
A broken entry (bad JSON, no code, a syntax error, no `Model`/`get_inputs`/`get_init_inputs`)
is reported by name and skipped; the rest load. This checks structure only (no torch here):
running the inputs is the job of the data pipeline in `rl`.

Example:
    tasks, problems = load_tasks("rl/data/kernelbench/problems.jsonl")
"""

from __future__ import annotations

import ast
from pathlib import Path

import orjson
from msgspec import Struct

from agentcore.types import Task

REQUIRED = ("Model", "get_inputs", "get_init_inputs")


class TaskProblem(Struct, frozen=True, kw_only=True):
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def check_source(source: str) -> str | None:
    """Why `source` is not a KernelBench-format task, or None if it is."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return f"syntax error at line {exc.lineno}: {exc.msg}"
    defined = {
        node.name
        for node in tree.body
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    }
    missing = [name for name in REQUIRED if name not in defined]
    if missing:
        return "missing top-level " + ", ".join(missing)
    return None


def _row_to_task(row: dict, where: str) -> Task:
    if "source" in row and "task_id" in row:
        return Task(**{k: row[k] for k in ("task_id", "source", "name", "level", "metadata") if k in row})
    if "code" in row:
        level, name = row.get("level"), row.get("name") or row.get("problem_id") or where
        task_id = f"L{level}/{name}" if level is not None else str(name)
        meta = {k: v for k, v in row.items() if k not in ("code", "name", "level") and isinstance(v, (str, int, float, bool))}
        return Task(task_id=task_id, source=row["code"], name=str(name), level=level, metadata=meta)
    raise ValueError("row has neither `task_id`+`source` nor `code`")


def _from_jsonl(path: Path) -> tuple[list[Task], list[TaskProblem]]:
    tasks, problems = [], []
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = orjson.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
            task = _row_to_task(row, where)
        except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
            problems.append(TaskProblem(where=where, message=str(exc)))
            continue
        _accept(task, where, tasks, problems)
    return tasks, problems


def _accept(task: Task, where: str, tasks: list[Task], problems: list[TaskProblem]) -> None:
    why = check_source(task.source)
    if why:
        problems.append(TaskProblem(where=f"{where} ({task.task_id})", message=why))
    else:
        tasks.append(task)


def _from_py(path: Path, tasks: list[Task], problems: list[TaskProblem]) -> None:
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(TaskProblem(where=str(path), message=str(exc)))
        return
    _accept(Task(task_id=path.stem, source=source, name=path.stem), str(path), tasks, problems)


def load_tasks(path: str | Path, *, levels: set[int] | None = None) -> tuple[list[Task], list[TaskProblem]]:
    """Load tasks from a JSON-lines file, a `.py` file or a directory of `.py` files."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task file not found: {path}")
    tasks: list[Task] = []
    problems: list[TaskProblem] = []
    if path.is_dir():
        for py in sorted(path.rglob("*.py")):
            _from_py(py, tasks, problems)
    elif path.suffix == ".py":
        _from_py(path, tasks, problems)
    else:
        tasks, problems = _from_jsonl(path)
    if levels is not None:
        tasks = [t for t in tasks if t.level in levels]
    return tasks, problems
