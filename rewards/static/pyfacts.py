"""What the model_new.py checker knows before and during its walk: facts and expression types.

`collect_facts` gathers import aliases (`F` -> torch.nn.functional; `ext = cuda_extension` too,
and where else the extension is bound: getters, methods returning it, class attributes, locals),
each class's parameters, buffers and torch submodules from its `__init__` and the helpers only
`__init__` calls (`rewards.static.pyscope.init_only`: `reset_parameters`, `_make_layer`, block
builders), module-level names and constants, the names live code reads, copies of the task's
functions that nothing calls, custom autograd functions, and from the trusted reference its
constant globals, the state its forward keeps on self and whether it computes in low precision.
`TensorTyping` decides whether an expression is a tensor (forward's arguments, parameters,
allocations, cuda_extension results, views of tensors) or a scalar (`.shape`, `.size()`,
`.numel()`): arithmetic on the first is torch compute, on the second launch-configuration maths.
Used only by `rewards.static.python`.
"""

from __future__ import annotations

import ast
import builtins
import enum
import re
from dataclasses import dataclass, field

from rewards.static import policy as P
from rewards.static.pyscope import (
    Scope,
    dead_task_copies,
    global_reads,
    init_only,
    loaded_names,
    module_constants,
    parent_map,
)

_ALLOC = frozenset(
    {"torch.empty", "torch.empty_like", "torch.empty_strided", "torch.zeros", "torch.zeros_like"}
)
_SUBMODULE_TENSORS = frozenset(
    {"weight", "bias", "running_mean", "running_var", "in_proj_weight", "in_proj_bias"}
)
BUILTIN_NAMES = frozenset(dir(builtins))
_LOW_PRECISION = re.compile(r"\btorch\.(float16|half|bfloat16|float8\w*)\b|\.(half|bfloat16)\(")
_CONTAINERS = frozenset({"torch.nn.ModuleList", "torch.nn.Sequential", "torch.nn.ModuleDict"})


class Ctx(enum.Enum):
    """Where code runs: module level, `__init__` (parameter creation) or per call (forward)."""

    MODULE = "module level"
    INIT = "__init__"
    RUNTIME = "forward"


@dataclass
class ClassFacts:
    """What a class's `__init__` binds on self, and its methods."""

    name: str
    node: ast.ClassDef | None = None
    methods: dict[str, ast.FunctionDef] = field(default_factory=dict)
    torch_modules: set[str] = field(default_factory=set)  # self.X = nn.Linear(...)
    tensors: set[str] = field(default_factory=set)  # parameters and buffers
    local_modules: set[str] = field(default_factory=set)  # self.X = Block() (checked itself)
    aliases: dict[str, str] = field(default_factory=dict)  # self.X = cuda_extension; "m()": a getter
    autograd: bool = False  # subclasses torch.autograd.Function


@dataclass
class ModuleFacts:
    """Imports, top-level definitions and names of one model_new.py, and the reference's facts."""

    aliases: dict[str, str]
    classes: dict[str, ClassFacts]
    functions: dict[str, ast.FunctionDef]
    module_names: set[str]
    low_precision_ok: bool
    reference_globals: dict[str, object]
    init_only: set[str] = field(default_factory=set)
    """Function keys ("Cls.method", "func") reached only from a class's __init__."""
    dead_task_copies: set[str] = field(default_factory=set)
    """Module-level get_inputs / get_init_inputs that nothing in the file refers to."""
    apply_aliases: dict[str, str] = field(default_factory=dict)
    """Module-level `name = Fn.apply` of a local autograd function -> "Fn"."""
    loaded_names: set[str] = field(default_factory=set)
    """Names read anywhere except inside dead task copies: a name not here is never used."""
    module_constants: dict[str, object] = field(default_factory=dict)
    """Module-level names bound to constants (numbers, strings, tuples and arithmetic on them)."""
    reference_state: set[str] = field(default_factory=set)
    """Attributes the reference Model's own forward assigns on self (an RNN's hidden state): the
    task keeps them across calls, so a correct candidate must too."""
    reference_imports: set[str] = field(default_factory=set)
    """Top-level modules the reference imports (numpy, einops): already loaded by the task."""
    extension_globals: set[str] = field(default_factory=set)
    """Module-level names that hold only the extension or None (`global _ext; _ext = load_inline(
    ...)` in a function that builds it once, rewritten to `cuda_extension`)."""
    per_call_names: set[str] = field(default_factory=set)
    """Like `loaded_names`, less what only `__init__` and the helpers only it calls read."""
    reference_init_reads: set[str] = field(default_factory=set)
    """Module-level names the reference Model's `__init__` reads (a batch_size sizing its state)."""


def collect_facts(tree: ast.Module, reference: str | None) -> ModuleFacts:
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = (
                    a.name if a.asname else a.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    aliases |= _extension_aliases(tree, aliases)
    ext_globals = _extension_globals(tree, aliases)
    aliases |= dict.fromkeys(ext_globals, "cuda_extension")
    aliases |= {f"{name}()": "cuda_extension" for name in _extension_getters(tree, aliases)}
    facts = ModuleFacts(aliases, {}, {}, set(), False, {}, extension_globals=ext_globals)
    local = {s.name for s in tree.body if isinstance(s, ast.ClassDef)}
    rebound = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and not isinstance(n.ctx, ast.Load)}
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef):
            info = facts.classes[stmt.name] = ClassFacts(stmt.name, stmt, _methods(stmt))
            info.aliases |= {f"{name}()": "cuda_extension" for name in _extension_methods(info, aliases) - rebound}
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            facts.functions[stmt.name] = stmt
        for t in _assigned(stmt):
            facts.module_names.add(t)
    scope = Scope(facts.functions, {name: info.methods for name, info in facts.classes.items()})
    facts.init_only = init_only(tree, scope)
    facts.dead_task_copies = dead_task_copies(tree, scope)
    facts.loaded_names = loaded_names(tree, facts.dead_task_copies)
    builds = {id(fn) for key in facts.init_only if key in facts.functions for fn in [facts.functions[key]]}
    builds |= {id(fn) for info in facts.classes.values() for name, fn in info.methods.items()
               if name == "__init__" or f"{info.name}.{name}" in facts.init_only}  # fmt: skip
    facts.per_call_names = loaded_names(tree, facts.dead_task_copies, frozenset(builds))
    facts.module_constants = module_constants(tree)
    for key, q in _class_extension_attrs(tree, facts.classes, aliases).items():
        facts.aliases[key] = q
        cls, attr = key.split(".")
        facts.classes[cls].aliases[attr] = q
    for info in facts.classes.values():
        info.autograd = _is_autograd(info, facts)
        _bind_attrs(info, facts, local)
    facts.apply_aliases = {
        t: v.value.id
        for stmt in tree.body
        if isinstance(stmt, ast.Assign) and isinstance(v := stmt.value, ast.Attribute) and v.attr == "apply"
        and isinstance(v.value, ast.Name) and v.value.id in facts.classes
        for t in _assigned(stmt)
    }
    if reference is not None:
        facts.low_precision_ok = bool(_LOW_PRECISION.search(reference))
        _add_reference_facts(facts, reference)
    return facts


def _extension_aliases(tree: ast.Module, aliases: dict[str, str]) -> dict[str, str]:
    """`ext = cuda_extension` (or one of its submodules) at module level, also inside a `try` or
    an `if` (a single-file solution's rewritten `ext = load_inline(...)` guarded by try/except)."""
    out: dict[str, str] = {}
    todo = list(tree.body)
    while todo:
        stmt = todo.pop()
        if isinstance(stmt, (ast.Try, ast.If, ast.With)):
            todo += stmt.body + getattr(stmt, "orelse", []) + getattr(stmt, "finalbody", [])
            todo += [s for h in getattr(stmt, "handlers", []) for s in h.body]
        elif isinstance(stmt, ast.Assign):
            q = _extension_of(stmt.value, aliases)
            if q is not None:
                out |= {t.id: q for t in stmt.targets if isinstance(t, ast.Name)}
    return out


def _extension_of(
    value: ast.expr | None, aliases: dict[str, str], self_aliases: dict[str, str] | None = None, none_ok: bool = False
) -> str | None:
    """What one store (or `return`) binds, as the binders below weigh it: the qualname of the
    extension or of its submodule when `value` evaluates to it given the names and getters
    `aliases` and `self_aliases` know to hold it, "None" for the constant None where `none_ok`,
    else None (also when `value` is None: a store that is not a plain assignment)."""
    if value is None:
        return None
    if none_ok and _is_none(value):
        return "None"
    q = qualname(value, aliases, self_aliases or {})
    return q if q is not None and q.split(".")[0] == "cuda_extension" else None


def _one_extension(bound: set[str | None]) -> str | None:
    """The extension a name holds when what its stores bind (`_extension_of` of each) is one
    qualname of the extension and otherwise only "None"; else None."""
    ext = bound - {"None"}
    return ext.pop() if len(ext) == 1 else None


def _name_stores(node: ast.AST) -> dict[str, list[ast.expr | None]]:
    """Each name stored to under `node` -> the value each of its stores binds (None for a store
    that is not a plain assignment: unpacking, augmented, a loop target)."""
    parents = parent_map(node)
    out: dict[str, list[ast.expr | None]] = {}
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.setdefault(n.id, []).append(_assigned_value(n, parents))
    return out


def _extension_globals(tree: ast.Module, aliases: dict[str, str]) -> set[str]:
    """Names a function declares `global` and that every store anywhere binds to None or to the
    extension: the build-once singleton (`if _ext is None: _ext = load_inline(...)`)."""
    declared = {name for n in ast.walk(tree) if isinstance(n, ast.Global) for name in n.names}
    stores = _name_stores(tree)
    return {
        name for name in declared
        if stores.get(name) and None not in {_extension_of(v, aliases, none_ok=True) for v in stores[name]}
    }  # fmt: skip


def _returns_extension(fn: ast.AST, aliases: dict[str, str], none_ok: bool = False) -> bool:
    """Every `return` in `fn` gives the extension (or, where `none_ok`, None, a bare `return`
    too) and one gives the extension."""
    returns = [n.value for n in ast.walk(fn) if isinstance(n, ast.Return)]
    bound = {"None" if r is None and none_ok else _extension_of(r, aliases, none_ok=none_ok) for r in returns}
    return None not in bound and bool(bound - {"None"})


def _extension_getters(tree: ast.Module, aliases: dict[str, str]) -> set[str]:
    """Module-level functions whose every `return` gives the extension (`return _ext` of the
    build-once singleton): `getter().f(x)` calls the extension."""
    return {
        fn.name for fn in tree.body
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and not fn.args.args and not fn.args.posonlyargs
        and _returns_extension(fn, aliases)
    }  # fmt: skip


def _extension_methods(info: ClassFacts, aliases: dict[str, str]) -> set[str]:
    """Methods whose every `return` gives the extension or None, and one gives the extension
    (`def _load(self): return load_inline(...)`, rewritten to `return (cuda_extension)`; also
    through a local bound to it): `self._load()` is the extension, unless an attribute of that
    name is assigned anywhere (`self._load = ...` would shadow the method)."""
    return {
        name for name, fn in info.methods.items()
        if _returns_extension(fn, aliases | local_extension(fn, aliases), none_ok=True)
    }  # fmt: skip


def _class_extension_attrs(tree: ast.Module, classes: dict[str, ClassFacts], aliases: dict[str, str]) -> dict[str, str]:
    """"Cls.attr" -> the extension, for a class attribute that every store binds to the
    extension or None and one to the extension: `ops = load_inline(...)` in the class body,
    `Cls.ops = load_inline(...)` anywhere, `self.ops = ...` in the class's methods. Any other
    store (unpacking, augmented, another value) disqualifies the attribute."""
    scopes: dict[int, dict[str, str]] = {}  # id(function) -> aliases with its extension locals
    bound: dict[str, set[str | None]] = {}
    for attr, value, fn, owner in _attribute_stores(tree, classes):
        if fn is not None and id(fn) not in scopes:
            scopes[id(fn)] = aliases | local_extension(fn, aliases)
        scope = scopes[id(fn)] if fn is not None else aliases
        q = _extension_of(value, scope, classes[owner].aliases, none_ok=True)
        bound.setdefault(f"{owner}.{attr}", set()).add(q)
    return {key: q for key, qs in bound.items() if (q := _one_extension(qs)) is not None}


def _attribute_stores(tree: ast.Module, classes: dict[str, ClassFacts]):
    """(attr, value, enclosing function, class) for each store of a class's attribute: a Name
    target in its body, `Cls.attr` anywhere, `self.attr` in its methods. `value` is None when
    the store is not a plain assignment."""
    owner_of = {id(fn): name for name, info in classes.items() for fn in info.methods.values()}

    def walk(node: ast.AST, fn: ast.AST | None, cls: str | None):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for child in ast.iter_child_nodes(node):
                yield from walk(child, node, owner_of.get(id(node), cls if fn is not None else None))
            return
        if isinstance(node, ast.ClassDef) and node.name in classes and fn is None:
            for stmt in node.body:
                assign = isinstance(stmt, ast.Assign)
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    yield stmt.name, None, None, node.name  # a def of the same name rebinds it
                for t in stmt.targets if assign else [getattr(stmt, "target", None)]:
                    if isinstance(t, ast.Name):
                        yield t.id, stmt.value if assign else None, None, node.name
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name):
            owner = node.value.id if node.value.id in classes else cls if node.value.id == "self" else None
            if owner is not None:
                yield node.attr, _assigned_value(node, parents), fn, owner
        for child in ast.iter_child_nodes(node):
            yield from walk(child, fn, cls)

    parents = parent_map(tree)
    yield from walk(tree, None, None)


def _assigned_value(target: ast.expr, parents: dict[int, ast.AST]) -> ast.expr | None:
    """The value of the plain assignment whose target `target` is, else None."""
    parent = parents.get(id(target))
    return parent.value if isinstance(parent, ast.Assign) and target in parent.targets else None


def local_extension(
    fn: ast.AST, aliases: dict[str, str], params: list[str] | None = None, self_aliases: dict[str, str] | None = None
) -> dict[str, str]:
    """Local names every store in `fn` binds to the extension (`ops = _get_ext()`, `ext =
    load_inline(...)` rewritten to `ext = (cuda_extension)`), other than its parameters."""
    if params is None and isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
    out = {}
    for name, values in _name_stores(fn).items():
        q = _one_extension({_extension_of(v, aliases, self_aliases) for v in values})
        if q is not None and name not in (params or ()):
            out[name] = q
    return out


def _is_none(value: ast.expr) -> bool:
    return isinstance(value, ast.Constant) and value.value is None


def _assigned(stmt: ast.stmt) -> list[str]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    return [n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)]


def _add_reference_facts(facts: ModuleFacts, reference: str) -> None:
    """The reference's facts, from one parse of the task's source (none when it does not parse):
    its literal globals, its top-level imports, what its Model's `__init__` reads from module level
    and what its forward keeps on self."""
    try:
        tree = ast.parse(reference)
    except SyntaxError:
        return
    facts.reference_globals = module_constants(tree)
    names = {a.name for s in tree.body if isinstance(s, ast.Import) for a in s.names}
    names |= {s.module for s in tree.body if isinstance(s, ast.ImportFrom) and s.module and not s.level}
    facts.reference_imports = {n.split(".")[0] for n in names}
    model = next((s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == "Model"), None)
    methods = _methods(model) if model is not None else {}
    if "__init__" in methods:
        facts.reference_init_reads = global_reads(methods["__init__"])
    if "forward" in methods:
        stores = [t for n in ast.walk(methods["forward"]) if isinstance(n, ast.Assign) for t in n.targets]
        facts.reference_state = {t.attr for t in stores if isinstance(t, ast.Attribute) and root_name(t) == "self"}


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {s.name: s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _is_autograd(info: ClassFacts, facts: ModuleFacts, depth: int = 0) -> bool:
    for base in info.node.bases if info.node is not None else ():
        if qualname(base, facts.aliases, {}) == "torch.autograd.Function":
            return True
        parent = facts.classes.get(base.id) if isinstance(base, ast.Name) else None
        if parent is not None and parent is not info and depth < 5 and _is_autograd(parent, facts, depth + 1):
            return True
    return False


def nested_class_facts(node: ast.ClassDef, key: str, facts: ModuleFacts) -> ClassFacts:
    """The facts of a class defined inside a function (a helper module built in a method), under
    `key`, a name no top-level class or function can take: its methods are its own, not helpers
    of the function it sits in."""
    info = ClassFacts(key, node, _methods(node))
    info.autograd = _is_autograd(info, facts)
    _bind_attrs(info, facts, set(facts.classes))
    return info


# ---------------------------------------------------------------------------------------------
# What a class binds on self while it is built.


def _bind_attrs(info: ClassFacts, facts: ModuleFacts, local: set[str]) -> None:
    """Parameters, buffers and submodules bound in __init__ and in the helpers only it calls."""
    builders = [fn for name, fn in info.methods.items() if name == "__init__" or f"{info.name}.{name}" in facts.init_only]
    for fn in builders:
        for node in _own_nodes(fn):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        _record_attr(info, t.attr, node.value, facts, local, fn)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in ("register_buffer", "register_parameter") and node.args:
                    if isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                        info.tensors.add(node.args[0].value)


def _own_nodes(fn: ast.AST) -> list[ast.AST]:
    """`ast.walk(fn)` without the bodies of the classes defined in it: their `self` and their
    `return`s are another object's."""
    out, todo = [], [fn]
    while todo:
        node = todo.pop(0)
        out.append(node)
        todo += [c for c in ast.iter_child_nodes(node) if not isinstance(c, ast.ClassDef)]
    return out


def _helper_returns(value: ast.expr, info: ClassFacts, facts: ModuleFacts) -> ast.FunctionDef | None:
    """The init-only helper that `value` (`self._make_layer(...)`, `block(...)`) calls, if any."""
    if not isinstance(value, ast.Call):
        return None
    func = value.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        key = f"{info.name}.{func.attr}"
        return info.methods.get(func.attr) if key in facts.init_only else None
    if isinstance(func, ast.Name) and func.id in facts.init_only:
        return facts.functions.get(func.id)
    return None


def _built_by_helper(
    value: ast.expr, info: ClassFacts, facts: ModuleFacts, local: set[str], depth: int = 0
) -> str | None:
    """"local" or "torch" when `value` calls an init-only helper returning such a module (through
    other helpers too), "" for a helper returning something else, None when it calls none."""
    helper = _helper_returns(value, info, facts)
    if helper is None or depth > 4:
        return None
    kinds = set()
    for r in (n.value for n in _own_nodes(helper) if isinstance(n, ast.Return) and n.value is not None):
        rq = qualname(r.func if isinstance(r, ast.Call) else r, facts.aliases, {})
        if _builds_local_module(r, rq, facts, local, helper):
            kinds.add("local")
        elif (rq or "").startswith("torch.nn.") or _bound_to_torch_module(r, helper, facts):
            kinds.add("torch")
        else:
            kinds.add(_built_by_helper(r, info, facts, local, depth + 1) or "")
    return "torch" if "torch" in kinds else "local" if kinds == {"local"} else ""


def _record_attr(
    info: ClassFacts, attr: str, value: ast.expr, facts: ModuleFacts, local: set[str], scope: ast.AST
) -> None:
    aliases = facts.aliases | local_extension(scope, facts.aliases, self_aliases=info.aliases)  # `self.k = ext`
    whole = qualname(value, aliases, info.aliases)
    if isinstance(value, ast.Call) and whole == "cuda_extension":  # self.ext = _get_ext(), self._load()
        info.aliases[attr] = whole
        return
    kind = _built_by_helper(value, info, facts, local)
    if kind == "local":
        info.local_modules.add(attr)
    elif kind == "torch":
        info.torch_modules.add(attr)
    if kind is not None:
        return
    q = qualname(value.func if isinstance(value, ast.Call) else value, aliases, {})
    if _builds_local_module(value, q, facts, local, scope):
        info.local_modules.add(attr)
        return
    if q is None:
        return
    last = q.rsplit(".", 1)[-1]
    if not isinstance(value, ast.Call):
        info.aliases[attr] = q
    elif q == "torch.nn.Parameter" or (q.startswith("torch.") and not last[:1].isupper()):
        info.tensors.add(attr)
    elif q.startswith("torch.nn."):
        info.torch_modules.add(attr)


def _builds_local_module(
    value: ast.expr, q: str | None, facts: ModuleFacts, local: set[str], scope: ast.AST | None = None
) -> bool:
    """`Block(...)`, or a ModuleList/Sequential whose modules are all local classes (also when
    they reach it through a list built in `scope`: `layers.append(Block(...))`, `*layers`). A
    class that `scope` defines is local too: the checker walks its methods where it is defined."""
    if scope is not None:
        local = local | {n.name for n in ast.walk(scope) if isinstance(n, ast.ClassDef)}
    if isinstance(value, ast.Name) and scope is not None:
        bound = [v for v in _bound_values(value.id, scope) if not isinstance(v, ast.Name)]
        return bool(bound) and all(_builds_local_module(v, None, facts, local, scope) for v in bound)
    if not isinstance(value, ast.Call):
        return False
    if isinstance(value.func, ast.Name) and value.func.id in local:
        return True
    if (q or qualname(value.func, facts.aliases, {})) not in _CONTAINERS:
        return False
    calls = _calls_through(value.args, scope)
    built = [qualname(c.func, facts.aliases, {}) or "" for c in calls]
    uses_local = any(isinstance(c.func, ast.Name) and c.func.id in local for c in calls)
    return uses_local and not any(b.startswith("torch.nn.") for b in built)


def _bound_values(name: str, scope: ast.AST) -> list[ast.expr]:
    """What `name` is bound to in `scope`: assignments, and items appended or extended onto it."""
    out: list[ast.expr] = []
    for node in ast.walk(scope):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            out.append(node.value)
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "extend", "add_module", "insert")
            and isinstance(node.func.value, ast.Name) and node.func.value.id == name
        ):
            out += node.args
    return out


def _calls_through(args: list[ast.expr], scope: ast.AST | None) -> list[ast.Call]:
    """The calls inside `args`, following names (and `*names`) to what `scope` binds them to."""
    calls, seen, todo = [], set(), list(args)
    while todo:
        expr = todo.pop()
        for n in ast.walk(expr):
            if isinstance(n, ast.Call):
                calls.append(n)
            elif isinstance(n, ast.Name) and scope is not None and n.id not in seen:
                seen.add(n.id)
                todo += _bound_values(n.id, scope)
    return calls


def _bound_to_torch_module(value: ast.expr, scope: ast.AST, facts: ModuleFacts) -> bool:
    values = _bound_values(value.id, scope) if isinstance(value, ast.Name) else []
    return any(
        isinstance(v, ast.Call) and (qualname(v.func, facts.aliases, {}) or "").startswith("torch.nn.")
        for v in values
    )


def qualname(node: ast.expr, aliases: dict[str, str], self_aliases: dict[str, str]) -> str | None:
    """`F.relu` -> 'torch.nn.functional.relu' when the chain starts at an import or self.X alias."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Call) and not node.args and not node.keywords:  # a getter of the extension
        if isinstance(node.func, ast.Name):
            return aliases.get(f"{node.func.id}()")  # `_ext()`
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            return self_aliases.get(f"{func.attr}()")  # `self._load()`
        return None
    if not isinstance(node, ast.Attribute):
        return None
    if isinstance(node.value, ast.Name) and node.value.id == "self":
        return self_aliases.get(node.attr)
    if isinstance(node.value, ast.Name) and f"{node.value.id}.{node.attr}" in aliases:
        return aliases[f"{node.value.id}.{node.attr}"]  # a class attribute holding the extension
    base = qualname(node.value, aliases, self_aliases)
    return f"{base}.{node.attr}" if base else None


def root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


class TensorTyping:
    """Mixin: `is_tensor(expr)` given `self.tensors` (local names), `self.cls` and `self.facts`."""

    tensors: set[str]
    cls: ClassFacts | None
    facts: ModuleFacts

    def self_aliases(self) -> dict[str, str]:
        return self.cls.aliases if self.cls is not None else {}

    def is_tensor(self, e: ast.expr) -> bool:
        if isinstance(e, ast.Name):
            return e.id in self.tensors
        if isinstance(e, ast.Attribute):
            return self._attr_is_tensor(e)
        if isinstance(e, ast.Call):
            return self._call_is_tensor(e)
        if isinstance(e, (ast.Subscript, ast.Starred)):
            return self.is_tensor(e.value)
        if isinstance(e, ast.BinOp):
            return self.is_tensor(e.left) or self.is_tensor(e.right)
        if isinstance(e, ast.UnaryOp):
            return self.is_tensor(e.operand)
        if isinstance(e, ast.IfExp):
            return self.is_tensor(e.body) or self.is_tensor(e.orelse)
        return False

    def _attr_is_tensor(self, e: ast.Attribute) -> bool:
        if e.attr in P.TENSOR_METADATA_ATTRS:
            return False
        if isinstance(e.value, ast.Name) and e.value.id == "self":
            return self.cls is not None and e.attr in self.cls.tensors
        if (
            isinstance(e.value, ast.Attribute)
            and root_name(e.value) == "self"
            and self.cls is not None
        ):
            if e.value.attr in self.cls.torch_modules:
                return e.attr in _SUBMODULE_TENSORS
        return e.attr in P.TENSOR_VIEW_ATTRS and self.is_tensor(e.value)

    def _call_is_tensor(self, e: ast.Call) -> bool:
        q = qualname(e.func, self.facts.aliases, self.self_aliases())
        if q is not None:
            return (
                q.startswith("cuda_extension.")
                or q in _ALLOC
                or (q.startswith("torch.") and q not in P.TORCH_ALLOWED)
            )
        if isinstance(e.func, ast.Attribute):
            if e.func.attr in P.TENSOR_METADATA_METHODS or (e.func.attr == "type" and not e.args and not e.keywords):
                return False  # `.type()` without arguments is the type's name
            if self.is_tensor(e.func.value):
                return True
        return any(self.is_tensor(a) for a in e.args) and not (
            isinstance(e.func, ast.Name) and e.func.id in BUILTIN_NAMES
        )


def is_scalar_annotation(arg: ast.arg) -> bool:
    return isinstance(arg.annotation, ast.Name) and arg.annotation.id in (
        "int",
        "float",
        "bool",
        "str",
    )
