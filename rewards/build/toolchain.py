"""Where the compilers, torch's headers and libraries live, and which GPU we build for.

What: `discover_toolchain()` finds nvcc and the host C++ compiler (paths and versions), the CUDA
include and library dirs (asked of nvcc itself, since `nvcc` on PATH may be a wrapper script),
torch's include and library dirs, the Python include dir, pybind11 (the copy bundled in torch's
includes), the linker, and the target arch, and returns them as one frozen `Toolchain`. Its
`fingerprint` (compiler versions, torch version, arch, defines, libraries) goes into every
cache key of `rewards.build.compile_pool`.
What not: it builds nothing and caches nothing on disk.
How used: once per process at start-up; it imports torch and runs each compiler once (~1-2 s).

    toolchain = discover_toolchain()               # arch: override > $CUDA_AGENT_ARCH > GPU > sm_90
    toolchain = discover_toolchain(arch="sm_90a")  # wgmma/TMA kernels need the `a` target
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import msgspec
from msgspec import Struct, json

ARCH_ENV = "CUDA_AGENT_ARCH"
DEFAULT_ARCH = "sm_90"  # H100 and H200 (REFERENCE.md: the GPU pool)
_ARCH_RE = re.compile(r"^sm_(\d{2,3})([af]?)$")

# torch's own CUDA pieces: present in a CUDA wheel, absent from a CPU one.
_TORCH_CUDA_LIBS = ("c10_cuda", "torch_cuda")
_TORCH_LIBS = ("c10", "torch", "torch_cpu", "torch_python")


class ToolchainError(RuntimeError):
    """The build machine lacks a compiler, torch or CUDA: broken infrastructure, not a model failure."""


class Toolchain(Struct, frozen=True, kw_only=True):
    """Everything a build depends on outside the workspace."""

    nvcc: str
    nvcc_version: str
    cxx: str
    cxx_version: str
    linker: str
    """`gold` when installed (links against libtorch ~3x faster than ld.bfd), else ``."""
    arch: str
    """SASS target, e.g. `sm_90`."""
    cuda_include_dir: str
    cuda_lib_dir: str
    torch_version: str
    torch_include_dirs: tuple[str, ...]
    torch_lib_dir: str
    torch_libs: tuple[str, ...]
    """Libraries a binding links against, e.g. (`c10`, `torch`, `torch_cpu`, `torch_python`)."""
    torch_has_cuda: bool
    """True for a CUDA wheel of torch: c10/cuda headers and libc10_cuda are there."""
    python_include_dir: str
    pybind11_include_dir: str
    ext_suffix: str
    """`.cpython-311-x86_64-linux-gnu.so`: the module file is `cuda_extension` + this."""
    defines: tuple[str, ...]
    """-D flags every binding unit (and the precompiled header) is built with."""
    fingerprint: str = ""

    @property
    def compute_arch(self) -> str:
        """`compute_90` for `sm_90`: the virtual arch nvcc lowers through."""
        return "compute_" + self.arch.removeprefix("sm_")

    @property
    def cxx_include_dirs(self) -> tuple[str, ...]:
        return (*self.torch_include_dirs, self.python_include_dir, self.cuda_include_dir)


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=_c_locale(), check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"cannot run {argv[0]}: {exc}") from exc
    return done.stdout + done.stderr


def _c_locale() -> dict[str, str]:
    return {**os.environ, "LC_ALL": "C"}


def _which(name: str, override: str | None) -> str:
    found = shutil.which(override or name)
    if found is None:
        raise ToolchainError(f"{override or name} not found on PATH")
    return found


def _nvcc_version(nvcc: str) -> str:
    match = re.search(r"release [\d.]+, V([\d.]+)", _run([nvcc, "--version"]))
    if match is None:
        # A stand-in compiler (tests) still gets a stable, distinct fingerprint.
        return "unknown-" + hashlib.sha256(_run([nvcc, "--version"]).encode()).hexdigest()[:12]
    return match.group(1)


def _cuda_dirs(nvcc: str) -> tuple[str, str]:
    """nvcc's own include and library dirs, from its dry run (works through wrapper scripts)."""
    text = _run([nvcc, "--dryrun", "-x", "cu", "-E", os.devnull])
    includes = re.search(r'INCLUDES="-I([^"]+)"', text)
    libraries = [p for p in re.findall(r'"-L([^"]+)"', text) if not p.rstrip("/").endswith("stubs")]
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    include_dir = includes.group(1) if includes else os.path.join(home, "include")
    lib_dir = libraries[0] if libraries else os.path.join(home, "lib64")
    return os.path.realpath(include_dir), os.path.realpath(lib_dir)


def resolve_arch(override: str | None = None) -> str:
    """Explicit override, then $CUDA_AGENT_ARCH, then the visible GPU, then sm_90.

    An override wins over the GPU so one can build for another machine; the compile machines
    have no GPU, so there the env var or the default decides.
    """
    arch = override or os.environ.get(ARCH_ENV) or _gpu_arch() or DEFAULT_ARCH
    if not _ARCH_RE.match(arch):
        raise ToolchainError(f"arch {arch!r} is not of the form sm_90, sm_90a, sm_100f")
    return arch


def _gpu_arch() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return f"sm_{major}{minor}"


def _torch_facts() -> dict:
    import torch

    root = Path(torch.__file__).parent
    include = root / "include"
    lib = root / "lib"
    has_cuda = (include / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").exists() and all(
        (lib / f"lib{name}.so").exists() for name in _TORCH_CUDA_LIBS
    )
    libs = _TORCH_LIBS + (_TORCH_CUDA_LIBS if has_cuda else ())
    abi = int(torch.compiled_with_cxx11_abi())
    return {
        "torch_version": f"{torch.__version__}+{torch.version.git_version[:12]}",
        "torch_include_dirs": (str(include), str(include / "torch" / "csrc" / "api" / "include")),
        "torch_lib_dir": str(lib),
        "torch_libs": libs,
        "torch_has_cuda": has_cuda,
        "pybind11_include_dir": str(include),
        "defines": (
            "-DTORCH_EXTENSION_NAME=cuda_extension",
            "-DTORCH_API_INCLUDE_EXTENSION_H",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        ),
    }


def _fingerprint(toolchain: Toolchain) -> str:
    fields = {k: v for k, v in json.decode(json.encode(toolchain)).items() if k != "fingerprint"}
    blob = json.encode(dict(sorted(fields.items())))
    return f"{toolchain.arch}-{hashlib.sha256(blob).hexdigest()[:16]}"


@functools.cache
def discover_toolchain(
    *, nvcc: str | None = None, cxx: str | None = None, arch: str | None = None
) -> Toolchain:
    """Find everything a build needs; raises `ToolchainError` when something is missing."""
    nvcc_path = _which("nvcc", nvcc)
    cxx_path = _which("g++", cxx)
    cxx_version = _run([cxx_path, "-dumpfullversion"]).strip()
    include_dir, lib_dir = _cuda_dirs(nvcc_path)
    toolchain = Toolchain(
        nvcc=nvcc_path,
        nvcc_version=_nvcc_version(nvcc_path),
        cxx=cxx_path,
        cxx_version=cxx_version,
        linker="gold" if shutil.which("ld.gold") else "",
        arch=resolve_arch(arch),
        cuda_include_dir=include_dir,
        cuda_lib_dir=lib_dir,
        python_include_dir=sysconfig.get_path("include", scheme="posix_prefix"),
        ext_suffix=sysconfig.get_config_var("EXT_SUFFIX") or ".so",
        **_torch_facts(),
    )
    return _with_fingerprint(toolchain)


def _with_fingerprint(toolchain: Toolchain) -> Toolchain:
    return msgspec.structs.replace(toolchain, fingerprint=_fingerprint(toolchain))
