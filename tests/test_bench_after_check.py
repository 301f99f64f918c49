"""`bench.system.after_check` on a CPU: its fresh processes, each way's steps and the table, on a
small task from a problems file of its own (KernelBench's level-1 tensors take minutes on a CPU)."""

import json

import pytest

TASK = """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)
def get_inputs():
    return [torch.randn(128, 64)]
def get_init_inputs():
    return []
"""


@pytest.fixture
def problems(tmp_path, monkeypatch):
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps({"level": 1, "problem_id": 1, "name": "small_softmax", "code": TASK}) + "\n")
    monkeypatch.setenv("KERNELBENCH_PROBLEMS", str(path))
    return path


def test_each_way_checks_in_its_own_process_and_every_check_passes(problems, tmp_path, capsys):
    from bench.system.after_check import main

    out = tmp_path / "after_check.json"
    assert main(["--device", "cpu", "--tasks", "small_softmax", "--repeats", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [(r["way"], len(r["checks"])) for r in report["results"]] == [("float64", 4), ("within", 4)]
    assert all(s["passed"] and s["steady"] for s in report["summary"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("| small_softmax | float64 |") and lines[2].endswith("| 1.000, 1.000 |")
    assert lines[3].startswith("| small_softmax | within |")


def test_an_unknown_task_fails_its_row_with_one_line_and_the_run_says_so(problems, tmp_path, capsys):
    from bench.system.after_check import main

    assert main(["--device", "cpu", "--tasks", "no_such_task", "--ways", "within", "--repeats", "1"]) == 1
    assert "no KernelBench problem named 'no_such_task'" in capsys.readouterr().err


def test_an_unknown_way_is_a_one_line_error(problems):
    from bench.system.after_check import main

    with pytest.raises(SystemExit, match="unknown float16"):
        main(["--device", "cpu", "--ways", "float16"])
