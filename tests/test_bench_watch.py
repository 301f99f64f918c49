"""bench.kernelbench.watch over a fake run directory with a tiny real checkpoint: committed steps
only, the export child really exports the checkpoint's actor, a torn checkpoint is a recorded
failure (not a dead watcher), results land in RUN/bench/metrics.jsonl and RUN/tb/bench, and a
second pass skips what is done. `run_benchmark` is faked: the real one needs a GPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from msgspec import Struct

from bench.kernelbench import watch as w
from bench.system.records import ProblemRecord, append_record


class FakeBenchConfig(Struct, frozen=True, kw_only=True):
    """The BenchConfig fields the watcher sets (engine, model_path, checkpoint_step, out_dir)."""

    engine: str = "sglang"
    model_path: str = ""
    checkpoint_step: int | None = None
    out_dir: str = ""
    gpus: tuple[int, ...] = (6, 7)


def _meta(path: Path, step: int) -> None:
    path.mkdir(parents=True)
    (path / "meta.json").write_text(json.dumps({"step": step, "world_size": 1, "extra": {}}))


def test_committed_checkpoints_skip_tmp_and_steps_past_latest(tmp_path):
    root = tmp_path / "ckpt"
    for step in (10, 20, 40):
        _meta(root / f"step_{step:06d}", step)
    _meta(root / "step_000030.tmp", 30)
    (root / "step_000050").mkdir()  # no meta.json: torn
    (root / "latest").write_text("step_000020")
    assert [s for s, _ in w.committed_checkpoints(tmp_path)] == [10, 20]
    (root / "latest").unlink()  # no pointer: every complete step
    assert [s for s, _ in w.committed_checkpoints(tmp_path)] == [10, 20, 40]


def _make_run(run: Path, tokenizer_dir: Path, hidden: int = 32, max_position: int = 4096):
    """RUN/config.json of a tiny Qwen2 and its step-10 checkpoint; returns the actor."""
    import torch

    from agentcore.tiny_tokenizer import load_tokenizer
    from rl.config import DataConfig, TrainConfig, save_config
    from rl.learner import checkpoint
    from rl.learner.models import ModelConfig, build_actor, tiny_qwen2_config

    vocab = len(load_tokenizer(tokenizer_dir))
    hf = tiny_qwen2_config(vocab, hidden=hidden, layers=2, intermediate=2 * hidden, max_position=max_position)
    model = ModelConfig(hf_config=hf)
    save_config(TrainConfig(run_dir=str(run), model=model, data=DataConfig(tokenizer=str(tokenizer_dir))), run)
    torch.manual_seed(1)
    actor = build_actor(model, "cpu")
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(torch.randn_like(p))  # weights no fresh init has
    checkpoint.save(run, 10, actor=actor)
    return actor


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_tokenizer_dir):
    """A run with a real step-10 checkpoint of a tiny actor, a torn step 20 that `latest` names,
    a `.tmp` step 30 and an uncommitted step 40 (a copy of step 10 past `latest`)."""
    import torch

    run = tmp_path_factory.mktemp("run")
    actor = _make_run(run, tiny_tokenizer_dir)
    root = run / "ckpt"
    shutil.copytree(root / "step_000010", root / "step_000040")
    _meta(root / "step_000020", 20)
    (root / "step_000020" / "state").mkdir()  # no shards: a torn checkpoint
    shutil.copytree(root / "step_000010", root / "step_000030.tmp")
    (root / "latest").write_text("step_000020")
    want = {k: v.detach().to(torch.bfloat16) for k, v in actor.lm.state_dict().items()}
    return run, want


class FakeRunner:
    """Stands in for run_benchmark: checks the export it is pointed at, returns two records."""

    def __init__(self, want: dict):
        self.want, self.calls = want, []

    async def __call__(self, config) -> list[ProblemRecord]:
        from safetensors.torch import load_file

        self.calls.append(config)
        weights = load_file(str(Path(config.model_path) / "model.safetensors"))
        for name, tensor in self.want.items():
            assert name in weights and weights[name].equal(tensor), name
        step = config.checkpoint_step
        records = [
            ProblemRecord(level=1, problem_id=1, name="1_A", source=config.model_path, outcome="scored",
                          correct=True, status="ok", speedup_vs_eager=2.0, speedup_vs_compile=1.5,
                          checkpoint_step=step),
            ProblemRecord(level=1, problem_id=2, name="2_B", source=config.model_path, outcome="scored",
                          correct=False, status="hack", hack="torch_compute", checkpoint_step=step),
        ]
        for r in records:  # as the runner does: the watcher's report reads them back
            append_record(Path(config.out_dir) / "records.jsonl", r)
        return records


@pytest.fixture(scope="module")
def first_pass(run_dir):
    import anyio

    run, want = run_dir
    runner = FakeRunner(want)
    rows = anyio.run(lambda: w.watch(run, FakeBenchConfig(), once=True, run_benchmark=runner))
    return run, runner, rows


def test_only_the_committed_complete_checkpoint_is_benchmarked_on_its_export(first_pass):
    run, runner, rows = first_pass
    assert [c.checkpoint_step for c in runner.calls] == [10]  # 20 torn, 30 .tmp, 40 past latest
    call = runner.calls[0]
    assert call.engine == "local" and call.gpus == (6, 7)
    assert Path(call.out_dir) == run / "bench" / "kernelbench"
    assert not Path(call.model_path).exists()  # the export is removed after the benchmark
    assert [r["step"] for r in rows] == [10]


def test_the_report_covers_the_benchmarked_checkpoints(first_pass):
    run, _, _ = first_pass
    text = (run / "bench" / "kernelbench" / "report.md").read_text()
    assert "hf/step_000010 @ step 10** overall | 50.0% | 50.0% | 50.0% | 2.00x | 1.50x | 2 |" in text


def test_a_torn_checkpoint_is_a_recorded_failure(first_pass):
    run, _, _ = first_pass
    failures = [json.loads(line) for line in (run / "bench" / "failures.jsonl").read_text().splitlines()]
    assert [f["step"] for f in failures] == [20]
    assert "export of step_000020 failed: exit code 3" in failures[0]["error"]
    assert "state/.metadata is missing" in failures[0]["error"]


def test_summary_goes_to_metrics_jsonl_and_tensorboard(first_pass):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _, _ = first_pass
    (line,) = [json.loads(x) for x in (run / "bench" / "metrics.jsonl").read_text().splitlines()]
    assert line["step"] == 10 and line["records"] == 2
    assert line["bench/pass_rate"] == 0.5
    assert line["bench/geomean_speedup_vs_compile"] == 1.5
    assert line["bench/hacks/torch_compute"] == 1.0
    events = EventAccumulator(str(run / "tb" / "bench"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("bench/pass_rate")] == [(10, 0.5)]
    assert not any((run / "tb").glob("events.*"))  # the trainer's own directory is left alone


def test_second_pass_skips_benchmarked_and_given_up_steps(first_pass, run_dir):
    import anyio

    run, _, _ = first_pass
    runner = FakeRunner(run_dir[1])
    rows = anyio.run(lambda: w.watch(run, FakeBenchConfig(), once=True, max_attempts=1, run_benchmark=runner))
    assert rows == [] and runner.calls == []
    assert len((run / "bench" / "failures.jsonl").read_text().splitlines()) == 1  # no new attempt
    assert len((run / "bench" / "metrics.jsonl").read_text().splitlines()) == 1


def test_watch_cli_builds_the_bench_config():
    run = pytest.importorskip("bench.kernelbench.run")
    args, config = w.parse_watch_args(["--watch", "runs/r1", "--gpus", "6,7", "--once", "--poll-s", "5",
                                       "--set", "max_turns=50", "--set", "engine_device=cuda:5"])
    assert isinstance(config, run.BenchConfig)
    assert config.gpus == (6, 7) and config.max_turns == 50 and config.engine_device == "cuda:5"
    assert args.once and args.poll_s == 5.0 and args.watch == Path("runs/r1")
    _, config = w.parse_watch_args(["--watch", "runs/r1", "--gpus", "6,7"])
    assert config.engine_device == "cuda:6"  # a spare GPU, not the trainer's
    with pytest.raises(SystemExit):
        w.parse_watch_args(["--watch", "runs/r1", "--set", "no_such_field=1"])


@pytest.mark.gpu
async def test_watch_benchmarks_a_checkpoint_with_the_real_runner_on_gpu(tmp_path, tiny_tokenizer_dir):
    """End to end on a GPU: export, the real runner with the local engine on the export (a tiny
    random model: it writes no kernel, so the record is no_candidate), metrics line and report."""
    from bench.kernelbench.problems import default_problems_path
    from bench.kernelbench.run import BenchConfig
    from bench.system.records import read_records

    problems = default_problems_path()
    _make_run(tmp_path, tiny_tokenizer_dir, hidden=64, max_position=32768)
    config = BenchConfig(problems_path=str(problems), levels=(1,), problem_ids=(19,), max_turns=2,
                         max_new_tokens=32, max_context_tokens=16384, gpus=(0,), progress=False)
    rows = await w.watch(tmp_path, config, once=True)
    failures = tmp_path / "bench" / "failures.jsonl"
    assert not failures.exists(), failures.read_text()
    (record,) = read_records(tmp_path / "bench" / "kernelbench" / "records.jsonl")
    print(record)
    assert record.checkpoint_step == 10 and record.outcome in ("no_candidate", "scored")
    assert [r["step"] for r in rows] == [10] and rows[0]["bench/problems"] == 1.0
    assert (tmp_path / "bench" / "kernelbench" / "report.md").is_file()


def test_watch_cli_once_over_a_run_without_checkpoints(tmp_path, capsys):
    pytest.importorskip("bench.kernelbench.run")
    assert w.main_watch(["--watch", str(tmp_path), "--once", "--set", "env=fake"]) == 0
    assert "0 checkpoint(s) benchmarked" in capsys.readouterr().out
    assert w.main_watch(["--watch", str(tmp_path / "missing"), "--once"]) == 2


def test_watch_on_a_machine_that_cannot_benchmark_is_one_line(tmp_path, capsys):
    from bench.kernelbench.cli import machine_problem

    if machine_problem(()) is None:
        pytest.skip("this machine can verify and time kernels")
    assert w.main_watch(["--watch", str(tmp_path), "--once"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cuda-agent bench --watch: this machine cannot benchmark")


async def test_a_watcher_started_before_the_trainer_waits_for_its_run_directory(tmp_path):
    import anyio

    run_dir, returned = tmp_path / "run", anyio.Event()

    async def waiter() -> None:
        await w.wait_for_run_dir(run_dir, 0.05)
        returned.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.sleep(0.3)
            assert not returned.is_set()  # still waiting: no run directory yet
            run_dir.mkdir()  # the trainer arrives
            await returned.wait()
