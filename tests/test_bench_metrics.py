"""bench.kernelbench.metrics against hand-computed values on a small synthetic record set."""

from __future__ import annotations

import math

import pytest

from bench.kernelbench.metrics import level_metrics, scalars, summarize
from bench.kernelbench.paper import PAPER_ROWS
from bench.system.records import ProblemRecord, append_record, read_records


def rec(level: int, pid: int, outcome: str = "scored", *, correct: bool = True, se: float | None = None,
        sc: float | None = None, status: str = "ok", hack: str | None = None, step: int | None = None,
        source: str = "m") -> ProblemRecord:
    return ProblemRecord(level=level, problem_id=pid, name=f"{pid}_P{level}", source=source, outcome=outcome,
                         correct=correct, status=status if outcome == "scored" else "", hack=hack,
                         speedup_vs_eager=se, speedup_vs_compile=sc, checkpoint_step=step,
                         error="gpu lost" if outcome == "error" else None)


def synthetic() -> list[ProblemRecord]:
    """L1: 4 counted (2 correct), 1 error; L2: 2 counted (1 correct, 1 hack), 1 skipped."""
    return [
        rec(1, 1, se=2.0, sc=1.0),  # faster than eager; exactly compile's time: not faster
        rec(1, 2, se=0.5, sc=0.25),
        rec(1, 3, correct=False, status="wrong_output"),
        rec(1, 4, "no_candidate", correct=False),
        rec(1, 5, "error", correct=False),
        rec(2, 1, se=8.0, sc=4.0),
        rec(2, 2, correct=False, status="hack", hack="torch_compute", se=10.0, sc=10.0),
        rec(2, 3, "skipped", correct=False),
    ]


def test_per_level_rates_and_geomeans_match_hand_computed_values():
    (s,) = summarize(synthetic())
    l1, l2 = s.levels[1], s.levels[2]
    assert (l1.problems, l1.correct, l1.errors, l1.no_candidate) == (4, 2, 1, 1)
    assert (l1.pass_rate, l1.faster_than_eager_rate, l1.faster_than_compile_rate) == (0.5, 0.25, 0.0)
    assert l1.geomean_speedup_vs_eager == pytest.approx(1.0)  # sqrt(2 * 0.5)
    assert l1.geomean_speedup_vs_compile == pytest.approx(0.5)  # sqrt(1 * 0.25)
    assert (l2.problems, l2.correct, l2.skipped) == (2, 1, 1)
    assert (l2.pass_rate, l2.faster_than_eager_rate, l2.faster_than_compile_rate) == (0.5, 0.5, 0.5)
    assert l2.geomean_speedup_vs_eager == pytest.approx(8.0)  # the hack's 10x is not counted


def test_overall_pools_problems_so_levels_weigh_by_their_count():
    (s,) = summarize(synthetic())
    o = s.overall
    assert o.problems == 6
    assert o.faster_than_eager_rate == pytest.approx(2 / 6)  # not the mean of levels, 0.375
    assert o.faster_than_compile_rate == pytest.approx(1 / 6)
    assert o.geomean_speedup_vs_eager == pytest.approx(2.0)  # (2 * 0.5 * 8) ** (1/3), not sqrt(1 * 8)
    assert o.geomean_speedup_vs_compile == pytest.approx(1.0)  # (1 * 0.25 * 4) ** (1/3)
    assert (o.timed_vs_eager, o.timed_vs_compile) == (3, 3)


def test_errors_and_skipped_are_excluded_from_rates_but_counted():
    base = summarize(synthetic())[0].overall
    more_errors = synthetic() + [rec(1, 9, "error", correct=False), rec(2, 9, "error", correct=False)]
    o = summarize(more_errors)[0].overall
    assert (o.errors, o.skipped) == (3, 1)
    assert (o.problems, o.pass_rate, o.faster_than_eager_rate) == (base.problems, base.pass_rate,
                                                                  base.faster_than_eager_rate)


def test_fast_p_at_several_thresholds():
    fp = summarize(synthetic())[0].overall.fast_p
    assert fp.at(0.0) == pytest.approx(3 / 6)  # fast_0 == pass rate
    assert fp.at(0.5) == pytest.approx(2 / 6)  # 0.5 is not > 0.5
    assert fp.at(1.0) == pytest.approx(2 / 6)
    assert fp.at(2.0) == pytest.approx(1 / 6)  # 2.0 is not > 2.0
    assert fp.at(3.0) == pytest.approx(1 / 6)
    assert fp.at(0.5, "compile") == pytest.approx(2 / 6)
    assert fp.at(1.0, "compile") == pytest.approx(1 / 6)
    assert fp.at(1.0) == summarize(synthetic())[0].overall.faster_than_eager_rate  # fast_1 == faster rate


def test_hacks_and_statuses_are_counted_by_category():
    o = summarize(synthetic())[0].overall
    assert o.hacks == {"torch_compute": 1}
    assert o.statuses == {"hack": 1, "ok": 3, "wrong_output": 1}
    assert summarize(synthetic())[0].levels[1].hacks == {}


def test_faster_margin_raises_the_bar():
    records = [rec(1, 1, se=1.03, sc=1.06), rec(1, 2, se=0.9, sc=0.9)]
    plain = level_metrics(records)
    strict = level_metrics(records, faster_margin=1 / 0.95 - 1)  # the reward's "more than 5% faster"
    assert (plain.faster_than_eager, plain.faster_than_compile) == (1, 1)
    assert (strict.faster_than_eager, strict.faster_than_compile) == (0, 1)


def test_groups_by_checkpoint_in_step_order():
    records = [rec(1, 1, se=2.0, step=20), rec(1, 1, correct=False, status="wrong_output", step=10),
               rec(1, 2, se=4.0, step=20)]
    summaries = summarize(records)
    assert [s.checkpoint_step for s in summaries] == [10, 20]
    assert summaries[0].overall.pass_rate == 0.0
    assert summaries[1].overall.geomean_speedup_vs_eager == pytest.approx(math.sqrt(8.0))
    assert scalars(summaries[1])["l1/pass_rate"] == 1.0


def test_pooling_reproduces_the_papers_overall_row_from_its_levels():
    """The paper's overall rates are its level rates weighted 100/100/50: our pooling agrees."""
    counts = {1: (100, 100, 99, 97), 2: (100, 100, 100, 100), 3: (50, 47, 47, 45)}
    records = []
    for level, (n, correct, eager, compiled) in counts.items():
        for i in range(n):
            records.append(rec(level, i + 1, correct=i < correct, status="ok" if i < correct else "wrong_output",
                               se=2.0 if i < eager else 0.5, sc=2.0 if i < compiled else 0.5))
    o = summarize(records)[0].overall
    paper = next(r for r in PAPER_ROWS if r.model == "CUDA Agent" and r.level is None)
    assert o.pass_rate == pytest.approx(paper.pass_rate)
    assert o.faster_than_eager_rate == pytest.approx(paper.faster_than_eager_rate)
    assert o.faster_than_compile_rate == pytest.approx(paper.faster_than_compile_rate)


def test_numbers_are_reproducible_from_the_saved_records(tmp_path):
    path = tmp_path / "records.jsonl"
    for r in synthetic():
        append_record(path, r)
    assert summarize(read_records(path)) == summarize(synthetic())


def test_non_positive_speedup_is_a_bug_not_a_number():
    with pytest.raises(ValueError, match="speedup"):
        summarize([rec(1, 1, se=0.0, sc=1.0)])
