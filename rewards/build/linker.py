"""The link step's flags and its check for unresolved symbols.

What: `link_flags(toolchain)` links a workspace's objects into one Python extension module
against torch (c10, torch, torch_cpu, torch_python, and torch's CUDA libraries when the wheel
has them) and cudart, with rpaths. It also asks the linker to list every unresolved symbol
(`-z defs` turned into warnings): `unresolved_symbols` keeps the ones nothing will provide at
import, which are a binding declaring a launcher that no kernel defines.
What not: it runs nothing; `rewards.build.compile_pool` runs the linker.
How used:
    argv = [toolchain.cxx, *objects, "-o", out, *link_flags(toolchain)]
    missing = unresolved_symbols(output, toolchain)
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

from rewards.build.compiler_log import undefined_symbols
from rewards.build.toolchain import Toolchain

# The two vendor libraries the paper allows (cuBLAS for GEMM, cuDNN for convolutions): linked
# only when a kernel includes their header. Whether a call is a GEMM/convolution is for the
# static checks and the GPU audit to decide.
VENDOR_LIBRARIES = {"cublas_v2.h": ("cublas", "cublasLt"), "cublasLt.h": ("cublasLt",), "cudnn.h": ("cudnn",)}
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


@functools.cache
def vendor_dirs(kind: str) -> tuple[str, ...]:
    """Directories of the NVIDIA wheels torch depends on that hold cuDNN or cuBLAS (`kind`
    "lib": their .so files; "include": a directory with cudnn.h, which ships only there).
    Other headers of those wheels are left out so they never shadow the toolkit's."""
    marker = "cudnn.h" if kind == "include" else "lib*.so*"
    found: list[str] = []
    for base in map(Path, sys.path):
        for d in sorted(base.glob(f"nvidia/*/{kind}")):
            hits = list(d.glob(marker))
            if kind == "lib":
                hits = [h for h in hits if h.name.startswith(("libcudnn", "libcublas"))]
            if hits and str(d) not in found:
                found.append(str(d))
    return tuple(found)


def vendor_libraries(sources: list[str]) -> tuple[str, ...]:
    """The vendor libraries the given .cu sources include, in a stable order."""
    wanted: list[str] = []
    for text in sources:
        for header in _INCLUDE.findall(text):
            for lib in VENDOR_LIBRARIES.get(header.rsplit("/", 1)[-1], ()):
                if lib not in wanted:
                    wanted.append(lib)
    return tuple(sorted(wanted))


def link_flags(toolchain: Toolchain, vendor: tuple[str, ...] = ()) -> list[str]:
    tc = toolchain
    flags = ["-shared"] + ([f"-fuse-ld={tc.linker}"] if tc.linker else [])
    flags += [f"-L{tc.torch_lib_dir}", *(f"-l{lib}" for lib in tc.torch_libs)]
    flags += [f"-L{tc.cuda_lib_dir}", "-lcudart"]
    flags += [f"-Wl,-rpath,{tc.torch_lib_dir}", f"-Wl,-rpath,{tc.cuda_lib_dir}"]
    if vendor:
        dirs = vendor_dirs("lib")
        flags += [f"-L{d}" for d in dirs] + [f"-l{lib}" for lib in vendor]
        flags += [f"-Wl,-rpath,{d}" for d in dirs]
    # A shared library may leave symbols undefined; list them so a launcher name typo is a
    # build error here rather than an ImportError on the GPU machine.
    return flags + ["-Wl,-z,defs", "-Wl,--warn-unresolved-symbols"]


def unresolved_symbols(output: str, toolchain: Toolchain) -> list[str]:
    """Undefined symbols except Python's (the interpreter provides them) and, with a CPU wheel
    of torch, torch's CUDA ones (the GPU machine's torch provides them)."""
    symbols = [s for s in undefined_symbols(output) if not s.startswith(("Py", "_Py"))]
    if not toolchain.torch_has_cuda:
        symbols = [s for s in symbols if not s.startswith(("c10::cuda::", "at::cuda::"))]
    return symbols


def unresolved_message(symbols: list[str]) -> str:
    lines = [f"link error: undefined reference to '{s}'" for s in symbols[:10]]
    if len(symbols) > 10:
        lines.append(f"[{len(symbols) - 10} more undefined symbols]")
    lines.append(
        'a binding calls a function no kernel defines: declare exactly the extern "C" launcher '
        "that the .cu file defines (same name and parameters)"
    )
    return "\n".join(lines)
