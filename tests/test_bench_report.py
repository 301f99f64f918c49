"""bench.kernelbench.report: the files are written, the Markdown holds the paper's rows and ours,
summary.json carries the same numbers the metrics compute."""

from __future__ import annotations

import json

import pytest

from bench.kernelbench.metrics import summarize
from bench.kernelbench.report import PLOTS, write_report
from tests.test_bench_metrics import rec, synthetic

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    path = write_report(out, synthetic())
    return out, path, path.read_text()


def test_report_md_summary_and_pngs_are_written(written):
    out, path, _ = written
    assert path == out / "report.md"
    for name in PLOTS:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC, name
    assert json.loads((out / "summary.json").read_text())["records"] == len(synthetic())


def test_markdown_has_the_papers_rows(written):
    _, _, text = written
    assert "| CUDA Agent (paper) overall | 98.8% | 98.4% | 96.8% | 2.60x | 2.11x | 250 |" in text
    assert "| CUDA Agent (paper) L3 | 94.0% | 94.0% | 90.0% | 1.80x | 1.52x | 50 |" in text
    for model in ("Claude Opus 4.5", "Gemini 3 Pro", "base model"):
        assert f"| {model} (paper) overall |" in text


def test_markdown_has_our_numbers(written):
    _, _, text = written
    assert "| **m** overall | 50.0% | 33.3% | 16.7% | 2.00x | 1.00x | 6 |" in text
    assert "| m L1 | 50.0% | 25.0% | 0.0% | 1.00x | 0.50x | 4 |" in text
    assert "| m L2 | 50.0% | 50.0% | 50.0% | 8.00x | 4.00x | 2 |" in text


def test_markdown_has_hacks_per_problem_rows_and_errors(written):
    _, _, text = written
    assert "| torch_compute | 0 | 1 | 1 |" in text  # L1, L2, total
    for r in synthetic():
        assert f"| {r.level} | {r.name} | {r.outcome} |" in text
    assert "gpu lost" in text


def test_summary_json_holds_the_metrics_numbers(written):
    out, _, _ = written
    saved = json.loads((out / "summary.json").read_text())["summaries"][0]
    want = summarize(synthetic())[0]
    assert saved["overall"]["faster_than_eager_rate"] == pytest.approx(want.overall.faster_than_eager_rate)
    assert saved["levels"]["2"]["geomean_speedup_vs_eager"] == pytest.approx(8.0)
    assert saved["overall"]["fast_p"]["vs_eager"] == list(want.overall.fast_p.vs_eager)


def test_empty_and_multi_checkpoint_record_sets_still_report(tmp_path):
    empty = write_report(tmp_path / "empty", []).read_text()
    assert "CUDA Agent (paper) overall" in empty
    records = [rec(1, 1, se=2.0, sc=1.5, step=10), rec(1, 1, se=3.0, sc=2.5, step=20)]
    text = write_report(tmp_path / "two", records).read_text()
    assert "| **m @ step 10** overall | 100.0% |" in text
    assert "| **m @ step 20** overall | 100.0% | 100.0% | 100.0% | 3.00x | 2.50x | 1 |" in text
    assert "| m @ 20 | 1 | 1_P1 |" in text  # per-problem rows name their checkpoint
