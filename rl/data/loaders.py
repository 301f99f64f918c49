"""Task loaders: KernelBench files, the CUDA-Agent-Ops-6K parquet layout and our dataset JSON lines.

What it is: every training/eval task source turned into `agentcore.types.Task` values, as one
`LoadResult` (tasks, problems, duplicates dropped). Structure is checked on load (parses, has
`Model`, `get_inputs`, `get_init_inputs`: `agentcore.tasks.check_source`); a broken entry is
reported by name in `problems` and the rest load. Byte-identical sources are dropped, first
kept (the public CUDA-Agent-Ops-6K set on Hugging Face has 352 such duplicates).
What it is not: the runtime filters of the data pipeline; `check_runs` only says whether a task's
Model builds and runs forward on CPU, in a child process with a timeout.

Example:
    result = load_ops6k("data/ops6k/")          # a parquet file or a directory of them
    print(len(result.tasks), result.duplicates_dropped, *result.problems, sep="\n")
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
from msgspec import Struct

from agentcore.tasks import TaskProblem, check_source, load_tasks
from agentcore.types import JsonScalar, Task

OPS6K_COLUMNS = ("code", "ops", "data_source")


class LoadResult(Struct, frozen=True, kw_only=True):
    """Tasks that loaded, the entries that did not (and why), and how many duplicates were dropped."""

    tasks: tuple[Task, ...]
    problems: tuple[TaskProblem, ...] = ()
    duplicates_dropped: int = 0


def _dedupe(tasks: list[Task]) -> tuple[list[Task], int]:
    """Drop byte-identical sources, keeping the first."""
    seen: set[bytes] = set()
    kept = []
    for task in tasks:
        key = hashlib.sha1(task.source.encode()).digest()
        if key not in seen:
            seen.add(key)
            kept.append(task)
    return kept, len(tasks) - len(kept)


def _result(tasks: list[Task], problems: list[TaskProblem]) -> LoadResult:
    kept, dropped = _dedupe(tasks)
    return LoadResult(tasks=tuple(kept), problems=tuple(problems), duplicates_dropped=dropped)


def load_kernelbench(path: str | Path, *, levels: set[int] | None = None) -> LoadResult:
    """One KernelBench problem `.py`, a directory of them, or `problems.jsonl` (level, problem_id, name, code)."""
    tasks, problems = load_tasks(path, levels=levels)
    return _result(tasks, problems)


# ---------------------------------------------------------------------------------------------
# CUDA-Agent-Ops-6K: parquet with columns code, ops, data_source.


def _read_parquet_columns(path: Path) -> dict[str, list]:
    """The Ops-6K columns of one parquet file as Python lists, via pyarrow or else pandas."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        pq = None
    if pq is not None:
        table = pq.read_table(path)
        missing = [c for c in OPS6K_COLUMNS if c not in table.column_names]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        return {c: table.column(c).to_pylist() for c in OPS6K_COLUMNS}
    try:
        import pandas as pd
    except ImportError:
        raise ImportError(
            "reading CUDA-Agent-Ops-6K parquet needs pyarrow or pandas (pip install pyarrow)"
        ) from None
    frame = pd.read_parquet(path)
    missing = [c for c in OPS6K_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
    return {c: frame[c].tolist() for c in OPS6K_COLUMNS}


def _ops_text(ops) -> str:
    """`ops` as one string: the column may hold a list of names or already a string."""
    if ops is None:
        return ""
    if isinstance(ops, str):
        return ops
    return orjson.dumps([str(op) for op in ops]).decode()


def load_ops6k(path: str | Path) -> LoadResult:
    """A CUDA-Agent-Ops-6K parquet file, or a directory of them (read in sorted order)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset not found: {path}")
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    tasks: list[Task] = []
    problems: list[TaskProblem] = []
    row_number = 0
    for file in files:
        columns = _read_parquet_columns(file)
        for code, ops, data_source in zip(*(columns[c] for c in OPS6K_COLUMNS)):
            task_id = f"ops6k/{row_number:05d}"
            where = f"{file.name}:row {row_number} ({task_id})"
            row_number += 1
            if not isinstance(code, str) or not code.strip():
                problems.append(TaskProblem(where=where, message="empty `code`"))
                continue
            meta: dict[str, JsonScalar] = {"source": "ops6k", "ops": _ops_text(ops), "data_source": str(data_source)}
            task = Task(task_id=task_id, source=code, name=str(data_source), metadata=meta)
            _accept(task, where, tasks, problems)
    return _result(tasks, problems)


# ---------------------------------------------------------------------------------------------
# Our dataset JSON lines: task_id, source, optional name/level/metadata, other keys = provenance.

_TASK_FIELDS = ("task_id", "source", "name", "level", "metadata")


def _dataset_row(row: dict) -> Task:
    if not isinstance(row.get("task_id"), str) or not isinstance(row.get("source"), str):
        raise ValueError("row needs string fields `task_id` and `source`")
    meta = dict(row.get("metadata") or {})
    # Provenance written at top level (seed ops, depth, rng seed...) is kept in metadata.
    meta.update({k: v for k, v in row.items() if k not in _TASK_FIELDS})
    bad = [k for k, v in meta.items() if not isinstance(v, (str, int, float, bool, type(None)))]
    if bad:
        raise ValueError(f"metadata must be JSON scalars; not: {', '.join(bad)}")
    level = row.get("level")
    return Task(task_id=row["task_id"], source=row["source"], name=str(row.get("name") or ""), level=level, metadata=meta)


def load_dataset_jsonl(path: str | Path) -> LoadResult:
    """Our own dataset file: one JSON object a line with `task_id`, `source` and provenance."""
    path = Path(path)
    tasks: list[Task] = []
    problems: list[TaskProblem] = []
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path.name}:{number}"
        try:
            row = orjson.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
            task = _dataset_row(row)
        except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
            problems.append(TaskProblem(where=where, message=str(exc)))
            continue
        _accept(task, f"{where} ({task.task_id})", tasks, problems)
    return _result(tasks, problems)


def _accept(task: Task, where: str, tasks: list[Task], problems: list[TaskProblem]) -> None:
    why = check_source(task.source)
    if why:
        problems.append(TaskProblem(where=where, message=why))
    else:
        tasks.append(task)


def dump_dataset_jsonl(tasks: list[Task] | tuple[Task, ...], path: str | Path) -> None:
    """Write tasks in the layout `load_dataset_jsonl` reads."""
    with open(path, "wb") as f:
        for task in tasks:
            row = {"task_id": task.task_id, "source": task.source, "name": task.name, "level": task.level, "metadata": task.metadata}
            f.write(orjson.dumps(row) + b"\n")


# ---------------------------------------------------------------------------------------------
# Does the Model run? A child process, because task code is untrusted and may hang or crash.

_RUNNER = """
import sys, types, torch
source = sys.stdin.read()
module = types.ModuleType("task_model")
exec(compile(source, "model.py", "exec"), module.__dict__)
torch.manual_seed(0)
model = module.Model(*module.get_init_inputs())
with torch.no_grad():
    out = model(*module.get_inputs())
outs = out if isinstance(out, (tuple, list)) else [out]
if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
    raise TypeError(f"forward returned {type(out).__name__}, not tensors")
"""


def check_runs(task: Task, timeout_s: float = 60.0, *, threads: int = 1) -> str | None:
    """Why `task`'s Model does not build and run forward on CPU within `timeout_s`, or None."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen(
        [sys.executable, "-c", _RUNNER],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env, start_new_session=True,  # own process group: a timeout kills its children too
    )
    try:
        _, err = proc.communicate(task.source.encode(), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return f"{task.task_id}: timed out after {timeout_s:g} s"
    if proc.returncode == 0:
        return None
    lines = [ln for ln in err.decode(errors="replace").splitlines() if ln.strip()]
    return f"{task.task_id}: " + (lines[-1] if lines else f"exit status {proc.returncode}")
