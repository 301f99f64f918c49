"""When the code of a model_new.py runs and what it reads, and the values of its constants.

`init_only` finds the helpers that run only while the model is built: methods and module-level
functions reached from a class's `__init__` (called, or passed to a call such as
`self.apply(self._init)`) and from nothing that runs per call; a function stored for later
(`self.forward = self._fast`) runs per call. `dead_task_copies` finds copies of get_inputs /
get_init_inputs that nothing refers to, `loaded_names` the module-level names live code reads
(`global_reads` those one function reads),
`constant_value` / `module_constants` fold constant expressions without running anything, and
`parent_map` maps each node of a tree to its parent. Used by `rewards.static.pyfacts` (the facts
of one file), `rewards.static.python` (the walk) and `rewards.inline.settings` (`parent_map`).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass

from rewards.static import policy as P


@dataclass(frozen=True)
class Scope:
    """The functions of one file: module-level ones by name, methods by class and name."""

    functions: Mapping[str, ast.FunctionDef]
    methods: Mapping[str, Mapping[str, ast.FunctionDef]]


def parent_map(tree: ast.AST) -> dict[int, ast.AST]:
    """`id(node)` -> the node's parent, for every node under `tree` (not `tree` itself)."""
    return {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}


def _references(fn: ast.AST, cls: str | None, scope: Scope) -> tuple[set[str], set[str]]:
    """Keys of the functions `fn` refers to (self.m, Cls.m, module-level functions): those it
    calls or passes to a call (`self.apply(self._init)`), and those it stores or returns
    (`self.forward = self._fast`), which may run on any later call."""
    called, stored = set(), set()
    for parent in ast.walk(fn):
        for node in ast.iter_child_nodes(parent):
            key = _function_key(node, cls, scope)
            if key is None:
                continue
            used_now = isinstance(parent, ast.Call) and (node is parent.func or node in parent.args)
            (called if used_now else stored).add(key)
    return called, stored


def _function_key(node: ast.AST, cls: str | None, scope: Scope) -> str | None:
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in scope.functions:
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        owner = cls if node.value.id == "self" else node.value.id
        if node.attr in scope.methods.get(owner or "", {}) and node.attr != "__init__":
            return f"{owner}.{node.attr}"
    return None


def _reach(graph: dict[str, set[str]], starts: set[str]) -> set[str]:
    seen, todo = set(), list(starts)
    while todo:
        key = todo.pop()
        if key not in seen:
            seen.add(key)
            todo += graph.get(key, ())
    return seen


def init_only(tree: ast.Module, scope: Scope) -> set[str]:
    """Helpers reached from some class's __init__ and from nothing that runs per call. Everything
    __init__ does not reach (forward, other methods, dead helpers, module-level code) is an
    entry point that runs per call, and so is forward even when __init__ warms it up."""
    refs = {name: _references(fn, None, scope) for name, fn in scope.functions.items()}
    for cls, methods in scope.methods.items():
        for name, fn in methods.items():
            refs[f"{cls}.{name}"] = _references(fn, cls, scope)
    top = [s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    refs["<module>"] = (set(), set().union(*(c | st for c, st in (_references(s, None, scope) for s in top))))
    graph = {key: called | stored for key, (called, stored) in refs.items()}
    stored = set().union(*(st for _, st in refs.values()))
    inits = {k for k in graph if k.endswith(".__init__")}
    from_init = _reach({k: called for k, (called, _) in refs.items()}, inits)
    runtime = {k for k in graph if k not in from_init or k.rsplit(".", 1)[-1] in ("forward", "__call__")}
    return from_init - _reach(graph, (runtime | stored) - inits) - inits


def dead_task_copies(tree: ast.Module, scope: Scope) -> set[str]:
    """get_inputs / get_init_inputs defined at module level and referred to nowhere else: the
    harness draws inputs with the task's own functions, so such a copy never runs."""
    copies = {name for name in P.TASK_FUNCTIONS if name in scope.functions}
    used = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name in copies:
            continue
        used |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and n.id in copies}
    return copies - used


def loaded_names(tree: ast.Module, dead: set[str], skip: frozenset[int] = frozenset()) -> set[str]:
    """Module-level names that live code reads (a function's own parameters and locals shadow
    them). Dead task copies are not live, and a module-level `x = f(y)` reads `y` only when `x`
    is itself read (`bias_shape = out_channels` read only by a dead get_init_inputs) and the
    value calls nothing (a call runs at import whoever reads the result). The bodies of the
    functions in `skip` (node ids) are left out, except the lambdas they make."""
    live: set[str] = set()
    bindings: list[tuple[set[str], set[str]]] = []  # (targets, names read by the value)
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name in dead:
            continue
        pure = not any(isinstance(n, (ast.Call, ast.Await, ast.NamedExpr)) for n in ast.walk(stmt))
        if pure and isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            reads: set[str] = set()
            _global_loads(stmt.value, frozenset(), reads, skip)
            bindings.append(({t.id for t in stmt.targets}, reads))
        else:
            _global_loads(stmt, frozenset(), live, skip)
    while True:
        more = set().union(*(reads for targets, reads in bindings if targets & live)) - live
        if not more:
            return live
        live |= more


def global_reads(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The names `fn` reads from module level (its parameters and locals shadow them)."""
    out: set[str] = set()
    _global_loads(fn, frozenset(), out)
    return out


def _global_loads(node: ast.AST, local: frozenset[str], out: set[str], skip: frozenset[int] = frozenset()) -> None:
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local:
        out.add(node.id)
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        for child in ast.iter_child_nodes(node):
            _global_loads(child, local, out, skip)
        return
    args = node.args
    for expr in [*getattr(node, "decorator_list", []), *args.defaults, *(d for d in args.kw_defaults if d)]:
        _global_loads(expr, local, out)
    params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    body = node.body if isinstance(node.body, list) else [node.body]
    stored = {n.id for b in body for n in ast.walk(b) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    declared = {name for b in body for n in ast.walk(b) if isinstance(n, ast.Global) for name in n.names}
    inner = local | ((params | stored) - declared)
    if id(node) in skip:  # runs while the model is built; a lambda it makes may run per call
        body = [n for b in body for n in ast.walk(b) if isinstance(n, ast.Lambda)]
    for b in body:
        _global_loads(b, frozenset(inner), out, skip)


_BINOPS = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b, ast.Div: lambda a, b: a / b, ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b if abs(b) <= 64 else None,
}  # fmt: skip


def constant_value(node: ast.expr, env: dict[str, object]) -> object:
    """The value of a constant expression (literals, tuples, arithmetic, names in `env`), or a
    sentinel that equals nothing when it is not one. Nothing is executed."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [constant_value(e, env) for e in node.elts]
        return _UNKNOWN if _UNKNOWN in items else type(items)(items) if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = constant_value(node.operand, env)
        return -value if isinstance(value, (int, float)) else _UNKNOWN
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = constant_value(node.left, env), constant_value(node.right, env)
        if isinstance(left, (int, float)) and isinstance(right, (int, float)):
            try:
                result = _BINOPS[type(node.op)](left, right)
            except (ZeroDivisionError, OverflowError):
                return _UNKNOWN
            return _UNKNOWN if result is None else result
    return _UNKNOWN


class _Unknown:
    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__


_UNKNOWN = _Unknown()


def module_constants(tree: ast.Module) -> dict[str, object]:
    """Module-level names bound to constant expressions (`height = width = 128`, `n = 2 * m`)."""
    out: dict[str, object] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            value = constant_value(stmt.value, out)
            for t in stmt.targets:
                if isinstance(t, ast.Name):
                    if value is _UNKNOWN:
                        out.pop(t.id, None)
                    else:
                        out[t.id] = value
    return out


def rebound(fn: ast.FunctionDef | ast.AsyncFunctionDef, params: set[str]) -> dict[str, int]:
    """Parameter -> the first line where a plain assignment (or a for loop) rebinds it."""
    out: dict[str, int] = {}
    for node in ast.walk(fn):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.For) else []
        for name in (n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)):
            if name in params:
                out[name] = min(out.get(name, node.lineno), node.lineno)
    return out


def only_called(name: str, scope: ast.AST) -> bool:
    """`name` (a function defined in `scope`) is only ever called there, never stored or returned."""
    calls = {id(n.func) for n in ast.walk(scope) if isinstance(n, ast.Call)}
    loads = [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
    return all(id(n) in calls for n in loads)
