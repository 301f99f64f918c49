"""bench.system.engines on a CPU: both engines' plumbing with a tiny model (the embedded engine for
real, SGLang as the fake launcher's server), the table they fill. The numbers mean nothing here."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from bench.system import engines

REPO = str(Path(__file__).resolve().parents[1])


def test_both_engines_are_measured_side_by_side_on_a_tiny_model(tiny_hf_dir, tmp_path):
    out = tmp_path / "out"
    pythonpath = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    rc = engines.main(["--model", str(tiny_hf_dir), "--out", str(out), "--prompt-tokens", "16", "--new-tokens", "4",
                       "--concurrency", "1,3", "--syncs", "2", "--sglang-module", "tests.fakes.fake_sglang_launch",
                       "--sglang-pythonpath", pythonpath])
    report = orjson.loads((out / "engines.json").read_bytes())
    results = report["results"]
    assert rc == 0, results
    for name in ("embedded", "embedded_static", "sglang"):
        r = results[name]
        assert r["ttft_ms"] > 0 and r["tokens_1"] == 4 and r["tokens_3"] == 12, (name, r)
        assert r["tokens_per_s_3"] > 0 and len(r["weight_sync_all_s"]) == 2
        assert r["released_gib"] is None  # no GPU to read free memory from
    assert results["sglang"]["server_start_s"] > 0
    table = (out / "engines.md").read_text()
    assert "| measure | embedded | embedded_static | sglang |" in table and "| tokens/s at 3 sequences |" in table


def test_an_engine_that_fails_is_a_row_of_its_own(tiny_hf_dir, tmp_path):
    rc = engines.main(["--model", str(tiny_hf_dir), "--out", str(tmp_path), "--engines", "sglang",
                       "--sglang-module", "no_such_module_here", "--prompt-tokens", "8", "--new-tokens", "2"])
    results = orjson.loads((tmp_path / "engines.json").read_bytes())["results"]
    assert rc == 1 and "error" in results["sglang"]
    assert "| time to first token, ms | " in (tmp_path / "engines.md").read_text()
