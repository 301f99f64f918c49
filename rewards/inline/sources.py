"""The compile-pool units of a single-file solution: what load_inline would have compiled.

What it is: step 3 of `rewards.inline.prepare`. `write_sources(dir, spec, model_new)` writes the rewritten
model_new.py, kernels/inline.cu (`cuda_file`: the cuda sources behind load_inline's implicit
includes, `#line`-mapped to "cuda_sources", `-D` flags as `#define`s) and
kernels/inline_binding.cpp (`binding_file`: `<torch/extension.h>`, the cpp sources and the
pybind11 module `cuda_extension` with `torch::wrap_pybind_function` for each of `functions`, as
load_inline generates). `UNITS` tells the compile pool how to build them (`cuda_torch`: nvcc with
torch's headers and cpp_extension's nvcc flags; extra_*flags are not passed on).
What it is not: the build itself (`rewards.build.compile_pool`) or the static checks on these sources
(`rewards.inline.checks`). `rewards.inline.prepare` re-exports `binding_file`, `cuda_file`, `write_sources`.
"""

from __future__ import annotations

from pathlib import Path

from rewards.build.plan import Unit
from rewards.inline.extract import InlineSpec

CUDA_FILE, BINDING_FILE = "kernels/inline.cu", "kernels/inline_binding.cpp"
UNITS = (Unit(kind="cuda_torch", path=CUDA_FILE), Unit(kind="cxx", path=BINDING_FILE))
CUDA_PRELUDE = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"  # as load_inline


def cuda_file(spec: InlineSpec) -> str:
    defines = "".join(f"#define {name} {value}\n" for name, value in spec.defines)
    return f'{CUDA_PRELUDE}{defines}#line 1 "cuda_sources"\n{spec.cuda_sources}\n'


def binding_file(spec: InlineSpec) -> str:
    """load_inline's main.cpp: the cpp sources, then the pybind11 module of `functions`."""
    defs = "".join(f'    m.def("{f}", torch::wrap_pybind_function({f}), "{f}");\n' for f in spec.functions)
    return (f'#include <torch/extension.h>\n#line 1 "cpp_sources"\n{spec.cpp_sources}\n'
            f'#line 1 "load_inline module"\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{defs}}}\n')


def write_sources(workspace: Path, spec: InlineSpec, model_new: str) -> None:
    """The rewritten model_new.py and the two units, into `workspace` (a trusted snapshot)."""
    (workspace / "kernels").mkdir(exist_ok=True)
    (workspace / "model_new.py").write_text(model_new)
    (workspace / CUDA_FILE).write_text(cuda_file(spec) if spec.cuda_sources else "")
    (workspace / BINDING_FILE).write_text(binding_file(spec))
