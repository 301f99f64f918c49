"""Static extraction of the `load_inline(...)` calls of a single-file KernelBench solution.

What it is: `extract(source) -> InlineSpec` reads every load_inline call's arguments from the AST
without running anything (step 1 of `rewards.inline.prepare`). Each argument is folded by
`rewards.inline.fold` (constants, string operations on constants, names bound once in the
module, an `if`, a function or the class). Each call builds one extension module
(`InlineModule`); calls with the same sources share it. `functions` may be a list, tuple, dict
(its keys) or one string, or be left out when the sources define `PYBIND11_MODULE` themselves.
What cannot matter for a build the compile pool owns is noted, not refused (`InlineSpec.notes`):
a computed `name=`, flags computed at import, `**options` when the sources and functions are
given explicitly. Imports used only to make such arguments (`os.getpid()` in a name, a build
directory) are listed in `InlineSpec.build_only_imports` (`rewards.inline.settings`). What is
refused raises `UnsupportedInline`, whose one-line message names the construct and why; a file
that does not parse raises `InvalidSolution`. `rewards.inline.prepare` turns both into
COMPILE_ERROR verdicts.
What it is not: the rewrite of model_new.py (`rewards.inline.rewrite`), the generated sources
(`rewards.inline.sources`) or the preparation as a whole (`rewards.inline.prepare`).

Example:
    spec = extract(Path("model_new.py").read_text())
    [m.functions for m in spec.modules], spec.calls, spec.notes
"""

from __future__ import annotations

import ast
import keyword
import re

import msgspec
from msgspec import Struct

from rewards.inline.fold import Folder, NotFoldable, dotted
from rewards.inline.settings import build_only_imports

CPP_EXTENSION = "torch.utils.cpp_extension"
LOAD_INLINE = f"{CPP_EXTENSION}.load_inline"
POSITIONAL = ("name", "cpp_sources", "cuda_sources")
FLAG_ARGS = ("extra_cflags", "extra_cuda_cflags", "extra_ldflags", "extra_include_paths")
BUILD_OPTIONS = frozenset(
    "build_directory verbose with_cuda with_sycl with_pytorch_error_handling keep_intermediates use_pch "
    "no_implicit_headers extra_sycl_cflags sycl_sources".split()
)  # load_inline's other parameters: the compile pool decides what they would
IGNORED_ARGS = frozenset({"name", *FLAG_ARGS, *BUILD_OPTIONS})
"""Arguments the build does not take as given: the module's name, the extra_* flags (only `-D`
defines that fold to constants are kept) and the build options, which the compile pool sets."""
MAX_SOURCE_BYTES = 1 << 20  # as rewards.evaluate.MAX_FILE_BYTES
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEFINE = re.compile(r"^-D([A-Za-z_][A-Za-z0-9_]*)(?:=([A-Za-z0-9_.+-]*))?$")
_PYBIND_MODULE = re.compile(r"\bPYBIND11_MODULE\s*\(")


class UnsupportedInline(ValueError):
    """A load_inline call that cannot be read statically; the message names the construct and why."""


class InvalidSolution(ValueError):
    """model_new.py is not a Python file this side can read (syntax error, too large)."""


class InlineModule(Struct, frozen=True, kw_only=True):
    """What one load_inline call compiles: one extension module."""

    name: str
    """load_inline's `name=` (or `module<i>` when it is computed at import)."""
    attr: str = ""
    """The module's attribute of `cuda_extension` when the file builds several; '' for one."""
    cpp_sources: str
    cuda_sources: str
    functions: tuple[str, ...] = ()
    """The bound C++ functions; () when the sources define PYBIND11_MODULE themselves."""
    defines: tuple[tuple[str, str], ...] = ()
    """`-DNAME[=value]` of the extra flags, as #defines."""
    ignored_flags: tuple[str, ...] = ()
    """Other extra flags: not passed to the compilers (the pool owns arch and flags)."""


class InlineCall(Struct, frozen=True, kw_only=True):
    """One call site: where it is, which module it builds, and NAME of a module-level
    `NAME = load_inline(...)` statement ('' otherwise)."""

    span: tuple[int, int, int, int]
    """(lineno, col, end_lineno, end_col), ast's UTF-8 byte columns."""
    module: int
    target: str = ""


class InlineSpec(Struct, frozen=True, kw_only=True):
    """The statically read load_inline calls of a model_new.py."""

    modules: tuple[InlineModule, ...]
    calls: tuple[InlineCall, ...]
    notes: tuple[str, ...] = ()
    """What was read but does not change the build (computed names, flags, **options)."""
    build_only_imports: tuple[str, ...] = ()
    """Imports used only to make load_inline's ignored arguments (`os` for a process-unique name
    or a build directory: `rewards.inline.settings`); their import is a note, not a finding."""


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


def _is_load_inline(call: ast.Call, aliases: dict[str, str]) -> bool:
    """torch's load_inline by any import alias, or a call through any name ending in it
    (`cpp_ext.load_inline` with `cpp_ext` bound at run time)."""
    func = call.func
    named = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return dotted(func, aliases) == LOAD_INLINE or named == "load_inline"


def parse(source: str) -> ast.Module:
    """The AST of model_new.py; raises InvalidSolution."""
    size = len(source.encode(errors="replace"))
    if size > MAX_SOURCE_BYTES:
        raise InvalidSolution(f"model_new.py is {size} bytes (at most {MAX_SOURCE_BYTES})")
    try:
        return ast.parse(source)
    except SyntaxError as exc:
        raise InvalidSolution(f"model_new.py does not parse: {exc.msg} (line {exc.lineno})") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, nesting past the parser's limit
        raise InvalidSolution(f"model_new.py does not parse: {type(exc).__name__}: {exc}") from None


class _Call:
    """The arguments of one call site, folded on demand."""

    def __init__(self, call: ast.Call, folder: Folder, notes: list[str]) -> None:
        self.call, self.folder, self.notes = call, folder, notes
        self.line = f"line {call.lineno}"
        self.args: dict[str, object] = {}
        self.opaque_options = self.opaque_why = ""  # a **options that could not be read, and why
        self._positional()
        for kw in call.keywords:
            if kw.arg is not None:
                self.args[kw.arg] = kw.value
            else:
                self._options(kw.value)

    def _positional(self) -> None:
        args = []
        for a in self.call.args:
            if isinstance(a, ast.Starred):
                items = self._fold(a.value, "*args")
                if not isinstance(items, (list, tuple)):
                    raise UnsupportedInline(f"{self.line}: *args: not a list or tuple")
                args += [_Given(i) for i in items]
            else:
                args.append(a)
        if len(args) > 4:
            raise UnsupportedInline(f"{self.line}: {len(args)} positional arguments (name, cpp_sources, "
                                    "cuda_sources and functions are the ones read)")
        self.args.update(zip(POSITIONAL, args))
        if len(args) == 4:  # torch < 2.6 had functions fourth, later ones sycl_sources
            self.args["functions"] = args[3]

    def _options(self, node: ast.AST) -> None:
        try:
            options = self.folder.value(node)
        except NotFoldable as exc:
            self.opaque_options, self.opaque_why = f"**{ast.unparse(node)[:40]}", str(exc)
            return
        if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
            raise UnsupportedInline(f"{self.line}: **{ast.unparse(node)[:40]} is not a dict of keywords")
        self.args.update({k: _Given(v) for k, v in options.items()})

    def has(self, key: str) -> bool:
        arg = self.args.get(key)
        return arg is not None and not (isinstance(arg, ast.Constant) and arg.value is None) and \
            not (isinstance(arg, _Given) and arg.value is None)

    def _fold(self, node: object, what: str) -> object:
        if isinstance(node, _Given):
            return node.value
        try:
            return self.folder.value(node)
        except NotFoldable as exc:
            raise UnsupportedInline(f"{what}: {exc}") from None

    def get(self, key: str) -> object:
        return self._fold(self.args[key], key)

    def text(self, key: str) -> str:
        """A source argument: one str, or a list or tuple of str joined by newlines."""
        if not self.has(key):
            if self.opaque_options and key not in self.args:
                raise UnsupportedInline(f"{self.line}: {key} is not given and may come from {self.opaque_options} "
                                        f"({self.opaque_why})")
            return ""
        value = self.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return "\n".join(value)
        raise UnsupportedInline(f"{key}: {self.line}: a {type(value).__name__}, not a str or a list of str")


class _Given:
    """An argument whose value is already folded (from **options or *args)."""

    def __init__(self, value: object) -> None:
        self.value = value


def _functions(call: _Call, sources: str) -> tuple[str, ...]:
    if not call.has("functions"):
        if _PYBIND_MODULE.search(sources):
            return ()
        if call.opaque_options and "functions" not in call.args:
            raise UnsupportedInline(f"{call.line}: functions= is not given and may come from "
                                    f"{call.opaque_options} ({call.opaque_why})")
        raise UnsupportedInline(f"{call.line}: functions= is missing and the sources define no PYBIND11_MODULE: "
                                "the module would have nothing to import")
    value = call.get("functions")
    keys = list(value) if isinstance(value, (list, tuple, dict)) else [value]
    bad = [k for k in keys if not isinstance(k, str) or not _IDENT.match(k)]
    if bad or not keys:
        raise UnsupportedInline(f"functions: {call.line}: {bad[:3] or 'empty'}: expected C++ function names")
    return tuple(keys)


def _flags(call: _Call) -> tuple[tuple, tuple]:
    defines, ignored = [], []
    for key in FLAG_ARGS:
        if not call.has(key):
            continue
        try:
            value = call.get(key)
        except UnsupportedInline as exc:
            call.notes.append(f"{key} not read ({exc}): the compile pool sets the flags")
            continue
        flags = [value] if isinstance(value, str) else value if isinstance(value, (list, tuple)) else []
        for flag in filter(None, flags):
            m = _DEFINE.match(str(flag)) if key != "extra_ldflags" else None
            if m and (m.group(1), m.group(2) or "1") not in defines:
                defines.append((m.group(1), m.group(2) or "1"))
            elif not m:
                ignored.append(str(flag))
    return tuple(defines), tuple(ignored)


def _module(call: ast.Call, folder: Folder, index: int, notes: list[str]) -> InlineModule:
    args = _Call(call, folder, notes)
    if args.has("is_python_module") and args.get("is_python_module") is not True:
        raise UnsupportedInline(f"{args.line}: is_python_module must be True (otherwise load_inline returns a path "
                                "and the functions are reached through torch.ops)")
    if "cpp_sources" not in args.args and not args.opaque_options:
        raise UnsupportedInline(f"{args.line}: cpp_sources is missing")
    cpp, cuda = args.text("cpp_sources"), args.text("cuda_sources")
    functions = _functions(args, cpp + "\n" + cuda)
    if args.opaque_options:
        notes.append(f"{args.line}: {args.opaque_options} not read ({args.opaque_why}): with the sources and "
                     "functions given, it can only hold build options, which the compile pool sets")
    name = f"module{index}"
    try:
        name = str(args.get("name")) if args.has("name") else name
    except UnsupportedInline as exc:
        notes.append(f"{args.line}: name= is computed at import ({exc}); the module is built as {name}")
    for key in sorted(set(args.args) - set(POSITIONAL) - {"functions", "is_python_module", *FLAG_ARGS, *BUILD_OPTIONS}):
        notes.append(f"{args.line}: load_inline has no argument {key!r}: ignored")
    defines, ignored = _flags(args)
    return InlineModule(name=name, cpp_sources=cpp, cuda_sources=cuda, functions=functions, defines=defines,
                        ignored_flags=ignored)


def _target(tree: ast.Module, call: ast.Call) -> str:
    """NAME of a module-level `NAME = load_inline(...)`, else ''."""
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1 and \
                isinstance(stmt.targets[0], ast.Name):
            return stmt.targets[0].id
    return ""


def _attrs(modules: list[InlineModule]) -> tuple[InlineModule, ...]:
    """Each module's attribute of cuda_extension: its name when that is a fresh identifier."""
    if len(modules) == 1:
        return tuple(modules)
    names = [m.name for m in modules]
    out = []
    for i, m in enumerate(modules):
        usable = _IDENT.match(m.name) and not m.name.startswith("_") and not keyword.iskeyword(m.name)
        attr = m.name if usable and names.count(m.name) == 1 and not m.name.startswith("module") else f"module{i}"
        out.append(msgspec.structs.replace(m, attr=attr))
    return tuple(out)


def extract(source: str) -> InlineSpec:
    """Every load_inline call's module; raises UnsupportedInline or InvalidSolution."""
    tree = parse(source)
    aliases = _aliases(tree)
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call) and _is_load_inline(n, aliases)),
                   key=lambda c: (c.lineno, c.col_offset))
    if not calls:
        raise UnsupportedInline("no load_inline(...) call: the name appears only in comments or strings, or "
                                "the function is reached through a value bound at run time")
    for outer, inner in zip(calls, calls[1:]):
        if (inner.lineno, inner.col_offset) < (outer.end_lineno, outer.end_col_offset):
            raise UnsupportedInline(f"line {inner.lineno}: a load_inline call inside another's arguments")
    folder = Folder(tree, aliases)
    modules: list[InlineModule] = []
    sites: list[InlineCall] = []
    notes: list[str] = []
    for call in calls:
        module = _module(call, folder, len(modules), notes)
        same = next((i for i, m in enumerate(modules) if _same_build(m, module)), None)
        if same is None:
            modules.append(module)
            same = len(modules) - 1
        span = (call.lineno, call.col_offset, call.end_lineno, call.end_col_offset)
        sites.append(InlineCall(span=span, module=same, target=_target(tree, call)))
    ignored = sorted({f for m in modules for f in m.ignored_flags})
    if ignored:
        notes.append(f"extra flags not passed on (the compile pool sets arch and flags): {' '.join(ignored)[:200]}")
    return InlineSpec(modules=_attrs(modules), calls=tuple(sites), notes=tuple(notes),
                      build_only_imports=build_only_imports(tree, aliases, calls, IGNORED_ARGS))


def _same_build(a: InlineModule, b: InlineModule) -> bool:
    return (a.cpp_sources, a.cuda_sources, a.functions, a.defines) == (b.cpp_sources, b.cuda_sources, b.functions,
                                                                      b.defines)
