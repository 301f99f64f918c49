"""`cuda-agent eval`: evaluate one solution the way the trainer does.

    cuda-agent eval --task model.py --solution WORKSPACE_DIR|MODEL_NEW.py [--json]

WORKSPACE_DIR is a workspace in our layout (model_new.py, kernels/<name>.cu,
kernels/<name>_binding.cpp); only those files are read, as in training (`rewards.evaluate`).
MODEL_NEW.py is a single-file KernelBench solution that calls `load_inline`: its sources are
read statically and built by the compile pool (`rewards.inline.prepare`), never by the candidate.
It runs the static checks, the build, final-mode verification and profiling, and prints the
verdict, the hack category, the three times and the reward; `--json` prints the flat
reward_info dict instead.

Exit status: 0 the solution is correct and was timed; 1 it failed (hack, no build, wrong answer,
crash); 2 the command line, the task or the solution is unusable; 3 no GPU on this machine (the static checks and the build still ran, and a
failure there is still 1); 4 the evaluation itself broke (no compiler, a task whose reference
cannot run, a broken worker), with the reason and no traceback.

What it is not: a benchmark of many solutions (bench/).
"""

from __future__ import annotations

import argparse
import ast
import sys
import tempfile
from pathlib import Path

import orjson

from agentcore import runtime
from agentcore.types import Task
from rewards.env import EnvConfig, NoGpuError, open_kernel_env
from rewards.evaluate import FinalEvaluator, snapshot_solution
from rewards.timing.profile import ProfileInfrastructureError
from rewards.build.toolchain import ToolchainError
from rewards.verdict import Score, VerdictStatus, reward_info
from rewards.verify.verifier import VerifyInfrastructureError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_GPU, EXIT_BROKEN = 0, 1, 2, 3, 4
TASK_NAMES = ("Model", "get_inputs", "get_init_inputs")


class UsageError(Exception):
    """A task or solution this command cannot evaluate; the message says why."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cuda-agent eval", description=__doc__.split("\n")[0])
    parser.add_argument("--task", required=True, help="KernelBench-format model.py (the reference)")
    parser.add_argument("--solution", required=True,
                        help="a workspace directory in our layout, or a single-file load_inline model_new.py")
    parser.add_argument("--json", action="store_true", help="print reward_info as JSON")
    return parser.parse_args(argv)


def load_task_file(path: Path) -> Task:
    """The task, checked for KernelBench's three names without running it."""
    if not path.is_file():
        raise UsageError(f"task file {path} does not exist or is not a file")
    source = path.read_text(errors="replace")
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        raise UsageError(f"task file {path} is not valid Python: {exc}") from None
    defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    missing = [name for name in TASK_NAMES if name not in defined]
    if missing:
        raise UsageError(f"task file {path} is not in KernelBench format: it does not define {', '.join(missing)}")
    return Task(task_id=path.stem, source=source, name=path.stem)


def check_solution(path: Path) -> Path:
    if path.is_file():
        if path.suffix != ".py":
            raise UsageError(f"{path}: a single-file solution is a Python file (model_new.py calling load_inline)")
        if "load_inline" not in path.read_text(errors="replace"):
            raise UsageError(f"{path}: a single-file solution must build its kernels with load_inline; "
                             "otherwise pass a workspace directory with model_new.py and kernels/")
        return path
    if not path.is_dir():
        raise UsageError(f"solution {path} does not exist")
    if not (path / "model_new.py").is_file():
        raise UsageError(f"solution directory {path} has no model_new.py")
    return path


def _ms(value) -> str:
    return f"{value:.4f} ms" if isinstance(value, float) else "-"


def describe(score: Score) -> str:
    info = reward_info(score)
    lines = [f"verdict: {info['status']}"]
    if info["hack"]:
        lines.append(f"hack: {info['hack']}")
    if score.verdict.message and not score.verdict.ok:
        lines.append(f"message: {score.verdict.message[:2000]}")
    lines += [f"candidate: {_ms(info.get('candidate_ms'))}", f"eager: {_ms(info.get('eager_ms'))}",
              f"torch.compile: {_ms(info.get('compile_ms'))}", f"reward: {score.reward:g}"]
    return "\n".join(lines)


def _as_workspace(solution: Path, scratch: Path) -> Path:
    """A single file becomes the model_new.py of a workspace with no kernels/."""
    if solution.is_dir():
        return solution
    workspace = scratch / "single"
    workspace.mkdir()
    (workspace / "model_new.py").write_bytes(solution.read_bytes())
    return workspace


async def evaluate(task: Task, solution: Path, config: EnvConfig) -> tuple[Score | None, str]:
    """The Score (None when it needs a GPU this machine lacks) and a note about the machine."""
    async with open_kernel_env(config) as env:
        note = "" if env.queue is not None else "this machine has no GPU: only the static checks and the build ran"
        with tempfile.TemporaryDirectory(prefix="eval-") as scratch:
            snapshot = snapshot_solution(_as_workspace(solution, Path(scratch)), task, Path(scratch) / "ws")
            evaluator = FinalEvaluator(env)
            prepared = await evaluator.prepare(snapshot, task)
            try:
                return await evaluator.evaluate_prepared(snapshot, task, prepared), note
            except NoGpuError:
                return None, f"static checks passed and the build succeeded; {note}"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        task = load_task_file(Path(args.task))
        solution = check_solution(Path(args.solution))
    except (UsageError, OSError) as exc:
        print(f"cuda-agent eval: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        score, note = runtime.run(evaluate, task, solution, EnvConfig())
    except (ToolchainError, VerifyInfrastructureError, ProfileInfrastructureError) as exc:
        print(f"cuda-agent eval: the evaluation itself failed (a broken task or machine): {exc}", file=sys.stderr)
        return EXIT_BROKEN
    if note:
        print(f"cuda-agent eval: {note}", file=sys.stderr)
    if score is None:
        return EXIT_NO_GPU
    if args.json:
        print(orjson.dumps(reward_info(score)).decode())
    else:
        print(describe(score))
    return EXIT_OK if score.verdict.status is VerdictStatus.OK else EXIT_FAILED
