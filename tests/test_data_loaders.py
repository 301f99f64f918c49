"""rl.data.loaders: KernelBench, Ops-6K parquet and dataset JSON lines into Tasks; check_runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import orjson
import pytest

from agentcore.types import Task
from rl.data.kernelbench import PROBLEMS
from rl.data.loaders import check_runs, dump_dataset_jsonl, load_dataset_jsonl, load_kernelbench, load_ops6k

KERNELBENCH = PROBLEMS

GOOD = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(4, 8)]

def get_init_inputs():
    return []
"""
NO_INPUTS = GOOD.replace("def get_inputs():", "def make_inputs():")
NO_MODEL = GOOD.replace("class Model(", "class Net(")
BROKEN = GOOD.replace("return torch.relu(x)", "return torch.relu(x")


def _have_parquet_lib() -> bool:
    return any(importlib.util.find_spec(m) is not None for m in ("pyarrow", "pandas"))


def _write_parquet(path: Path, rows: dict[str, list]) -> None:
    if importlib.util.find_spec("pyarrow") is not None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table(rows), path)
    else:
        import pandas as pd

        pd.DataFrame(rows).to_parquet(path)


def test_kernelbench_jsonl_loads_levels_1_to_3():
    result = load_kernelbench(KERNELBENCH, levels={1, 2, 3})
    assert len(result.tasks) == 250 and not result.problems
    assert {t.level for t in result.tasks} == {1, 2, 3}
    assert result.tasks[0].task_id.startswith("L1/")


def test_kernelbench_directory_reports_malformed_files_by_name(tmp_path):
    for name, source in {"good": GOOD, "no_inputs": NO_INPUTS, "no_model": NO_MODEL, "broken": BROKEN}.items():
        (tmp_path / f"{name}.py").write_text(source)
    result = load_kernelbench(tmp_path)
    assert [t.task_id for t in result.tasks] == ["good"]
    problems = {Path(p.where).stem: p.message for p in result.problems}
    assert "get_inputs" in problems["no_inputs"]
    assert "Model" in problems["no_model"]
    assert "syntax error" in problems["broken"]


def test_single_kernelbench_file_loads(tmp_path):
    (tmp_path / "relu.py").write_text(GOOD)
    result = load_kernelbench(tmp_path / "relu.py")
    assert [t.task_id for t in result.tasks] == ["relu"]


@pytest.mark.skipif(not _have_parquet_lib(), reason="needs pyarrow or pandas")
def test_ops6k_parquet_drops_byte_identical_duplicates_and_reports_broken_rows(tmp_path):
    other = GOOD.replace("torch.relu", "torch.sigmoid")
    rows = {
        "code": [GOOD, other, GOOD, NO_MODEL],
        "ops": [["nn.ReLU"], ["torch.sigmoid"], ["nn.ReLU"], ["nn.ReLU"]],
        "data_source": ["torch#1", "torch#1", "torch#1", "torch#1"],
    }
    _write_parquet(tmp_path / "train.parquet", rows)
    result = load_ops6k(tmp_path)
    assert [t.source for t in result.tasks] == [GOOD, other]
    assert result.duplicates_dropped == 1
    assert len(result.problems) == 1 and "ops6k/00003" in result.problems[0].where
    assert orjson.loads(result.tasks[0].metadata["ops"]) == ["nn.ReLU"]
    assert result.tasks[0].metadata["data_source"] == "torch#1"


@pytest.mark.skipif(_have_parquet_lib(), reason="only meaningful without pyarrow and pandas")
def test_ops6k_without_parquet_library_raises_a_clear_error(tmp_path):
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(ImportError, match="pyarrow or pandas"):
        load_ops6k(tmp_path / "x.parquet")


def test_dataset_jsonl_keeps_provenance_and_reports_bad_rows(tmp_path):
    path = tmp_path / "data.jsonl"
    rows = [
        {"task_id": "compose/1", "source": GOOD, "ops": "nn.ReLU", "depth": 1, "metadata": {"rng_seed": 1}},
        {"task_id": "compose/2", "source": NO_INPUTS},
        {"source": GOOD},
    ]
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\nnot json\n")
    result = load_dataset_jsonl(path)
    assert [t.task_id for t in result.tasks] == ["compose/1"]
    assert result.tasks[0].metadata == {"rng_seed": 1, "ops": "nn.ReLU", "depth": 1}
    assert len(result.problems) == 3
    assert any("compose/2" in p.where and "get_inputs" in p.message for p in result.problems)


def test_dataset_jsonl_round_trips_and_dedupes(tmp_path):
    tasks = [
        Task(task_id="a", source=GOOD, metadata={"source": "seed"}),
        Task(task_id="b", source=GOOD, metadata={"source": "seed"}),
    ]
    dump_dataset_jsonl(tasks, tmp_path / "d.jsonl")
    result = load_dataset_jsonl(tmp_path / "d.jsonl")
    assert result.tasks == (tasks[0],)
    assert result.duplicates_dropped == 1


def test_check_runs_passes_a_working_task():
    assert check_runs(Task(task_id="ok", source=GOOD), timeout_s=60) is None


def test_check_runs_reports_a_forward_that_raises():
    bad = GOOD.replace("torch.relu(x)", "x @ x")  # [4, 8] @ [4, 8]: shape mismatch
    error = check_runs(Task(task_id="mm", source=bad), timeout_s=60)
    assert error is not None and error.startswith("mm:") and "RuntimeError" in error


def test_check_runs_times_out_a_hanging_task():
    hang = GOOD.replace("return torch.relu(x)", "import time\n        time.sleep(60)")
    error = check_runs(Task(task_id="hang", source=hang), timeout_s=3)
    assert error == "hang: timed out after 3 s"
