"""`cuda-agent bench` replay on a real GPU: honest demonstrations pass the final evaluation and
reference wrappers are rejected with a hack category, through the real tools, compile pool, GPU
queue and FinalEvaluator."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.kernelbench.problems import default_problems_path
from bench.kernelbench.run import BenchConfig, run_benchmark
from bench.system.records import read_records

REPO = Path(__file__).resolve().parents[1]
DEMOS = {(1, 1), (1, 47), (1, 51)}  # cuBLAS matmul, sum, argmax: the demos that verify in seconds


@pytest.mark.gpu
async def test_replay_demos_pass_and_wrappers_are_rejected(tmp_path):
    problems = default_problems_path()
    # ids 1, 47, 51 of levels 1-3: the three demos and five wrappers (L2/1, L2/47, L2/51, L3/1, L3/47)
    config = BenchConfig(problems_path=str(problems), levels=(1, 2, 3), problem_ids=(1, 47, 51), engine="replay",
                         replay_paths=(str(REPO / "rl/demos"),), replay_wrappers=True, out_dir=str(tmp_path / "out"),
                         gpus=(0,), progress=False)
    records = {(r.level, r.problem_id): r for r in await run_benchmark(config)}
    assert set(records) == DEMOS | {(2, 1), (2, 47), (2, 51), (3, 1), (3, 47)}
    for key, r in records.items():
        print(key, r.outcome, r.status, r.hack, r.speedup_vs_eager, r.speedup_vs_compile, r.message[:200])
    for key in DEMOS:
        r = records[key]
        assert (r.outcome, r.correct, r.hack, r.candidates) == ("scored", True, None, 1), r.message[-3000:]
        assert r.speedup_vs_eager and r.speedup_vs_compile and r.eager_ms and r.compile_ms
    for key in set(records) - DEMOS:
        r = records[key]
        assert r.outcome == "scored" and not r.correct and r.status == "hack" and r.hack, r
    again = await run_benchmark(config)  # resumes: nothing left to do
    assert {(r.level, r.problem_id): r for r in again} == records
    assert len(read_records(Path(config.out_dir) / "records.jsonl")) == len(records)
