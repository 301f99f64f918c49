"""Single-file KernelBench solutions (`rewards.inline.prepare`): the load_inline call read from the AST in
its published forms, dynamic forms refused with a clear verdict, the rewritten model_new.py, the
static checks on the source strings, and the build through the real compile pool (slow: nvcc
parses torch's headers). On the GPU: tests/test_env_gpu.py."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from agentcore.types import Task
from rewards.build.compile_pool import CompileConfig, CompilePool
from rewards.env import RewardsKernelEnv
from rewards.evaluate import FinalEvaluator, snapshot_solution
from rewards.inline.prepare import (
    UnsupportedInline, binding_file, convert, extract, is_inline_solution, rewrite, static_findings,
)
from rewards.verdict import VerdictStatus

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "inline"
HONEST = FIXTURES / "relu_honest.py"
TORCH_CHEAT = FIXTURES / "relu_torch_in_wrapper.py"
TASK = Task(task_id="relu", source=(REPO / "tests" / "fixtures" / "build" / "relu" / "model.py").read_text())
needs_compiler = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("g++") is None,
                                    reason="needs nvcc and g++")

KERNEL = '__global__ void k(const float* x, float* y, int n) { int i = threadIdx.x; if (i < n) y[i] = x[i]; }\n'
WRAPPER = ('torch::Tensor f(torch::Tensor x) { auto y = torch::empty_like(x);\n'
           '  k<<<1, 32>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel()); return y; }\n')
MODEL = "\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return ext.f(x)\n"


def solution(call: str, before: str = "") -> str:
    head = f"import torch\nfrom torch.utils.cpp_extension import load_inline\nKERNEL = {KERNEL!r}\nWRAPPER = {WRAPPER!r}\n"
    return head + before + call + MODEL


def test_the_published_form_is_read_from_triple_quoted_constants_and_names():
    spec = extract(HONEST.read_text())
    assert spec.functions == ("relu_cuda",) and spec.target == "relu" and spec.name == "relu"
    assert "__global__ void relu_kernel" in spec.cuda_sources
    assert spec.cpp_sources == "torch::Tensor relu_cuda(torch::Tensor x);"
    assert spec.ignored_flags == ()


def test_concatenation_augmented_names_and_cpp_sources_as_a_list():
    src = solution('ext = load_inline("e", ["torch::Tensor f(torch::Tensor x);"], cuda_sources=CUDA, '
                   'functions={"f": "doc"}, extra_cuda_cflags=["-O3", "-DBLOCK=256"])\n',
                   before="CUDA = KERNEL\nCUDA += WRAPPER\n")
    spec = extract(src)
    assert spec.cuda_sources == KERNEL + WRAPPER
    assert spec.cpp_sources == "torch::Tensor f(torch::Tensor x);"
    assert spec.functions == ("f",) and spec.defines == (("BLOCK", "256"),) and spec.ignored_flags == ("-O3",)


def test_attribute_form_inside_init_is_rewritten_to_the_prebuilt_module():
    src = ("import torch\nimport torch.utils.cpp_extension\nSRC = " + repr(KERNEL + WRAPPER) + "\n"
           "class ModelNew(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
           "        self.ext = torch.utils.cpp_extension.load_inline(\n            name='e', cpp_sources='torch::Tensor f(torch::Tensor x);',\n"
           "            cuda_sources=SRC, functions=['f'])\n    def forward(self, x):\n        return self.ext.f(x)\n")
    spec = extract(src)
    out = rewrite(src, spec)
    assert out.count("\n") == src.count("\n")  # tracebacks keep the author's line numbers
    assert "load_inline" not in out and "cpp_extension" not in out
    assert out.startswith("import cuda_extension; import torch\n")
    assert "self.ext = (cuda_extension)" in out
    assert static_findings(spec, out, TASK.source) == []


def test_module_level_assignment_becomes_an_import_alias():
    src = HONEST.read_text()
    out = rewrite(src, extract(src))
    tree = ast.parse(out)
    imports = [(a.name, a.asname) for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert ("cuda_extension", "relu") in imports
    assert out.count("\n") == src.count("\n") and "load_inline(" not in out


@pytest.mark.parametrize("call, before, why", [
    ('ext = load_inline("e", "decl", cuda_sources=f"{KERNEL}", functions=["f"])\n', "", "cuda_sources"),
    ('ext = load_inline("e", "decl", cuda_sources=SRC, functions=["f"])\n', "SRC = open('k.cu').read()\n", "'SRC'"),
    ('ext = load_inline("e", "decl", cuda_sources=KERNEL, functions=NAMES)\n', "", "'NAMES'"),
    ('ext = load_inline("e", "decl", cuda_sources=KERNEL, functions=["f"], is_python_module=False)\n', "",
     "is_python_module"),
    ('ext = load_inline("e", "decl", cuda_sources=KERNEL, functions=["f"])\n'
     'ext2 = load_inline("g", "decl", cuda_sources=KERNEL, functions=["f"])\n', "", "2 load_inline calls"),
    ('ext = load_inline(**ARGS)\n', "", "**kwargs"),
])
def test_dynamic_forms_are_refused_with_a_clear_message(call, before, why):
    with pytest.raises(UnsupportedInline, match=why.replace("*", r"\*")):
        extract(solution(call, before))


def test_an_unsupported_form_is_a_compile_error_verdict(tmp_path):
    (tmp_path / "model_new.py").write_text(solution('ext = load_inline("e", "d", cuda_sources=f"{KERNEL}", functions=["f"])\n'))
    verdict = convert(tmp_path, TASK)
    assert verdict.status is VerdictStatus.COMPILE_ERROR
    assert verdict.message.startswith("unsupported load_inline form: cuda_sources")


def test_honest_sources_have_no_finding_although_kernel_and_wrapper_share_names():
    src = HONEST.read_text()
    spec = extract(src)
    assert static_findings(spec, rewrite(src, spec), TASK.source) == []


def test_torch_compute_inside_cuda_sources_is_a_hack(tmp_path):
    (tmp_path / "model_new.py").write_text(TORCH_CHEAT.read_text())
    verdict = convert(tmp_path, TASK)
    assert verdict.status is VerdictStatus.HACK and verdict.hack.value == "torch_compute"
    assert "torch::relu" in verdict.message and "load_inline/cuda_sources.cpp:18" in verdict.message


def test_torch_in_a_kernel_body_is_flagged_by_the_device_rules():
    spec = extract(solution('ext = load_inline("e", "d", cuda_sources=BAD, functions=["f"])\n',
                            before="BAD = '__global__ void k(float* y) { torch::Tensor t; }\\n' + WRAPPER\n"))
    findings = static_findings(spec, "import cuda_extension as ext\n" + MODEL, TASK.source)
    assert any(f.file == "load_inline/cuda_sources.cuh" and f.blocking for f in findings)


def test_the_generated_module_binds_each_function_as_load_inline_does():
    text = binding_file(extract(HONEST.read_text()))
    assert "#include <torch/extension.h>" in text
    assert 'm.def("relu_cuda", torch::wrap_pybind_function(relu_cuda), "relu_cuda");' in text


def test_single_file_detection(tmp_path):
    (tmp_path / "model_new.py").write_text(HONEST.read_text())
    assert is_inline_solution(tmp_path)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.cu").write_text("")
    assert not is_inline_solution(tmp_path)


# -- the build, the final evaluator's preparation and `cuda-agent eval` ----------------------------


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("inline-cache")


def fast_honest() -> str:
    """The honest fixture without its own <torch/extension.h> in cuda_sources: the same code
    (load_inline's prelude brings torch/types.h), a third of nvcc's time on this 2-core VM."""
    return HONEST.read_text().replace('relu_source = """\n#include <torch/extension.h>\n', 'relu_source = """\n')


@pytest.mark.slow
@needs_compiler
def test_final_evaluator_builds_the_single_file_in_the_compile_pool(tmp_path, cache_dir):
    single = tmp_path / "single"
    single.mkdir()
    (single / "model_new.py").write_text(fast_honest())
    config = CompileConfig(cache_dir=str(cache_dir), max_parallel=2, unit_timeout_s=1200)

    async def prepare():
        evaluator = FinalEvaluator(RewardsKernelEnv(CompilePool(config), None))
        snapshot = snapshot_solution(single, TASK, tmp_path / "ws")
        return snapshot, await evaluator.prepare(snapshot, TASK)

    snapshot, prepared = anyio.run(prepare)
    assert prepared.verdict is None, prepared.verdict
    assert prepared.build.result.built_units == 2
    assert "import cuda_extension as relu" in (snapshot / "model_new.py").read_text()
    so = prepared.build.artifact.so_path
    probe = f"from rewards.build.loader import load_extension\nm = load_extension({so!r})\nprint(m.relu_cuda.__doc__)"
    cudart = Path(CompilePool(config).toolchain.cuda_lib_dir) / "libcudart.so"
    if cudart.exists():
        loaded = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert loaded.returncode == 0 and "relu_cuda" in loaded.stdout, loaded.stderr


def run_eval(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentcore.cli", "eval", *args], check=False, cwd=REPO,
                          capture_output=True, text=True, timeout=1500, env=env)


@needs_compiler
def test_eval_of_a_single_file_cheat_prints_its_category():
    run = run_eval("--task", str(REPO / "tests" / "fixtures" / "build" / "relu" / "model.py"), "--solution", str(TORCH_CHEAT))
    assert run.returncode == 1, run.stderr
    assert "hack: torch_compute" in run.stdout and "Traceback" not in run.stderr


def test_eval_of_an_unsupported_single_file_is_a_failed_build(tmp_path):
    path = tmp_path / "model_new.py"
    path.write_text(solution('ext = load_inline("e", "d", cuda_sources=f"{KERNEL}", functions=["f"])\n'))
    run = run_eval("--task", str(REPO / "tests" / "fixtures" / "build" / "relu" / "model.py"), "--solution", str(path))
    assert run.returncode == 1, run.stderr
    assert "unsupported load_inline form" in run.stdout
