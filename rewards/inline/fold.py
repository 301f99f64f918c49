"""Constant folding of a model_new.py without running it: the value an expression has where it stands.

What it is: `Folder(tree, aliases).value(node)` returns the Python value (str, int, float, bool,
None, or a list, tuple or dict of those) that `node` denotes at its place in the file, or raises
`NotFoldable` naming the construct and why. It reads constants, string operations on constants
(`+`, `%`, `*`, f-strings, `.format`, `.join`, `strip`/`replace` and the other pure str methods,
`textwrap.dedent`), and names bound once: module-level and function-local assignments before the
use (`src += ...` included), the branches of an `if`/`try` that agree or the one branch that binds
a name, `self.attr` assigned one value in the class, and calls of the file's own functions and
methods whose returns fold to one value. Bindings are recorded as they stand and evaluated only
when a use needs them. Names bound in loops, by imports or to anything else are not folded.
Results are capped at `MAX_CHARS`, so a file cannot make the folder build a huge string.
What it is not: an interpreter. Nothing of the candidate runs; used by `rewards.inline.extract`.

Example:
    folder = Folder(tree, aliases)
    folder.value(call.keywords[0].value)   # "__global__ void k(...)"
"""

from __future__ import annotations

import ast
import inspect
import re
import string
import textwrap

from rewards.inline.bindings import (
    FUNCTIONS,
    MAX_CHARS,
    MAX_NESTING,
    MISSING,
    Bindings,
    Def,
    Lazy,
    NotFoldable,
    Opaque,
    Scope,
    check_size,
    key_of,
    line_of,
    own_nodes,
    same,
)

MAX_WIDTH = 10_000  # format specs wider than this are refused before formatting
MAX_CALL_DEPTH = 8  # nested calls of the file's own functions
_STR_METHODS = frozenset(
    "strip lstrip rstrip replace format format_map join upper lower splitlines split removeprefix "
    "removesuffix".split()
)
_DEDENT = {"textwrap.dedent": textwrap.dedent, "inspect.cleandoc": inspect.cleandoc}
_BUILTINS = {"str": str, "list": list, "tuple": tuple, "dict": dict}
_CONSTANT_TYPES = (str, int, float, bool, type(None))
_NUMBER = re.compile(r"\d+")
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?[a-zA-Z%]")
_PURE_DECORATORS = frozenset({"staticmethod", "classmethod", "functools.cache", "functools.lru_cache"})
_ARITHMETIC = {ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
               ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}


def _check_spec(spec: str) -> None:
    if any(len(n) > 6 or int(n) > MAX_WIDTH for n in _NUMBER.findall(spec)):
        raise NotFoldable(f"format spec {spec[:40]!r} is wider than {MAX_WIDTH}")


def _check_template(template: str, args: list[object]) -> None:
    """The specs of a str.format template, and a bound on the length of the result."""
    try:
        specs = [spec or "" for _, field, spec, _ in string.Formatter().parse(template) if field is not None]
    except ValueError as exc:
        raise NotFoldable(f"bad format template: {exc}") from None
    _check_fields(template, specs, args)


def _check_percent(template: str, args: list[object]) -> None:
    specs = [f"{width} {precision}" for width, precision in _PERCENT_SPEC.findall(template)]
    if any("*" in spec for spec in specs):
        raise NotFoldable("a %-format with a * width")
    _check_fields(template, specs, args)


def _check_fields(template: str, specs: list[str], args: list[object]) -> None:
    """Each field is at most as long as the longest argument or its spec's width."""
    for spec in specs:
        _check_spec(spec)
    widest = max((int(n) for spec in specs for n in _NUMBER.findall(spec)), default=0)
    longest = max((len(repr(a)) for a in args), default=0)
    if len(template) + len(specs) * (longest + widest) > MAX_CHARS:
        raise NotFoldable("the formatted string would be too long")


def describe(node: ast.AST) -> str:
    """The source of `node`, shortened for a message."""
    try:
        text = ast.unparse(node)
    except Exception:  # noqa: BLE001 - a description only
        text = type(node).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """`np.add` -> "numpy.add" through the file's import aliases; None if not a dotted name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([aliases.get(node.id, node.id), *reversed(parts)])


class Folder(Bindings):
    """See the module docstring. One per parsed file."""

    def __init__(self, tree: ast.Module, aliases: dict[str, str]) -> None:
        super().__init__(tree, aliases)
        self._depth = 0  # calls of the file's own functions being folded

    def value(self, node: ast.AST, scope: Scope | None = None) -> object:
        """The value of `node` where it stands (or in `scope`); raises NotFoldable."""
        try:
            if scope is None:
                scope = self.scope_before(self.statement_of(node))
            return check_size(self._value(node, scope))
        except NotFoldable:
            raise
        except RecursionError:  # a last guard: every recursion of the folder counts against MAX_NESTING
            raise NotFoldable(f"{line_of(node)}: nested too deeply") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError, MemoryError) as exc:
            raise NotFoldable(f"{line_of(node)}: {type(exc).__name__}: {exc}") from None

    def _value(self, node: ast.AST, scope: Scope) -> object:
        self._deeper(node)
        try:
            if isinstance(node, ast.Constant):
                if not isinstance(node.value, _CONSTANT_TYPES):
                    raise NotFoldable(f"{line_of(node)}: a {type(node.value).__name__} constant")
                return node.value
            if isinstance(node, (ast.Name, ast.Attribute)) and (key := key_of(node)) is not None:
                return self._lookup(key, node, scope)
            if isinstance(node, ast.JoinedStr):
                return check_size("".join(self._formatted(v, scope) for v in node.values))
            if isinstance(node, ast.BinOp):
                return check_size(self._binop(node, scope))
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
                operand = self._value(node.operand, scope)
                if not isinstance(operand, (int, float, bool)):
                    raise NotFoldable(f"{line_of(node)}: a unary operator on a {type(operand).__name__}")
                if isinstance(node.op, ast.Not):
                    return not operand
                return -operand if isinstance(node.op, ast.USub) else operand
            if isinstance(node, (ast.List, ast.Tuple)):
                items = []
                for e in node.elts:
                    items += list(self._value(e.value, scope)) if isinstance(e, ast.Starred) else [self._value(e, scope)]
                return check_size(items if isinstance(node, ast.List) else tuple(items))
            if isinstance(node, ast.Dict):
                out: dict = {}
                for k, v in zip(node.keys, node.values):
                    out.update(self._value(v, scope) if k is None else {self._value(k, scope): self._value(v, scope)})
                return out
            if isinstance(node, ast.Subscript):
                return self._subscript(node, scope)
            if isinstance(node, ast.IfExp):
                return self._ifexp(node, scope)
            if isinstance(node, ast.Call):
                return check_size(self._call(node, scope))
            raise NotFoldable(f"{line_of(node)}: {describe(node)} is not a constant expression")
        finally:
            self._nesting -= 1

    def _formatted(self, part: ast.AST, scope: Scope) -> str:
        if isinstance(part, ast.Constant):
            return str(part.value)
        value = self._value(part.value, scope)
        if not isinstance(value, _CONSTANT_TYPES):
            raise NotFoldable(f"{line_of(part)}: an f-string of a {type(value).__name__}")
        value = {ord("r"): repr, ord("s"): str, ord("a"): ascii}.get(part.conversion, lambda x: x)(value)
        spec = self._value(part.format_spec, scope) if part.format_spec is not None else ""
        _check_spec(spec)
        return format(value, spec)

    def _binop(self, node: ast.BinOp, scope: Scope) -> object:
        if isinstance(node.op, ast.Add) and isinstance(node.left, ast.BinOp) and isinstance(node.left.op, ast.Add):
            return self._sum(node, scope)
        return self._apply(node, self._value(node.left, scope), self._value(node.right, scope))

    def _sum(self, node: ast.BinOp, scope: Scope) -> object:
        """A left-deep `a + b + c + ...` without one Python frame per term."""
        terms = []
        while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            terms.append(node)
            node = node.left
        total = self._value(node, scope)
        for term in reversed(terms):
            total = check_size(self._apply(term, total, self._value(term.right, scope)))
        return total

    def _apply(self, node: ast.BinOp, left: object, right: object) -> object:
        op = type(node.op)
        if op is ast.Mod and isinstance(left, str):
            args = right.values() if isinstance(right, dict) else right if isinstance(right, tuple) else [right]
            _check_percent(left, list(args))
            return left % right
        sequences = (str, list, tuple)
        if op is ast.Mult and isinstance(left, sequences) != isinstance(right, sequences):
            seq, n = (left, right) if isinstance(left, sequences) else (right, left)
            if not isinstance(n, int) or len(seq) * max(n, 0) > MAX_CHARS:
                raise NotFoldable(f"{line_of(node)}: a repetition of more than {MAX_CHARS} items")
            return seq * n
        numbers = all(isinstance(x, (int, float)) for x in (left, right))
        if op is ast.Add and (numbers or type(left) is type(right) and isinstance(left, sequences)):
            return left + right
        if numbers and op in _ARITHMETIC and abs(left) < 2**63 and abs(right) < 2**63:
            return _ARITHMETIC[op](left, right)
        kinds = f"{type(left).__name__} and {type(right).__name__}"
        raise NotFoldable(f"{line_of(node)}: {type(node.op).__name__} of {kinds}")

    def _subscript(self, node: ast.Subscript, scope: Scope) -> object:
        base = self._value(node.value, scope)
        if isinstance(node.slice, ast.Slice):
            s = node.slice
            return base[slice(*(None if p is None else self._value(p, scope) for p in (s.lower, s.upper, s.step)))]
        return base[self._value(node.slice, scope)]

    def _ifexp(self, node: ast.IfExp, scope: Scope) -> object:
        try:
            test = self._value(node.test, scope)
        except NotFoldable:
            body, orelse = self._value(node.body, scope), self._value(node.orelse, scope)
            if same(body, orelse):
                return body
            raise
        return self._value(node.body if test else node.orelse, scope)

    def _maybe(self, node: ast.AST, scope: Scope) -> object:
        """The value of an argument, or an opaque marker (the function may not use it)."""
        try:
            return self.value(node, scope)
        except NotFoldable as exc:
            return Opaque(str(exc))

    def _keywords(self, call: ast.Call, scope: Scope) -> dict:
        out: dict = {}
        for k in call.keywords:
            out.update(self._value(k.value, scope) if k.arg is None else {k.arg: self._value(k.value, scope)})
        return out

    def _call(self, node: ast.Call, scope: Scope) -> object:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _STR_METHODS:
            try:
                receiver = self._value(func.value, scope)
            except NotFoldable:
                receiver = None
            if isinstance(receiver, str):
                return self._str_method(receiver, func.attr, node, scope)
        name = dotted(func, self.aliases)
        if name in _DEDENT:
            args = [self._value(a, scope) for a in node.args]
            if len(args) != 1 or not isinstance(args[0], str):
                raise NotFoldable(f"{line_of(node)}: {name}() of something other than one str")
            return _DEDENT[name](args[0])
        if name in _BUILTINS and scope.lookup(name) is MISSING:
            args = [self._value(a, scope) for a in node.args]
            if name == "str" and args and not isinstance(args[0], _CONSTANT_TYPES):
                raise NotFoldable(f"{line_of(node)}: str() of a {type(args[0]).__name__}")
            return _BUILTINS[name](*args, **self._keywords(node, scope))
        target = self._callee(func, scope)
        if target is not None:
            return self._call_own(target, node, scope)
        raise NotFoldable(f"{line_of(node)}: a call of {name or describe(func)}")

    def _str_method(self, text: str, method: str, node: ast.Call, scope: Scope) -> object:
        args = [self._value(a, scope) for a in node.args]
        kwargs = self._keywords(node, scope)
        if method in ("format", "format_map"):
            mapping = list(args[0].values()) if method == "format_map" and args and isinstance(args[0], dict) else []
            _check_template(text, [*args, *kwargs.values(), *mapping])
        elif method == "join":
            items = list(args[0]) if args else []
            if not all(isinstance(i, str) for i in items):
                raise NotFoldable(f"{line_of(node)}: .join() of items that are not all str")
            if len(text) * len(items) + sum(map(len, items)) > MAX_CHARS:
                raise NotFoldable(f"{line_of(node)}: the joined string would be too long")
        elif method == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            old, new = args[0], args[1]
            grows = text.count(old) * max(len(new) - len(old), 0) if old else (len(text) + 1) * len(new)
            if len(text) + grows > MAX_CHARS:
                raise NotFoldable(f"{line_of(node)}: the replaced string would be too long")
        return getattr(text, method)(*args, **kwargs)

    def _callee(self, func: ast.AST, scope: Scope) -> ast.AST | None:
        """The file's own function that `func` names: a name bound to a def, or `self.method`."""
        if isinstance(func, ast.Name):
            found = scope.lookup(func.id)
            return found.node if isinstance(found, Def) and isinstance(found.node, FUNCTIONS) else None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            cls = self._method_class(scope, func.value.id)
            if cls is not None:
                return next((m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == func.attr), None)
        return None

    def _call_own(self, fn: ast.FunctionDef, call: ast.Call, scope: Scope) -> object:
        """The one value every `return` of the file's function `fn` folds to for these arguments."""
        if self._depth >= MAX_CALL_DEPTH:
            raise NotFoldable(f"{line_of(call)}: calls nested more than {MAX_CALL_DEPTH} deep")
        decorators = [dotted(d.func if isinstance(d, ast.Call) else d, self.aliases) for d in fn.decorator_list]
        if any(d not in _PURE_DECORATORS for d in decorators):
            raise NotFoldable(f"{line_of(call)}: {fn.name}() is decorated with {', '.join(map(str, decorators))}")
        params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
        if isinstance(call.func, ast.Attribute) and "staticmethod" not in decorators:  # self stays opaque
            params = params[1:]
        args: dict[str, object] = dict(zip(params, (self._maybe(a, scope) for a in call.args)))
        args |= {k.arg: self._maybe(k.value, scope) for k in call.keywords if k.arg is not None}
        defaults = fn.args.defaults
        for name, default in zip(params[len(params) - len(defaults):], defaults):
            if name not in args:
                args[name] = Lazy(default, self.scope_before(fn))
        returns = [n for n in own_nodes(fn.body) if isinstance(n, ast.Return)]
        if not returns or any(r.value is None for r in returns):
            raise NotFoldable(f"{line_of(call)}: {fn.name}() does not return a value on every path")
        self._depth += 1
        try:
            values = [self._value(r.value, self.scope_before(r, args)) for r in returns]
        finally:
            self._depth -= 1
        if not all(same(values[0], v) for v in values):
            raise NotFoldable(f"{line_of(call)}: {fn.name}() returns different values")
        return values[0]


__all__ = ["MAX_CHARS", "MAX_NESTING", "Folder", "NotFoldable"]
