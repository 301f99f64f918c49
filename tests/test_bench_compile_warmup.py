"""`bench.system.compile_warmup --aot`: a reference's forward compiled ahead of time by a trusted
process, loaded and called in a fresh one, and the summary of a way that failed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.system import compile_warmup


@pytest.mark.slow
def test_an_aot_compiled_forward_loads_and_matches_eager_in_a_fresh_process(tmp_path):
    pytest.importorskip("torch")
    # Both sides in processes of their own, as the bench runs them: compiling raises this
    # process's recursion limit (Inductor), which other tests' static checks would then inherit.
    saved = compile_warmup._record_aot("linear_relu", "cpu", tmp_path)
    assert not isinstance(saved, str), saved
    assert saved.stat().st_size > 0
    code = ("import json; from pathlib import Path; from bench.system.compile_warmup import TASKS, child_aot; "
            f"print(json.dumps(child_aot(TASKS['linear_relu'], 'cpu', Path({str(saved)!r}))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["ok"] is True
    assert set(compile_warmup.STEPS) <= set(result) and result["steady_ms"] > 0


def test_a_way_whose_every_run_failed_is_reported_by_its_errors():
    runs = [{"ok": False, "error": "RuntimeError: no"}, {"ok": False, "error": "RuntimeError: no"}]
    assert compile_warmup.summary(runs) == {"ok": False, "errors": ["RuntimeError: no"]}
    good = {"load_ms": 1.0, "build_ms": 2.0, "first_call_ms": 3.0, "steady_ms": 0.5, "ok": True, "hit": True}
    s = compile_warmup.summary([good, runs[0]])
    assert s["total_ms"] == 6.0 and s["steady_ms"] == 0.5 and s["errors"] == ["RuntimeError: no"] and not s["ok"]
