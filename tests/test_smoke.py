"""`cuda-agent smoke` runs demonstrations end to end on a CPU machine."""

from __future__ import annotations

import subprocess
import sys

import orjson


def test_smoke_completes_every_demonstration(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "agentcore.cli", "smoke", "--out", str(tmp_path), "--demos", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = orjson.loads((tmp_path / "summary.json").read_bytes())
    assert len(summary) == 2 and {s["status"] for s in summary.values()} == {"completed"}
    assert all("CompileResult" in s["results"] and "VerifyResult" in s["results"] for s in summary.values())
