"""The replay policy: solution sets found by name, scripts rendered in the model's tool format,
and a whole replay run end to end through the real orchestrator, tools, sandbox, static checks,
compile pool and final evaluator, with only the GPU edge (verify and timing) faked."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from agentcore.store import read_trajectories
from agentcore.types import Compile, Finish, Profile, ReadFile, Status, Verify, WriteFile
from bench.kernelbench.replay import Solution, find_solutions, group_of, replay_turns
from bench.kernelbench.run import BenchConfig, run_benchmark
from bench.system.records import read_records
from rewards.build.compile_pool import CompileConfig, CompilePool
from rewards.env import RewardsKernelEnv, _before_run
from rewards.evaluate import EvaluateConfig, FinalEvaluator
from rewards.timing.profile import Profile as Timed
from rewards.verdict import Timing, Verdict, VerdictStatus
from rewards.verify.verifier import to_verify_result

REPO = Path(__file__).resolve().parents[1]
RELU = REPO / "tests" / "fixtures" / "build" / "relu"  # honest, and it builds against a CPU torch
SUM = (REPO / "rl/demos/l1_47_sum_dim/model.py").read_text()
GEMM = (REPO / "rl/demos/l2_76_gemm_add_relu_cublas/model.py").read_text()
needs_compiler = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("g++") is None, reason="needs nvcc")


def put(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------------------------
# Finding solutions


def test_our_workspaces_are_keyed_by_their_names(tmp_path):
    put(tmp_path / "l1_19_relu/model_new.py", "class ModelNew: pass\n")
    put(tmp_path / "l1_19_relu/kernels/relu.cu", "// k\n")
    put(tmp_path / "l1_19_relu/kernels/notes.txt", "not a solution file\n")
    put(tmp_path / "l1_19_relu/model.py", "class Model: pass\n")
    found = find_solutions([tmp_path])
    solution = found.solutions[(1, 19)]
    assert solution.kind == "workspace"
    assert set(solution.files) == {"model_new.py", "kernels/relu.cu"}


def test_kernelbench_single_files_are_keyed_by_level_dir_and_id(tmp_path):
    put(tmp_path / "level1/19_ReLU.py", "class ModelNew: pass\n")
    put(tmp_path / "level2/7_Conv.py", "class ModelNew: pass\n")
    put(tmp_path / "runs/level_3_problem_5_sample_0_kernel.py", "class ModelNew: pass\n")
    put(tmp_path / "level1/helpers.py", "x = 1\n")  # no id in the name: not a solution
    found = find_solutions([tmp_path])
    assert set(found.solutions) == {(1, 19), (2, 7), (3, 5)}
    assert found.solutions[(2, 7)].kind == "single_file"
    assert found.solutions[(2, 7)].files == {"model_new.py": "class ModelNew: pass\n"}


def test_the_first_set_wins_and_duplicates_are_reported(tmp_path):
    put(tmp_path / "a/l1_19_relu/model_new.py", "A\n")
    put(tmp_path / "b/level1/19_ReLU.py", "B\n")
    found = find_solutions([tmp_path / "a", tmp_path / "b"])
    assert found.solutions[(1, 19)].files["model_new.py"] == "A\n"
    assert any("already from" in why for why in found.ignored)


def test_unnamed_workspace_is_reported_not_guessed(tmp_path):
    put(tmp_path / "my_solution/model_new.py", "x\n")
    found = find_solutions([tmp_path])
    assert found.solutions == {} and "does not say level" in found.ignored[0]


def test_missing_replay_path_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        find_solutions([tmp_path / "nope"])


def test_bundled_demos_are_twelve_workspaces():
    found = find_solutions([REPO / "rl/demos"])
    assert len(found.solutions) == 12 and found.ignored == ()
    assert all(s.kind == "workspace" and "model.py" not in s.files for s in found.solutions.values())


# ---------------------------------------------------------------------------------------------
# The script


def test_replay_script_reads_writes_checks_and_finishes():
    s = Solution(level=1, problem_id=19, kind="workspace", path="x", files={"model_new.py": "m", "kernels/a.cu": "k"})
    turns = replay_turns(s)
    assert turns[0] == (ReadFile(path="model.py"),)
    assert turns[1] == (WriteFile(path="model_new.py", content="m"), WriteFile(path="kernels/a.cu", content="k"))
    assert [type(t[0]) for t in turns[2:]] == [Compile, Verify, Profile, Finish]
    assert [type(t[0]) for t in replay_turns(s, checks=False)[2:]] == [Compile, Finish]


def test_replay_turns_parse_back_to_the_same_calls(renderer):
    s = Solution(level=1, problem_id=19, kind="single_file", path="x",
                 files={"model_new.py": 'import torch\nprint("</tool_call> {\\"x\\": 1}")\n'})
    for turn in replay_turns(s):
        parsed = renderer.parser.parse(renderer.parser.render_turn("", turn))
        assert tuple(parsed.calls) == turn and not parsed.errors


def test_group_of_an_orchestrator_trajectory_id():
    assert group_of("L1/19_ReLU@final/0/ab12cd34") == "L1/19_ReLU@final"


# ---------------------------------------------------------------------------------------------
# End to end on CPU: everything real but the GPU.


def _timing(ms: float) -> Timing:
    return Timing.from_samples([ms], method="fake_gpu")


class CpuEdgeEnv(RewardsKernelEnv):
    """The real env (static checks, compile pool) with the GPU edge faked: a workspace that passes
    the static checks and builds is 'correct', and times 1.0 ms against eager 2.0 / compile 1.5."""

    async def verify(self, workspace, task):
        prepared = await self.prepare(workspace, task)
        if prepared.verdict is not None:
            return to_verify_result(_before_run(prepared.verdict))
        return to_verify_result(await self.final_verdict(workspace, task, prepared.build))

    async def final_verdict(self, workspace, task, build, *, inline=False):
        return Verdict(status=VerdictStatus.OK, trials=1, message="GPU faked")

    async def time(self, workspace, task, build, *, paired=False):
        return Timed(ok=True, candidate=_timing(1.0), eager=_timing(2.0), compiled=_timing(1.5))


class SpyEvaluator:
    """The real FinalEvaluator, noting the solution files of each evaluated directory."""

    def __init__(self, env) -> None:
        self.inner, self.seen = FinalEvaluator(env, EvaluateConfig(paired=False)), {}  # fixed times

    async def warm(self, task):
        await self.inner.warm(task)

    async def evaluate(self, workspace, task):
        files = sorted(p.relative_to(workspace).as_posix() for p in Path(workspace).rglob("*") if p.is_file())
        self.seen[task.task_id] = [f for f in files if f == "model_new.py" or f.startswith("kernels/")]
        return await self.inner.evaluate(workspace, task)


@pytest.fixture
def replay_setup(tmp_path):
    rows = [(1, 19, "19_ReLU", (RELU / "model.py").read_text()), (1, 47, "47_Sum_reduction_over_a_dimension", SUM),
            (2, 76, "76_Gemm_Add_ReLU", GEMM), (4, 1, "1_gpt2", SUM)]
    problems = tmp_path / "problems.jsonl"
    problems.write_bytes(b"".join(orjson.dumps({"level": lv, "problem_id": i, "name": n, "code": c}) + b"\n"
                                  for lv, i, n, c in rows))
    solutions = tmp_path / "set"
    shutil.copytree(RELU, solutions / "l1_19_relu", ignore=shutil.ignore_patterns("model.py"))
    put(solutions / "level1/47_Sum_reduction_over_a_dimension.py", "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n")
    config = BenchConfig(problems_path=str(problems), levels=(1, 2, 4), engine="replay",
                         replay_paths=(str(solutions),), replay_wrappers=True, out_dir=str(tmp_path / "out"),
                         workers=3, progress=False)
    env = CpuEdgeEnv(CompilePool(CompileConfig(max_parallel=2)), queue=None)
    return config, env


@needs_compiler
async def test_replay_end_to_end_scores_honest_rejects_wrapper_and_resumes(replay_setup):
    config, env = replay_setup
    spy = SpyEvaluator(env)
    records = {(r.level, r.problem_id): r for r in await run_benchmark(config, kernel_env=env, evaluator=spy)}
    assert set(records) == {(1, 19), (1, 47), (2, 76), (4, 1)}

    relu = records[(1, 19)]
    assert (relu.outcome, relu.correct, relu.hack, relu.candidates) == ("scored", True, None, 1)
    assert relu.speedup_vs_compile == pytest.approx(1.5) and relu.speedup_vs_eager == pytest.approx(2.0)

    wrapper = records[(2, 76)]
    assert (wrapper.outcome, wrapper.correct, wrapper.status, wrapper.hack) == ("scored", False, "hack", "torch_compute")
    assert spy.seen["L2/76_Gemm_Add_ReLU"] == ["kernels/noop.cu", "kernels/noop_binding.cpp", "model_new.py"]

    single = records[(1, 47)]  # load_inline mode is the evaluator's business; it got model_new.py alone
    assert single.outcome == "scored" and not single.correct
    assert spy.seen["L1/47_Sum_reduction_over_a_dimension"] == ["model_new.py"]

    assert records[(4, 1)].outcome == "skipped"
    out = Path(config.out_dir)
    trajs = list(read_trajectories(out / "trajectories.jsonl"))
    assert len(trajs) == 3 and all(t.status is Status.COMPLETED for t in trajs)
    assert all(r.source == "replay:" + config.replay_paths[0] + ",wrappers" for r in records.values())

    lines = (out / "records.jsonl").read_bytes()
    again = await run_benchmark(config, kernel_env=env, evaluator=spy)
    assert {(r.level, r.problem_id): r for r in again} == records
    assert (out / "records.jsonl").read_bytes() == lines  # nothing redone, nothing appended
    assert len(list(read_trajectories(out / "trajectories.jsonl"))) == 3
    assert len(read_records(out / "records.jsonl")) == 4
