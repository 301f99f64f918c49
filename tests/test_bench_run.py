"""The benchmark runner on CPU: best-candidate selection through the real orchestrator and tools,
the final-workspace fallback, records from trajectories, resumability (a stopped run loses
nothing and redoes nothing finished), per-trajectory seeds, and the command line."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import orjson
import pytest

from agentcore.engine import Generation, SamplingParams
from agentcore.kernel_env import FakeKernelEnv
from agentcore.orchestrator import Orchestrator, OrchestratorConfig, WorkItem, collect
from agentcore.rollout import RolloutConfig, RolloutRunner
from agentcore.sandbox import Sandbox, SandboxConfig
from agentcore.scripted import ScriptedEngine
from agentcore.session import WorkspaceTools
from agentcore.store import read_trajectories
from agentcore.types import Finish, Profile, ProfileResult, Task, Verify, WriteFile
from bench.kernelbench import cli
from bench.kernelbench.candidates import BestCandidateScorer, Candidate, CandidateTools, EnvEvaluator, pick_best
from bench.kernelbench.problems import Problem
from bench.kernelbench.run import BenchConfig, SeededEngine, run_benchmark, seed_of
from bench.system.records import read_records
from rewards.build.toolchain import MachineError

REPO = Path(__file__).resolve().parents[1]
SOURCE = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n" \
         "def get_inputs():\n    return [torch.rand(4)]\ndef get_init_inputs():\n    return []\n"
DEMOS = {(1, 19): ("l1_19_relu", "19_ReLU"), (1, 47): ("l1_47_sum_dim", "47_Sum_reduction_over_a_dimension"),
         (1, 51): ("l1_51_argmax_dim", "51_Argmax_over_a_dimension")}


def version(i: int) -> str:
    return f"import torch.nn as nn\nclass ModelNew(nn.Module):\n    version = {i}\n"


# ---------------------------------------------------------------------------------------------
# Best candidate


def cand(index: int, candidate_ms: float, compile_ms: float = 1.5) -> Candidate:
    return Candidate(index=index, files={}, candidate_ms=candidate_ms, eager_ms=2.0, compile_ms=compile_ms)


def test_pick_best_is_the_largest_speedup_over_compile():
    assert pick_best([cand(0, 2.0), cand(1, 1.0), cand(2, 1.2)]).index == 1
    assert pick_best([cand(0, 1.0, compile_ms=1.0), cand(1, 2.0, compile_ms=4.0)]).index == 1
    assert pick_best([]) is None


def test_pick_best_keeps_the_earliest_on_a_tie():
    assert pick_best([cand(0, 1.0), cand(1, 1.0)]).index == 0


class TimedEnv(FakeKernelEnv):
    """The fake env, profiling each call at the next of `times` (ms)."""

    def __init__(self, times: list[float]) -> None:
        super().__init__()
        self.times = list(times)

    async def profile(self, workspace, task):
        await self._wait("profile")
        ms = self.times.pop(0) if self.times else 1.0  # the final evaluation's profile comes last
        return ProfileResult(ok=True, candidate_ms=ms, eager_ms=2.0, compile_ms=1.5)


class SpyEvaluator:
    def __init__(self, env) -> None:
        self.inner, self.seen = EnvEvaluator(env), []

    async def warm(self, task):
        await self.inner.warm(task)

    async def evaluate(self, workspace, task):
        path = Path(workspace) / "model_new.py"
        self.seen.append(path.read_text() if path.exists() else None)
        return await self.inner.evaluate(workspace, task)


def write(i: int) -> tuple:
    return (WriteFile(path="model_new.py", content=version(i)), WriteFile(path="kernels/a.cu", content=f"// {i}\n"))


async def roll(renderer, workspace_root, turns: list[tuple], times: list[float]):
    """One scripted trajectory through the real orchestrator, tools and the best-candidate scorer."""
    env = TimedEnv(times)
    engine = ScriptedEngine(script=lambda s, t: renderer.parser.render_turn("", turns[min(t, len(turns) - 1)]),
                            encode=lambda text: renderer.tokenizer.encode(text, add_special_tokens=False),
                            end_ids=renderer.stop_token_ids[:1])
    tools = CandidateTools(WorkspaceTools(root=workspace_root, sandbox=Sandbox(SandboxConfig()), kernel_env=env))
    spy = SpyEvaluator(env)
    runner = RolloutRunner(engine=engine, renderer=renderer, parser=renderer.parser,
                           config=RolloutConfig(max_turns=20, max_new_tokens=4096))
    orch = Orchestrator(runner=runner, tools=tools, config=OrchestratorConfig(workers=1),
                        scorer=BestCandidateScorer(spy, tools))
    groups = await collect(orch, [WorkItem(task=Task(task_id="t", source=SOURCE), group_id="t")])
    return groups[0].trajectories[0], spy.seen


async def test_scorer_evaluates_the_fastest_verified_candidate_not_the_final_files(renderer, workspace_root):
    turns = [write(1), (Verify(),), (Profile(),),  # 2.0 ms: 0.75x compile
             write(2), (Verify(),), (Profile(),),  # 1.0 ms: 1.5x, the best
             write(3), (Profile(),),  # 0.5 ms but never verified as is: not a candidate
             write(4), (Verify(),), (Profile(),),  # 1.2 ms: verified, slower than v2
             write(5), (Finish(),)]
    traj, seen = await roll(renderer, workspace_root, turns, [2.0, 1.0, 0.5, 1.2])
    assert seen == [version(2)]
    assert traj.reward_info["candidates"] == 3
    assert traj.reward_info["candidate_index"] == 1
    assert traj.reward_info["candidate_source"] == "profiled"


async def test_verify_then_edit_then_profile_is_not_a_candidate(renderer, workspace_root):
    turns = [write(1), (Verify(),), write(2), (Profile(),), (Finish(),)]
    traj, seen = await roll(renderer, workspace_root, turns, [0.1])
    assert traj.reward_info["candidates"] == 0
    assert traj.reward_info["candidate_source"] == "final_workspace"
    assert seen == [version(2)]  # the final workspace is evaluated instead


async def test_no_model_new_means_no_candidate(renderer, workspace_root):
    traj, seen = await roll(renderer, workspace_root, [(Finish(),)], [])
    assert seen == []
    assert traj.reward_info["outcome"] == "no_candidate" and traj.reward is None


# ---------------------------------------------------------------------------------------------
# Runs: records, resume


def problems_file(tmp_path: Path) -> Path:
    path = tmp_path / "problems.jsonl"
    rows = [{"level": lv, "problem_id": pid, "name": name, "code": (REPO / "rl/demos" / demo / "model.py").read_text()}
            for (lv, pid), (demo, name) in DEMOS.items()]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def fake_config(tmp_path: Path, **kw) -> BenchConfig:
    fields = dict(problems_path=str(problems_file(tmp_path)), levels=(1,), engine="replay", env="fake",
                  replay_paths=(str(REPO / "rl/demos"),), out_dir=str(tmp_path / "out"), workers=1, progress=False)
    return BenchConfig(**(fields | kw))


class CountingEvaluator(EnvEvaluator):
    def __init__(self, env, cancel_at: int | None = None, scope: anyio.CancelScope | None = None) -> None:
        super().__init__(env)
        self.calls, self.cancel_at, self.scope = 0, cancel_at, scope

    async def evaluate(self, workspace, task):
        self.calls += 1
        if self.calls == self.cancel_at:
            self.scope.cancel()  # the run is stopped here (Ctrl-C, a kill of the job)
            await anyio.sleep(10)
        return await super().evaluate(workspace, task)


async def test_fake_replay_records_every_problem_once(tmp_path):
    records = await run_benchmark(fake_config(tmp_path))
    assert [(r.level, r.problem_id, r.outcome, r.correct) for r in records] == [
        (1, 19, "scored", True), (1, 47, "scored", True), (1, 51, "scored", True)]
    assert all(r.turns == 6 and r.candidates == 1 and r.trajectory_id for r in records)
    stats = [orjson.loads(line) for line in (Path(fake_config(tmp_path).out_dir) / "run_stats.jsonl").read_bytes().splitlines()]
    assert len(stats) == 1 and stats[0]["wall_s"] > 0 and stats[0]["gpu_queue"] is None  # the fake env has no queue
    assert stats[0]["orchestrator"]["finished"] == 3


async def test_a_stopped_run_resumes_without_losing_or_redoing_work(tmp_path):
    config = fake_config(tmp_path)
    env = FakeKernelEnv()
    with anyio.CancelScope() as scope:
        await run_benchmark(config, kernel_env=env, evaluator=CountingEvaluator(env, cancel_at=2, scope=scope))
    out = Path(config.out_dir)
    first = {r.problem_id: r for r in read_records(out / "records.jsonl")}
    assert 19 in first and len(first) < 3  # stopped partway
    again = CountingEvaluator(env)
    records = await run_benchmark(config, kernel_env=env, evaluator=again)
    assert [r.problem_id for r in records] == [19, 47, 51]
    assert again.calls == 3 - len(first)  # finished problems are not redone
    assert {r.problem_id: r for r in records}[19] == first[19]
    lines = [orjson.loads(line) for line in (out / "records.jsonl").read_bytes().splitlines()]
    assert sorted(x["problem_id"] for x in lines) == [19, 47, 51]  # each problem recorded once
    assert len(list(read_trajectories(out / "trajectories.jsonl"))) == 3


async def test_a_record_lost_after_its_trajectory_was_stored_is_rebuilt_from_the_store(tmp_path):
    config = fake_config(tmp_path)
    env = FakeKernelEnv()
    first = await run_benchmark(config, kernel_env=env, evaluator=EnvEvaluator(env))
    path = Path(config.out_dir) / "records.jsonl"
    kept = path.read_bytes().splitlines()[:-1]
    path.write_bytes(b"\n".join(kept) + b"\n" + b'{"level": 1, "probl')  # killed mid-append
    counting = CountingEvaluator(env)
    again = await run_benchmark(config, kernel_env=env, evaluator=counting)
    assert counting.calls == 0
    assert again == first
    assert len(list(read_trajectories(Path(config.out_dir) / "trajectories.jsonl"))) == 3


async def test_redo_judges_named_problems_again_and_keeps_their_old_lines_aside(tmp_path):
    config = fake_config(tmp_path)
    env = FakeKernelEnv()
    await run_benchmark(config, kernel_env=env, evaluator=EnvEvaluator(env))
    counting = CountingEvaluator(env)
    redo = msgspec.structs.replace(config, redo=((1, 47), (2, 3)))  # (2, 3) has no record: nothing to set aside
    records = await run_benchmark(redo, kernel_env=env, evaluator=counting)
    assert counting.calls == 1 and [r.problem_id for r in records] == [19, 47, 51]
    out = Path(config.out_dir)
    assert [r.problem_id for r in read_records(out / "records.redone.jsonl")] == [47]
    assert [t.task_id for t in read_trajectories(out / "trajectories.redone.jsonl")] == ["L1/47_Sum_reduction_over_a_dimension"]
    assert sorted(r.problem_id for r in read_records(out / "records.jsonl")) == [19, 47, 51]
    assert len(list(read_trajectories(out / "trajectories.jsonl"))) == 3


def test_redo_items_are_level_slash_problem_id():
    assert cli._problem_keys("1/6, 3/28") == ((1, 6), (3, 28))
    with pytest.raises(ValueError, match="LEVEL/PROBLEM_ID"):
        cli._problem_keys("6")


async def test_checkpoints_share_an_out_dir_without_skipping_each_other(tmp_path):
    await run_benchmark(fake_config(tmp_path, checkpoint_step=10))
    records = await run_benchmark(fake_config(tmp_path, checkpoint_step=20))
    assert len(records) == 3 and all(r.checkpoint_step == 20 for r in records)
    assert len(read_records(Path(tmp_path / "out/records.jsonl"))) == 6


async def test_problems_missing_from_the_replay_set_have_no_candidate(tmp_path):
    config = fake_config(tmp_path, replay_paths=(str(REPO / "rl/demos/l1_19_relu"),))
    records = {r.problem_id: r for r in await run_benchmark(config)}
    assert records[19].outcome == "scored"
    assert records[47].outcome == records[51].outcome == "no_candidate"


class FailingEvaluator(EnvEvaluator):
    """Raises `error` for the problems named in `names` (all when empty), else scores as the fake env."""

    def __init__(self, env, error: Exception, names: tuple[str, ...] = ()) -> None:
        super().__init__(env)
        self.error, self.names, self.calls = error, names, 0

    async def evaluate(self, workspace, task):
        self.calls += 1
        if not self.names or task.name in self.names:
            raise self.error
        return await super().evaluate(workspace, task)


async def test_an_infrastructure_error_is_recorded_and_retried_by_the_next_run(tmp_path):
    config = fake_config(tmp_path)
    env = FakeKernelEnv()
    first = await run_benchmark(config, kernel_env=env, evaluator=FailingEvaluator(env, RuntimeError("queue died"),
                                                                                  ("19_ReLU",)))
    assert [(r.problem_id, r.outcome) for r in first] == [(19, "error"), (47, "scored"), (51, "scored")]
    again = CountingEvaluator(env)
    records = await run_benchmark(config, kernel_env=env, evaluator=again)
    assert [(r.problem_id, r.outcome) for r in records] == [(19, "scored"), (47, "scored"), (51, "scored")]
    assert again.calls == 1  # only the errored problem ran again
    out = Path(config.out_dir)
    assert len(list(read_trajectories(out / "trajectories.jsonl", strict=True))) == 3
    assert [t.status.value for t in read_trajectories(out / "trajectories.redone.jsonl")] == ["failed"]


async def test_an_environment_error_stops_the_run_records_nothing_and_a_rerun_retries(tmp_path):
    config = fake_config(tmp_path)
    env = FakeKernelEnv()
    broken = FailingEvaluator(env, MachineError("this torch build (2.13.0+cpu) has no CUDA headers: install ..."))
    with pytest.raises(MachineError, match="no CUDA headers"):
        await run_benchmark(config, kernel_env=env, evaluator=broken)
    assert broken.calls == 1  # stopped at the first one, not run over every problem
    assert read_records(Path(config.out_dir) / "records.jsonl") == []  # not the candidates' fault: no record
    records = await run_benchmark(config, kernel_env=env, evaluator=EnvEvaluator(env))
    assert [(r.problem_id, r.outcome, r.correct) for r in records] == [
        (19, "scored", True), (47, "scored", True), (51, "scored", True)]


async def test_an_out_dir_holds_runs_of_one_kernel_environment(tmp_path):
    await run_benchmark(fake_config(tmp_path))
    with pytest.raises(ValueError, match="--env fake"):
        await run_benchmark(fake_config(tmp_path, env="real"))


# ---------------------------------------------------------------------------------------------
# Seeds


class RecordingEngine:
    def __init__(self) -> None:
        self.seeds: list[tuple[str, int | None]] = []

    async def generate(self, input_ids, params: SamplingParams, *, session_id: str) -> Generation:
        self.seeds.append((session_id, params.seed))
        return Generation(token_ids=[1], logprobs=[0.0], finish_reason="stop", weight_version=0, prompt_tokens=1)


async def test_each_trajectory_samples_with_its_own_recorded_seed():
    config = BenchConfig(seed=7)
    p = Problem(level=1, problem_id=19, name="19_ReLU", code="")
    inner = RecordingEngine()
    engine = SeededEngine(inner, {("G", 0): seed_of(config, p, 0), ("G", 1): seed_of(config, p, 1)})
    for session, turn in [("G/0/a", 0), ("G/0/a", 1), ("G/1/b", 0)]:
        await engine.generate([1], SamplingParams(max_new_tokens=1, seed=turn), session_id=session)
    s0, s1 = seed_of(config, p, 0), seed_of(config, p, 1)
    assert [s for _, s in inner.seeds] == [s0, s0 + 1, s1]
    assert s0 != s1 and seed_of(BenchConfig(seed=8), p, 0) != s0
    assert seed_of(config, p, 0) == s0  # deterministic: reruns sample alike


# ---------------------------------------------------------------------------------------------
# Command line


def test_replay_flag_implies_the_replay_engine():
    config = cli.to_config(cli.build_parser().parse_args(["--replay", "x", "--levels", "1,2", "--gpus", "0,1"]))
    assert (config.engine, config.replay_paths, config.levels, config.gpus) == ("replay", ("x",), (1, 2), (0, 1))
    assert config.max_turns == 200


@pytest.mark.parametrize("argv", [["--engine", "local"], ["--engine", "sglang", "--url", "http://h"],
                                  ["--engine", "replay"]])
def test_incomplete_engine_arguments_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2


def test_cli_replays_and_prints_the_table_with_level_4_skipped(tmp_path, capsys):
    problems = problems_file(tmp_path)
    with problems.open("ab") as f:
        f.write(orjson.dumps({"level": 4, "problem_id": 1, "name": "1_gpt2", "code": SOURCE}) + b"\n")
    rc = cli.main(["--suite", "kernelbench", "--problems", str(problems), "--levels", "1,4", "--replay",
                   str(REPO / "rl/demos"), "--env", "fake", "--out", str(tmp_path / "out"), "--no-report"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "19_ReLU" in out and "skipped" in out
    assert "4 problems" in out
    assert len(read_records(tmp_path / "out/records.jsonl")) == 4


def test_cli_fake_env_says_it_is_a_plumbing_check_and_prints_no_pass_rate(tmp_path, capsys):
    rc = cli.main(["--problems", str(problems_file(tmp_path)), "--levels", "1", "--replay", str(REPO / "rl/demos"),
                   "--env", "fake", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith(cli.FAKE_ENV_LINE) and out.count("plumbing check, not a result") == 2
    assert "correct" not in out and "1.20x" not in out and "not compiled, not timed" in out
    assert "plumbing check" in (tmp_path / "out/report.md").read_text().splitlines()[0]


@pytest.mark.skipif(cli.machine_problem(()) is None, reason="this machine can run --env real")
def test_cli_real_env_on_a_machine_that_cannot_run_it_is_one_line(tmp_path, capsys):
    rc = cli.main(["--problems", str(problems_file(tmp_path)), "--levels", "1", "--replay", str(REPO / "rl/demos"),
                   "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("cuda-agent bench: this machine cannot run --env real: ")
    assert "--env fake" in err and not (tmp_path / "out").exists()  # nothing started


def test_cli_stops_on_an_environment_error_with_one_line_and_the_fix(tmp_path, capsys, monkeypatch):
    import bench.kernelbench.run as runner

    async def broken(config, stack):  # a machine that passes the check, then fails every build
        env = FakeKernelEnv()
        return env, FailingEvaluator(env, MachineError("this torch build (2.13.0+cpu) has no CUDA headers "
                                                       "(c10/cuda/impl/cuda_cmake_macros.h is missing): install ..."))

    monkeypatch.setattr(cli, "check_gpu_machine", lambda gpus: None)
    monkeypatch.setattr(runner, "_open_env", broken)
    rc = cli.main(["--problems", str(problems_file(tmp_path)), "--levels", "1", "--replay", str(REPO / "rl/demos"),
                   "--out", str(tmp_path / "out")])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2
    assert last.startswith("cuda-agent bench: environment error (this machine, not the kernels), stopped: "
                           "this torch build (2.13.0+cpu) has no CUDA headers")
    assert "the same command retries them" in last
    assert read_records(tmp_path / "out/records.jsonl") == []


def test_help_shows_the_defaults_and_workers_keeps_its_old_name():
    text = " ".join(cli.build_parser().format_help().split())
    assert "(default: real)" in text and "(default: 256)" in text and "(default: runs/bench)" in text
    assert "--workers WORKERS, --concurrency WORKERS" in text
    for flag in ("--workers", "--concurrency"):
        assert cli.to_config(cli.build_parser().parse_args(["--replay", "x", flag, "8"])).workers == 8


def test_cli_writes_wrappers(tmp_path, capsys):
    rc = cli.main(["--problems", str(problems_file(tmp_path)), "--levels", "1", "--write-wrappers", str(tmp_path / "w")])
    assert rc == 0
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["l1_19_relu", "l1_47_sum_reduction_over_a_dimension",
                                                                "l1_51_argmax_over_a_dimension"]


# ---------------------------------------------------------------------------------------------
# The local engine (what the checkpoint watcher runs): a tiny random HF model on CPU


async def test_local_engine_run_records_seeds_and_checkpoint_step(tmp_path, tiny_hf_dir):
    config = fake_config(tmp_path, engine="local", model_path=str(tiny_hf_dir), replay_paths=(), problem_ids=(19,),
                         engine_device="cpu", max_turns=2, max_new_tokens=8, samples=2, checkpoint_step=3, seed=5)
    records = await run_benchmark(config)
    assert len(records) == 1
    r = records[0]
    assert r.checkpoint_step == 3 and r.source == str(tiny_hf_dir) and 1 <= r.turns <= 2
    assert r.outcome in ("no_candidate", "scored")  # a random model rarely writes model_new.py
    trajs = sorted(read_trajectories(Path(config.out_dir) / "trajectories.jsonl"), key=lambda t: t.sample_index)
    best = next(t for t in trajs if t.trajectory_id == r.trajectory_id)
    problem = Problem(level=1, problem_id=19, name=r.name, code="")
    assert r.seed == seed_of(config, problem, best.sample_index)
    assert len(trajs) == 2 and trajs[0].response_ids != trajs[1].response_ids  # samples draw their own seeds


# ---------------------------------------------------------------------------------------------
# The sglang engine: a loopback server speaking SGLang's JSON


async def test_sglang_engine_run_sends_fixed_sampling_and_recorded_seeds(tmp_path, tiny_tokenizer_dir):
    from tests.fakes.sglang_server import FakeSGLangServer
    from tests.test_rollout_cli import scripted_policy

    async with FakeSGLangServer(policy=scripted_policy(tiny_tokenizer_dir)) as fake:
        config = fake_config(tmp_path, engine="sglang", urls=(fake.url,), tokenizer=str(tiny_tokenizer_dir),
                             replay_paths=(), problem_ids=(19, 47), temperature=0.7, top_p=0.9, seed=3)
        records = await run_benchmark(config)
        requests = fake.generate_requests
    assert [(r.problem_id, r.outcome, r.correct) for r in records] == [(19, "scored", True), (47, "scored", True)]
    assert {(q["sampling_params"]["temperature"], q["sampling_params"]["top_p"]) for q in requests} == {(0.7, 0.9)}
    first_turn_seeds = {q["sampling_params"]["sampling_seed"] for q in requests}
    assert {r.seed for r in records} <= first_turn_seeds  # turn 0 samples with the recorded seed
    assert all(r.source == fake.url for r in records)


async def test_sglang_without_a_url_serves_the_model_on_a_server_the_bench_starts(tmp_path, tiny_hf_dir):
    from agentcore.sglang import SGLangClient, SGLangClientConfig
    from agentcore.sglang import SGLangLaunch

    launch = SGLangLaunch(module="tests.fakes.fake_sglang_launch", pythonpath=str(REPO), startup_timeout_s=60)
    config = fake_config(tmp_path, engine="sglang", model_path=str(tiny_hf_dir), replay_paths=(), problem_ids=(19,),
                         max_turns=2, max_new_tokens=16, sglang=launch)
    records = await run_benchmark(config)
    assert [r.problem_id for r in records] == [19]
    log = (tmp_path / "out" / "sglang.log").read_text()
    assert f"'model_path': '{tiny_hf_dir}'" in log and "base_gpu_id': 0" in log
    url = records[0].source
    async with SGLangClient(SGLangClientConfig(base_url=url, max_retries=0)) as client:
        assert not await client.health_generate()  # stopped with the run


@pytest.mark.parametrize("argv, message", [
    (["--engine", "sglang", "--url", "localhost:30000"], "is not a server URL"),
    (["--engine", "sglang", "--url", "http://127.0.0.1:1", "--tokenizer", "/no/such/dir"], "no such directory"),
])  # fmt: skip
def test_a_bad_url_or_tokenizer_is_a_one_line_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]
