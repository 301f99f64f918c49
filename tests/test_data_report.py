"""rl.data.report: numbers from accepted / rejected rows, and the Markdown + PNG files."""

from __future__ import annotations

from rl.data.report import summarize, write_report


def accepted(index: int, ops: str, eager_ms: float, similarity: float, signature: str = "") -> dict:
    meta = {"index": index, "kind": "compose", "ops": ops, "depth": len(ops.split(",")), "eager_ms": eager_ms,
            "kernelbench_similarity": similarity, "signature_match": signature, "nearest_kernelbench": "L1/1"}
    return {"task_id": f"compose/{index}", "source": "...", "metadata": meta}


ACCEPTED = [accepted(0, "nn.Conv2d,nn.GELU", 3.0, 0.55), accepted(1, "nn.Conv2d", 12.0, 0.72, "L1/54"),
            accepted(2, "torch.tanh,nn.GELU,nn.Softmax", 1.5, 0.61)]
REJECTED = [
    {"index": 3, "stage": "generate", "reason": "no_code"},
    {"index": 4, "stage": "decontaminate", "reason": "similar_to_kernelbench", "kernelbench_similarity": 0.95},
    {"index": 5, "stage": "runtime", "reason": "too_fast", "kernelbench_similarity": 0.4, "eager_ms": 0.2},
    {"index": 6, "stage": "runtime", "reason": "too_fast", "kernelbench_similarity": 0.45},
    {"index": 7, "stage": "deterministic", "reason": "stochastic", "kernelbench_similarity": 0.5},
]


def test_per_filter_acceptance_counts_everything_that_reached_a_stage():
    s = summarize(ACCEPTED, REJECTED)
    assert (s["candidates"], s["accepted"], s["acceptance_rate"]) == (8, 3, 0.375)
    f = s["per_filter"]
    assert f["generate"] == {"entered": 8, "passed": 7, "rate": 0.875}
    assert f["decontaminate"] == {"entered": 7, "passed": 6, "rate": round(6 / 7, 4)}
    assert f["deterministic"]["entered"] == 6 and f["deterministic"]["passed"] == 5
    assert f["runtime"] == {"entered": 5, "passed": 3, "rate": 0.6}
    assert f["compile"] == {"entered": 3, "passed": 3, "rate": 1.0}
    assert s["rejections"] == {"too_fast": 2, "no_code": 1, "similar_to_kernelbench": 1, "stochastic": 1}


def test_histograms_and_distributions():
    s = summarize(ACCEPTED, REJECTED)
    assert s["operators"] == {"nn.Conv2d": 2, "nn.GELU": 2, "torch.tanh": 1, "nn.Softmax": 1}
    assert s["depth"] == {"1": 1, "2": 1, "3": 1}
    assert s["eager_ms"]["p50"] == 3.0 and s["eager_ms"]["max"] == 12.0
    assert s["similarity"]["n"] == 7 and s["similarity"]["max"] == 0.95
    assert s["similarity"]["histogram"]["0.9-1.0"] == 1 and s["similarity"]["histogram"]["0.4-0.5"] == 2
    assert s["signature_matches"] == {"candidates": 1, "accepted": 1}


def test_report_files_are_written(tmp_path):
    s = summarize(ACCEPTED, REJECTED)
    paths = write_report(tmp_path, s, ACCEPTED, REJECTED, extra={"filtered_per_min": 12.5})
    names = sorted(p.name for p in paths)
    assert names == sorted(["report.md", "operators.png", "depth.png", "runtime.png", "rejections.png", "similarity.png"])
    for p in paths:
        assert p.stat().st_size > 500
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "report.md").read_text()
    assert "| runtime | 5 | 3 | 60.0% |" in md and "too_fast" in md and "filtered_per_min" in md


def test_an_empty_run_still_reports(tmp_path):
    s = summarize([], [])
    assert s["candidates"] == 0 and s["per_filter"] == {}
    assert len(write_report(tmp_path, s, [], [])) == 6
