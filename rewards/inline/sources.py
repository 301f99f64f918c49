"""The compile-pool units of a single-file solution: what load_inline would have compiled.

What it is: step 3 of `rewards.inline.prepare`. `write_sources(dir, spec, model_new)` writes the
rewritten model_new.py and, for each module, a .cu (`cuda_file`: the cuda sources behind
load_inline's implicit includes, `#line`-mapped to "cuda_sources", `-D` flags as `#define`s) and a
binding .cpp (`binding_file`: `<torch/extension.h>`, the cpp sources and, as load_inline
generates, a pybind11 module with `torch::wrap_pybind_function` for each of `functions`), and
returns the `Unit`s that tell the compile pool how to build them (`cuda_torch`: nvcc with torch's
headers and cpp_extension's nvcc flags; extra_*flags are not passed on). Sources that dispatch on
the deprecated `x.type()` get back the overload torch dropped in 2.6 (`TYPE_DISPATCH_COMPAT`).
One module is `cuda_extension` itself (kernels/inline.cu, kernels/inline_binding.cpp). Several are
submodules of it: module i's files are kernels/inline_<i>.cu and kernels/inline_<i>_binding.cpp,
its pybind11 definitions become a function `cuda_agent_inline_<i>(module_&)` (a PYBIND11_MODULE of
its own sources included, by redefining the macro), and kernels/inline_module.cpp defines
`cuda_extension` with one `def_submodule` per module. The modules share one link: two that define
the same external symbol fail it, where load_inline's separate libraries would not.
What it is not: the build itself (`rewards.build.compile_pool`) or the static checks on these
sources (`rewards.inline.checks`).
"""

from __future__ import annotations

from pathlib import Path

from rewards.build.plan import Unit
from rewards.inline.extract import InlineModule, InlineSpec

CUDA_FILE, BINDING_FILE, MODULE_FILE = "kernels/inline.cu", "kernels/inline_binding.cpp", "kernels/inline_module.cpp"
# AT_DISPATCH_*(x.type(), ...): torch before 2.6 took the deprecated type object with a warning
# (at::detail::scalar_type's overload for it); published solutions were written against that.
# A template, so that a torch that still has the overload prefers its own.
TYPE_DISPATCH_COMPAT = (
    "namespace detail {\n"
    "template <typename T, typename = decltype(std::declval<const T&>().scalarType())>\n"
    "inline c10::ScalarType scalar_type(const T& t) { return t.scalarType(); }\n"
    "}  // namespace detail\n"
)
CUDA_PRELUDE = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"  # as load_inline
REGISTER = "cuda_agent_inline_{}"


def unit_paths(spec: InlineSpec, index: int) -> tuple[str, str]:
    """The .cu and binding .cpp of module `index`."""
    if len(spec.modules) == 1:
        return CUDA_FILE, BINDING_FILE
    return f"kernels/inline_{index}.cu", f"kernels/inline_{index}_binding.cpp"


def _label(module: InlineModule, what: str) -> str:
    return f"{module.attr}/{what}" if module.attr else what


def _own_module(index: int) -> str:
    """A PYBIND11_MODULE in the sources becomes module `index`'s registration function."""
    register = REGISTER.format(index)
    return ("#undef PYBIND11_MODULE\n"
            f"#define PYBIND11_MODULE(name, variable, ...) void {register}(::pybind11::module_ &variable)\n")


def _defines(module: InlineModule) -> str:
    return "".join(f"#define {name} {value}\n" for name, value in module.defines)


def _compat(source: str) -> str:
    return TYPE_DISPATCH_COMPAT if ".type()" in source else ""


def cuda_file(module: InlineModule, index: int = 0) -> str:
    prelude = CUDA_PRELUDE + _compat(module.cuda_sources)
    if module.attr and not module.functions and "PYBIND11_MODULE" in module.cuda_sources:
        prelude = "#include <torch/extension.h>\n" + prelude + _own_module(index)
    return f'{prelude}{_defines(module)}#line 1 "{_label(module, "cuda_sources")}"\n{module.cuda_sources}\n'


def binding_file(module: InlineModule, index: int = 0) -> str:
    """load_inline's main.cpp: the cpp sources, then the pybind11 definitions of `functions`."""
    head = "#include <torch/extension.h>\n" + _compat(module.cpp_sources)
    head += _own_module(index) if module.attr and not module.functions else ""
    text = f'{head}{_defines(module)}#line 1 "{_label(module, "cpp_sources")}"\n{module.cpp_sources}\n'
    if not module.functions:
        return text
    defs = "".join(f'    m.def("{f}", torch::wrap_pybind_function({f}), "{f}");\n' for f in module.functions)
    opening = f"void {REGISTER.format(index)}(pybind11::module_ &m)" if module.attr else \
        "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)"
    return f'{text}#line 1 "load_inline module"\n{opening} {{\n{defs}}}\n'


def module_file(spec: InlineSpec) -> str:
    """`cuda_extension` with one submodule per load_inline module (several modules only)."""
    declare = "".join(f"void {REGISTER.format(i)}(pybind11::module_ &);\n" for i in range(len(spec.modules)))
    subs = "".join(f'    auto m{i} = m.def_submodule("{module.attr}");\n    {REGISTER.format(i)}(m{i});\n'
                   for i, module in enumerate(spec.modules))
    return f"#include <torch/extension.h>\n{declare}PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{subs}}}\n"


def write_sources(workspace: Path, spec: InlineSpec, model_new: str) -> tuple[Unit, ...]:
    """The rewritten model_new.py and the units, into `workspace` (a trusted snapshot); the
    units to build, in order."""
    (workspace / "kernels").mkdir(exist_ok=True)
    (workspace / "model_new.py").write_text(model_new)
    units = []
    for i, module in enumerate(spec.modules):
        cuda, binding = unit_paths(spec, i)
        if module.cuda_sources:
            (workspace / cuda).write_text(cuda_file(module, i))
            units.append(Unit(kind="cuda_torch", path=cuda))
        (workspace / binding).write_text(binding_file(module, i))
        units.append(Unit(kind="cxx", path=binding))
    if len(spec.modules) > 1:
        (workspace / MODULE_FILE).write_text(module_file(spec))
        units.append(Unit(kind="cxx", path=MODULE_FILE))
    return tuple(units)
