"""Single-file KernelBench solutions (`load_inline`) turned into a build the trusted side owns.

What it is: published KernelBench solutions are one model_new.py that calls
`torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., cuda_sources=...,
functions=[...])` at import and defines ModelNew over the returned module. Running that file as
is would compile (and run the compiler on candidate text) inside the candidate child, outside
the compile pool and the static checks. Instead:

1. `extract(source)` reads the call's arguments from the AST without running anything: string
   constants, module-level names bound to them earlier in the file (`src = "..."`, `src += "..."`),
   `+` concatenations, lists/tuples of those (cpp_sources as a list), `functions` as a list,
   tuple, dict (its keys) or one string. Anything else (an f-string, a call, a name bound in a
   function, two load_inline calls, `is_python_module=False`, a stray use of `load_inline`) is
   `UnsupportedInline`, which becomes a COMPILE_ERROR verdict "unsupported load_inline form: ...".
2. `rewrite(source, spec)` replaces the call by the prebuilt module: `ext = load_inline(...)` at
   module level becomes `import cuda_extension as ext` (the static checks know import aliases),
   any other call site becomes the name `cuda_extension` with `import cuda_extension;` in front
   of the first top-level statement; imports of torch.utils.cpp_extension become `pass`. Line
   numbers are kept, so tracebacks point at the author's lines.
3. `write_sources(dir, spec)` writes what load_inline would compile: kernels/inline.cu (the cuda
   sources behind load_inline's implicit includes, `#line`-mapped to "cuda_sources") and
   kernels/inline_binding.cpp (`<torch/extension.h>`, the cpp sources, and the pybind11 module
   `cuda_extension` with `torch::wrap_pybind_function` for each of `functions`, as load_inline
   generates). The compile pool builds them (`kind="cuda_torch"`: nvcc with torch's headers and
   cpp_extension's nvcc flags); extra_*flags are not passed on (arch and flags are the pool's),
   `-DNAME[=value]` flags become `#define`s.
4. `static_findings(...)` runs the Python checks on the rewritten model_new.py and the C++ host
   rules (`rewards.static_cpp`; torch may only allocate and read metadata) on both source
   strings. The verification and profiling that follow are the same as for our layout: the
   candidate child only imports the prebuilt module; the dispatch audit and the profiler's kernel
   attribution see kernels/inline.cu.

What it is not: a general Python evaluator, and no support for several load_inline calls (one
module per solution, as `rewards.loader` loads one).

How it is used (by `rewards.evaluate.FinalEvaluator.prepare`):
    if is_inline_solution(snapshot):
        prepared = await prepare_inline(env, snapshot, task)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import anyio
from msgspec import Struct

from agentcore.types import Task
from rewards.build_checks import Unit
from rewards.static_cpp import check_kernels
from rewards.static_python import check_model_new
from rewards.verdict import Finding, Verdict, VerdictStatus, hack_verdict

CPP_EXTENSION = "torch.utils.cpp_extension"
LOAD_INLINE = f"{CPP_EXTENSION}.load_inline"
POSITIONAL = ("name", "cpp_sources", "cuda_sources")
CUDA_FILE, BINDING_FILE = "kernels/inline.cu", "kernels/inline_binding.cpp"
UNITS = (Unit(kind="cuda_torch", path=CUDA_FILE), Unit(kind="cxx", path=BINDING_FILE))
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEFINE = re.compile(r"^-D([A-Za-z_][A-Za-z0-9_]*)(?:=([A-Za-z0-9_.+-]*))?$")
_LOAD_INLINE_CALL = re.compile(r"\bload_inline\s*\(")


class UnsupportedInline(ValueError):
    """The load_inline call cannot be read statically; the message says which part."""


class InlineSpec(Struct, frozen=True, kw_only=True):
    """The statically read arguments of the one load_inline call of a model_new.py."""

    name: str
    cpp_sources: str
    cuda_sources: str
    functions: tuple[str, ...]
    defines: tuple[tuple[str, str], ...] = ()
    """`-DNAME[=value]` of extra_cflags / extra_cuda_cflags."""
    ignored_flags: tuple[str, ...] = ()
    """Other extra flags: not passed to the compilers (the pool owns arch and flags)."""
    call: tuple[int, int, int, int] = (0, 0, 0, 0)
    """The call's (lineno, col, end_lineno, end_col), ast's UTF-8 byte columns."""
    target: str = ""
    """NAME of a module-level `NAME = load_inline(...)`, else ''."""


# ---------------------------------------------------------------------------------------------
# Detection and extraction.


def is_inline_solution(workspace: Path) -> bool:
    """model_new.py mentions load_inline and kernels/ holds no file: the single-file form."""
    model_new = Path(workspace) / "model_new.py"
    kernels = Path(workspace) / "kernels"
    if not model_new.is_file() or (kernels.is_dir() and any(p.is_file() for p in kernels.rglob("*"))):
        return False
    return bool(_LOAD_INLINE_CALL.search(model_new.read_text(errors="replace")))


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted name, from every import in the file."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([aliases.get(node.id, node.id), *reversed(parts)])


def _load_inline_calls(tree: ast.Module, aliases: dict[str, str]) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _dotted(n.func, aliases) == LOAD_INLINE]


def _strings(node: ast.AST, names: dict[str, object], what: str) -> object:
    """The str, or list of str, that `node` statically denotes."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise UnsupportedInline(f"{what}: name {node.id!r} is not bound to a string constant at module level before the call")
        return names[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _strings(node.left, names, what), _strings(node.right, names, what)
        if type(left) is type(right):
            return left + right
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_strings(e, names, what) for e in node.elts]
        if all(isinstance(i, str) for i in items):
            return items
    raise UnsupportedInline(f"{what}: line {getattr(node, 'lineno', '?')}: not a string constant, "
                            "a module-level name bound to one, or a concatenation of those")


def _module_strings(tree: ast.Module, before_line: int) -> dict[str, object]:
    """Module-level names bound to statically known strings by statements before `before_line`;
    a name rebound to something unknown is dropped."""
    names: dict[str, object] = {}
    for stmt in tree.body:
        if stmt.lineno >= before_line:
            break
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            value = stmt.value
            if isinstance(stmt, ast.AugAssign):
                value = ast.BinOp(left=ast.Name(id=getattr(stmt.target, "id", ""), ctx=ast.Load()), op=stmt.op,
                                  right=stmt.value, lineno=stmt.lineno)
            try:
                known = _strings(value, names, "")
            except UnsupportedInline:
                known = None
            for target in targets:
                if isinstance(target, ast.Name):
                    if known is None:
                        names.pop(target.id, None)
                    else:
                        names[target.id] = known
    return names


def _joined(value: object) -> str:
    return "\n".join(value) if isinstance(value, list) else str(value)


def _functions(node: ast.AST | None, names: dict[str, object]) -> tuple[str, ...]:
    if node is None:
        raise UnsupportedInline("functions= is missing: the module would expose nothing")
    if isinstance(node, ast.Dict):
        keys = [_strings(k, names, "functions") for k in node.keys if k is not None]
    else:
        value = _strings(node, names, "functions")
        keys = [value] if isinstance(value, str) else value
    bad = [k for k in keys if not isinstance(k, str) or not _IDENT.match(k)]
    if bad or not keys:
        raise UnsupportedInline(f"functions: {bad or 'empty'}: expected C++ function names")
    return tuple(keys)


def _flags(args: dict[str, ast.AST], names: dict[str, object]) -> tuple[tuple, tuple]:
    defines, ignored = [], []
    for key in ("extra_cflags", "extra_cuda_cflags", "extra_ldflags", "extra_include_paths"):
        if key not in args or (isinstance(args[key], ast.Constant) and args[key].value is None):
            continue
        try:
            value = _strings(args[key], names, key)
        except UnsupportedInline:
            ignored.append(f"{key}=<not a constant>")
            continue
        for flag in filter(None, [value] if isinstance(value, str) else value):
            m = _DEFINE.match(flag) if key != "extra_ldflags" else None
            if m and (m.group(1), m.group(2) or "1") not in defines:
                defines.append((m.group(1), m.group(2) or "1"))
            elif not m:
                ignored.append(flag)
    return tuple(defines), tuple(ignored)


def _call_args(call: ast.Call) -> dict[str, ast.AST]:
    if len(call.args) > len(POSITIONAL) or any(isinstance(a, ast.Starred) for a in call.args):
        raise UnsupportedInline("more than name, cpp_sources, cuda_sources passed by position")
    if any(k.arg is None for k in call.keywords):
        raise UnsupportedInline("**kwargs in the call")
    return {**dict(zip(POSITIONAL, call.args)), **{k.arg: k.value for k in call.keywords}}


def extract(source: str) -> InlineSpec:
    """The one load_inline call's arguments; raises UnsupportedInline."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise UnsupportedInline(f"model_new.py does not parse: {exc}") from None
    aliases = _aliases(tree)
    calls = _load_inline_calls(tree, aliases)
    if len(calls) != 1:
        raise UnsupportedInline(f"{len(calls)} load_inline calls (exactly one is supported)")
    call = calls[0]
    top = next(s for s in tree.body if s.lineno <= call.lineno <= s.end_lineno)
    names = _module_strings(tree, top.lineno)
    args = _call_args(call)
    module = args.get("is_python_module")
    if module is not None and not (isinstance(module, ast.Constant) and module.value is True):
        raise UnsupportedInline("is_python_module must be True")
    if "name" not in args or "cpp_sources" not in args:
        raise UnsupportedInline("name= and cpp_sources= are required")
    name = _strings(args["name"], names, "name")
    cuda = args.get("cuda_sources")
    cuda_text = "" if cuda is None or (isinstance(cuda, ast.Constant) and cuda.value is None) else \
        _joined(_strings(cuda, names, "cuda_sources"))
    defines, ignored = _flags(args, names)
    target = ""
    if isinstance(top, ast.Assign) and top.value is call and len(top.targets) == 1 and isinstance(top.targets[0], ast.Name):
        target = top.targets[0].id
    return InlineSpec(
        name=str(name), cpp_sources=_joined(_strings(args["cpp_sources"], names, "cpp_sources")),
        cuda_sources=cuda_text, functions=_functions(args.get("functions"), names), defines=defines,
        ignored_flags=ignored, call=(call.lineno, call.col_offset, call.end_lineno, call.end_col_offset), target=target,
    )


# ---------------------------------------------------------------------------------------------
# The rewritten model_new.py.


def _offsets(source: bytes) -> list[int]:
    """Byte offset of the start of each line (1-based: index 0 is unused)."""
    starts = [0, 0]
    for i, byte in enumerate(source):
        if byte == 10:
            starts.append(i + 1)
    return starts


def _import_edits(tree: ast.Module) -> list[tuple[ast.stmt, str]]:
    """Statements importing torch.utils.cpp_extension and what replaces them."""
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            hits = [a for a in node.names
                    if node.module.startswith(CPP_EXTENSION) or f"{node.module}.{a.name}" == CPP_EXTENSION]
            if hits and len(hits) != len(node.names) and not node.module.startswith(CPP_EXTENSION):
                raise UnsupportedInline(f"line {node.lineno}: cpp_extension imported with other names")
            if hits:
                edits.append((node, "pass"))
        elif isinstance(node, ast.Import) and any(a.name.startswith(CPP_EXTENSION) for a in node.names):
            if len(node.names) != 1:
                raise UnsupportedInline(f"line {node.lineno}: cpp_extension imported with other modules")
            edits.append((node, "pass" if node.names[0].asname else "import torch"))
    return edits


def _first_statement(tree: ast.Module) -> ast.stmt | None:
    for i, stmt in enumerate(tree.body):
        docstring = i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        future = isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"
        if not (docstring or future):
            return stmt
    return None


def rewrite(source: str, spec: InlineSpec) -> str:
    """model_new.py importing the prebuilt `cuda_extension` instead of calling load_inline."""
    tree = ast.parse(source)
    data = source.encode()
    starts = _offsets(data)

    def span(node_or_pos) -> tuple[int, int, int]:
        line, col, end_line, end_col = node_or_pos
        return starts[line] + col, starts[end_line] + end_col, end_line - line

    edits = []  # (start, end, text), byte offsets
    for node, text in _import_edits(tree):
        start, end, lines = span((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset))
        edits.append((start, end, text + "\n" * lines))
    call_start, call_end, call_lines = span(spec.call)
    if spec.target:
        top = next(s for s in tree.body if s.lineno <= spec.call[0] <= s.end_lineno)
        start, end, lines = span((top.lineno, top.col_offset, top.end_lineno, top.end_col_offset))
        edits.append((start, end, f"import cuda_extension as {spec.target}" + "\n" * lines))
    else:
        edits.append((call_start, call_end, "(cuda_extension)" + "\n" * call_lines))
        first = _first_statement(tree)
        at = starts[first.lineno] if first is not None else len(data)
        compound = first is not None and isinstance(first, (ast.ClassDef, ast.FunctionDef, ast.If, ast.With, ast.For, ast.Try, ast.AsyncFunctionDef, ast.While))
        edits.append((at, at, "import cuda_extension\n" if compound or first is None else "import cuda_extension; "))
    for start, end, text in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        data = data[:start] + text.encode() + data[end:]
    rewritten = data.decode()
    try:
        ast.parse(rewritten)
    except SyntaxError as exc:
        raise UnsupportedInline(f"the call site cannot be rewritten: {exc}") from None
    return rewritten


# ---------------------------------------------------------------------------------------------
# The sources the compile pool builds, and their static checks.

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


_DEVICE_FN = re.compile(r"\b__(?:global|device)__\b")


def split_device_code(source: str) -> tuple[str, str]:
    """(host view, device view) of a .cu text, same length and lines: the bodies of __global__ and
    __device__ functions go to the device view, the rest stays host. In one load_inline string a
    kernel's `out[i] = ...` shares names with the wrapper's `torch::Tensor out`; the host rules
    must not read the kernel as tensor code, and the device rules forbid torch in kernels."""
    from rewards.static_cpp import strip_cpp

    code = strip_cpp(source)
    device = [False] * len(source)
    pos = 0
    while (m := _DEVICE_FN.search(code, pos)) is not None:
        brace, semi = code.find("{", m.end()), code.find(";", m.end())
        if brace < 0 or (0 <= semi < brace):
            pos = m.end()
            continue
        depth, end = 0, brace
        for end in range(brace, len(code)):
            depth += {"{": 1, "}": -1}.get(code[end], 0)
            if depth == 0:
                break
        for i in range(m.start(), end + 1):
            device[i] = True
        pos = end + 1

    def view(keep: bool) -> str:
        return "".join(c if c == "\n" or device[i] == keep else " " for i, c in enumerate(source))

    return view(False), view(True)


def static_findings(spec: InlineSpec, model_new: str, reference: str) -> list[Finding]:
    """Python checks on the rewritten model_new.py, C++ checks on the source strings (file names
    say which argument; lines are lines of that string)."""
    host, device = split_device_code(spec.cuda_sources)
    files = {"load_inline/cpp_sources.cpp": spec.cpp_sources}
    if spec.cuda_sources:
        files |= {"load_inline/cuda_sources.cpp": host, "load_inline/cuda_sources.cuh": device}
    findings = check_model_new(model_new, reference=reference) + check_kernels(files)
    return sorted(findings, key=lambda f: (f.file, f.line))


# ---------------------------------------------------------------------------------------------
# The whole preparation, as `RewardsKernelEnv.prepare` does for our layout.


def unsupported(message: str) -> Verdict:
    return Verdict(status=VerdictStatus.COMPILE_ERROR, message=f"unsupported load_inline form: {message}")


def convert(workspace: Path, task: Task) -> Verdict | None:
    """Rewrite the snapshot `workspace` into the built layout; a verdict when it must not build."""
    source = (workspace / "model_new.py").read_text(errors="replace")
    try:
        spec = extract(source)
        model_new = rewrite(source, spec)
    except UnsupportedInline as exc:
        return unsupported(str(exc))
    hack = hack_verdict(static_findings(spec, model_new, task.source))
    if hack is not None:
        return hack
    write_sources(workspace, spec, model_new)
    return None


async def prepare_inline(env, workspace: Path, task: Task):
    """`rewards.env.Prepared` for a single-file solution in the snapshot `workspace`."""
    from rewards.env import Prepared

    verdict = await anyio.to_thread.run_sync(convert, workspace, task)
    if verdict is not None:
        return Prepared(verdict=verdict)
    units = UNITS if (workspace / CUDA_FILE).read_text() else UNITS[1:]
    build = await env.pool.build(workspace, units=units)
    env.builds[Path(workspace).resolve()] = build
    if not build.result.ok:
        return Prepared(build=build, verdict=Verdict(status=VerdictStatus.COMPILE_ERROR, message=build.result.log))
    return Prepared(build=build, inline=True)


__all__ = ["InlineSpec", "UnsupportedInline", "binding_file", "convert", "cuda_file", "extract", "is_inline_solution",
           "prepare_inline", "rewrite", "split_device_code", "static_findings", "write_sources"]
