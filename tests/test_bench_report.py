"""bench.kernelbench.report: the files are written, the Markdown holds the paper's rows and ours,
summary.json carries the same numbers the metrics compute; a fake-environment run reads as a
plumbing check; the plots keep their labels, legends and shares where a reader can see them."""

from __future__ import annotations

import json

import msgspec
import pytest

from bench.kernelbench import report
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


# ---------------------------------------------------------------------------------------------
# A fake-environment run is a plumbing check


def fake(records):
    return [msgspec.structs.replace(r, env="fake") for r in records]


def test_fake_env_report_says_so_at_the_top_and_shows_no_rate_beside_the_paper(tmp_path):
    text = write_report(tmp_path, fake(synthetic())).read_text()
    head = text.splitlines()[:3]
    assert "fake environment" in head[0] and "plumbing check, not a result" in head[2]
    assert "(paper)" not in text and "%" not in text  # no paper rows, no rates
    assert "| m [fake env] overall | 6 | 3 |" in text  # the outcome counts stay
    assert not any((tmp_path / name).exists() for name in PLOTS)
    assert json.loads((tmp_path / "summary.json").read_text())["plumbing_check_only"] is True


def test_fake_records_beside_real_ones_are_kept_out_of_the_results(tmp_path):
    text = write_report(tmp_path, synthetic() + fake([rec(1, 9, se=5.0, sc=5.0)])).read_text()
    assert text.startswith("# KernelBench report\n") and "plumbing check, not a result" in text
    results = text.split("## Results beside the paper")[1].split("## Outcomes")[0]
    assert "| **m** overall | 50.0% |" in results and "fake env" not in results


# ---------------------------------------------------------------------------------------------
# Plots a person reads


def draw(draw_fn, records):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), layout="constrained")  # as report.draw_plots makes them
    ax = fig.add_subplot(1, 1, 1)
    draw_fn(ax, records, summarize(records))
    FigureCanvasAgg(fig).draw()  # the layout and the ticks are computed
    return fig, ax


def test_levels_plot_names_the_papers_marks_and_keeps_shares_within_one():
    _, ax = draw(report._levels, synthetic())
    _, labels = ax.get_legend_handles_labels()
    assert "CUDA Agent (paper), each rate" in labels and "pass (ours)" in labels
    assert ax.get_ylim() == (0.0, 1.0)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["L1", "L2"]


def test_speedup_histogram_counts_problems_in_whole_numbers():
    _, ax = draw(report._speedups, synthetic())
    ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_plot_labels_stay_inside_the_canvas(tmp_path):
    for draw_fn in (report._speedups, report._fast_p, report._levels):
        fig, ax = draw(draw_fn, synthetic())
        renderer = fig.canvas.get_renderer()
        canvas = fig.bbox
        for artist in (ax.title, ax.xaxis.label, ax.yaxis.label, ax.get_legend()):
            box = artist.get_window_extent(renderer)
            assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= canvas.x1 + 1 and box.y1 <= canvas.y1 + 1, artist
