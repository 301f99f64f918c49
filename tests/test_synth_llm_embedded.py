"""LLM composition through the real embedded engine (a random tiny Qwen2 on CPU), not a scripted
one: `cuda-agent synth --mix 1 --engine embedded` prompts the engine for every candidate, and the
random model's replies become rejections with reasons; nothing is raised, nothing is lost, and a
rerun does not redo the rejected indices."""

from __future__ import annotations

import contextlib
import io

import orjson

from rl.data.synth_cmd import main


def test_random_model_compositions_are_rejected_with_reasons(tmp_path, tiny_hf_dir):
    kb = tmp_path / "problems.jsonl"
    kb.write_bytes(orjson.dumps({"level": 1, "problem_id": 1, "name": "1_x", "code": "import torch\n"}) + b"\n")
    out = tmp_path / "d.jsonl"
    argv = ["--n", "1", "--max-candidates", "3", "--out", str(out), "--gpus", "0", "--lanes-per-gpu", "1",
            "--device", "cpu", "--no-compile", "--kernelbench", str(kb),
            "--mix", "1.0", "--engine", "embedded", "--model", str(tiny_hf_dir)]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(argv) == 0
    summary = orjson.loads(stdout.getvalue())
    assert summary["candidates"] == 3 and summary["accepted"] == 0
    rejects = [orjson.loads(line) for line in (tmp_path / "d.jsonl.rejects.jsonl").read_bytes().splitlines()]
    assert [r["kind"] for r in rejects] == ["llm"] * 3
    assert all(r["reason"] and r["stage"] == "generate" for r in rejects), rejects  # why, for each
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0  # resumed: the three indices are spent, nothing is redone
    assert len((tmp_path / "d.jsonl.rejects.jsonl").read_bytes().splitlines()) == 3
