"""The corpus comparison (`bench.kernelbench.corpus.compare`): our replay's records beside each
source's own verdict, on records written here (no replay, no GPU)."""

from __future__ import annotations

import pytest

from bench.kernelbench.corpus.compare import compare, main, markdown, ours
from bench.kernelbench.corpus.fetch import Entry, read_manifest
from bench.kernelbench.rules_report import FORM_REFUSAL
from bench.system.records import ProblemRecord, append_record


def entry(pid: int, verdict: str, source: str = "lab", set_: str = "runs/a") -> Entry:
    return Entry(source=source, set=set_, repo="o/r", commit="0" * 40, path="p.py", sha256="0" * 64, level=1,
                 problem_id=pid, name=f"{pid}_X", file=f"{source}/{set_}/level1/{pid}_X.py", verdict=verdict)


def record(pid: int, **fields) -> ProblemRecord:
    return ProblemRecord(level=1, problem_id=pid, name=f"{pid}_X", source="replay:x", **({"outcome": "scored"} | fields))


def test_each_record_lands_in_one_column_per_source_verdict(tmp_path):
    rows = [record(1, correct=True, status="ok"),
            record(2, correct=True, status="ok", partial="torch does aten.addmm"),
            record(3, status="hack", hack="decoy_kernel"),
            record(4, status="wrong_output"),
            record(5, status="compile_error", message=f"{FORM_REFUSAL}: cuda_sources"),
            record(6, outcome="error", error="worker died"),
            record(7, outcome="no_candidate")]
    for r in rows:
        append_record(tmp_path / "lab_runs_a" / "kernelbench" / "records.jsonl", r)
    entries = [entry(i, "correct") for i in range(1, 8)] + [entry(8, "hack")]
    table = compare(entries, tmp_path, "kernelbench")
    assert table[("lab/runs/a", "correct")] == {"files": 7, "accepted": 1, "partial": 1, "hack": 1, "failed": 1,
                                                "form": 1, "error": 1, "not judged": 1}
    assert table[("lab/runs/a", "hack")] == {"files": 1, "not judged": 1}  # no record at all
    assert "| lab/runs/a | correct | 7 | 1 | 1 | 1 | 1 | 1 | 1 | 1 |" in markdown(table, "kernelbench")
    assert compare(entries, tmp_path, "paper")[("lab/runs/a", "correct")]["not judged"] == 7  # no paper run


def test_a_missing_runs_folder_is_a_one_line_error(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_committed_manifest_reads_and_every_row_has_a_column():
    entries = read_manifest()
    assert len(entries) == len({(e.source, e.set, e.level, e.problem_id) for e in entries}) > 400
    assert ours(None) == "not judged"


def test_static_verdicts_fill_files_without_a_record_and_a_static_pass_stays_not_judged(tmp_path, capsys):
    """The static lines come from the real linter (`cuda-agent eval --static-only --json`) over a
    corpus laid out as `.corpus/<source>/<set>/levelL/<id>_<name>.py`."""
    from pathlib import Path

    from bench.kernelbench.corpus.compare import read_static
    from rewards.eval_cmd import main as eval_main

    fixtures = Path(__file__).parent / "fixtures" / "inline"
    level = tmp_path / ".corpus" / "lab" / "runs" / "a" / "level1"
    level.mkdir(parents=True)
    for pid, name in ((1, "relu_honest"), (2, "relu_torch_in_wrapper"), (3, "relu_honest")):
        (level / f"{pid}_X.py").write_bytes((fixtures / f"{name}.py").read_bytes())
    eval_main(["--static-only", "--solution", str(tmp_path / ".corpus"), "--rules", "paper", "--json"])
    lines = tmp_path / "static.jsonl"
    lines.write_text(capsys.readouterr().out)
    static = read_static(lines, "paper")
    assert static == {"lab/runs/a/level1/2_X.py": "hack"}  # the pass is not a verdict: the GPU decides it
    assert read_static(lines, "kernelbench") == {}  # lines of another rule set are not used
    append_record(tmp_path / "runs" / "lab_runs_a" / "paper" / "records.jsonl", record(3, correct=True, status="ok"))
    table = compare([entry(1, "correct"), entry(2, "correct"), entry(3, "correct")], tmp_path / "runs", "paper", static)
    assert table[("lab/runs/a", "correct")] == {"files": 3, "accepted": 1, "hack": 1, "not judged": 1}
    lines.write_text("not json\n")
    with pytest.raises(SystemExit, match="static.jsonl:1 is not a line of"):
        read_static(lines, "paper")
