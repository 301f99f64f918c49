"""`cuda-agent bench --rules`: the rule set reaches the records, and `--rules both` runs one
benchmark per rule set and writes the side-by-side report (`bench.kernelbench.rules_report`).
The fake environment checks the plumbing on a CPU; the table's rows are checked on records."""

from __future__ import annotations

from pathlib import Path

import orjson

from bench.kernelbench import cli
from bench.kernelbench.rules_report import outcome_of, rules_table
from bench.system.records import ProblemRecord, read_records

REPO = Path(__file__).resolve().parents[1]


def problems_file(tmp_path: Path) -> Path:
    path = tmp_path / "problems.jsonl"
    row = {"level": 1, "problem_id": 19, "name": "19_ReLU", "code": (REPO / "rl/demos/l1_19_relu/model.py").read_text()}
    path.write_bytes(orjson.dumps(row) + b"\n")
    return path


def test_rules_both_runs_each_rule_set_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli.main(["--problems", str(problems_file(tmp_path)), "--levels", "1", "--replay", str(REPO / "rl/demos"),
                   "--env", "fake", "--out", str(out), "--no-report", "--rules", "both"])
    assert rc == 0
    assert [r.rules for r in read_records(out / "paper" / "records.jsonl")] == ["paper"]
    assert [r.rules for r in read_records(out / "kernelbench" / "records.jsonl")] == ["kernelbench"]
    report = (out / "rules_report.md").read_text()
    assert "| | paper | kernelbench |" in report and "| partial |" in report
    assert str(out / "rules_report.md") in capsys.readouterr().out


def record(**kw) -> ProblemRecord:
    base = dict(level=1, problem_id=1, name="1_x", source="replay:set", outcome="scored", status="ok", correct=True)
    return ProblemRecord(**(base | kw))


def test_partial_is_its_own_row_and_never_a_hack():
    paper = [record(status="hack", correct=False, hack="torch_compute", rules="paper")]
    kernelbench = [record(partial="aten.convolution", rules="kernelbench", speedup_vs_eager=1.2)]
    assert outcome_of(paper[0]) == "hack:torch_compute" and outcome_of(kernelbench[0]) == "partial"
    table = "\n".join(rules_table({"paper": paper, "kernelbench": kernelbench}))
    assert "| pass rate | 0.0% | 100.0% |" in table
    assert "| partial | 0 | 1 |" in table and "| hack:torch_compute | 1 | 0 |" in table


def test_a_refusal_for_the_form_is_not_a_wrong_answer():
    refused = record(status="compile_error", correct=False, message="unsupported load_inline form: two calls")
    assert outcome_of(refused) == "form" and outcome_of(record(status="compile_error", correct=False)) == (
        "failed:compile_error"
    )
