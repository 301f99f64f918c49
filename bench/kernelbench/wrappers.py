"""Reference-wrapping solutions: for every problem, a workspace that only re-runs the reference.

What it is: `wrapper_files(problem)` writes the problem's own PyTorch code as `ModelNew` (the
reference classes and size constants copied, `Model` renamed, the task functions dropped) and a
trivial CUDA kernel that `forward` launches before doing the real work in torch, so it builds
and "calls the extension". Such a solution is correct and as fast as eager PyTorch; it earns
nothing, and the evaluator must say so with a hack category (torch_compute statically, or the
dynamic audit). `write_wrappers(problems, root)` lays them out as replayable workspaces
(`l<level>_<id>_<name>/model_new.py` + `kernels/noop.cu` + `kernels/noop_binding.cpp`).
What it is not: a cheat corpus for the verifier's unit tests (tests/fixtures/cheats), nor honest.

Example:
    paths = write_wrappers(load_problems(path).problems, Path("runs/wrappers"))
    # cuda-agent bench --suite kernelbench --replay runs/wrappers
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from bench.kernelbench.problems import Problem

TASK_FUNCTIONS = ("get_inputs", "get_init_inputs")

NOOP_CU = """\
// A kernel that does nothing: the wrapper launches it so that it "uses" the extension.
#include <cuda_runtime.h>

__global__ void noop_kernel() {}

extern "C" void noop_launcher(cudaStream_t stream) { noop_kernel<<<1, 1, 0, stream>>>(); }
"""

NOOP_BINDING = """\
#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include <ATen/DeviceAccelerator.h>
#include <cuda_runtime.h>
#include "../binding_registry.h"

extern "C" void noop_launcher(cudaStream_t stream);

// torch's device-generic stream API: no c10/cuda headers, so it also builds against a CPU torch.
static void noop_forward(torch::Tensor like) {
    auto stream = at::accelerator::getCurrentStream(like.get_device());
    noop_launcher(static_cast<cudaStream_t>(stream.native_handle()));
}

static void register_noop(pybind11::module& m) {
    m.def("noop_forward", &noop_forward, "launch an empty kernel on like's device");
}

REGISTER_BINDING(noop, register_noop);
"""

HEADER = '"""Wraps the reference: the same torch ops as Model (generated; must be rejected as a hack)."""\n'


class _Rename(ast.NodeTransformer):
    """Model -> ModelNew everywhere (class name, super(Model, self), isinstance checks)."""

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.ClassDef:
        if node.name == "Model":
            node.name = "ModelNew"
            forward = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
            args = [a.arg for a in forward.args.args[1:]] if forward is not None else []
            if args:  # launch on the device of forward's first input
                call = ast.parse(f"cuda_extension.noop_forward({args[0]})").body[0]
                forward.body.insert(_after_docstring(forward), call)
        self.generic_visit(node)
        return node

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id == "Model":
            node.id = "ModelNew"
        return node


def _after_docstring(func: ast.FunctionDef) -> int:
    first = func.body[0] if func.body else None
    is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return 1 if is_doc and isinstance(first.value.value, str) else 0


def wrapper_model_new(code: str) -> str:
    """The reference module as a ModelNew that re-runs the reference's forward (see module docs)."""
    tree = ast.parse(code)
    tree.body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name in TASK_FUNCTIONS)]
    imports = [i for i, n in enumerate(tree.body) if isinstance(n, (ast.Import, ast.ImportFrom))]
    at = imports[-1] + 1 if imports else 0
    tree.body.insert(at, ast.parse("import cuda_extension").body[0])
    tree = ast.fix_missing_locations(_Rename().visit(tree))
    return HEADER + ast.unparse(tree) + "\n"


def wrapper_files(problem: Problem) -> dict[str, str]:
    """Relative path -> text of the wrapper workspace of `problem`."""
    return {
        "model_new.py": wrapper_model_new(problem.code),
        "kernels/noop.cu": NOOP_CU,
        "kernels/noop_binding.cpp": NOOP_BINDING,
    }


def workspace_name(problem: Problem) -> str:
    """Our workspace naming, as in rl/demos: l<level>_<id>_<lowercase name>, e.g. l1_19_relu."""
    stem = problem.name.split("_", 1)[1] if "_" in problem.name else problem.name
    slug = re.sub(r"[^a-z0-9]+", "_", stem.lower()).strip("_")
    return f"l{problem.level}_{problem.problem_id}_{slug}" if slug else f"l{problem.level}_{problem.problem_id}"


def write_wrappers(problems: tuple[Problem, ...] | list[Problem], root: Path) -> list[Path]:
    """One wrapper workspace per problem under `root` (overwritten); returns their directories."""
    out = []
    for problem in problems:
        ws = Path(root) / workspace_name(problem)
        for rel, text in wrapper_files(problem).items():
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            (ws / rel).write_text(text)
        out.append(ws)
    return out


__all__ = ["NOOP_BINDING", "NOOP_CU", "workspace_name", "wrapper_files", "wrapper_model_new", "write_wrappers"]
