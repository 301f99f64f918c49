"""What the model_new.py checker knows before and during its walk: facts and expression types.

`collect_facts` gathers import aliases (`F` -> torch.nn.functional), each class's parameters,
buffers and torch submodules from its `__init__`, module-level names, and from the trusted
reference its literal globals and whether it computes in low precision. `TensorTyping` decides
whether an expression is a tensor (forward's arguments, parameters, allocations, cuda_extension
results, views of tensors) or a scalar (`.shape`, `.size()`, `.numel()`): arithmetic on the first
is torch compute, on the second launch-configuration maths. Used only by `rewards.static.python`.
"""

from __future__ import annotations

import ast
import builtins
import enum
import re
from dataclasses import dataclass, field

from rewards.static import policy as P

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
    aliases: dict[str, str] = field(default_factory=dict)  # self.X = cuda_extension


@dataclass
class ModuleFacts:
    """Imports, top-level definitions and names of one model_new.py, and the reference's facts."""

    aliases: dict[str, str]
    classes: dict[str, ClassFacts]
    functions: dict[str, ast.FunctionDef]
    module_names: set[str]
    low_precision_ok: bool
    reference_globals: dict[str, object]


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
    facts = ModuleFacts(aliases, {}, {}, set(), False, {})
    local = {s.name for s in tree.body if isinstance(s, ast.ClassDef)}
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef):
            facts.classes[stmt.name] = _class_facts(stmt, facts, local)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            facts.functions[stmt.name] = stmt
        for t in _assigned(stmt):
            facts.module_names.add(t)
    if reference is not None:
        facts.low_precision_ok = bool(_LOW_PRECISION.search(reference))
        facts.reference_globals = _literal_globals(reference)
    return facts


def _assigned(stmt: ast.stmt) -> list[str]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    return [n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)]


def _literal_globals(reference: str) -> dict[str, object]:
    try:
        tree = ast.parse(reference)
    except SyntaxError:
        return {}
    out = {}
    for stmt in tree.body:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
        ):
            try:
                out[stmt.targets[0].id] = ast.literal_eval(stmt.value)
            except ValueError:
                pass
    return out


def _class_facts(cls: ast.ClassDef, facts: ModuleFacts, local: set[str]) -> ClassFacts:
    info = ClassFacts(cls.name, cls)
    info.methods = {
        s.name: s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    init = info.methods.get("__init__")
    for node in ast.walk(init) if init else ():
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    _record_attr(info, t.attr, node.value, facts, local)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("register_buffer", "register_parameter") and node.args:
                if isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                    info.tensors.add(node.args[0].value)
    return info


def _record_attr(
    info: ClassFacts, attr: str, value: ast.expr, facts: ModuleFacts, local: set[str]
) -> None:
    q = qualname(value.func if isinstance(value, ast.Call) else value, facts.aliases, {})
    if _builds_local_module(value, q, facts, local):
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
    value: ast.expr, q: str | None, facts: ModuleFacts, local: set[str]
) -> bool:
    """`Block(...)`, or a ModuleList/Sequential whose modules are all local classes."""
    if not isinstance(value, ast.Call):
        return False
    if isinstance(value.func, ast.Name) and value.func.id in local:
        return True
    if q not in _CONTAINERS:
        return False
    calls = [n for a in value.args for n in ast.walk(a) if isinstance(n, ast.Call)]
    built = [qualname(c.func, facts.aliases, {}) or "" for c in calls]
    uses_local = any(isinstance(c.func, ast.Name) and c.func.id in local for c in calls)
    return uses_local and not any(b.startswith("torch.nn.") for b in built)


def qualname(node: ast.expr, aliases: dict[str, str], self_aliases: dict[str, str]) -> str | None:
    """`F.relu` -> 'torch.nn.functional.relu' when the chain starts at an import or self.X alias."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if not isinstance(node, ast.Attribute):
        return None
    if isinstance(node.value, ast.Name) and node.value.id == "self":
        return self_aliases.get(node.attr)
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
            if e.func.attr in P.TENSOR_METADATA_METHODS:
                return False
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
