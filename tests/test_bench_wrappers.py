"""The reference-wrapper generator: every wrapper parses, keeps the reference's constructor, and
the static checks reject it (all 250 KernelBench level 1-3 problems); its kernel files are clean
and build for real."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from bench.kernelbench.problems import Problem, load_problems
from bench.kernelbench.replay import find_solutions
from bench.kernelbench.wrappers import workspace_name, wrapper_files, wrapper_model_new, write_wrappers
from rewards.env import pristine_files, static_verdict
from rewards.static.checks import check_sources
from rewards.verdict import HackCategory
from rl.data.kernelbench import PROBLEMS

REPO = Path(__file__).resolve().parents[1]
SHARED = PROBLEMS
needs_compiler = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("g++") is None, reason="needs nvcc")


def demo_problem(name: str, level: int, pid: int, kb_name: str) -> Problem:
    return Problem(level=level, problem_id=pid, name=kb_name, code=(REPO / "rl/demos" / name / "model.py").read_text())


RELU = demo_problem("l1_19_relu", 1, 19, "19_ReLU")
GEMM = demo_problem("l2_76_gemm_add_relu_cublas", 2, 76, "76_Gemm_Add_ReLU")


def test_wrapper_renames_model_and_drops_the_task_functions():
    tree = ast.parse(wrapper_model_new(GEMM.code))
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert "ModelNew" in names and "Model" not in names
    assert not names & {"get_inputs", "get_init_inputs"}


def test_wrapper_keeps_the_reference_constructor_signature():
    def init_args(source: str, cls: str) -> list[str]:
        node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls)
        init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
        return [a.arg for a in init.args.args]

    assert init_args(wrapper_model_new(GEMM.code), "ModelNew") == init_args(GEMM.code, "Model")


def test_wrapper_forward_launches_the_trivial_kernel_first():
    tree = ast.parse(wrapper_model_new(RELU.code))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    forward = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward")
    calls = [ast.unparse(s) for s in forward.body]
    assert "cuda_extension.noop_forward(x)" in calls
    assert calls.index("cuda_extension.noop_forward(x)") < len(calls) - 1  # the torch work follows


def test_wrapper_is_rejected_statically_as_torch_compute(tmp_path):
    ws = write_wrappers([RELU], tmp_path)[0]
    for rel, data in pristine_files(RELU.task).items():
        (ws / rel).write_bytes(data)
    verdict = static_verdict(ws, RELU.task)
    assert verdict is not None and verdict.hack is HackCategory.TORCH_COMPUTE


def test_wrapper_kernel_files_have_no_findings():
    files = wrapper_files(RELU)
    kernels = {k: v for k, v in files.items() if k.startswith("kernels/")}
    assert [f for f in check_sources({**kernels, "model_new.py": files["model_new.py"]}) if f.file.startswith("kernels/")] == []


def test_written_wrappers_are_found_as_replayable_workspaces(tmp_path):
    write_wrappers([RELU, GEMM], tmp_path)
    found = find_solutions([tmp_path])
    assert set(found.solutions) == {(1, 19), (2, 76)}
    assert found.solutions[(2, 76)].kind == "workspace"
    assert set(found.solutions[(1, 19)].files) == {"model_new.py", "kernels/noop.cu", "kernels/noop_binding.cpp"}


def test_workspace_names_follow_the_demos():
    assert workspace_name(RELU) == "l1_19_relu"
    assert workspace_name(GEMM) == "l2_76_gemm_add_relu"


def test_every_level_1_to_3_wrapper_parses_and_is_flagged_statically():
    problems = load_problems(SHARED).problems
    assert len(problems) == 250
    unflagged = []
    for problem in problems:
        source = wrapper_model_new(problem.code)
        ast.parse(source)
        blocking = [f for f in check_sources(wrapper_files(problem), reference=problem.code) if f.blocking]
        if not blocking:
            unflagged.append(problem.task_id)
    assert unflagged == []


@needs_compiler
async def test_wrapper_kernels_build(tmp_path):
    from rewards.build.compile_pool import CompileConfig, CompilePool

    ws = write_wrappers([RELU], tmp_path)[0]
    for rel, data in pristine_files(RELU.task).items():
        (ws / rel).write_bytes(data)
    build = await CompilePool(CompileConfig(max_parallel=2)).build(ws)
    assert build.result.ok, build.result.log
