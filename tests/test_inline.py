"""Single-file KernelBench solutions (`rewards.inline.prepare`): the load_inline calls read from the
AST in every published form (one or several calls; sources folded from constants, string
operations and names bound once; functions= or a PYBIND11_MODULE of their own; computed names;
**options), the forms that cannot be read refused with a one-line verdict, files that cannot be
read at all turned into verdicts instead of exceptions, the rewritten model_new.py, the static
checks on the source strings, and the build through the real compile pool (slow: nvcc parses
torch's headers). On the GPU: `test_single_file_forms_verify_on_the_gpu` here and
tests/test_env_gpu.py."""

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
from rewards.inline.fold import MAX_CHARS, MAX_NESTING
from rewards.inline.prepare import (
    NOTES_KEY,
    InvalidSolution,
    UnsupportedInline,
    binding_file,
    check_source,
    convert,
    extract,
    is_inline_solution,
    rewrite,
    static_findings,
)
from rewards.inline.sources import MODULE_FILE, module_file
from rewards.verdict import VerdictStatus

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "inline"
HONEST = FIXTURES / "relu_honest.py"
TWO_MODULES = FIXTURES / "relu_two_modules.py"
IN_METHOD = FIXTURES / "relu_built_in_method.py"
TORCH_CHEAT = FIXTURES / "relu_torch_in_wrapper.py"
RELU_MODEL = REPO / "tests" / "fixtures" / "build" / "relu" / "model.py"
TASK = Task(task_id="relu", source=RELU_MODEL.read_text())
needs_compiler = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("g++") is None,
                                    reason="needs nvcc and g++")

KERNEL = '__global__ void k(const float* x, float* y, int n) { int i = threadIdx.x; if (i < n) y[i] = x[i]; }\n'
WRAPPER = ('torch::Tensor f(torch::Tensor x) { auto y = torch::empty_like(x);\n'
           '  k<<<1, 32>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel()); return y; }\n')
DECL = "torch::Tensor f(torch::Tensor x);"
MODEL = "\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return ext.f(x)\n"


def solution(call: str, before: str = "") -> str:
    head = "import torch\nfrom torch.utils.cpp_extension import load_inline\n"
    head += f"KERNEL = {KERNEL!r}\nWRAPPER = {WRAPPER!r}\n"
    return head + before + call + MODEL


def name_chain(n: int) -> str:
    """`S1 = KERNEL`, `S2 = S1`, ... `SRC = Sn`: n names, each bound to the one before."""
    return "".join(f"S{i + 1} = S{i}\n" for i in range(n)).replace("S0", "KERNEL") + f"SRC = S{n}\n"


def only(src: str):
    spec = extract(src)
    assert len(spec.modules) == 1, spec.modules
    return spec.modules[0]


# -- the single published form ----------------------------------------------------------------


def test_the_published_form_is_read_from_triple_quoted_constants_and_names():
    spec = extract(HONEST.read_text())
    (module,) = spec.modules
    assert module.functions == ("relu_cuda",) and module.name == "relu" and module.attr == ""
    assert [c.target for c in spec.calls] == ["relu"]
    assert "__global__ void relu_kernel" in module.cuda_sources
    assert module.cpp_sources == "torch::Tensor relu_cuda(torch::Tensor x);"
    assert module.ignored_flags == () and spec.notes == ()


def test_concatenation_augmented_names_and_cpp_sources_as_a_list():
    module = only(solution('ext = load_inline("e", ["torch::Tensor f(torch::Tensor x);"], cuda_sources=CUDA, '
                           'functions={"f": "doc"}, extra_cuda_cflags=["-O3", "-DBLOCK=256"])\n',
                           before="CUDA = KERNEL\nCUDA += WRAPPER\n"))
    assert module.cuda_sources == KERNEL + WRAPPER
    assert module.cpp_sources == "torch::Tensor f(torch::Tensor x);"
    assert module.functions == ("f",) and module.defines == (("BLOCK", "256"),) and module.ignored_flags == ("-O3",)


def test_attribute_form_inside_init_is_rewritten_to_the_prebuilt_module():
    src = ("import torch\nimport torch.utils.cpp_extension\nSRC = " + repr(KERNEL + WRAPPER) + "\n"
           "class ModelNew(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
           "        self.ext = torch.utils.cpp_extension.load_inline(\n"
           "            name='e', cpp_sources='torch::Tensor f(torch::Tensor x);',\n"
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


def test_an_import_of_cpp_extension_with_other_names_keeps_the_others():
    src = solution('ext = load_inline("e", DECL, cuda_sources=KERNEL + WRAPPER, functions=["f"])\n',
                   before=f"import os, torch.utils.cpp_extension as cx\nDECL = {DECL!r}\n")
    out = rewrite(src, extract(src))
    assert "import os\n" in out and "cpp_extension" not in out


# -- several modules ----------------------------------------------------------------------------


def test_two_calls_build_two_modules_imported_under_their_names():
    src = TWO_MODULES.read_text()
    spec = extract(src)
    relu, grid = spec.modules
    assert (relu.attr, relu.functions) == ("relu", ("relu_cuda",))
    assert (grid.attr, grid.functions, grid.cuda_sources) == ("grid", (), "")
    assert "#define RELU_BLOCK 256" in relu.cuda_sources  # an f-string of a module constant
    out = rewrite(src, spec)
    assert "from cuda_extension import relu as relu" in out and "from cuda_extension import grid as grid" in out
    assert out.count("\n") == src.count("\n")
    assert static_findings(spec, out, TASK.source) == []


def test_each_module_registers_itself_under_cuda_extension():
    spec = extract(TWO_MODULES.read_text())
    relu, grid = binding_file(spec.modules[0], 0), binding_file(spec.modules[1], 1)
    assert "void cuda_agent_inline_0(pybind11::module_ &m) {" in relu and "PYBIND11_MODULE" not in relu
    assert "#define PYBIND11_MODULE(name, variable, ...) void cuda_agent_inline_1(" in grid  # its own module
    main = module_file(spec)
    assert 'm.def_submodule("relu")' in main and 'm.def_submodule("grid")' in main


def test_three_calls_and_a_repeated_call_share_modules():
    calls = ('a = load_inline("a", DECL, cuda_sources=KERNEL + WRAPPER, functions=["f"])\n'
             'b = load_inline("b", "torch::Tensor g(torch::Tensor x);", cuda_sources=KERNEL.replace("k(", "k2(") + '
             'WRAPPER.replace("f(", "g(").replace("k<<<", "k2<<<"), functions=["g"])\n'
             'c = load_inline(name="a", cpp_sources=DECL, cuda_sources=KERNEL + WRAPPER, functions=["f"])\n'
             'd = load_inline("d", DECL + "\\ntorch::Tensor h(torch::Tensor x);", cuda_sources=KERNEL + WRAPPER + '
             '"torch::Tensor h(torch::Tensor x) { return f(x); }", functions=["f", "h"])\n')
    spec = extract(solution(calls, before=f"DECL = {DECL!r}\n"))
    assert [m.attr for m in spec.modules] == ["a", "b", "d"]
    assert [(c.module, c.target) for c in spec.calls] == [(0, "a"), (1, "b"), (0, "c"), (2, "d")]
    assert "k2<<<" in spec.modules[1].cuda_sources


def test_colliding_or_unusable_names_become_numbered_attributes():
    calls = ('a = load_inline("x", DECL, cuda_sources=KERNEL + WRAPPER, functions=["f"])\n'
             'b = load_inline("x", DECL, cuda_sources=WRAPPER + KERNEL, functions=["f"])\n'
             'c = load_inline("not an identifier", DECL, cuda_sources=KERNEL, functions=["f"])\n')
    spec = extract(solution(calls, before=f"DECL = {DECL!r}\n"))
    assert [m.attr for m in spec.modules] == ["module0", "module1", "module2"]


# -- sources that are not a plain module-level constant -------------------------------------------


@pytest.mark.parametrize("before, cuda", [
    ('SRC = f"{KERNEL}{WRAPPER}"\n', "SRC"),
    ('SRC = "{}{}".format(KERNEL, WRAPPER)\n', "SRC"),
    ('SRC = "%s%s" % (KERNEL, WRAPPER)\n', "SRC"),
    ('SRC = "".join([KERNEL, WRAPPER])\n', "SRC"),
    ('import textwrap\nSRC = textwrap.dedent("""\n    X\n    """).strip().replace("X", KERNEL + WRAPPER)\n', "SRC"),
    ('from textwrap import dedent as dd\nPARTS = [KERNEL]\nPARTS.append(WRAPPER)\nSRC = dd("".join(PARTS))\n',
     'SRC.strip() + "\\n"'),
    ('N = 32\nSRC = (KERNEL + WRAPPER).replace("<<<1, 32>>>", f"<<<1, {N}>>>")\n', "SRC"),
    ('if torch.cuda.is_available():\n    SRC = KERNEL + WRAPPER\n', "SRC"),
    ('if torch.cuda.is_available():\n    SRC = KERNEL + WRAPPER\nelse:\n    SRC = KERNEL + WRAPPER\n', "SRC"),
    ('FAST = True\nif FAST:\n    SRC = KERNEL + WRAPPER\nelse:\n    SRC = "slow"\n', "SRC"),
    ('try:\n    SRC = KERNEL + WRAPPER\nexcept ImportError:\n    pass\n', "SRC"),
    ('def source():\n    """The kernel."""\n    text = KERNEL\n    return text + WRAPPER\n', "source()"),
    ('SOURCES = {"k": KERNEL + WRAPPER}\n', 'SOURCES["k"]'),
])
def test_sources_folded_from_constants_and_names_bound_once(before, cuda):
    module = only(solution(f'ext = load_inline("e", {DECL!r}, cuda_sources={cuda}, functions=["f"])\n', before))
    assert module.cuda_sources.strip() == (KERNEL + WRAPPER).strip()


def test_sources_bound_inside_a_function_that_builds_the_module():
    src = solution('def build():\n    src = KERNEL\n    src += WRAPPER\n'
                   f'    return load_inline(name="e", cpp_sources={DECL!r}, cuda_sources=src, functions="f")\n'
                   'ext = build()\n')
    spec = extract(src)
    assert spec.modules[0].cuda_sources == KERNEL + WRAPPER and spec.modules[0].functions == ("f",)
    out = rewrite(src, spec)
    assert "    return (cuda_extension)\n" in out and "ext = build()" in out


def test_sources_in_a_method_from_self_attributes_and_helper_methods():
    spec = extract(IN_METHOD.read_text())
    (module,) = spec.modules
    assert module.cuda_sources.startswith("__global__ void relu_kernel(const float* x, float* out, int size)\n{")
    assert "relu_kernel<<<(n + 256 - 1) / 256, 256>>>" in module.cuda_sources  # str.format with {{ }}
    assert module.cpp_sources == "torch::Tensor relu_cuda(torch::Tensor x);" and module.functions == ("relu_cuda",)
    assert module.defines == (("UNROLL", "4"),)  # read from **BUILD_OPTIONS
    assert any("name= is computed" in n and "os.getpid" in n for n in spec.notes)
    out = rewrite(IN_METHOD.read_text(), spec)
    assert "self.ext = (cuda_extension)" in out
    assert not [f for f in static_findings(spec, out, TASK.source) if f.blocking]


def test_a_name_from_a_variable_is_folded_and_a_computed_one_is_noted():
    named = only(solution('ext = load_inline(NAME, "d", cuda_sources=KERNEL, functions=["f"])\n',
                          'NAME = "ext_" + "a"\n'))
    assert named.name == "ext_a"
    spec = extract(solution('import uuid\next = load_inline(f"ext_{uuid.uuid4().hex}", "d", cuda_sources=KERNEL, '
                            'functions=["f"])\n'))
    assert spec.modules[0].name == "module0" and "uuid.uuid4" in spec.notes[0]


def test_sources_that_define_their_own_pybind_module_need_no_functions():
    own = 'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("f", &f); }\n'
    module = only(solution('ext = load_inline("e", "", cuda_sources=KERNEL + WRAPPER + OWN)\n', f"OWN = {own!r}\n"))
    assert module.functions == ()
    assert "PYBIND11_MODULE" not in binding_file(module)  # TORCH_EXTENSION_NAME is cuda_extension


def test_options_that_cannot_be_read_are_noted_when_sources_and_functions_are_explicit():
    src = solution('ext = load_inline("e", "d", cuda_sources=KERNEL, functions=["f"], **opts)\n',
                   'import subprocess\nopts = {"extra_ldflags": [subprocess.check_output(["nvcc", "--version"])]}\n')
    spec = extract(src)
    assert spec.modules[0].cuda_sources == KERNEL
    assert any("**opts not read" in n and "build options" in n for n in spec.notes)


def test_notes_reach_the_verdict_of_a_file_that_must_not_build(tmp_path):
    cheat = TORCH_CHEAT.read_text().replace("verbose=True,", "**OPTS,")
    options = 'OPTS = {"extra_cuda_cflags": ["-O3"]}\n'
    (tmp_path / "model_new.py").write_text(cheat.replace("\nrelu = load_inline(", f"\n{options}relu = load_inline("))
    converted = convert(tmp_path, TASK)
    assert converted.verdict.status is VerdictStatus.HACK
    assert "extra flags not passed on" in converted.verdict.details[NOTES_KEY]


# -- refused: forms that cannot be read statically -------------------------------------------------


@pytest.mark.parametrize("call, before, why", [
    ('ext = load_inline("e", "decl", cuda_sources=SRC, functions=["f"])\n', "SRC = open('k.cu').read()\n",
     "a call of open"),
    ('ext = load_inline("e", "decl", cuda_sources=KERNEL, functions=NAMES)\n', "", "'NAMES' is not bound"),
    ('ext = load_inline("e", "decl", cuda_sources=KERNEL, functions=["f"], is_python_module=False)\n', "",
     "is_python_module"),
    ('ext = load_inline(**ARGS)\n', "", "may come from \\*\\*ARGS"),
    ('ext = load_inline("e", "d", KERNEL, **ARGS)\n', "", "functions= is not given and may come from"),
    ('ext = load_inline("e", "d", cuda_sources=KERNEL)\n', "", "no PYBIND11_MODULE"),
    ('ext = load_inline("e", "d", cuda_sources=SRC, functions=["f"])\n',
     'SRC = ""\nfor part in (KERNEL, WRAPPER):\n    SRC += part\n', "assigned in the loop"),
    ('ext = load_inline("e", "d", cuda_sources=SRC, functions=["f"])\n',
     'import torch\nif torch.cuda.is_available():\n    SRC = KERNEL\nelse:\n    SRC = WRAPPER\n', "bound differently"),
    ('class ModelNew2(torch.nn.Module):\n    def __init__(self, n):\n        super().__init__()\n'
     '        self.ext = load_inline("e", "d", cuda_sources=f"#define N {n}\\n" + KERNEL, functions=["f"])\n', "",
     "'n' is a parameter of __init__"),
    ('ext = load_inline("e", "d", cuda_sources=load_inline("x", "y"), functions=["f"])\n', "", "inside another"),
    ('ext = compile_it(KERNEL)\n', "compile_it = getattr(__import__('torch.utils.cpp_extension'), 'x')\n",
     "no load_inline"),
])
def test_forms_that_cannot_be_read_are_refused_naming_the_construct(call, before, why):
    with pytest.raises(UnsupportedInline, match=why):
        extract(solution(call, before))


def test_an_unsupported_form_is_a_compile_error_verdict(tmp_path):
    call = 'ext = load_inline("e", "d", cuda_sources=open("k").read(), functions=["f"])\n'
    (tmp_path / "model_new.py").write_text(solution(call))
    verdict = convert(tmp_path, TASK).verdict
    assert verdict.status is VerdictStatus.COMPILE_ERROR
    assert verdict.message.startswith("unsupported load_inline form: cuda_sources: line 5: a call of open")


# -- what the candidate's text causes is a verdict, never an exception ------------------------------


def test_a_long_concatenation_is_folded_without_deep_recursion():
    module = only(solution('ext = load_inline("e", "d", cuda_sources=SRC, functions=["f"])\n',
                           "SRC = " + " + ".join(["KERNEL"] * 900) + "\n"))
    assert module.cuda_sources == KERNEL * 900


@pytest.mark.parametrize("text, why", [
    ("import torch\nx = (\n", "does not parse"),
    ("import torch\x00\nload_inline(", "does not parse"),
    ("load_inline(" + "(" * 300 + "1" + ")" * 300 + ")\n", "does not parse"),
    ("x = 1\n" + "load_inline('a', 'b')\n" + "#" * (1 << 20), "at most 1048576"),
])
def test_a_file_that_cannot_be_read_is_a_compile_error_not_an_exception(text, why):
    with pytest.raises(InvalidSolution, match=why):
        extract(text)
    verdict = check_source(text, TASK).verdict
    assert verdict.status is VerdictStatus.COMPILE_ERROR and why in verdict.message


@pytest.mark.parametrize("before, why", [
    ('SRC = KERNEL * 1000000000\n', "repetition"),
    ('SRC = "{:999999999}".format(1)\n', "wider than"),
    ('SRC = "%999999999d" % 1\n', "wider than"),
    ('SRC = "x"\n' + "".join("SRC = SRC + SRC\n" for _ in range(40)), "more than"),
    ("SRC = '+'.join([KERNEL] * 1000000)\n", "too long"),
    (name_chain(400), "nested too deeply"),
    ("A = B\nB = A\nSRC = A\n", "not bound"),
])
def test_folding_cannot_be_made_to_build_huge_values_or_recurse(before, why):
    with pytest.raises(UnsupportedInline, match=why):
        extract(solution('ext = load_inline("e", "d", cuda_sources=SRC, functions=["f"])\n', before))
    assert MAX_CHARS < 1 << 30


def test_deep_nesting_is_refused_whatever_the_recursion_limit():
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(5000)  # as in a process where torch Inductor has compiled something
    try:
        with pytest.raises(UnsupportedInline, match="nested too deeply"):
            extract(solution('ext = load_inline("e", "d", cuda_sources=SRC, functions=["f"])\n', name_chain(400)))
    finally:
        sys.setrecursionlimit(limit)


def test_a_long_run_of_branches_rebinding_a_name_is_refused_whatever_the_recursion_limit():
    # the condition does not fold, so each `if` merges its branches over the merge before it
    branches = "".join("if torch.version.cuda:\n    SRC = KERNEL\nelse:\n    SRC = KERNEL\n" for _ in range(400))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(5000)
    try:
        with pytest.raises(UnsupportedInline, match="nested too deeply"):
            extract(solution('ext = load_inline("e", "d", cuda_sources=SRC, functions=["f"])\n', branches))
    finally:
        sys.setrecursionlimit(limit)
    few = "".join("if torch.version.cuda:\n    SRC = KERNEL\nelse:\n    SRC = KERNEL\n" for _ in range(20))
    assert only(solution('ext = load_inline("e", "d", cuda_sources=SRC, functions=["f"])\n', few)).cuda_sources == KERNEL


def test_nesting_just_under_the_bound_is_folded():
    # SRC, the chain of names, KERNEL and its constant: MAX_NESTING levels in all
    module = only(solution('ext = load_inline("e", "d", cuda_sources=SRC, functions=["f"])\n',
                           name_chain(MAX_NESTING - 3)))
    assert module.cuda_sources == KERNEL


def test_a_file_with_bad_bytes_is_read_with_replacement_characters(tmp_path):
    (tmp_path / "model_new.py").write_bytes(HONEST.read_bytes().replace(b"# ", b"\xff\xfe# ", 1) + b"# \xc3\n")
    assert convert(tmp_path, TASK).verdict is None


# -- static checks on the sources ---------------------------------------------------------------


def test_honest_sources_have_no_finding_although_kernel_and_wrapper_share_names():
    src = HONEST.read_text()
    spec = extract(src)
    assert static_findings(spec, rewrite(src, spec), TASK.source) == []


def test_torch_compute_inside_cuda_sources_is_a_hack(tmp_path):
    (tmp_path / "model_new.py").write_text(TORCH_CHEAT.read_text())
    verdict = convert(tmp_path, TASK).verdict
    assert verdict.status is VerdictStatus.HACK and verdict.hack.value == "torch_compute"
    assert "torch::relu" in verdict.message and "load_inline/cuda_sources.cpp:18" in verdict.message


def test_torch_in_a_kernel_body_is_flagged_by_the_device_rules():
    spec = extract(solution('ext = load_inline("e", "d", cuda_sources=BAD, functions=["f"])\n',
                            before="BAD = '__global__ void k(float* y) { torch::Tensor t; }\\n' + WRAPPER\n"))
    findings = static_findings(spec, "import cuda_extension as ext\n" + MODEL, TASK.source)
    assert any(f.file == "load_inline/cuda_sources.cuh" and f.blocking for f in findings)


def test_findings_of_a_second_module_name_the_module():
    calls = ('a = load_inline("a", DECL, cuda_sources=KERNEL + WRAPPER, functions=["f"])\n'
             'b = load_inline("b", "torch::Tensor g(torch::Tensor x);", cuda_sources="torch::Tensor g(torch::Tensor x) '
             '{ return torch::relu(x); }", functions=["g"])\n')
    src = solution(calls, before=f"DECL = {DECL!r}\n")
    spec = extract(src)
    findings = [f for f in static_findings(spec, rewrite(src, spec), TASK.source) if f.blocking]
    assert any(f.file == "load_inline/b/cuda_sources.cpp" and "torch::relu" in f.message for f in findings)


def test_the_generated_module_binds_each_function_as_load_inline_does():
    text = binding_file(extract(HONEST.read_text()).modules[0])
    assert "#include <torch/extension.h>" in text
    assert 'm.def("relu_cuda", torch::wrap_pybind_function(relu_cuda), "relu_cuda");' in text


def test_single_file_detection(tmp_path):
    (tmp_path / "model_new.py").write_text(HONEST.read_text())
    assert is_inline_solution(tmp_path)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.cu").write_text("")
    assert not is_inline_solution(tmp_path)


def test_converting_writes_one_unit_pair_per_module_and_the_module_file(tmp_path):
    (tmp_path / "model_new.py").write_text(TWO_MODULES.read_text())
    converted = convert(tmp_path, TASK)
    assert converted.verdict is None
    assert [u.path for u in converted.units] == ["kernels/inline_0.cu", "kernels/inline_0_binding.cpp",
                                                 "kernels/inline_1_binding.cpp", MODULE_FILE]
    assert all((tmp_path / u.path).is_file() for u in converted.units)


# -- the build, the final evaluator's preparation and `cuda-agent eval` ----------------------------


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("inline-cache")


def fast(text: str) -> str:
    """A fixture without its own <torch/extension.h> in cuda_sources: the same code (load_inline's
    prelude brings torch/types.h), a third of nvcc's time on a 2-core VM."""
    return text.replace('relu_source = """\n#include <torch/extension.h>\n', 'relu_source = """\n')


def prepare_single_file(text: str, tmp_path: Path, cache_dir: Path):
    single = tmp_path / "single"
    single.mkdir()
    (single / "model_new.py").write_text(text)
    config = CompileConfig(cache_dir=str(cache_dir), max_parallel=2, unit_timeout_s=1200)

    async def prepare():
        evaluator = FinalEvaluator(RewardsKernelEnv(CompilePool(config), None))
        snapshot = snapshot_solution(single, TASK, tmp_path / "ws")
        return snapshot, await evaluator.prepare(snapshot, TASK)

    snapshot, prepared = anyio.run(prepare)
    return snapshot, prepared, config


def load_probe(so: str, expression: str, config: CompileConfig) -> str | None:
    """`expression` printed by a fresh interpreter that loaded the module; None without libcudart."""
    if not (Path(CompilePool(config).toolchain.cuda_lib_dir) / "libcudart.so").exists():
        return None
    probe = f"from rewards.build.loader import load_extension\nm = load_extension({so!r})\nprint({expression})"
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    return loaded.stdout


@pytest.mark.slow
@needs_compiler
def test_final_evaluator_builds_the_single_file_in_the_compile_pool(tmp_path, cache_dir):
    snapshot, prepared, config = prepare_single_file(fast(HONEST.read_text()), tmp_path, cache_dir)
    assert prepared.verdict is None, prepared.verdict
    assert prepared.build.result.built_units == 2
    assert "import cuda_extension as relu" in (snapshot / "model_new.py").read_text()
    loaded = load_probe(prepared.build.artifact.so_path, "m.relu_cuda.__doc__", config)
    assert loaded is None or "relu_cuda" in loaded


@pytest.mark.slow
@needs_compiler
def test_two_modules_build_into_submodules_of_one_extension(tmp_path, cache_dir):
    snapshot, prepared, config = prepare_single_file(TWO_MODULES.read_text(), tmp_path, cache_dir)
    assert prepared.verdict is None, prepared.verdict
    assert prepared.build.result.built_units == 4
    probe = "m.grid.blocks_for(1000, 256), m.relu.relu_cuda.__doc__"
    loaded = load_probe(prepared.build.artifact.so_path, probe, config)
    assert loaded is None or (loaded.startswith("4 ") and "relu_cuda" in loaded)


def run_eval(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentcore.cli", "eval", *args], check=False, cwd=REPO,
                          capture_output=True, text=True, timeout=1500, env=env)


@needs_compiler
def test_eval_of_a_single_file_cheat_prints_its_category():
    run = run_eval("--task", str(RELU_MODEL), "--solution", str(TORCH_CHEAT))
    assert run.returncode == 1, run.stderr
    assert "hack: torch_compute" in run.stdout and "Traceback" not in run.stderr


def test_eval_of_an_unsupported_single_file_is_a_failed_build(tmp_path):
    path = tmp_path / "model_new.py"
    path.write_text(solution('ext = load_inline("e", "d", cuda_sources=open("k").read(), functions=["f"])\n'))
    run = run_eval("--task", str(RELU_MODEL), "--solution", str(path))
    assert run.returncode == 1, run.stderr
    assert "unsupported load_inline form" in run.stdout


# -- on the GPU -----------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_compiler
@pytest.mark.parametrize("fixture", [TWO_MODULES, IN_METHOD])
def test_single_file_forms_verify_on_the_gpu(tmp_path, fixture):
    from rewards.env import EnvConfig, open_kernel_env

    single = tmp_path / "single"
    single.mkdir()
    shutil.copy(fixture, single / "model_new.py")
    config = EnvConfig(gpus=(0,), compile=CompileConfig(cache_dir=str(tmp_path / "compile-cache")))

    async def verify():
        async with open_kernel_env(config) as env:
            snapshot = snapshot_solution(single, TASK, tmp_path / "ws")
            prepared = await FinalEvaluator(env).prepare(snapshot, TASK)
            assert prepared.verdict is None, prepared.verdict
            return await env.final_verdict(snapshot, TASK, prepared.build, inline=True)

    verdict = anyio.run(verify)
    assert verdict.ok, verdict.message
