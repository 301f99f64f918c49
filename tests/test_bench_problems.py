"""KernelBench problem selection for `cuda-agent bench`: levels, ids, level 4 skipped with a message."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bench.kernelbench.problems import (
    LEVEL4_MESSAGE,
    PROBLEMS,
    ProblemsError,
    default_problems_path,
    load_problems,
    parse_levels,
    read_problems,
)

SHARED = PROBLEMS
SOURCE = "import torch\nclass Model(torch.nn.Module):\n    pass\ndef get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n"


def write_problems(path: Path, rows: list[tuple[int, int, str]]) -> Path:
    lines = []
    for level, pid, name in rows:
        row = {"level": level, "problem_id": pid, "name": name, "code": SOURCE}
        if level == 4:
            row |= {"level4": True, "note": "hub weights"}
        lines.append(orjson.dumps(row))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.fixture
def problems_file(tmp_path) -> Path:
    rows = [(2, 1, "1_Conv"), (1, 19, "19_ReLU"), (1, 2, "2_Matmul"), (3, 5, "5_AlexNet"), (4, 1, "1_gpt2")]
    return write_problems(tmp_path / "problems.jsonl", rows)


def test_problems_are_sorted_by_level_then_id(problems_file):
    keys = [(p.level, p.problem_id) for p in read_problems(problems_file)]
    assert keys == [(1, 2), (1, 19), (2, 1), (3, 5), (4, 1)]


def test_level_filter_keeps_only_the_asked_levels(problems_file):
    selection = load_problems(problems_file, levels=(1,))
    assert [p.name for p in selection.problems] == ["2_Matmul", "19_ReLU"]
    assert selection.skipped == ()


def test_level_4_is_skipped_with_the_hub_weights_message(problems_file):
    selection = load_problems(problems_file, levels=(1, 2, 3, 4))
    assert all(p.level != 4 for p in selection.problems)
    assert [(p.level, why) for p, why in selection.skipped] == [(4, LEVEL4_MESSAGE)]
    assert "hub" in LEVEL4_MESSAGE


def test_problem_id_filter(problems_file):
    selection = load_problems(problems_file, levels=(1, 2), problem_ids=(19, 1))
    assert [(p.level, p.problem_id) for p in selection.problems] == [(1, 19), (2, 1)]


def test_task_ids_follow_agentcore_naming(problems_file):
    problem = load_problems(problems_file, levels=(1,)).problems[1]
    assert problem.task.task_id == "L1/19_ReLU"
    assert problem.task.level == 1 and problem.task.metadata["problem_id"] == 19


@pytest.mark.parametrize("text,levels", [("1,2,3", (1, 2, 3)), ("3,1", (1, 3)), ("2", (2,))])
def test_parse_levels(text, levels):
    assert parse_levels(text) == levels


@pytest.mark.parametrize("text", ["", "0", "a", "1,-2"])
def test_parse_levels_rejects_garbage(text):
    with pytest.raises(ValueError):
        parse_levels(text)


def test_environment_variable_names_the_problems_file(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELBENCH_PROBLEMS", str(tmp_path / "p.jsonl"))
    assert default_problems_path() == tmp_path / "p.jsonl"


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ProblemsError, match="KERNELBENCH_PROBLEMS"):
        read_problems(tmp_path / "nope.jsonl")


def test_the_real_set_has_250_runnable_problems_and_20_skipped():
    selection = load_problems(SHARED, levels=(1, 2, 3, 4))
    assert len(selection.problems) == 250
    assert len(selection.skipped) == 20
