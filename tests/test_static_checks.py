"""Static checks: every cheat in the corpus is flagged with its category and earns no reward, every
honest workspace is clean, and findings say file:line. Snippet tests pin single rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rewards.reward import score
from rewards.static.checks import (
    PROTECTED_FILES,
    check_protected,
    check_sources,
    check_workspace,
    file_digest,
)
from rewards.static.cpp import check_cpp, strip_cpp
from rewards.static.python import check_model_new
from rewards.verdict import (
    RULES,
    HackCategory,
    Verdict,
    VerdictStatus,
    apply_rules,
    hack_verdict,
    partial_work,
)

FIXTURES = Path(__file__).parent / "fixtures"
CHEATS = sorted(p for p in (FIXTURES / "cheats").iterdir() if (p / "cheat.json").exists())
HONEST = sorted(p for p in (FIXTURES / "honest_static").iterdir() if p.is_dir())


def meta(workspace: Path) -> dict:
    return json.loads((workspace / "cheat.json").read_text())


STATIC_CHEATS = [p for p in CHEATS if meta(p)["static"]]
DYNAMIC_CHEATS = [p for p in CHEATS if not meta(p)["static"]]


def findings_of(workspace: Path):
    originals_dir = workspace / "originals"
    originals = None
    if originals_dir.is_dir():
        originals = {
            p.relative_to(originals_dir).as_posix(): file_digest(p.read_bytes())
            for p in originals_dir.rglob("*")
            if p.is_file()
        }
    reference = (workspace / "model.py").read_text()
    return check_workspace(workspace, reference=reference, originals=originals)


def blocking_categories(workspace: Path) -> set[HackCategory]:
    return {f.category for f in findings_of(workspace) if f.blocking}


def ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


# --- the corpus -----------------------------------------------------------------------------------


def test_corpus_is_not_empty():
    assert len(STATIC_CHEATS) >= 20 and len(DYNAMIC_CHEATS) >= 5 and len(HONEST) >= 6


@pytest.mark.parametrize("workspace", CHEATS, ids=ids(CHEATS))
def test_cheat_json_names_a_known_category(workspace):
    data = meta(workspace)
    assert HackCategory(data["category"]) and isinstance(data["static"], bool)
    assert data["description"]


@pytest.mark.parametrize("workspace", STATIC_CHEATS, ids=ids(STATIC_CHEATS))
def test_static_cheat_is_flagged_with_its_category(workspace):
    assert HackCategory(meta(workspace)["category"]) in blocking_categories(workspace)


@pytest.mark.parametrize("workspace", STATIC_CHEATS, ids=ids(STATIC_CHEATS))
def test_static_cheat_earns_no_reward(workspace):
    verdict = hack_verdict(findings_of(workspace))
    assert verdict is not None and verdict.status is VerdictStatus.HACK
    assert score(verdict, None, None, None).reward == -1.0


@pytest.mark.parametrize("workspace", DYNAMIC_CHEATS, ids=ids(DYNAMIC_CHEATS))
def test_dynamic_cheat_is_left_to_the_gpu_audit(workspace):
    # These pass the static checks by design; the GPU audit must catch them. If a static rule
    # starts catching one, flip its cheat.json to "static": true.
    assert blocking_categories(workspace) == set()


TIMED_CHEATS = sorted(p for p in (FIXTURES / "cheats_timed").iterdir() if (p / "cheat.json").exists())


@pytest.mark.parametrize("workspace", TIMED_CHEATS, ids=ids(TIMED_CHEATS))
def test_cheats_only_the_timing_sees_pass_the_static_checks(workspace):
    # Call counters in the binding or on the GPU: the check after the paired timing catches them
    # (tests/test_env_gpu.py); a static rule that starts catching one shows up here.
    assert meta(workspace)["static"] is False and blocking_categories(workspace) == set()


@pytest.mark.parametrize("workspace", HONEST, ids=ids(HONEST))
def test_honest_workspace_has_no_blocking_findings(workspace):
    assert [str(f) for f in findings_of(workspace) if f.blocking] == []


@pytest.mark.parametrize(("name", "library"), [("gemm_cublas", "cublas"), ("conv_cudnn", "cudnn")])
def test_vendor_library_use_is_a_note_for_the_gpu_audit(name, library):
    notes = [f for f in findings_of(FIXTURES / "honest_static" / name) if not f.blocking]
    assert [(f.category, f.details["library"]) for f in notes] == [
        (HackCategory.VENDOR_LIBRARY, library)
    ]
    assert library in str(notes[0].details["calls"])


@pytest.mark.parametrize("workspace", STATIC_CHEATS, ids=ids(STATIC_CHEATS))
def test_findings_point_at_a_real_file_and_line(workspace):
    for f in findings_of(workspace):
        lines = (workspace / f.file).read_text().count("\n") + 1
        assert 1 <= f.line <= lines, str(f)
        assert str(f).startswith(f"{f.file}:{f.line}: [{f.category.value}] ")


def test_finding_message_names_the_offending_call():
    (finding,) = findings_of(FIXTURES / "cheats" / "binding_torch_matmul")
    assert str(finding).startswith("kernels/linear_binding.cpp:10: [torch_compute] torch::matmul")


# --- model_new.py rules ---------------------------------------------------------------------------

HEADER = (
    "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\nimport cuda_extension\n"
)


def model_new(
    init: str = "pass", forward: str = "return cuda_extension.f(x)", extra: str = ""
) -> str:
    body = "\n".join("        " + line for line in forward.splitlines())
    setup = "\n".join("        " + line for line in init.splitlines())
    return (
        f"{HEADER}{extra}\n\nclass ModelNew(nn.Module):\n    def __init__(self, n=4):\n"
        f"        super().__init__()\n{setup}\n\n    def forward(self, x, y=None):\n{body}\n"
    )


HONEST_SNIPPETS = {
    "shape arithmetic": (
        "n = x.shape[0] * x.shape[1]\nb = (n + 255) // 256\nreturn cuda_extension.f(x, b)"
    ),
    "size and numel": "return cuda_extension.f(x, x.size(0) * 2, x.numel() // x.size(-1))",
    "views": "return cuda_extension.f(x.contiguous().view(-1, x.size(-1)).transpose(0, 1))",
    "allocation": (
        "out = torch.empty(x.shape, dtype=x.dtype, device=x.device)\n"
        "acc = torch.zeros_like(x)\ncuda_extension.f(x, out, acc)\nreturn out"
    ),
    "tuple results": "a, b = cuda_extension.f(x)\nreturn cuda_extension.g(a.view(-1), b)",
    "no_grad": "with torch.no_grad():\n    return cuda_extension.f(x)",
    "assert on metadata": (
        "assert x.dtype == torch.float32 and x.is_contiguous(), f'{x.shape}'\n"
        "return cuda_extension.f(x)"
    ),
    "python containers": (
        "dims = [d for d in x.shape]\ndims.append(1)\nreturn cuda_extension.f(x, tuple(dims))"
    ),
    "helper with scalars": "return cuda_extension.f(x, self._grid(x.numel()))",
    "none check": "if y is None:\n    return cuda_extension.f(x)\nreturn cuda_extension.g(x, y)",
}


@pytest.mark.parametrize("forward", HONEST_SNIPPETS.values(), ids=HONEST_SNIPPETS.keys())
def test_honest_forward_snippet_is_clean(forward):
    extra_method = "\n    def _grid(self, n):\n        return min(4096, (n + 255) // 256)\n"
    assert [str(f) for f in check_model_new(model_new(forward=forward) + extra_method)] == []


def test_init_may_create_parameters_like_the_reference():
    init = (
        "self.linear = nn.Linear(n, n)\nself.w = nn.Parameter(torch.randn(n, n) * 0.02)\n"
        "nn.init.kaiming_uniform_(self.w)\n"
        "self.register_buffer('mask', torch.tril(torch.ones(n, n)))"
    )
    forward = "return cuda_extension.f(x, self.linear.weight, self.linear.bias, self.w, self.mask)"
    assert check_model_new(model_new(init, forward)) == []


CHEAT_SNIPPETS = {
    "from-import alias": (
        "from torch.nn.functional import relu as r\nreturn r(x)",
        "torch_compute",
    ),
    "tensor sum": ("return cuda_extension.f(x).sum()", "torch_compute"),
    "unary minus": ("return -cuda_extension.f(x)", "torch_compute"),
    "comparison": ("return cuda_extension.f(x) > 0", "torch_compute"),
    "builtin abs": ("return abs(cuda_extension.f(x))", "torch_compute"),
    "gather": ("i = cuda_extension.idx(x)\nreturn x[i]", "torch_compute"),
    "parameter arithmetic": ("return cuda_extension.f(x) * self.w", "torch_compute"),
    "helper arithmetic": ("return self._add(cuda_extension.f(x), x)", "torch_compute"),
    "submodule loop": ("for layer in self.layers:\n    x = layer(x)\nreturn x", "torch_compute"),
    "to float16": ("return cuda_extension.f(x.to(torch.float16))", "precision_downgrade"),
    "cuda graph": ("g = torch.cuda.CUDAGraph()\nreturn cuda_extension.f(x)", "side_stream"),
    "register_buffer in forward": ("self.register_buffer('o', x)\nreturn x", "output_caching"),
    "setattr on self": ("setattr(self, 'o', x)\nreturn cuda_extension.f(x)", "output_caching"),
    "augmented input": ("x += 1\nreturn cuda_extension.f(x)", "input_mutation"),
    "in-place method on input": ("x.relu_()\nreturn cuda_extension.f(x)", "input_mutation"),
    "dunder class": ("return cuda_extension.f(x).__class__", "obfuscation"),
    "exec": ("exec('y = x')\nreturn cuda_extension.f(x)", "obfuscation"),
    "torch.load": ("return torch.load('out.pt')", "sandbox_escape"),
}


@pytest.mark.parametrize(
    ("forward", "category"), CHEAT_SNIPPETS.values(), ids=CHEAT_SNIPPETS.keys()
)
def test_cheating_forward_snippet_is_flagged(forward, category):
    init = "self.w = nn.Parameter(torch.ones(n))\nself.layers = nn.ModuleList([nn.ReLU()])"
    helper = "\n    def _add(self, a, b):\n        return a + b\n"
    findings = check_model_new(model_new(init, forward) + helper)
    assert HackCategory(category) in {f.category for f in findings}


LOCAL_BLOCKS = """import torch
import torch.nn as nn
import cuda_extension


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3)

    def forward(self, x):
        return cuda_extension.conv(x, self.conv.weight, self.conv.bias)


class ModelNew(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.stem = Block(c)
        self.blocks = nn.ModuleList([Block(c) for _ in range(3)])
        self.acts = nn.ModuleList([nn.ReLU() for _ in range(3)])

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return x
"""


def test_local_submodules_are_checked_on_their_own():
    assert check_model_new(LOCAL_BLOCKS) == []


def test_looping_over_torch_modules_in_forward_is_torch_compute():
    source = LOCAL_BLOCKS.replace(
        "        return x\n",
        "        for act in self.acts:\n            x = act(x)\n        return x\n",
    )
    (finding,) = check_model_new(source)
    assert finding.category is HackCategory.TORCH_COMPUTE and "act(...)" in finding.message


def test_global_counter_in_forward_is_output_caching():
    source = model_new(
        forward="global CALLS\nCALLS += 1\nreturn cuda_extension.f(x)", extra="CALLS = 0"
    )
    assert HackCategory.OUTPUT_CACHING in {f.category for f in check_model_new(source)}


def test_mutable_default_argument_is_output_caching():
    source = model_new().replace("def forward(self, x, y=None)", "def forward(self, x, memo={})")
    assert HackCategory.OUTPUT_CACHING in {f.category for f in check_model_new(source)}


def test_low_precision_is_allowed_when_the_reference_uses_it():
    source = model_new(forward="return cuda_extension.f(x, torch.empty(4, dtype=torch.float16))")
    reference = "import torch\ndef get_inputs():\n    return [torch.rand(4, dtype=torch.float16)]\n"
    assert check_model_new(source, reference=reference) == []
    assert check_model_new(source)[0].category is HackCategory.PRECISION_DOWNGRADE


def test_task_globals_may_be_copied_unchanged():
    source = model_new(extra="batch_size = 16")
    assert check_model_new(source, reference="batch_size = 16\n") == []
    assert check_model_new(source, reference="batch_size = 128\n")[0].category is (
        HackCategory.PROBLEM_SHRINKING
    )


def test_missing_model_new_class_is_a_layout_finding():
    (finding,) = check_model_new("import torch\n")
    assert finding.category is HackCategory.LAYOUT and "ModelNew" in finding.message


def test_syntax_error_is_a_layout_finding_at_its_line():
    (finding,) = check_model_new("import torch\n\ndef broken(:\n")
    assert (finding.category, finding.line) == (HackCategory.LAYOUT, 3)


def test_missing_model_new_file_is_a_layout_finding():
    (finding,) = check_sources({})
    assert (finding.file, finding.category) == ("model_new.py", HackCategory.LAYOUT)


# --- kernel source rules --------------------------------------------------------------------------

BINDING_HEAD = (
    '#include <torch/types.h>\n#include <c10/cuda/CUDAStream.h>\n#include "../binding_registry.h"\n'
)


def test_strip_cpp_blanks_comments_and_strings_keeping_offsets():
    source = (
        'a = 1\'000; // torch::matmul\n/* at::relu\n */ s = "at::relu"; r = R"x(torch::mm)x";\n'
    )
    stripped = strip_cpp(source)
    assert len(stripped) == len(source) and stripped.count("\n") == source.count("\n")
    assert "torch" not in stripped and "relu" not in stripped and "1'000" in stripped


def test_torch_names_in_comments_and_strings_are_ignored():
    source = BINDING_HEAD + '// torch::matmul(a, b)\nconst char* doc = "uses at::relu";\n'
    assert check_cpp(source, file="kernels/k_binding.cpp") == []


def test_cpp_finding_line_counts_multiline_comments():
    source = BINDING_HEAD + "/* one\n two\n three */\nauto y = at::relu(x);\n"
    (finding,) = check_cpp(source, file="kernels/k_binding.cpp")
    assert (finding.line, finding.category) == (7, HackCategory.TORCH_COMPUTE)


def test_torch_headers_are_allowed_in_bindings_but_not_in_kernels():
    assert check_cpp(BINDING_HEAD, file="kernels/k_binding.cpp") == []
    cu = '#include <torch/types.h>\nextern "C" void f() {}\n'
    assert {f.category for f in check_cpp(cu, file="kernels/k.cu")} == {
        HackCategory.FORBIDDEN_IMPORT
    }


def test_pointer_declarators_are_not_tensor_arithmetic():
    source = BINDING_HEAD + (
        'extern "C" void launch(float* out, const float* x);\n'
        "torch::Tensor f(torch::Tensor x) {\n  auto out = torch::empty_like(x);\n"
        "  launch(out.data_ptr<float>(), x.data_ptr<float>() + x.size(0) * 2);\n  return out;\n}\n"
    )
    assert check_cpp(source, file="kernels/k_binding.cpp") == []


def test_metadata_locals_are_scalars_not_tensors():
    source = BINDING_HEAD + (
        "torch::Tensor f(torch::Tensor x) {\n  auto n = x.size(0);\n  int blocks = n * 2 + 1;\n"
        "  auto v = x.view({-1});\n  return v;\n}\n"
    )
    assert check_cpp(source, file="kernels/k_binding.cpp") == []


def test_static_handles_and_static_functions_are_not_output_caching():
    source = BINDING_HEAD + (
        "static cublasHandle_t handle = nullptr;\n"
        "static torch::Tensor forward(torch::Tensor x) { return torch::empty_like(x); }\n"
    )
    assert check_cpp(source, file="kernels/k_binding.cpp") == []


def test_kernel_source_without_extern_c_launcher_is_a_layout_finding():
    cu = "__global__ void k(float* y) { y[0] = 1; }\nvoid launch(float* y) { k<<<1, 1>>>(y); }\n"
    (finding,) = check_cpp(cu, file="kernels/k.cu")
    assert finding.category is HackCategory.LAYOUT and 'extern "C"' in finding.message


def test_own_function_named_cublas_is_not_cublas_and_an_aliased_level1_call_is():
    head = '#include <cublas_v2.h>\n'
    own = head + (
        'extern "C" void cublas_fused_bias(cublasHandle_t h, const float* a, float* c) {\n'
        "  float one = 1.0f;\n"
        "  cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, a, 4, a, 4, &one, c, 4);\n}\n"
    )
    assert not [f for f in check_cpp(own, file="kernels/k.cu") if f.blocking]
    aliased = head + (
        "#define ADD_ROWS cublasSaxpy\n"
        'extern "C" void f(cublasHandle_t h, const float* a, float* c) {\n'
        "  float one = 1.0f;\n  ADD_ROWS(h, 16, &one, a, 1, c, 1);\n}\n"
    )
    (found,) = [f for f in check_cpp(aliased, file="kernels/k.cu") if f.blocking]
    assert found.category is HackCategory.VENDOR_LIBRARY and "cublasSaxpy" in found.message


def test_tf32_math_mode_is_a_note():
    cu = (
        '#include <cublas_v2.h>\nextern "C" void f(cublasHandle_t h) {\n'
        "  cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH);\n}\n"
    )
    notes = [
        f
        for f in check_cpp(cu, file="kernels/k.cu")
        if f.category is HackCategory.PRECISION_DOWNGRADE
    ]
    assert len(notes) == 1 and not notes[0].blocking


# --- protected files ------------------------------------------------------------------------------


def test_unchanged_protected_files_pass():
    files = {name: f"text of {name}" for name in PROTECTED_FILES}
    originals = {name: file_digest(text) for name, text in files.items()}
    assert check_protected(files, originals) == []


def test_modified_and_deleted_protected_files_are_flagged():
    originals = {"model.py": file_digest("a"), "binding.cpp": file_digest("b")}
    findings = check_protected({"model.py": "a, shrunk"}, originals)
    assert [(f.file, f.category) for f in findings] == [
        ("binding.cpp", HackCategory.PROTECTED_FILE),
        ("model.py", HackCategory.PROTECTED_FILE),
    ]
    assert "deleted" in findings[0].message and "modified" in findings[1].message


def test_a_clean_workspace_verdict_is_none():
    assert hack_verdict(findings_of(HONEST[0])) is None
    assert Verdict(status=VerdictStatus.OK).ok


# --- idiom pairs: honest code accepted under both rule sets, the cheat behind it rejected ----------

IDIOMS_DIR = FIXTURES / "idioms"
IDIOMS = sorted(p for p in IDIOMS_DIR.iterdir() if (p / "idiom.json").exists())


def idiom_files(idiom: Path, variant: str) -> dict[str, str]:
    """base/ with the variant's files laid over it, and the pair's own task (model.py) if it has one.
    A variant whose model_new.py calls load_inline is a single-file solution: base/'s kernels/ stay out."""
    files = {}
    for root in (IDIOMS_DIR / "base", idiom / variant):
        for p in root.rglob("*"):
            if p.is_file():
                files[p.relative_to(root).as_posix()] = p.read_text()
    if (idiom / "model.py").is_file():
        files["model.py"] = (idiom / "model.py").read_text()
    if "load_inline(" in files["model_new.py"]:
        files = {name: text for name, text in files.items() if not name.startswith("kernels/")}
    return files


def idiom_findings(idiom: Path, variant: str, rules: str):
    files = idiom_files(idiom, variant)
    if "load_inline(" in files["model_new.py"]:  # read, rewritten and checked as rewards.inline does
        from rewards.inline.prepare import extract, rewrite, static_findings

        spec = extract(files["model_new.py"])
        findings = static_findings(spec, rewrite(files["model_new.py"], spec), files["model.py"])
        return sorted(apply_rules(findings, rules), key=lambda f: (f.file, f.line))
    return check_sources(files, reference=files["model.py"], rules=rules)


@pytest.mark.parametrize("rules", RULES)
@pytest.mark.parametrize("idiom", IDIOMS, ids=ids(IDIOMS))
def test_honest_idiom_is_accepted(idiom, rules):
    findings = [f for f in idiom_findings(idiom, "honest", rules) if f.blocking]
    if rules in json.loads((idiom / "idiom.json").read_text()).get("honest_rules", RULES):
        assert [str(f) for f in findings] == []
    else:  # torch doing part of the work, which only KernelBench's rules allow
        assert {f.category for f in findings} == {HackCategory.TORCH_COMPUTE}, [str(f) for f in findings]


@pytest.mark.parametrize("idiom", IDIOMS, ids=ids(IDIOMS))
def test_cheat_behind_an_idiom_is_rejected(idiom):
    category = HackCategory(json.loads((idiom / "idiom.json").read_text())["cheat_category"])
    verdict = hack_verdict(idiom_findings(idiom, "cheat", "paper"))
    assert verdict is not None and category in {f.category for f in verdict.findings if f.blocking}


@pytest.mark.parametrize("idiom", IDIOMS, ids=ids(IDIOMS))
def test_cheat_behind_an_idiom_under_kernelbench_rules(idiom):
    meta = json.loads((idiom / "idiom.json").read_text())
    findings = idiom_findings(idiom, "cheat", "kernelbench")
    blocking = {f.category for f in findings if f.blocking}
    if meta["kernelbench"] == "rejected":
        assert HackCategory(meta["cheat_category"]) in blocking
    else:  # torch doing part of the work: a note here; the GPU audit judges the own share
        assert blocking == set() and any(f.torch_work and not f.blocking for f in findings)


def test_idiom_base_is_clean():
    files = idiom_files(IDIOMS_DIR / "base", "")
    assert check_sources(files, reference=files["model.py"]) == []


# --- rule sets ---------------------------------------------------------------------------------


def test_torch_work_is_a_hack_under_paper_rules_and_partial_under_kernelbench():
    source = model_new(forward="return cuda_extension.f(F.conv2d(x, self.w))", init="self.w = nn.Parameter(torch.ones(1))")
    paper = hack_verdict(check_model_new(source))
    assert paper.hack is HackCategory.TORCH_COMPUTE and paper.rules == "paper"
    assert hack_verdict(check_model_new(source), "kernelbench") is None
    (note,) = apply_rules(check_model_new(source), "kernelbench")
    assert not note.blocking and note.message.startswith("partial: torch does torch.nn.functional.conv2d")


def test_kernelbench_rules_keep_every_other_check():
    source = model_new(forward="y = cuda_extension.f(x)\nself.cache = y\nreturn F.relu(y)")
    verdict = hack_verdict(check_model_new(source), "kernelbench")
    assert verdict.hack is HackCategory.OUTPUT_CACHING and verdict.rules == "kernelbench"


def test_forward_without_the_extension_is_a_decoy_under_both_rule_sets():
    source = model_new(forward="return F.relu(x)")
    for rules in RULES:
        verdict = hack_verdict(check_model_new(source), rules)
        assert HackCategory.DECOY_KERNEL in {f.category for f in verdict.findings if f.blocking}


def test_torch_code_generators_stay_hacks_under_kernelbench_rules():
    source = model_new(forward="return cuda_extension.f(torch.compile(F.relu)(x))")
    assert hack_verdict(check_model_new(source), "kernelbench").hack is HackCategory.TORCH_COMPUTE


def test_binding_torch_ops_are_partial_under_kernelbench_rules():
    source = BINDING_HEAD + "torch::Tensor f(torch::Tensor x) {\n  return at::relu(torch::conv2d(x, x));\n}\n"
    findings = check_cpp(source, file="kernels/k_binding.cpp")
    assert {f.torch_work for f in findings} == {"at::relu", "torch::conv2d"}
    assert all(not f.blocking for f in apply_rules(findings, "kernelbench"))


def test_namespace_alias_is_obfuscation_under_paper_rules_and_partial_under_kernelbench():
    findings = check_cpp(BINDING_HEAD + "using namespace at;\n", file="kernels/k_binding.cpp")
    assert hack_verdict(findings).hack is HackCategory.OBFUSCATION
    assert hack_verdict(findings, "kernelbench") is None


def test_partial_work_names_what_torch_does():
    findings = apply_rules(check_model_new(model_new(forward="return cuda_extension.f(x) @ x")), "kernelbench")
    verdict = Verdict(status=VerdictStatus.OK, findings=tuple(findings), rules="kernelbench")
    assert partial_work(verdict) == "a matmul (@)"
    assert partial_work(Verdict(status=VerdictStatus.OK, details={"partial": "aten.addmm"})) == "aten.addmm"


# --- idioms, pinned one rule at a time ---------------------------------------------------------


def test_helpers_forward_also_calls_are_not_init_context():
    source = model_new(
        init="self.w = nn.Parameter(torch.ones(4))\nself._scale()",
        forward="return cuda_extension.f(self._scale())",
    ) + "\n    def _scale(self):\n        return self.w * 2\n"
    assert HackCategory.TORCH_COMPUTE in {f.category for f in check_model_new(source) if f.blocking}


def test_apply_of_an_init_helper_is_followed():
    source = model_new(init="self.apply(self._init)", forward="return cuda_extension.f(x)") + (
        "\n    def _init(self, m):\n        if isinstance(m, nn.Linear):\n"
        "            nn.init.zeros_(m.weight)\n"
    )
    assert check_model_new(source) == []


def test_local_blocks_built_through_a_list_are_local_modules():
    source = LOCAL_BLOCKS.replace(
        "        self.blocks = nn.ModuleList([Block(c) for _ in range(3)])\n",
        "        self.blocks = self._make_layer(c)\n",
    ).replace(
        "    def forward(self, x):\n        x = self.stem(x)",
        "    def _make_layer(self, c):\n        layers = []\n        for _ in range(3):\n"
        "            layers.append(Block(c))\n        return nn.Sequential(*layers)\n\n"
        "    def forward(self, x):\n        x = self.blocks(self.stem(x))",
    )
    assert check_model_new(source) == []


def test_unused_third_party_import_is_still_forbidden():
    (finding,) = check_model_new(model_new(extra="import scipy"))
    assert finding.category is HackCategory.FORBIDDEN_IMPORT and finding.blocking


def test_numpy_computes_constants_only():
    honest = model_new(extra="import numpy as np\nfrom numpy import pi\nLIMIT = np.log(1 / 0.01)",
                       forward="return cuda_extension.f(x, min(LIMIT, np.sqrt(pi)))")
    assert check_model_new(honest) == []
    for use, category in [("np.load('out.npy')", HackCategory.SANDBOX_ESCAPE), ("np.memmap('o')", HackCategory.SANDBOX_ESCAPE),
                          ("np.array([1.0])", HackCategory.FORBIDDEN_IMPORT), ("np.exp(x)", HackCategory.FORBIDDEN_IMPORT)]:
        source = model_new(extra="import numpy as np", forward=f"y = {use}\nreturn cuda_extension.f(x, y)")
        assert category in {f.category for f in check_model_new(source) if f.blocking}, use
    star = model_new(extra="from numpy import *")
    assert HackCategory.FORBIDDEN_IMPORT in {f.category for f in check_model_new(star) if f.blocking}


def test_a_global_that_builds_the_extension_once_is_not_state():
    extra = "_ext = None\n\ndef _get():\n    global _ext\n    if _ext is None:\n        _ext = cuda_extension\n    return _ext\n"
    source = model_new(extra=extra, init="self.ops = _get()", forward="return self.ops.f(_get().g(x))")
    assert check_model_new(source) == []
    cheat = extra.replace("_ext = cuda_extension", "_ext = cuda_extension.f(x)").replace("def _get():", "def _get(x=None):")
    assert HackCategory.OUTPUT_CACHING in {f.category for f in check_model_new(model_new(extra=cheat)) if f.blocking}


def test_a_single_file_build_once_getter_is_the_extension():
    from agentcore.types import Task
    from rewards.inline.prepare import check_source

    source = (INLINE_FIXTURES / "relu_honest.py").read_text()
    lazy = source.replace("relu = load_inline(", "_relu = None\n\n\ndef _build():\n    global _relu\n"
                          "    if _relu is None:\n        _relu = load_inline(").replace(
        '    extra_ldflags=[""],\n)\n', '    extra_ldflags=[""],\n        )\n    return _relu\n').replace(
        "self.relu = relu", "self.relu = _build()")
    assert "global _relu" in lazy and "return _relu" in lazy
    assert check_source(lazy, Task(task_id="t", source=RELU_TASK)).verdict is None


def blocking_of(source: str) -> set[HackCategory]:
    return {f.category for f in check_model_new(source) if f.blocking}


LOAD_METHOD = "\n    def _load(self):\n        return cuda_extension\n"


def test_a_method_returning_the_extension_is_the_extension():
    kept = model_new(init="self.ops = self._load()", forward="return self.ops.f(x)")
    assert check_model_new(kept + LOAD_METHOD) == []
    maybe = "\n    def _load(self):\n        if n < 0:\n            return None\n        return cuda_extension\n"
    assert check_model_new(kept + maybe) == []
    assert check_model_new(model_new(forward="return self._load().f(x)") + LOAD_METHOD) == []
    unused = model_new(init="self.ops = self._load()", forward="return x") + LOAD_METHOD
    assert HackCategory.DECOY_KERNEL in blocking_of(unused)  # built, never called
    other = "\n    def _load(self):\n        if n < 0:\n            return F\n        return cuda_extension\n"
    assert HackCategory.DECOY_KERNEL in blocking_of(kept + other)
    shadowed = model_new(init="self._load = lambda: F", forward="return self._load().relu(x)") + LOAD_METHOD
    assert blocking_of(shadowed) == {HackCategory.TORCH_COMPUTE}  # self._load() is the lambda's F


def test_a_try_around_a_build_method_guards_the_build_only_when_the_method_only_builds():
    guarded = "try:\n    self.ops = self._load()\nexcept RuntimeError as exc:\n    print(exc)\n    raise"
    assert check_model_new(model_new(init=guarded, forward="return self.ops.f(x)") + LOAD_METHOD) == []
    inner = ('\n    def _load(self):\n        """The prebuilt module."""\n        src = "k"\n        try:\n'
             "            return cuda_extension\n        except Exception as exc:\n            print(exc)\n"
             "            return None\n")
    assert check_model_new(model_new(init=guarded, forward="return self.ops.f(x)") + inner) == []
    probe = "\n    def _load(self):\n        cuda_extension.f(torch.ones(2))\n        return cuda_extension\n"
    fallback = model_new(init=guarded.replace("    raise", "    self.ops = None"), forward="return self.ops.f(x)")
    assert HackCategory.FALLBACK_PATH in blocking_of(fallback + probe)
    getter = ("def _get():\n    cuda_extension.warmup()\n    return cuda_extension\n\n"
              "try:\n    ext = _get()\nexcept Exception:\n    ext = None\n")
    assert HackCategory.FALLBACK_PATH in blocking_of(model_new(extra=getter, forward="return ext.f(x)"))
    only_builds = getter.replace("    cuda_extension.warmup()\n", "")
    assert check_model_new(model_new(extra=only_builds, forward="return _get().f(x)")) == []


def test_a_local_bound_once_to_the_extension_and_its_functions_are_the_extension():
    guarded = "try:\n    ext = cuda_extension\n    self.kernel = ext.f\nexcept Exception:\n    self.kernel = None"
    for init, forward in [("ext = cuda_extension\nself.ops = ext", "return self.ops.f(x)"),
                          ("ops = cuda_extension\nself.kernel = ops.f", "return self.kernel(x)"),
                          (guarded, "return self.kernel(x)")]:
        assert check_model_new(model_new(init=init, forward=forward)) == [], init
    twice = model_new(init="ext = cuda_extension\nif n > 2:\n    ext = F\nself.ops = ext",
                      forward="return self.ops.relu(x)")
    assert HackCategory.DECOY_KERNEL in blocking_of(twice)
    probe = guarded.replace("\nexcept", "\n    ext.f(torch.ones(2))\nexcept")
    assert HackCategory.FALLBACK_PATH in blocking_of(model_new(init=probe, forward="return self.kernel(x)"))


def test_a_class_attribute_holding_the_extension_is_the_extension():
    def with_attr(body: str, init: str = "pass", forward: str = "return ModelNew.ops.f(x)") -> str:
        head = "class ModelNew(nn.Module):\n"
        return model_new(init=init, forward=forward).replace(head, head + body)

    assert check_model_new(with_attr("    ops = cuda_extension\n")) == []
    assert check_model_new(with_attr("    ops = cuda_extension\n", forward="return self.ops.f(x)")) == []
    assert check_model_new(with_attr("    ops = None\n", init="ModelNew.ops = cuda_extension")) == []
    assert HackCategory.DECOY_KERNEL in blocking_of(with_attr("    ops = cuda_extension\n", forward="return x"))
    shadowed = with_attr("    ops = cuda_extension\n", init="self.ops = F", forward="return self.ops.relu(x)")
    assert HackCategory.DECOY_KERNEL in blocking_of(shadowed)
    method = "\n    def ops(self, x):\n        return F.relu(x)\n"
    redefined = with_attr("    ops = cuda_extension\n" + method, forward="return self.ops(x)")
    assert HackCategory.DECOY_KERNEL in blocking_of(redefined)
    late = with_attr("    ops = None\n", forward="ModelNew.ops = cuda_extension\nreturn ModelNew.ops.f(x)")
    assert blocking_of(late) == {HackCategory.OUTPUT_CACHING}  # bound per call: state, as before


BUILD_SETTINGS = ('import os\nNAME = f"relu_{os.getpid()}"\nDIR = os.path.join("/tmp", NAME)\n'
                  "os.makedirs(DIR, exist_ok=True)\n")


@pytest.mark.parametrize(("settings", "build", "blocking"), [
    (BUILD_SETTINGS, "name=NAME, build_directory=DIR, ", False),
    ("import os\n", 'name=f"relu_{os.getpid()}", build_directory=os.path.join("/tmp", str(os.getpid())), ', False),
    ("from os.path import join\nDIR = join('/tmp', 'relu')\n", "build_directory=DIR, ", False),
    ("import os\nos.makedirs('relu_build', exist_ok=True)\n", "build_directory='relu_build', ", False),
    ("import os\nos.makedirs('elsewhere', exist_ok=True)\n", "build_directory='relu_build', ", True),
    (BUILD_SETTINGS + "PID = os.getpid()\n", "name=NAME, build_directory=DIR, ", True),  # PID is read by forward
    (BUILD_SETTINGS + 'os.environ["CUDA_LAUNCH_BLOCKING"] = "1"\n', "name=NAME, build_directory=DIR, ", True),
    (BUILD_SETTINGS.replace(", exist_ok=True", ""), "name=NAME, build_directory=DIR, ", True),
    (BUILD_SETTINGS.replace("os.makedirs(", "if not os.path.exists(DIR):\n    os.makedirs("),
     "name=NAME, build_directory=DIR, ", True),
    (BUILD_SETTINGS, "name=NAME, ", True),  # DIR made but no build directory
    (BUILD_SETTINGS + 'os.makedirs("/tmp/out", exist_ok=True)\n', "name=NAME, build_directory=DIR, ", True),
    ('import os\nDIR = os.path.join(os.getcwd(), "build")\n', "build_directory=DIR, ", True),
    (BUILD_SETTINGS + "LISTED = os.listdir(DIR)\n", "name=NAME, build_directory=DIR, ", True),
])
def test_os_for_build_settings_only_is_a_note(settings, build, blocking):
    from agentcore.types import Task
    from rewards.inline.prepare import check_source

    source = (INLINE_FIXTURES / "relu_honest.py").read_text()
    source = source.replace("import torch\n", f"import torch\n{settings}", 1)
    source = source.replace('    name="relu",\n', f"    {build}\n")
    if "PID" in settings:
        source = source.replace("return self.relu.relu_cuda(x)", "return self.relu.relu_cuda(x) if PID else x")
    for rules in RULES:
        verdict = check_source(source, Task(task_id="t", source=RELU_TASK), rules).verdict
        if blocking:
            assert verdict is not None and verdict.hack is HackCategory.SANDBOX_ESCAPE
            assert "import os" in verdict.message
        else:
            assert verdict is None, verdict.message


def test_torch_jit_queries_are_allowed_and_torch_jit_is_not():
    source = model_new(forward="if torch.jit.is_scripting() or torch.jit.is_tracing():\n    pass\nreturn cuda_extension.f(x)")
    assert check_model_new(source) == []
    scripted = model_new(init="self.g = torch.jit.script(F.relu)")
    assert HackCategory.TORCH_COMPUTE in {f.category for f in check_model_new(scripted) if f.blocking}


def test_autocast_turned_off_is_allowed_and_on_is_global_state():
    for off in ("torch.autocast('cuda', enabled=False)", "torch.cuda.amp.autocast(False)", "autocast(enabled=False)"):
        source = model_new(extra="from torch.cuda.amp import autocast", forward=f"with {off}:\n    return cuda_extension.f(x)")
        assert check_model_new(source) == [], off
    for on in ("torch.autocast('cuda')", "torch.cuda.amp.autocast(enabled=True)", "torch.cuda.amp.autocast(enabled=self.amp)",
               "autocast()"):
        source = model_new(extra="from torch.cuda.amp import autocast", forward=f"with {on}:\n    return cuda_extension.f(x)")
        assert HackCategory.GLOBAL_STATE in {f.category for f in check_model_new(source) if f.blocking}, on


def test_backend_flag_reads_are_allowed_and_writes_are_global_state():
    for read in ("torch.backends.cudnn.is_available()", "torch.backends.cudnn.enabled", "torch.backends.cudnn.version()",
                 "hasattr(torch.backends.cuda, 'matmul')", "torch.backends.cuda.matmul.allow_tf32", "torch.backends.cuda.is_built()"):
        source = model_new(init=f"self.flag = {read}", forward=f"if {read}:\n    pass\nreturn cuda_extension.f(x)")
        assert check_model_new(source) == [], read
    for write in ("torch.backends.cudnn.benchmark = True", "torch.backends.cuda.matmul.allow_tf32 |= True",
                  "setattr(torch.backends.cudnn, 'benchmark', True)", "torch.backends.cuda.enable_flash_sdp(False)",
                  "cudnn = torch.backends.cudnn\ncudnn.benchmark = True", "with torch.backends.cudnn.flags(enabled=False):\n    pass"):
        for place in ("init", "forward"):
            source = model_new(**{place: f"{write}\n" + ("return cuda_extension.f(x)" if place == "forward" else "pass")})
            assert HackCategory.GLOBAL_STATE in {f.category for f in check_model_new(source) if f.blocking}, (write, place)


NESTED = """
    def _post(self, x):
        class Post(nn.Module):
            def __init__(self, scale):
                super(Post, self).__init__()
                self.scale = scale
{init}
            def forward(self, x):
{forward}
        return Post(2)(x)
"""


def nested(init: str = "", forward: str = "return cuda_extension.f(x, self.scale)") -> str:
    """A module class defined in a method that forward calls (so built per call)."""
    body = NESTED.format(init="\n".join(" " * 16 + line for line in init.splitlines()),
                         forward="\n".join(" " * 16 + line for line in forward.splitlines()))
    return model_new(forward="return cuda_extension.g(self._post(x))") + body


def test_a_class_defined_in_a_method_builds_itself_in_its_own_init():
    # super().__init__() and the attributes it sets build a new instance: neither the reference
    # nor state kept across calls; its forward, which calls the kernel, is checked on its own.
    assert check_model_new(nested()) == []


def test_a_class_defined_in_a_method_is_still_checked():
    compute = nested(forward="return torch.relu(x) * self.scale")
    assert {"torch.relu", "tensor arithmetic (Mult)"} <= {f.torch_work for f in check_model_new(compute)}
    state = nested(forward="self.last = cuda_extension.f(x)\nreturn self.last")
    assert HackCategory.OUTPUT_CACHING in {f.category for f in check_model_new(state) if f.blocking}
    built_per_call = nested(init="self.y = torch.relu(torch.ones(3))")
    assert "torch.relu" in {f.torch_work for f in check_model_new(built_per_call)}
    reference = nested().replace("class Post(nn.Module)", "class Post(Model)")
    assert HackCategory.INHERITS_REFERENCE in {f.category for f in check_model_new(reference) if f.blocking}


def test_a_module_class_defined_in_init_is_a_local_module_with_a_per_call_forward():
    source = model_new(init="class Scale(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                       "        self.w = nn.Parameter(torch.ones(4))\n    def forward(self, x):\n"
                       "        return cuda_extension.f(x, self.w)\nself.scale = Scale()",
                       forward="return self.scale(x)")
    assert check_model_new(source) == []
    cheat = source.replace("return cuda_extension.f(x, self.w)", "return cuda_extension.f(x) * self.w")
    assert HackCategory.TORCH_COMPUTE in {f.category for f in check_model_new(cheat) if f.blocking}
    torch_base = model_new(init="class Proj(nn.Linear):\n    pass\nself.proj = Proj(4, 4)",
                           forward="return cuda_extension.f(self.proj(x))")
    assert "torch.nn.Linear" in {f.torch_work for f in check_model_new(torch_base)}


def test_stale_task_global_read_by_model_new_is_problem_shrinking():
    source = model_new(extra="features = 8", init="self.n = features")
    (finding,) = check_model_new(source, reference="features = 1024\n")
    assert finding.category is HackCategory.PROBLEM_SHRINKING and finding.blocking


SIZED_STATE_TASK = "class Model(nn.Module):\n    def __init__(self, n):\n        self.h = torch.zeros(batch_size, n)\n\nbatch_size = 256\n"


def test_stale_task_global_sizing_state_as_the_task_does_is_a_note():
    source = model_new(extra="batch_size = 8", init="self.h = torch.zeros(batch_size, n)")
    (finding,) = check_model_new(source, reference=SIZED_STATE_TASK)
    assert finding.category is HackCategory.PROBLEM_SHRINKING and not finding.blocking
    per_call = model_new(extra="batch_size = 8", init="self.h = torch.zeros(batch_size, n)",
                         forward="return cuda_extension.f(x[:batch_size])")
    assert HackCategory.PROBLEM_SHRINKING in {f.category for f in check_model_new(per_call, reference=SIZED_STATE_TASK) if f.blocking}


def test_task_globals_may_be_computed_from_constants():
    source = model_new(extra="height = width = 64\nsize = height * 2")
    assert check_model_new(source, reference="height = width = 64\nsize = 128\n") == []


def test_build_guard_with_a_kernel_call_is_a_fallback():
    source = "try:\n    import cuda_extension\n    cuda_extension.warmup()\nexcept Exception:\n    pass\n"
    assert HackCategory.FALLBACK_PATH in {f.category for f in check_model_new(model_new(extra=source))}


def test_type_with_an_argument_is_a_cast():
    findings = check_model_new(model_new(forward="return cuda_extension.f(x.type(torch.float64))"))
    assert [f.torch_work for f in findings] == [".type()"]


def test_used_denied_header_stays_blocking_when_used_in_another_file():
    files = {
        "kernels/k.cu": '#include <curand_kernel.h>\nextern "C" void f() {}\n',
        "kernels/k_binding.cpp": BINDING_HEAD + "void g() { curandState s; }\n",
    }
    findings = check_sources({"model_new.py": model_new(), **files})
    (finding,) = [f for f in findings if f.category is HackCategory.FORBIDDEN_IMPORT]
    assert finding.blocking and "curand" in finding.message


def test_a_method_init_stores_for_later_runs_per_call():
    source = model_new(
        init="self.w = nn.Parameter(torch.ones(4))\nself.fast = self._fast",
        forward="return cuda_extension.f(self.fast(x))",
    ) + "\n    def _fast(self, x):\n        return x * self.w\n"
    assert HackCategory.TORCH_COMPUTE in {f.category for f in check_model_new(source) if f.blocking}


def test_a_lambda_made_in_init_runs_per_call():
    source = model_new(init="self.act = lambda v: F.relu(v)", forward="return self.act(cuda_extension.f(x))")
    assert HackCategory.TORCH_COMPUTE in {f.category for f in check_model_new(source) if f.blocking}


def test_a_builder_nested_in_init_is_init_context():
    init = (
        "def block(c):\n    return nn.Sequential(nn.Conv2d(c, c, 3), nn.BatchNorm2d(c))\n"
        "self.body = block(n)\nnn.init.zeros_(self.body[0].weight)"
    )
    source = model_new(init=init, forward="return cuda_extension.f(x, self.body[0].weight)")
    assert check_model_new(source) == []


def test_an_extension_bound_inside_try_is_the_extension():
    extra = "try:\n    ext = cuda_extension\nexcept Exception as exc:\n    raise RuntimeError(exc)\n"
    source = model_new(extra=extra, forward="return ext.f(x)")
    assert check_model_new(source) == []


# --- cuda-agent eval --static-only ----------------------------------------------------------------

INLINE_FIXTURES = FIXTURES / "inline"
RELU_TASK = (FIXTURES / "cheats_dynamic" / "echo_input" / "model.py").read_text()


def test_lint_of_a_single_file_solution_names_its_rules(tmp_path):
    from rewards.static.lint import lint

    verdict = lint(INLINE_FIXTURES / "relu_honest.py", reference=RELU_TASK, rules="kernelbench")
    assert verdict.ok and verdict.rules == "kernelbench"
    cheat = lint(INLINE_FIXTURES / "relu_torch_in_wrapper.py", reference=RELU_TASK, rules="paper")
    assert cheat.hack is HackCategory.TORCH_COMPUTE


def test_lint_of_a_folder_finds_each_task_by_its_kernelbench_path(tmp_path):
    from rewards.static.lint import Problems, line, lint_tree

    (tmp_path / "set" / "level1").mkdir(parents=True)
    (tmp_path / "set" / "level1" / "19_ReLU.py").write_text((INLINE_FIXTURES / "relu_honest.py").read_text())
    (tmp_path / "set" / "level1" / "20_Other.py").write_text("import torch\n")
    problems = Problems([Problems.row(1, 19, RELU_TASK)])
    lines = [line(p, v) for p, v in lint_tree(tmp_path / "set", problems, rules="paper")]
    assert [ln.split("\t")[1:3] for ln in lines] == [["ok", "paper"], ["layout", "paper"]]


def test_static_only_command_lints_a_folder_without_a_gpu(tmp_path, capsys):
    from rewards.eval_cmd import main

    (tmp_path / "level1").mkdir()
    for name in ("relu_honest.py", "relu_torch_in_wrapper.py"):
        (tmp_path / "level1" / f"19_{name}").write_text((INLINE_FIXTURES / name).read_text())
    task = tmp_path / "model.py"
    task.write_text(RELU_TASK)
    code = main(["--static-only", "--solution", str(tmp_path / "level1"), "--task", str(task), "--rules", "kernelbench"])
    out = capsys.readouterr()
    statuses = [ln.split("\t")[1] for ln in out.out.splitlines()]
    assert code == 0 and statuses == ["ok", "partial"] and "2 solutions under kernelbench rules" in out.err



def test_static_only_takes_tasks_from_kernelbench_problems_and_says_when_it_has_none(tmp_path, capsys, monkeypatch):
    import orjson

    from rewards.eval_cmd import main

    (tmp_path / "level1").mkdir()
    (tmp_path / "level1" / "19_ReLU.py").write_text((INLINE_FIXTURES / "relu_honest.py").read_text())
    monkeypatch.delenv("KERNELBENCH_PROBLEMS", raising=False)
    assert main(["--static-only", "--solution", str(tmp_path / "level1")]) == 0
    assert "no task given" in capsys.readouterr().err
    problems = tmp_path / "problems.jsonl"
    problems.write_bytes(orjson.dumps({"level": 1, "problem_id": 19, "name": "19_ReLU", "code": RELU_TASK}) + b"\n")
    monkeypatch.setenv("KERNELBENCH_PROBLEMS", str(problems))
    assert main(["--static-only", "--solution", str(tmp_path / "level1")]) == 0
    assert "no task given" not in capsys.readouterr().err

STATEFUL_TASK = """
class Model(nn.Module):
    def forward(self, x):
        self.hidden = torch.tanh(self.i2h(torch.cat((x, self.hidden), dim=1)))
        return self.h2o(self.hidden)
"""


def test_state_the_task_itself_keeps_across_calls_is_allowed():
    source = model_new(forward="self.hidden = cuda_extension.rnn_step(x, self.hidden)\nreturn cuda_extension.f(self.hidden)")
    assert check_model_new(source, reference=STATEFUL_TASK) == []
    cheat = model_new(forward="self.hidden = cuda_extension.rnn_step(x, self.hidden)\nself.out = self.hidden\nreturn self.out")
    assert HackCategory.OUTPUT_CACHING in {f.category for f in check_model_new(cheat, reference=STATEFUL_TASK)}


def test_adding_into_a_rebound_input_name_is_not_input_mutation():
    source = model_new(forward="identity = x\nx = cuda_extension.f(x)\nx += identity\nreturn x")
    assert {f.category for f in check_model_new(source)} == {HackCategory.TORCH_COMPUTE}
    cheat = model_new(forward="x += 1\nx = cuda_extension.f(x)\nreturn x")
    assert HackCategory.INPUT_MUTATION in {f.category for f in check_model_new(cheat)}


@pytest.mark.parametrize("workspace", STATIC_CHEATS, ids=ids(STATIC_CHEATS))
def test_kernelbench_rules_relax_only_torch_doing_part_of_the_work(workspace):
    # Under kernelbench rules a static cheat is still rejected unless every blocking finding is
    # torch doing work; those are left to the GPU audit's decoy checks (rewards.verify.judge).
    findings = findings_of(workspace)
    if hack_verdict(findings, "kernelbench") is None:
        assert all(f.torch_work for f in findings if f.blocking)
