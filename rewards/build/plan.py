"""Static checks of a workspace before anything compiles, and the list of units to build.

What: `plan_build(workspace)` reads `kernels/<name>.cu`, `kernels/<name>_binding.cpp` and the
fixed `binding.cpp`, checks the layout rules of the paper's workspace (agentcore/assets/SKILL.md)
and returns the translation units, each with the local headers it includes (they go into its
cache key), or the problems found: one line each, naming file and line, saying what to do.
What not: no compiler runs here. A check is a text scan with comments stripped, not a parse;
the compiler has the last word on everything else.
How used: by `rewards.build.compile_pool.CompilePool.build`, first thing, in a worker thread.

    plan = plan_build(Path("ws"))
    if plan.problems: ...  # report them to the agent, compile nothing
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from msgspec import Struct

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "agentcore" / "assets" / "template"
FIXED_FILES = ("binding.cpp", "binding_registry.h")
MAX_SOURCE_BYTES = 1 << 20

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]*)[>"]', re.MULTILINE)
_COMPUTED_INCLUDE_RE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[A-Za-z_]", re.MULTILINE)
_BLOCK_COMMENT_RE = re.compile(r"/\*.*?\*/", re.DOTALL)
_LINE_COMMENT_RE = re.compile(r"//[^\n]*")

# A .cu is pure CUDA (the paper's rule; nvcc of a .cu with torch/extension.h takes ~60 s).
_CUDA_FORBIDDEN = ("torch/", "ATen/", "c10/", "caffe2/", "pybind11/", "Python.h")
# Bindings use the light headers that the precompiled header holds; these pull in all of torch.
_BINDING_FORBIDDEN = ("torch/extension.h", "torch/torch.h", "torch/all.h")


class Unit(Struct, frozen=True, kw_only=True):
    """One translation unit: paths relative to the workspace."""

    kind: Literal["cuda", "cxx", "cuda_torch"]
    """cuda_torch: a .cu with torch headers, only from `rewards.inline.prepare` (load_inline solutions)."""
    path: str
    headers: tuple[str, ...] = ()
    """Local headers it includes, transitively, sorted."""


class BuildPlan(Struct, frozen=True, kw_only=True):
    units: tuple[Unit, ...] = ()
    problems: tuple[str, ...] = ()


def plan_build(workspace: Path) -> BuildPlan:
    """The units to compile, or every problem found (then no unit)."""
    root = workspace.resolve()
    problems = _check_fixed_files(root)
    kernels = root / "kernels"
    names, layout_problems = _kernel_names(kernels)
    problems += layout_problems
    units = [Unit(kind="cxx", path="binding.cpp")] if not problems else []
    for name in names:
        for kind, rel in (("cuda", f"kernels/{name}.cu"), ("cxx", f"kernels/{name}_binding.cpp")):
            headers, unit_problems = _scan_unit(root, rel, kind)
            problems += unit_problems
            units.append(Unit(kind=kind, path=rel, headers=headers))
    if problems:
        return BuildPlan(problems=tuple(problems))
    return BuildPlan(units=tuple(units))


def _check_fixed_files(root: Path) -> list[str]:
    problems = []
    for name in FIXED_FILES:
        path = root / name
        if not path.is_file():
            problems.append(f"{name} is missing from the workspace root: it is a fixed file, restore it")
        elif (TEMPLATE_DIR / name).is_file() and path.read_bytes() != (TEMPLATE_DIR / name).read_bytes():
            problems.append(f"{name} was modified: it is a fixed, protected file, restore it")
    return problems


def _kernel_names(kernels: Path) -> tuple[list[str], list[str]]:
    if not kernels.is_dir():
        return [], ["no kernels/ directory: write kernels/<name>.cu and kernels/<name>_binding.cpp"]
    files = sorted(p.name for p in kernels.iterdir() if p.is_file())
    cu = {f[: -len(".cu")] for f in files if f.endswith(".cu")}
    bindings = {f[: -len("_binding.cpp")] for f in files if f.endswith("_binding.cpp")}
    problems = [_stray(f) for f in files if _is_stray_source(f)]
    problems += [f"kernels/{n}.cu: kernel names must be C identifiers" for n in cu if not _NAME_RE.match(n)]
    problems += [
        f"kernels/{n}.cu has no kernels/{n}_binding.cpp (it wraps the launcher and calls REGISTER_BINDING)"
        for n in sorted(cu - bindings)
    ]
    problems += [f"kernels/{n}_binding.cpp has no kernels/{n}.cu" for n in sorted(bindings - cu)]
    if not cu and not problems:
        problems.append("no kernels/*.cu to build")
    return sorted(cu & bindings), problems


def _is_stray_source(name: str) -> bool:
    source = name.endswith((".cpp", ".cc", ".cxx", ".c"))
    return source and not name.endswith("_binding.cpp")


def _stray(name: str) -> str:
    return (
        f"kernels/{name} is not built: kernel code goes in kernels/<name>.cu, tensor glue in "
        "kernels/<name>_binding.cpp (headers .h/.cuh are fine)"
    )


def _scan_unit(root: Path, rel: str, kind: str) -> tuple[tuple[str, ...], list[str]]:
    """Walk the unit's local includes; check each file's includes against the rules."""
    problems: list[str] = []
    seen: set[str] = set()
    stack = [rel]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        text, problem = _read_source(root, current)
        if problem:
            problems.append(problem)
            continue
        for lineno, quote, target in _includes(text, current, problems):
            problem = _forbidden(rel, current, lineno, target, kind)
            if problem:
                problems.append(problem)
            local, problem = _resolve_local(root, current, lineno, quote, target)
            if problem:
                problems.append(problem)
            elif local:
                stack.append(local)
    if kind == "cxx" and rel != "binding.cpp" and not problems:
        problems += _check_registration(root, rel)
    return tuple(sorted(seen - {rel})), problems


def _read_source(root: Path, rel: str) -> tuple[str, str | None]:
    path = root / rel
    if not path.resolve().is_relative_to(root):
        return "", f"{rel} points outside the workspace"
    if path.stat().st_size > MAX_SOURCE_BYTES:
        return "", f"{rel} is larger than {MAX_SOURCE_BYTES >> 10} KiB"
    return path.read_bytes().decode("utf-8", errors="replace"), None


def strip_comments(text: str) -> str:
    """Blank out comments, keeping line numbers."""
    text = _BLOCK_COMMENT_RE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return _LINE_COMMENT_RE.sub("", text)


def _includes(text: str, current: str, problems: list[str]) -> list[tuple[int, str, str]]:
    text = strip_comments(text)
    for match in _COMPUTED_INCLUDE_RE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        problems.append(f"{current}:{line}: #include of a macro is not supported: name the header")
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2).strip())
        for m in _INCLUDE_RE.finditer(text)
    ]


def _forbidden(unit: str, current: str, lineno: int, target: str, kind: str) -> str | None:
    where = f"{current}:{lineno}"
    if kind == "cuda" and target.startswith(_CUDA_FORBIDDEN):
        glue = unit[: -len(".cu")] + "_binding.cpp"
        return (
            f"{where}: includes <{target}>: a .cu file is pure CUDA (<cuda_runtime.h>, CUDA and "
            f"standard headers only), with extern \"C\" launchers; tensor code goes in {glue}"
        )
    if kind == "cxx" and target in _BINDING_FORBIDDEN:
        return (
            f"{where}: includes <{target}>, which pulls in all of torch (~20 s more per build): "
            "include <torch/types.h> and <torch/csrc/utils/pybind.h> instead"
        )
    return None


def _resolve_local(
    root: Path, current: str, lineno: int, quote: str, target: str
) -> tuple[str | None, str | None]:
    """The workspace file an include names (as the compiler searches: quotes look next to the
    including file first, then the workspace root, which is on the include path)."""
    if target.startswith("/"):
        return None, f'{current}:{lineno}: #include "{target}": absolute paths are not allowed'
    bases = [(root / current).parent, root] if quote == '"' else [root]
    for base in bases:
        candidate = base / target
        if candidate.is_file():
            resolved = candidate.resolve()
            if not resolved.is_relative_to(root):
                return None, f"{current}:{lineno}: #include {target}: outside the workspace"
            return resolved.relative_to(root).as_posix(), None
    return None, None  # a system header, or missing: the compiler will say which


def _check_registration(root: Path, rel: str) -> list[str]:
    text = strip_comments((root / rel).read_text(errors="replace"))
    if "REGISTER_BINDING" not in text:
        name = Path(rel).name[: -len("_binding.cpp")]
        return [f"{rel} never calls REGISTER_BINDING({name}, register_{name}): nothing would be exposed"]
    return []
