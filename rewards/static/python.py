"""Static checks of a candidate's model_new.py, written with `ast`.

`check_model_new(source, file=..., reference=...) -> list[Finding]` flags the hacks of
rewards/README.md that static analysis can see: torch doing the work in forward (torch.*, F.*,
tensor methods, tensor arithmetic, the `@` operator, torch.nn modules called), the reference Model,
try/except fallbacks, threads and processes, state kept across calls, global flags, side streams,
precision casts, tensor subclasses, monkey-patching, obfuscation (exec/eval/getattr) and
redefinitions of the task's inputs. What is allowed lives in `rewards.static.policy`.

It is not a proof: the dynamic audit (dispatch-level op trace, launch counts, fresh inputs) is
the backstop. To keep honest code clean the checker types expressions as tensor or scalar:
forward's arguments, parameters and buffers, allocations and `cuda_extension` results are
tensors; `.shape`, `.size()`, `.numel()` are scalars. Helpers get tensor-typed parameters from
their call sites (a small fixpoint). `__init__`, and the helpers only `__init__` calls, may create
parameters and modules with torch like Model does; so may a custom autograd function's backward,
which never runs while forward is evaluated, and a copy of get_inputs that nothing calls.

Findings of torch doing part of the work carry `details["partial"]` (what torch does): blocking
under the paper's rules, notes under KernelBench's (`rewards.verdict.apply_rules`). The walk
itself is the same under both rule sets.
"""

from __future__ import annotations

import ast
import sys

from rewards.static import policy as P
from rewards.static.pyexpr import ExpressionChecks
from rewards.static.pyfacts import (
    ClassFacts,
    Ctx,
    ModuleFacts,
    collect_facts,
    is_scalar_annotation,
    local_extension,
    nested_class_facts,
    qualname,
    root_name,
)
from rewards.static.pyscope import constant_value, only_called, rebound
from rewards.verdict import PARTIAL, Finding
from rewards.verdict import HackCategory as H


def check_model_new(
    source: str, *, file: str = "model_new.py", reference: str | None = None,
    build_only_imports: frozenset[str] = frozenset(),
) -> list[Finding]:
    """Findings for one model_new.py; `reference` is the trusted model.py text, if at hand.
    `build_only_imports` are modules a single-file solution uses only to make load_inline's
    ignored build settings (`rewards.inline.settings`): their import is a note."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [
            Finding(
                category=H.LAYOUT, file=file, line=e.lineno or 1, message=f"does not parse: {e.msg}"
            )
        ]
    checker = _Checker(file, collect_facts(tree, reference), build_only_imports)
    checker.run(tree)
    return checker.findings


# ---------------------------------------------------------------------------------------------
# The walk.


class _Checker(ExpressionChecks, ast.NodeVisitor):
    def __init__(self, file: str, facts: ModuleFacts, build_only_imports: frozenset[str] = frozenset()) -> None:
        self.file, self.facts, self.build_only_imports = file, facts, build_only_imports
        self.findings: list[Finding] = []
        self.report = False
        self.ctx = Ctx.MODULE
        self.cls: ClassFacts | None = None
        self.func: str | None = None
        self.tensors: set[str] = set()
        self.params: set[str] = set()
        self.locals: set[str] = set()
        self.tensor_params: dict[str, set[str]] = {}  # function key -> tensor-typed parameters
        self.calls_extension = False
        self.module_vars: set[str] = set()
        self.autograd_ctx: str | None = None  # the ctx argument of an autograd function's forward
        self.fn_node: ast.FunctionDef | ast.AsyncFunctionDef | None = None  # the function being walked
        self.rebound: dict[str, int] = {}
        self.module_aliases = facts.aliases  # each function's walk adds its own locals to facts.aliases

    def run(self, tree: ast.Module) -> None:
        for _ in range(5):  # typing fixpoint over helper parameters
            before = {k: set(v) for k, v in self.tensor_params.items()}
            self.visit(tree)
            if before == self.tensor_params:
                break
        self.report = True
        self.visit(tree)
        self._check_layout(tree)

    def flag(
        self, node: ast.AST, category: H, message: str, partial: str = "", *, blocking: bool = True
    ) -> None:
        if not self.report:
            return
        f = Finding(
            category=category,
            file=self.file,
            line=getattr(node, "lineno", 1),
            message=message,
            blocking=blocking,
            details={PARTIAL: partial} if partial else {},
        )
        if f not in self.findings:
            self.findings.append(f)

    def _check_layout(self, tree: ast.Module) -> None:
        cls = self.facts.classes.get("ModelNew")
        if cls is None:
            self.flag(tree, H.LAYOUT, "model_new.py must define `class ModelNew(nn.Module)`")
        elif "forward" not in cls.methods:
            self.flag(tree, H.LAYOUT, "ModelNew has no forward method")
        elif not self.calls_extension:
            self.flag(
                cls.methods["forward"],
                H.DECOY_KERNEL,
                "forward never calls cuda_extension: the compiled kernels cannot be doing the work",
            )

    # --- imports, classes, functions -----------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._check_module(node, a.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.flag(
                node,
                H.FORBIDDEN_IMPORT,
                "relative import: only torch, cuda_extension and the stdlib allow-list",
            )
        elif node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
            if not all(n in P.TORCH_QUERIES or n in P.AUTOCAST_ENABLED_ARG for n in names):
                self._check_module(node, node.module)  # else each use is judged where it is made
            for name in names:
                self._check_stdlib_name(node, name)
                if name.split(".")[0] == "numpy":
                    self._check_numpy(node, name)

    def _check_module(self, node: ast.Import | ast.ImportFrom, name: str) -> None:
        if name in P.ALLOWED_IMPORTS:
            return
        if name.startswith("torch."):
            self._check_torch(node, name)
            return
        top = name.split(".")[0]
        if top in P.IMPORT_CATEGORIES:
            category, why = P.IMPORT_CATEGORIES[top]
            message = f"import {name}: {why}"
        else:
            category = H.FORBIDDEN_IMPORT
            message = f"import {name}: not in the allow-list ({', '.join(sorted(P.ALLOWED_IMPORTS))})"
        unused = top != "model" and not (_bound_names(node) & self.facts.loaded_names)
        if top in self.build_only_imports:
            self.flag(node, category, f"{message}; used only for load_inline's build settings (a name, a build "
                      "directory), which the compile pool sets", blocking=False)  # fmt: skip
        elif unused and top not in P.IMPORT_CATEGORIES and top in self.facts.reference_imports:
            self.flag(node, category, f"{message}; imported but never used (the task imports it too)", blocking=False)
        elif unused and top in _STDLIB:
            self.flag(node, category, f"{message}; imported but never used", blocking=False)
        else:
            self.flag(node, category, message)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            q = qualname(base, self.facts.aliases, {}) or ""
            if q.startswith("torch.") and q.endswith("Tensor"):
                self.flag(
                    node,
                    H.LAZY_TENSOR,
                    f"class {node.name} subclasses {q}: outputs must be plain tensors",
                )
        if node.name == "ModelNew" and not self._is_module_class(node):
            self.flag(node, H.LAYOUT, "ModelNew must subclass nn.Module")
        for stmt in node.body:
            if isinstance(stmt, ast.FunctionDef) and stmt.name in P.LAZY_HOOKS:
                self.flag(
                    stmt,
                    H.LAZY_TENSOR,
                    f"{stmt.name} intercepts torch calls and can defer or fake results",
                )
        outer, fn_node = self.cls, self.fn_node
        if fn_node is None:
            self.cls = self.facts.classes.get(node.name)
        else:  # defined in a method or function: its methods are not helpers of that function
            ctx, self.ctx = self.ctx, Ctx.RUNTIME  # a torch base (nn.Linear) computes per call
            for base in node.bases:
                self.visit(base)
            self.ctx = ctx
            self.cls = nested_class_facts(node, f"{self.func}.<locals>.{node.name}", self.facts)
            self.fn_node = None
        self.generic_visit(node)
        self.cls, self.fn_node = outer, fn_node

    def _is_module_class(self, node: ast.ClassDef, depth: int = 0) -> bool:
        for base in node.bases:
            if qualname(base, self.facts.aliases, {}) == "torch.nn.Module":
                return True
            local = self.facts.classes.get(base.id) if isinstance(base, ast.Name) else None
            if local is not None and local.node is not None and depth < 5:
                if self._is_module_class(local.node, depth + 1):
                    return True
        return False

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        task_copy = self.ctx is Ctx.MODULE and self.cls is None and node.name in P.TASK_FUNCTIONS
        if task_copy and node.name not in self.facts.dead_task_copies:
            self.flag(
                node,
                H.PROBLEM_SHRINKING,
                f"defines {node.name} and uses it: the harness draws inputs from the task itself",
            )
        for d in node.decorator_list:
            self.visit(d)
        saved = (self.ctx, self.func, self.tensors, self.params, self.locals, self.module_vars,
                 self.autograd_ctx, self.fn_node, self.rebound, self.facts.aliases)  # fmt: skip
        inner_of_init = self.ctx is Ctx.INIT and self.fn_node is not None and only_called(node.name, self.fn_node)
        self.func = self._key(node.name)
        self.ctx = Ctx.INIT if inner_of_init or self._builds_only(node, task_copy) else Ctx.RUNTIME
        self.fn_node = node
        names = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        autograd = self.cls is not None and self.cls.autograd
        self.autograd_ctx = names[0] if autograd and node.name == "forward" and names else None
        if self.cls is not None and names:
            names = names[1:]
        self.params = set(names)
        self.rebound = rebound(node, self.params)
        self.module_vars = set()
        self.locals = set(names) | {
            n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
        self.facts.aliases = self.facts.aliases | local_extension(node, self.facts.aliases, names, self.self_aliases())
        self.tensors = set(self.tensor_params.get(self.func, set()))
        if node.name == "forward" and self.cls is not None:
            self.tensors |= {a.arg for a in node.args.args[1:] if not is_scalar_annotation(a)}
        self._check_defaults(node)
        for stmt in node.body:  # typing pre-pass: flow-insensitive tensor names
            report, self.report = self.report, False
            self.visit(stmt)
            self.report = report
        for stmt in node.body:
            self.visit(stmt)
        (self.ctx, self.func, self.tensors, self.params, self.locals, self.module_vars,
         self.autograd_ctx, self.fn_node, self.rebound, self.facts.aliases) = saved  # fmt: skip

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        """A lambda made while the model is built is kept to run later (`self.forward = lambda
        x: ...`): its body is checked as per-call code."""
        saved = self.ctx
        self.ctx = Ctx.RUNTIME if self.ctx is Ctx.INIT else self.ctx
        self.generic_visit(node)
        self.ctx = saved

    def _builds_only(self, node: ast.FunctionDef | ast.AsyncFunctionDef, task_copy: bool) -> bool:
        """Code that runs only while the model is built (or never while forward is evaluated):
        __init__, the helpers only it calls, an autograd function's backward, a dead task copy.
        The `__init__` of a class defined in per-call code runs per call (`constructing`)."""
        if self.cls is not None and node.name == "__init__":
            return self.ctx is not Ctx.RUNTIME
        if self.cls is not None and self.cls.autograd and node.name in P.AUTOGRAD_GRAD_METHODS:
            return True
        return self.func in self.facts.init_only or (task_copy and node.name in self.facts.dead_task_copies)

    def constructing(self) -> bool:
        """In the `__init__` of a class defined in per-call code: each call builds a new instance,
        so its own attributes and its base's `__init__` are construction, not state kept across
        calls; torch compute there is still per-call work."""
        init = self.cls.methods.get("__init__") if self.cls is not None else None
        return self.ctx is Ctx.RUNTIME and init is not None and self.fn_node is init

    def _key(self, name: str) -> str:
        return f"{self.cls.name}.{name}" if self.cls is not None else name

    def _check_defaults(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            if self.ctx is Ctx.RUNTIME and isinstance(d, (ast.List, ast.Dict, ast.Set, ast.Call)):
                self.flag(d, H.OUTPUT_CACHING, "mutable default argument keeps state across calls")
            self.visit(d)

    # --- statements ----------------------------------------------------------------------------

    def visit_Try(self, node: ast.Try) -> None:
        if not _BuildBindings(self.facts, self.cls, self.facts.aliases, self.module_aliases).guards(node):
            self.flag(
                node,
                H.FALLBACK_PATH,
                "try/except is a fallback path: a failing kernel must fail, not fall back",
            )
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_Global(self, node: ast.Global | ast.Nonlocal) -> None:
        singleton = isinstance(node, ast.Global) and set(node.names) <= self.facts.extension_globals
        if self.ctx is not Ctx.MODULE and not singleton:  # building the extension once is no state
            self.flag(
                node,
                H.OUTPUT_CACHING,
                f"global/nonlocal {', '.join(node.names)} keeps state across calls",
            )

    visit_Nonlocal = visit_Global

    def visit_Assign(self, node: ast.Assign | ast.AnnAssign) -> None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            self._check_store(t, node)
            if node.value is not None:
                self._bind(t, node.value)
        self.generic_visit(node)

    visit_AnnAssign = visit_Assign

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_store(node.target, node)
        if isinstance(node.target, ast.Name) and self.is_tensor(node.target):
            if self.is_input(node.target.id, node):
                self.flag(
                    node, H.INPUT_MUTATION, f"in-place arithmetic on the input {node.target.id}"
                )
            elif self.ctx is not Ctx.INIT:
                self.flag(
                    node,
                    H.TORCH_COMPUTE,
                    f"in-place tensor arithmetic on {node.target.id} runs a torch kernel",
                    partial="in-place tensor arithmetic",
                )
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        if self.is_tensor(node.iter):
            self._bind_all(node.target)
        it = node.iter
        if isinstance(it, ast.Attribute) and root_name(it) == "self" and self.cls is not None:
            if it.attr in self.cls.local_modules:
                self.module_vars |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        self.generic_visit(node)

    def _check_store(self, target: ast.expr, node: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._check_store(t, node)
            return
        if isinstance(target, ast.Name):
            self._check_module_store(target, node)
            return
        q = qualname(target, self.facts.aliases, {})
        if q is not None and not self._binds_class_extension(target):
            category = H.GLOBAL_STATE if q.startswith("torch.backends") else H.MONKEY_PATCH
            self.flag(node, category, f"assigns {q}: rebinding library state is not allowed")
            return
        root = root_name(target)
        if self.ctx is Ctx.RUNTIME and _own_state(target, self.facts.reference_state):
            return  # the task's own Model keeps this attribute across calls
        if self.ctx is Ctx.RUNTIME and root == "self" and not self.constructing():
            self.flag(
                node,
                H.OUTPUT_CACHING,
                f"assigns {ast.unparse(target)} in {self.func}: state kept across calls",
            )
        elif self.ctx is Ctx.RUNTIME and root is not None and self.is_input(root, node):
            self.flag(node, H.INPUT_MUTATION, f"writes into the input {root}")
        elif self.ctx is Ctx.RUNTIME and root in self._module_level() and root not in self.locals:
            self.flag(
                node, H.OUTPUT_CACHING, f"writes into module-level {root}: state kept across calls"
            )
        elif (
            self.ctx is not Ctx.INIT
            and isinstance(target, ast.Subscript)
            and self.is_tensor(target.value)
        ):
            self.flag(
                node,
                H.TORCH_COMPUTE,
                f"indexed assignment into tensor {ast.unparse(target.value)} runs a torch copy",
                partial="an indexed tensor copy",
            )

    def _binds_class_extension(self, target: ast.expr) -> bool:
        """`Cls.ops = ...` of a class attribute that every store binds to the extension or None
        (`rewards.static.pyfacts`): building it is no patch of library state."""
        return isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
            and f"{target.value.id}.{target.attr}" in self.facts.aliases and target.value.id in self.facts.classes

    def _module_level(self) -> set[str]:
        """Module-level names whose attributes or items outlive a call (classes included)."""
        return self.facts.module_names | set(self.facts.classes) | set(self.facts.functions)

    def _check_module_store(self, target: ast.Name, node: ast.AST) -> None:
        if self.ctx is not Ctx.MODULE or self.cls is not None:
            return
        if target.id in P.TASK_FUNCTIONS:
            self.flag(
                node,
                H.PROBLEM_SHRINKING,
                f"rebinds {target.id}: the harness draws inputs from the task itself",
            )
        value = getattr(node, "value", None)
        ref = self.facts.reference_globals
        if target.id in ref and value is not None:
            mine = constant_value(value, self.facts.module_constants)
            if mine == ref[target.id]:
                return
            shown = f"{target.id} = {ast.unparse(value)[:40]}, the task's {ref[target.id]!r}"
            if target.id in self.facts.loaded_names and self._sizes_state_as_the_task_does(target.id):
                self.flag(node, H.PROBLEM_SHRINKING, f"a copy of the task's global with another value ({shown}), "
                          "read only while the model is built, as the task's Model.__init__ reads it",
                          blocking=False)  # fmt: skip
            elif target.id in self.facts.loaded_names:
                self.flag(node, H.PROBLEM_SHRINKING, f"rebinds the task's global {target.id} to a "
                          f"different value and uses it ({shown})")  # fmt: skip
            else:
                self.flag(node, H.PROBLEM_SHRINKING, f"a copy of the task's global with another value "
                          f"({shown}) that nothing here reads: the harness draws inputs from the task itself",
                          blocking=False)  # fmt: skip

    def _sizes_state_as_the_task_does(self, name: str) -> bool:
        """The task's Model.__init__ reads the global `name` (an RNN sizing its hidden state by
        batch_size) and here only code that runs while the model is built reads it: the copy
        mirrors the task's own construction; what forward computes never reads it."""
        return name in self.facts.reference_init_reads and name not in self.facts.per_call_names

    def _bind(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            if self.is_tensor(value):
                self.tensors.add(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                for t, v in zip(target.elts, value.elts, strict=True):
                    self._bind(t, v)
            elif self.is_tensor(value):
                self._bind_all(target)

    def _bind_all(self, target: ast.expr) -> None:
        self.tensors |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


_STDLIB = sys.stdlib_module_names  # importing an unused stdlib module runs nothing of the candidate's


def _own_state(target: ast.expr, state: set[str]) -> bool:
    """`self.hidden = ...` where the reference's forward assigns `self.hidden` itself."""
    return (
        isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
        and target.value.id == "self" and target.attr in state
    )


def _bound_names(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.asname or a.name.split(".")[0] for a in node.names}
    return {a.asname or a.name for a in node.names}


class _BuildBindings:
    """The statements that bind the prebuilt extension, as one function (or module level) sees
    its names: `import cuda_extension`, `ext = load_inline(...)` (rewritten to `ext =
    (cuda_extension)`), `self.k = ext.f`, `return ext`, and `self.k = self._load()` or `ext =
    _get()` when the getter itself only builds (`_builds_only`)."""

    def __init__(
        self, facts: ModuleFacts, cls: ClassFacts | None, aliases: dict[str, str], module_aliases: dict[str, str],
        depth: int = 0,
    ) -> None:
        self.facts, self.cls, self.aliases, self.module_aliases, self.depth = facts, cls, aliases, module_aliases, depth

    def guards(self, node: ast.Try) -> bool:
        """`try:` around binding the extension, with at most flags and prints besides: the
        compile pool builds the extension before anything runs and a failed build is a verdict,
        so the except branch can never run. Anything else in the try body (a test call of a
        kernel) could fail and fall back."""
        if node.orelse or node.finalbody or not all(map(self.binds_or_notes, node.body)):
            return False
        return any(map(self.binds, node.body))

    def binds(self, stmt: ast.stmt) -> bool:
        if isinstance(stmt, ast.Import):
            return all(a.name == "cuda_extension" for a in stmt.names)
        if isinstance(stmt, ast.ImportFrom):
            return stmt.module == "cuda_extension"
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.Return)) else None
        if value is None:
            return False
        self_aliases = self.cls.aliases if self.cls is not None else {}
        if isinstance(value, ast.Call):
            getter = self._getter(value, self_aliases)
            return getter is not None and self._builds_only(getter)
        q = qualname(value, self.aliases, self_aliases) or ""
        return root_name(value) == "cuda_extension" or q.split(".")[0] == "cuda_extension"

    def binds_or_notes(self, stmt: ast.stmt) -> bool:
        """Binds the extension, sets a flag to a constant, passes or prints."""
        if self.binds(stmt) or isinstance(stmt, ast.Pass):
            return True
        if isinstance(stmt, ast.Assign):
            return isinstance(stmt.value, ast.Constant)
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print"

    def _getter(self, call: ast.Call, self_aliases: dict[str, str]) -> ast.FunctionDef | None:
        """The function a call of an extension getter (`_get()`, `self._load()`) runs."""
        if qualname(call, self.aliases, self_aliases) != "cuda_extension":
            return None
        if isinstance(call.func, ast.Name):
            return self.facts.functions.get(call.func.id)
        return self.cls.methods.get(call.func.attr) if self.cls is not None else None

    def _builds_only(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        """Every statement of `fn` binds or returns the extension (or None), notes, or is a try
        that guards the build: calling it can fail only where the build would."""
        if self.depth > 3:
            return False
        cls = self.cls if self.cls is not None and fn in self.cls.methods.values() else None
        aliases = self.module_aliases | local_extension(fn, self.module_aliases, None, cls.aliases if cls else None)
        inner = _BuildBindings(self.facts, cls, aliases, self.module_aliases, self.depth + 1)
        docstring = fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant)
        return all(
            _returns_none(s) or inner.binds_or_notes(s) or (isinstance(s, ast.Try) and inner.guards(s))
            for s in fn.body[1 if docstring else 0:]
        )


def _returns_none(stmt: ast.stmt) -> bool:
    """`return` or `return None`."""
    if not isinstance(stmt, ast.Return):
        return False
    return stmt.value is None or (isinstance(stmt.value, ast.Constant) and stmt.value.value is None)
