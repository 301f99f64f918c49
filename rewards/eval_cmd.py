"""`cuda-agent eval`: evaluate one solution the way the trainer does.

    cuda-agent eval --task model.py --solution WORKSPACE_DIR|MODEL_NEW.py [--rules paper|kernelbench] [--json]
    cuda-agent eval --static-only --solution PATH [--task model.py | --problems problems.jsonl] [--rules ...]

WORKSPACE_DIR is a workspace in our layout (model_new.py, kernels/<name>.cu,
kernels/<name>_binding.cpp); only those files are read, as in training (`rewards.evaluate`).
MODEL_NEW.py is a single-file KernelBench solution that calls `load_inline`: its sources are
read statically and built by the compile pool (`rewards.inline.prepare`), never by the candidate.
It runs the static checks, the build, final-mode verification and profiling, and prints the
verdict, the hack category, the three times and the reward; `--json` prints the flat
reward_info dict instead. `--rules` picks the rule set (`rewards.verdict.Rules`): "paper" (the
default and the training rule: the candidate's kernels do all the work) or "kernelbench" (torch
may do part of it, reported as "partial"); the verdict names it.

`--static-only` runs the extraction and the static rules only (`rewards.static.lint`): no build,
no GPU, seconds per solution. PATH may also be a folder of solutions: one line per file (path,
verdict, rules, first finding) and counts on stderr; `--problems` (default $KERNELBENCH_PROBLEMS)
finds each file's task by its KernelBench path (`level1/19_ReLU.py`); without a task the rules that
compare with the task's own Model judge the solution alone (a note on stderr says so). Exit status
0 when every solution passes, else 1.

Exit status: 0 the solution is correct and was timed; 1 it failed (hack, no build, wrong answer,
crash); 2 the command line, the task or the solution is unusable; 3 no GPU on this machine (the
static checks and the build still ran, and a failure there is still 1); 4 the evaluation itself
broke, with the reason in one line and no traceback: an environment error (the machine cannot
build what a correct solution needs, e.g. a torch build without CUDA headers: no verdict, and the
fix is named) or a broken task or worker (no compiler, a reference that cannot run).

What it is not: a benchmark of many solutions (bench/).
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import tempfile
from pathlib import Path

import orjson

from agentcore import runtime
from agentcore.cli import HelpFormatter
from agentcore.types import Task
from rewards.build.toolchain import MachineError, ToolchainError
from rewards.env import EnvConfig, NoGpuError, open_kernel_env
from rewards.evaluate import FinalEvaluator, snapshot_solution
from rewards.static.lint import Problems, lint, lint_tree
from rewards.static.lint import line as lint_line
from rewards.timing.profile import ProfileInfrastructureError
from rewards.verdict import RULES, Score, Verdict, VerdictStatus, partial_work, reward_info
from rewards.verify.verifier import VerifyInfrastructureError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_GPU, EXIT_BROKEN = 0, 1, 2, 3, 4
EXIT_HELP = ("exit status: 0 correct and timed; 1 failed (hack, no build, wrong answer, crash); 2 unusable "
             "command line, task or solution; 3 no GPU here (the static checks and the build ran); 4 the machine "
             "or the evaluation is broken (an environment error, e.g. a torch build without CUDA headers: no verdict)")
TASK_NAMES = ("Model", "get_inputs", "get_init_inputs")


class UsageError(Exception):
    """A task or solution this command cannot evaluate; the message says why."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cuda-agent eval", description=__doc__.split("\n")[0],
                                     formatter_class=HelpFormatter, epilog=EXIT_HELP)
    parser.add_argument("--task", help="KernelBench-format model.py (the reference); required unless --static-only")
    parser.add_argument("--solution", required=True,
                        help="a workspace directory in our layout, or a single-file load_inline model_new.py")
    parser.add_argument("--rules", choices=RULES, default="paper",
                        help="paper: the candidate's kernels do all the work; kernelbench: torch may do part of it")
    parser.add_argument("--static-only", action="store_true",
                        help="extraction and static rules only, no build or GPU; --solution may be a folder of solutions")
    parser.add_argument("--problems", default=os.environ.get("KERNELBENCH_PROBLEMS"),
                        help="with --static-only: a problems.jsonl giving each file's task by its path "
                             "(default: $KERNELBENCH_PROBLEMS)")
    parser.add_argument("--json", action="store_true", help="print reward_info as JSON (one verdict per line with --static-only)")
    args = parser.parse_args(argv)
    if not args.static_only and not args.task:
        parser.error("--task is required (unless --static-only)")
    return args


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
    lines.append(f"rules: {score.verdict.rules}")
    if partial_work(score.verdict):
        lines.append(f"partial: torch does {partial_work(score.verdict)}")
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


def static_only(args: argparse.Namespace) -> int:
    """`--static-only`: lint one solution or a folder of them; 0 when every one passes."""
    try:
        reference = load_task_file(Path(args.task)).source if args.task else None
        problems = Problems.load(args.problems) if args.problems else None
        root = Path(args.solution)
        if not root.exists():
            raise UsageError(f"solution {root} does not exist")
    except (UsageError, OSError, ValueError) as exc:
        print(f"cuda-agent eval: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if root.is_file() or (root / "model_new.py").is_file():
        found = problems.reference_for(root) if problems is not None else None
        verdicts = [(root, lint(root, reference=reference or found, rules=args.rules))]
    else:
        verdicts = list(lint_tree(root, problems, reference=reference, rules=args.rules))
    if reference is None and problems is None:
        print("cuda-agent eval: no task given (--task, --problems or $KERNELBENCH_PROBLEMS): the rules that "
              "compare a solution with the task's own Model (state it keeps, ops it makes) judge it alone",
              file=sys.stderr)
    for path, verdict in verdicts:
        print(_static_json(path, verdict) if args.json else lint_line(path, verdict))
    if len(verdicts) > 1:
        counts: dict[str, int] = {}
        for _, verdict in verdicts:
            key = lint_line(Path(), verdict).split("\t")[1]
            counts[key] = counts.get(key, 0) + 1
        summary = ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        print(f"cuda-agent eval: {len(verdicts)} solutions under {args.rules} rules: {summary}", file=sys.stderr)
    return EXIT_OK if all(v.ok for _, v in verdicts) else EXIT_FAILED


def _static_json(path: Path, verdict: Verdict) -> str:
    first = next((f for f in verdict.findings if f.blocking), None)
    return orjson.dumps({
        "path": str(path), "status": verdict.status.value, "hack": verdict.hack.value if verdict.hack else None,
        "rules": verdict.rules, "partial": partial_work(verdict), "message": verdict.message[:1000],
        "finding": str(first) if first else None, "findings": [str(f) for f in verdict.findings if f.blocking],
    }).decode()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.static_only:
        return static_only(args)
    try:
        task = load_task_file(Path(args.task))
        solution = check_solution(Path(args.solution))
    except (UsageError, OSError) as exc:
        print(f"cuda-agent eval: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        score, note = runtime.run(evaluate, task, solution, EnvConfig(rules=args.rules))
    except MachineError as exc:
        print(f"cuda-agent eval: environment error (this machine, not the solution; no verdict): {exc}",
              file=sys.stderr)
        return EXIT_BROKEN
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
