"""Static extraction of the one `load_inline(...)` call of a single-file KernelBench solution.

What it is: `extract(source) -> InlineSpec` reads the call's arguments from the AST without running
anything (step 1 of `rewards.inline.prepare`): string constants, module-level names bound to them earlier
in the file (`src = "..."`, `src += "..."`), `+` concatenations, lists/tuples of those,
`functions` as a list, tuple, dict (its keys) or one string, and `-DNAME[=value]` extra flags.
Anything else raises `UnsupportedInline`, whose message says which part.
What it is not: the rewrite of model_new.py (`rewards.inline.rewrite`), the generated sources
(`rewards.inline.sources`) or the preparation as a whole (`rewards.inline.prepare`, which re-exports
`extract`, `InlineSpec` and `UnsupportedInline`).

Example:
    spec = extract(Path("model_new.py").read_text())
    spec.name, spec.functions, spec.call
"""

from __future__ import annotations

import ast
import re

from msgspec import Struct

CPP_EXTENSION = "torch.utils.cpp_extension"
LOAD_INLINE = f"{CPP_EXTENSION}.load_inline"
POSITIONAL = ("name", "cpp_sources", "cuda_sources")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEFINE = re.compile(r"^-D([A-Za-z_][A-Za-z0-9_]*)(?:=([A-Za-z0-9_.+-]*))?$")


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
