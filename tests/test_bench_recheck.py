"""The baseline recheck (`cuda-agent bench --recheck-baselines`): on CPU, a real GPU queue whose
"baseline" handler answers times written in the task source (tests/fakes/fake_baselines.py) in
place of timing on a GPU; with the `gpu` marker, rewards' real baseline job on two small level-1
problems."""

from __future__ import annotations

import json
import os
from pathlib import Path

import orjson
import pytest

from bench.kernelbench import cli
from bench.kernelbench.config import BenchConfig
from bench.kernelbench.problems import default_problems_path
from bench.kernelbench.recheck import (
    CACHE_DIR,
    RECHECK_FILE,
    RecheckRow,
    agrees,
    read_recheck,
    recheck_baselines,
    summarize_recheck,
)
from bench.kernelbench.report import write_report
from bench.system.records import ProblemRecord, append_record, read_records
from rewards.queue.gpu_queue import GpuQueueConfig

BODY = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
        "def get_inputs():\n    return [torch.rand(4)]\ndef get_init_inputs():\n    return []\n")
# (problem id, marker): steady, drifting by 30% on the second measurement, failing
PROBLEMS = {1: "eager_ms=2.0 compile_ms=1.0", 2: "eager_ms=4.0 compile_ms=3.0 drift=0.3",
            3: "eager_ms=1.0 compile_ms=1.0 fail=1", 4: "eager_ms=8.0 compile_ms=4.0 drift=0.05"}


def problems_file(tmp_path: Path) -> Path:
    path = tmp_path / "problems.jsonl"
    rows = [{"level": 1, "problem_id": pid, "name": f"{pid}_P", "code": f"# fake_baseline {mark}\n{BODY}"}
            for pid, mark in PROBLEMS.items()]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


@pytest.fixture
def fake_dir(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "fake"
    path.mkdir()
    monkeypatch.setenv("FAKE_BASELINE_DIR", str(path))
    return path


def queue_config(tmp_path: Path) -> GpuQueueConfig:
    return GpuQueueConfig(gpus=(0,), scratch_root=str(tmp_path / "scratch"), job_default_deadline_s=60.0,
                          worker_start_timeout_s=60.0, fork_per_job=True,
                          handlers={"baseline": "tests.fakes.fake_baselines:baseline"})


def config(tmp_path: Path, **kw) -> BenchConfig:
    return BenchConfig(**({"problems_path": str(problems_file(tmp_path)), "levels": (1,), "engine": "replay",
                           "out_dir": str(tmp_path / "out"), "progress": False} | kw))


def calls(fake_dir: Path) -> list[tuple[str, int, str]]:
    lines = (fake_dir / "calls.log").read_text().split("\n") if (fake_dir / "calls.log").exists() else []
    return [(sha, int(pid), cache) for sha, pid, cache in (line.split() for line in lines if line)]


def run_record(pid: int, eager_ms: float, compile_ms: float) -> ProblemRecord:
    return ProblemRecord(level=1, problem_id=pid, name=f"{pid}_P", source="replay:x", outcome="scored",
                         correct=True, status="ok", eager_ms=eager_ms, compile_ms=compile_ms, candidate_ms=1.0,
                         speedup_vs_eager=eager_ms, speedup_vs_compile=compile_ms)


async def test_each_problem_is_timed_twice_in_fresh_processes_without_the_cache(tmp_path, fake_dir):
    rows = {r.problem_id: r for r in await recheck_baselines(config(tmp_path), queue_config=queue_config(tmp_path))}
    assert set(rows) == {1, 2, 3, 4}
    assert (rows[1].eager_ms_first, rows[1].eager_ms_second, rows[1].eager_ratio) == (2.0, 2.0, 1.0)
    assert rows[1].first_from == "recheck" and rows[1].method == "cuda_graph" and rows[1].gpu == 0 and rows[1].gpu_first == 0
    assert (rows[1].eager_cv_first, rows[1].compile_cv_second) == (0.0, 0.0)  # the fake times without spread
    assert rows[2].eager_ratio == pytest.approx(1.3) and rows[2].compile_ratio == pytest.approx(1.3)
    assert rows[2].compile_ms_second == pytest.approx(3.9)
    assert rows[3].error and "fake baseline failure" in rows[3].error and rows[3].eager_ratio is None
    seen = calls(fake_dir)
    assert len(seen) == 2 * 3 + 1  # the failing problem stops after its first job
    assert {cache for _, _, cache in seen} == {"-"}  # the disk cache is bypassed
    assert len({pid for _, pid, _ in seen}) == len(seen)  # every measurement in a fresh process


async def test_the_runs_own_times_are_the_first_measurement(tmp_path, fake_dir):
    cfg = config(tmp_path, problem_ids=(1, 2))
    Path(cfg.out_dir).mkdir(parents=True)
    append_record(Path(cfg.out_dir) / "records.jsonl", run_record(1, eager_ms=2.5, compile_ms=1.0))
    append_record(Path(cfg.out_dir) / "records.jsonl",
                  ProblemRecord(level=1, problem_id=2, name="2_P", source="replay:x", outcome="scored", status="hack",
                                hack="torch_compute"))  # never timed: the recheck times it twice
    rows = {r.problem_id: r for r in await recheck_baselines(cfg, queue_config=queue_config(tmp_path))}
    assert rows[1].first_from == "run" and rows[1].eager_ms_first == 2.5 and rows[1].eager_ratio == pytest.approx(0.8)
    assert rows[1].gpu_first == -1 and rows[1].eager_cv_first is None and rows[1].eager_cv_second == 0.0
    assert rows[2].first_from == "recheck"
    assert len(calls(fake_dir)) == 1 + 2


async def test_a_rerun_measures_only_problems_without_a_good_row(tmp_path, fake_dir):
    cfg = config(tmp_path, problem_ids=(1, 3))
    await recheck_baselines(cfg, queue_config=queue_config(tmp_path))
    before = len(calls(fake_dir))
    rows = await recheck_baselines(cfg, queue_config=queue_config(tmp_path))
    assert len(calls(fake_dir)) == before + 1  # only the failed problem is tried again
    assert [r.problem_id for r in rows] == [1, 3]
    lines = (Path(cfg.out_dir) / RECHECK_FILE).read_bytes().splitlines()
    assert len(lines) == 3 and len(read_recheck(Path(cfg.out_dir) / RECHECK_FILE)) == 2


def row(pid: int, eager_ratio: float | None, compile_ratio: float | None, error: str | None = None,
        first_from: str = "recheck") -> RecheckRow:
    return RecheckRow(level=1, problem_id=pid, name=f"{pid}_P", first_from=first_from, eager_ms_first=1.0,
                      compile_ms_first=1.0, eager_ms_second=eager_ratio, compile_ms_second=compile_ratio,
                      eager_ratio=eager_ratio, compile_ratio=compile_ratio, error=error)


def test_agreement_is_max_over_min_within_ten_percent():
    assert agrees(1.0) and agrees(1.1) and agrees(1 / 1.1)
    assert not agrees(1.11) and not agrees(0.9) and not agrees(None)


def test_summary_shares_and_worst_ratios():
    rows = [row(1, 1.0, 1.02, first_from="run"), row(2, 1.05, 1.3), row(3, 0.7, 0.95), row(4, None, None, error="x")]
    s = summarize_recheck(rows)
    assert (s.problems, s.errors, s.first_from_run) == (3, 1, 1)
    assert s.eager_within == pytest.approx(2 / 3) and s.compile_within == pytest.approx(2 / 3)
    assert s.both_within == pytest.approx(1 / 3)
    assert (s.worst_eager.name, s.worst_eager.ratio) == ("3_P", 0.7)
    assert (s.worst_compile.name, s.worst_compile.ratio) == ("2_P", 1.3)
    empty = summarize_recheck([])
    assert empty.problems == 0 and empty.both_within is None and empty.worst_eager is None


async def test_report_and_summary_json_carry_the_recheck(tmp_path, fake_dir):
    cfg = config(tmp_path)
    await recheck_baselines(cfg, queue_config=queue_config(tmp_path))
    out = Path(cfg.out_dir)
    text = write_report(out, read_records(out / "records.jsonl")).read_text()
    saved = json.loads((out / "summary.json").read_text())["baseline_recheck"]
    assert saved["summary"]["problems"] == 3 and saved["summary"]["errors"] == 1
    assert saved["summary"]["both_within"] == pytest.approx(2 / 3)  # 1 and 4 (5%) agree, 2 (30%) does not
    assert saved["summary"]["worst_eager"]["name"] == "2_P"
    assert {p["problem_id"]: p["eager_ratio"] for p in saved["problems"]}[4] == pytest.approx(1.05)
    assert "## Baseline re-measurement" in text and "**both 66.7%**" in text
    assert "| 1 | 2_P | recheck | 4 / 5.2 | 1.300 | 3 / 3.9 | 1.300 | no | - |" in text
    assert "fake baseline failure" in text


def test_a_report_without_recheck_or_run_stats_has_neither_section(tmp_path):
    text = write_report(tmp_path, [run_record(1, 2.0, 1.0)]).read_text()
    assert "Baseline re-measurement" not in text and "Machine use" not in text
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["baseline_recheck"] is None and saved["machine"] == []


def test_cli_flag_sets_the_config_and_refuses_the_fake_env(tmp_path):
    a = cli.build_parser().parse_args(["--replay", "x", "--recheck-baselines"])
    assert cli.to_config(a).recheck_baselines
    with pytest.raises(SystemExit) as exc:
        cli.main(["--replay", "x", "--env", "fake", "--recheck-baselines", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2


@pytest.mark.gpu
async def test_real_baseline_jobs_reproduce_on_two_small_level1_problems(tmp_path):
    problems = default_problems_path()
    cfg = BenchConfig(problems_path=str(problems), levels=(1,), problem_ids=(19, 21), out_dir=str(tmp_path / "out"),
                      gpus=(0,), progress=False)
    rows = await recheck_baselines(cfg)
    for r in rows:
        print(r)
    assert [(r.level, r.problem_id, r.first_from, r.error) for r in rows] == [(1, 19, "recheck", None),
                                                                             (1, 21, "recheck", None)]
    for r in rows:
        assert r.eager_ms_first > 0 and r.eager_ms_second > 0 and r.compile_ms_first > 0 and r.compile_ms_second > 0
        assert r.method and r.gpu == 0
        assert 0.5 < r.eager_ratio < 2 and 0.5 < r.compile_ratio < 2, r  # loose: a broken measurement, not noise
    s = summarize_recheck(rows)
    print("both within 10%:", s.both_within, "worst:", s.worst_eager, s.worst_compile)
    assert s.problems == 2


async def test_the_default_queue_forks_a_fresh_process_per_job_with_rewards_baseline_job(monkeypatch, tmp_path):
    import rewards.env
    from bench.kernelbench.recheck import NoGpuError, default_queue_config

    async def two_gpus(config):
        return (0, 1)

    monkeypatch.setattr(rewards.env, "detect_gpus", two_gpus)
    q = await default_queue_config(BenchConfig(out_dir=str(tmp_path / "out")))
    assert q.fork_per_job and q.gpus == (0, 1)
    assert q.handlers["baseline"] == "rewards.timing.baselines:baseline" and "profile" in q.handlers
    # the compile caches persist under OUT and are writable inside the sandbox; torch is preloaded
    cache = tmp_path / "out" / CACHE_DIR
    assert q.writable_paths == (str(cache),) and q.preload[0] == "torch"
    assert q.env == {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "TRITON_CACHE_DIR": str(cache / "triton")}
    # each forked job compiles with the machine's cores shared among the lanes (at most 8)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert (await default_queue_config(BenchConfig(out_dir=str(tmp_path / "out")))).compile_threads == 8
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert (await default_queue_config(BenchConfig(out_dir=str(tmp_path / "out")))).compile_threads == 3

    async def no_gpu(config):
        return ()

    monkeypatch.setattr(rewards.env, "detect_gpus", no_gpu)
    with pytest.raises(NoGpuError):
        await default_queue_config(BenchConfig())
