"""What the names of a model_new.py are bound to where a load_inline argument is read, without running it.

What it is: `Bindings(tree, aliases)`, the base of `rewards.inline.fold.Folder`: `scope_before(stmt)`
replays the statements that run before `stmt` in its module, class and function bodies and
records each binding as the expression it was assigned (a `Lazy`, evaluated by the folder once a
use needs it) or as an `Opaque` marker saying why its value is unknown: bound in a loop, by an
import or a `with`, a parameter. The branches of an `if` or `try` are `Merged`: a use gets the
value they agree on, or the one value the binding branches give a name unbound before. A
function body sees its locals, then the enclosing function, then the module as it stands once
the file has run. `self.attr` resolves to the one value the class's methods assign it.
What it is not: the evaluation of expressions (`rewards.inline.fold`); nothing here runs code.
"""

from __future__ import annotations

import ast

MAX_CHARS = 8 << 20  # a folded string or list longer than this is refused
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_SCOPES = (*FUNCTIONS, ast.ClassDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


class NotFoldable(Exception):
    """The expression has no value known without running the file; the message says why."""


class Opaque:
    """A binding whose value is not known; `why` is what a use of it reports."""

    def __init__(self, why: str) -> None:
        self.why = why


class Def:
    """A function or class of the file, bound to its name."""

    def __init__(self, node: ast.AST) -> None:
        self.node = node


class Lazy:
    """`node` as evaluated in `scope` (a snapshot), item `index` of it if set; computed once."""

    def __init__(self, node: ast.AST, scope: Scope, index: int | None = None) -> None:
        self.node, self.scope, self.index, self.state, self.result = node, scope, index, "new", None


class Merged:
    """A name after branches (`where`) that may bind it: `before` and each branch's binding."""

    def __init__(self, before: object, values: list[object], where: str) -> None:
        self.before, self.values, self.where = before, values, where


MISSING = object()


class Scope:
    """Bindings so far in one function, class or module body (keys: names and `self.attr`).
    `local`: every name the function binds somewhere (a use before its binding is unbound)."""

    def __init__(self, parent: Scope | None = None, local: frozenset[str] = frozenset(), owner: ast.AST | None = None):
        self.vars: dict[str, object] = {}
        self.parent, self.local, self.owner = parent, local, owner

    def snapshot(self) -> Scope:
        copy = Scope(self.parent, self.local, self.owner)
        copy.vars = dict(self.vars)
        return copy

    def lookup(self, key: str) -> object:
        scope = self
        while scope is not None:
            if key in scope.vars:
                return scope.vars[key]
            if key in scope.local:
                return Opaque(f"{key!r} is used before it is assigned in this function")
            scope = scope.parent
        return MISSING


def check_size(value: object) -> object:
    if isinstance(value, (str, list, tuple, dict)) and len(value) > MAX_CHARS:
        raise NotFoldable(f"the folded value has {len(value)} items (more than {MAX_CHARS})")
    return value


# -- the syntax of bindings --------------------------------------------------------------------


def key_of(node: ast.AST) -> str | None:
    """`x` or `x.attr` (one level: `self.cuda_source`), else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


def _targets(node: ast.AST) -> list[str]:
    """The keys an assignment target binds (a subscript or starred target binds its base)."""
    if (key := key_of(node)) is not None:
        return [key]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [k for e in node.elts for k in _targets(e)]
    if isinstance(node, (ast.Subscript, ast.Starred)):
        return _targets(node.value)
    return []


def _statement_targets(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Assign):
        return [k for t in node.targets for k in _targets(t)]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.comprehension, ast.NamedExpr)):
        return _targets(node.target)
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [k for item in node.items if item.optional_vars for k in _targets(item.optional_vars)]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, ast.ExceptHandler) and node.name:
        return [node.name]
    if isinstance(node, ast.Delete):
        return [k for t in node.targets for k in _targets(t)]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    return []


def own_nodes(stmts: list[ast.AST]) -> list[ast.AST]:
    """The nodes of `stmts`, the bodies of nested functions and classes left out."""
    out, todo = [], list(stmts)
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return out


def _assigned(stmts: list[ast.AST]) -> set[str]:
    return {k for node in own_nodes(stmts) for k in _statement_targets(node)}


def same(a: object, b: object) -> bool:
    if any(isinstance(x, (Opaque, Def)) or x is MISSING for x in (a, b)):
        return a is b
    return type(a) is type(b) and a == b


def line_of(node: ast.AST) -> str:
    return f"line {getattr(node, 'lineno', '?')}"


# Values worked out inside one another: expressions, name lookups, a name rebound in `if` branches
# after `if` branches. Each level costs at most seven Python frames (a name through `if` branches or
# a class attribute), so the folder refuses at about 700 frames whatever the interpreter's recursion
# limit (torch Inductor raises it to 2000). Honest sources nest under 10 levels; `SRC = SRC + SRC`
# forty times, refused for its size, reaches 82.
MAX_NESTING = 100


class Bindings:
    """Scopes of one parsed file; a subclass evaluates expressions (`value`)."""

    def __init__(self, tree: ast.Module, aliases: dict[str, str]) -> None:
        self.tree, self.aliases = tree, aliases
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self._module_end: Scope | None = None
        self._attributes: dict[tuple[int, str], object] = {}
        self._nesting = 0  # levels of `_deeper` entered and not yet left

    def _deeper(self, node: ast.AST) -> None:
        """One level further in (the caller steps back out with `self._nesting -= 1` in a
        `finally`); past `MAX_NESTING` levels the source is refused."""
        if self._nesting >= MAX_NESTING:
            raise NotFoldable(f"{line_of(node)}: nested too deeply (more than {MAX_NESTING} levels)")
        self._nesting += 1

    def value(self, node: ast.AST, scope: Scope | None = None) -> object:
        """The value of `node` where it stands (or in `scope`); raises NotFoldable."""
        raise NotImplementedError

    # -- scopes --------------------------------------------------------------------------------

    def statement_of(self, node: ast.AST) -> ast.stmt:
        while not isinstance(node, ast.stmt):
            node = self.parents[node]
        return node

    def scope_before(self, stmt: ast.stmt, args: dict[str, object] | None = None) -> Scope:
        """The bindings in effect just before `stmt` runs, in its own scope; `args`: the values
        of the enclosing function's parameters, when a call of it is being folded."""
        chain = [stmt]
        while (parent := self.parents.get(chain[0])) is not None and parent is not self.tree:
            chain.insert(0, parent)
        called = self._innermost_function(self.parents.get(stmt))
        scope = Scope()
        for node, inner in zip(chain, chain[1:] + [None]):
            if isinstance(node, ast.stmt):
                block = self._block_of(node)
                for before in block[: next(i for i, s in enumerate(block) if s is node)]:
                    self.bind(before, scope)
            if inner is not None:
                scope = self._enter(node, inner, scope, args if node is called and args is not None else {})
        return scope

    def _block_of(self, stmt: ast.stmt) -> list[ast.stmt]:
        parent = self.parents.get(stmt, self.tree)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and any(s is stmt for s in block):
                return block
        return [stmt]

    def _enter(self, node: ast.AST, inner: ast.AST, scope: Scope, args: dict[str, object]) -> Scope:
        """The scope of `inner`, a child of `node`, given the scope `node` stands in."""
        if isinstance(node, FUNCTIONS):
            return self._function_scope(node, self._enclosing(scope), args)
        if isinstance(node, ast.ClassDef):
            return Scope(scope, owner=node)
        if isinstance(node, _LOOPS) and any(s is inner for s in node.body):
            for key in _assigned(node.body):  # a loop body runs any number of times
                scope.vars[key] = Opaque(f"{key!r} is assigned in the loop at line {node.lineno}")
        if isinstance(node, ast.ExceptHandler) and node.name:
            scope.vars[node.name] = Opaque(f"{node.name!r} is an exception")
        return scope

    def _innermost_function(self, node: ast.AST) -> ast.AST | None:
        while node is not None and not isinstance(node, FUNCTIONS):
            node = self.parents.get(node)
        return node

    def _enclosing(self, scope: Scope) -> Scope:
        """What a function body sees besides its locals: the enclosing function's scope, or the
        module as it stands once the file has run (a class body is not visible from methods)."""
        while isinstance(scope.owner, ast.ClassDef):
            scope = scope.parent
        return self.module_end() if scope.owner is None else scope

    def _function_scope(self, fn: ast.AST, enclosing: Scope, args: dict[str, object]) -> Scope:
        p = fn.args
        names = [a.arg for a in (*p.posonlyargs, *p.args, *p.kwonlyargs, p.vararg, p.kwarg) if a is not None]
        body = fn.body if isinstance(fn.body, list) else []
        local = {k for k in _assigned(body) if "." not in k} | set(names)
        scope = Scope(enclosing, frozenset(local), owner=fn)
        for name in names:
            scope.vars[name] = args.get(name, Opaque(f"{name!r} is a parameter of {getattr(fn, 'name', 'lambda')}()"))
        return scope

    def module_end(self) -> Scope:
        if self._module_end is None:
            self._module_end = Scope()
            for stmt in self.tree.body:
                self.bind(stmt, self._module_end)
        return self._module_end

    # -- statements ----------------------------------------------------------------------------

    def bind(self, stmt: ast.stmt, scope: Scope) -> None:
        """Record what `stmt` binds in `scope`: expressions to evaluate when used, or opaque
        markers saying why a name has no known value."""
        if isinstance(stmt, ast.Assign):
            snapshot = scope.snapshot()
            for target in stmt.targets:
                self._assign(target, stmt.value, snapshot, scope)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            self._assign(stmt.target, stmt.value, scope.snapshot(), scope)
        elif isinstance(stmt, ast.AugAssign) and key_of(stmt.target) is not None:
            both = ast.copy_location(ast.BinOp(left=ast.copy_location(ast.Name(id="__left__"), stmt),
                                               op=stmt.op, right=stmt.value), stmt)
            snapshot = scope.snapshot()
            snapshot.vars["__left__"] = scope.lookup(key_of(stmt.target))
            scope.vars[key_of(stmt.target)] = Lazy(both, snapshot)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope.vars[stmt.name] = Def(stmt)
        elif isinstance(stmt, ast.If):
            self._bind_if(stmt, scope)
        elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            self._bind_try(stmt, scope)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for key in _statement_targets(stmt):
                scope.vars[key] = Opaque(f"{key!r} is bound by the with statement at line {stmt.lineno}")
            for inner in stmt.body:
                self.bind(inner, scope)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            self._bind_mutation(stmt.value, scope)
        elif not isinstance(stmt, (ast.Expr, ast.Pass, ast.Return, ast.Global, ast.Nonlocal, ast.Assert)):
            how = "assigned in the loop" if isinstance(stmt, _LOOPS) else f"bound by the {type(stmt).__name__.lower()}"
            for key in _assigned([stmt]):
                scope.vars[key] = Opaque(f"{key!r} is {how} at line {stmt.lineno}")

    def _assign(self, target: ast.AST, value: ast.AST, snapshot: Scope, scope: Scope, index: int | None = None) -> None:
        if isinstance(target, (ast.Tuple, ast.List)) and index is None and \
                not any(isinstance(e, ast.Starred) for e in target.elts):
            for i, element in enumerate(target.elts):
                self._assign(element, value, snapshot, scope, i)
            return
        bound = Lazy(value, snapshot, index)
        if isinstance(target, (ast.Subscript, ast.Starred, ast.Tuple, ast.List)):
            bound = Opaque(f"an item of it is assigned at line {target.lineno}")
        for key in _targets(target):
            scope.vars[key] = bound

    def _bind_mutation(self, call: ast.Call, scope: Scope) -> None:
        """`parts.append(x)`, `parts.extend(xs)`, `opts.update(d)` of a folded list or dict."""
        func = call.func
        if not (isinstance(func, ast.Attribute) and (key := key_of(func.value)) is not None):
            return
        if key.partition(".")[0] in self.aliases and scope.lookup(key) is MISSING:
            return  # a module's function, e.g. warnings.warn(...)
        current = self._resolve(scope.lookup(key), call)
        if not isinstance(current, (list, dict)):
            return
        try:
            args = [self.value(a, scope) for a in call.args]
            keywords = {k.arg: self.value(k.value, scope) for k in call.keywords if k.arg is not None}
            if func.attr in ("append", "extend") and isinstance(current, list) and len(args) == 1:
                new = current + ([args[0]] if func.attr == "append" else list(args[0]))
            elif func.attr == "update" and isinstance(current, dict) and len(args) <= 1:
                new = {**current, **(args[0] if args else {}), **keywords}
            else:
                return
            scope.vars[key] = check_size(new)
        except (NotFoldable, TypeError, ValueError):
            scope.vars[key] = Opaque(f"{key!r} is changed by .{func.attr}() at line {call.lineno}")

    def _branches(self, scope: Scope, blocks: list[list[ast.stmt]]) -> list[Scope]:
        out = []
        for block in blocks:
            branch = scope.snapshot()
            for stmt in block:
                self.bind(stmt, branch)
            out.append(branch)
        return out

    def _bind_if(self, stmt: ast.If, scope: Scope) -> None:
        try:
            taken = bool(self.value(stmt.test, scope))
        except NotFoldable:
            self._merge(scope, self._branches(scope, [stmt.body, stmt.orelse]), f"the if at line {stmt.lineno}")
            return
        for inner in stmt.body if taken else stmt.orelse:
            self.bind(inner, scope)

    def _bind_try(self, stmt: ast.Try, scope: Scope) -> None:
        branches = self._branches(scope, [stmt.body + stmt.orelse, *(h.body for h in stmt.handlers)])
        for handler, branch in zip(stmt.handlers, branches[1:]):
            if handler.name:
                branch.vars[handler.name] = Opaque(f"{handler.name!r} is an exception")
        self._merge(scope, branches, f"the try at line {stmt.lineno}")
        for inner in stmt.finalbody:
            self.bind(inner, scope)

    @staticmethod
    def _merge(scope: Scope, branches: list[Scope], where: str) -> None:
        keys = {k for b in branches for k, v in b.vars.items() if scope.vars.get(k, MISSING) is not v}
        for key in keys:
            before = scope.vars.get(key, MISSING)
            scope.vars[key] = Merged(before, [b.vars.get(key, MISSING) for b in branches], where)

    # -- values of bindings --------------------------------------------------------------------

    def _resolve(self, found: object, use: ast.AST) -> object:
        """A binding's value (plain data), or an Opaque / Def / MISSING as is."""
        if isinstance(found, Lazy):
            if found.state == "busy":
                return Opaque("its value depends on itself")
            if found.state == "new":
                found.state = "busy"
                try:
                    value = self.value(found.node, found.scope)
                    found.result = value if found.index is None else self._item(value, found.index, found.node)
                except NotFoldable as exc:
                    found.result = Opaque(str(exc))
                found.state = "done"
            return found.result
        if isinstance(found, Merged):
            return self._resolve_merged(found, use)
        return found

    def _item(self, value: object, index: int, node: ast.AST) -> object:
        if not isinstance(value, (list, tuple)):
            return Opaque(f"{line_of(node)}: unpacked from a {type(value).__name__}")
        return value[index]

    def _resolve_merged(self, merged: Merged, use: ast.AST) -> object:
        """The branches agree, or (the name was unbound before) the ones that bind it agree."""
        self._deeper(use)  # `before` may be the merge of an earlier `if`, and so on up the file
        try:
            before = self._resolve(merged.before, use)
            values = [before if v is merged.before else self._resolve(v, use) for v in merged.values]
        finally:
            self._nesting -= 1
        changed = [v for v, raw in zip(values, merged.values) if raw is not merged.before]
        if changed and (merged.before is MISSING or len(changed) == len(values)) and \
                all(same(changed[0], v) for v in changed):
            return changed[0]
        return Opaque(f"it is bound differently in the branches of {merged.where}")

    def _lookup(self, key: str, node: ast.AST, scope: Scope) -> object:
        found = self._resolve(scope.lookup(key), node)
        if found is MISSING and "." in key:
            found = self._attribute(key, scope, node)
        if found is MISSING:
            base = key.partition(".")[0]
            found = Opaque(f"{base!r} is imported" if base in self.aliases else f"{key!r} is not bound in the file")
        if isinstance(found, Opaque):
            why = f"{key!r} <- {found.why}" if found.why.startswith("line ") else found.why
            why = why if len(why) <= 300 else f"{why[:100]} <- ... <- {why[-180:]}"
            raise NotFoldable(f"{line_of(node)}: {why}")
        if isinstance(found, Def):
            raise NotFoldable(f"{line_of(node)}: {key!r} is a function or class")
        return found

    def _attribute(self, key: str, scope: Scope, node: ast.AST) -> object:
        """`self.attr`, assigned one value in the methods of the enclosing class, or
        `Class.attr` of a class body."""
        base, _, attr = key.partition(".")
        cls = self._method_class(scope, base)
        if cls is None:
            defined = scope.lookup(base)
            cls = defined.node if isinstance(defined, Def) and isinstance(defined.node, ast.ClassDef) else None
        if cls is None:
            return MISSING
        memo = (id(cls), attr)
        if memo not in self._attributes:
            self._attributes[memo] = Opaque(f"{key!r} depends on itself")
            self._attributes[memo] = self._class_attribute(cls, attr, node)
        return self._attributes[memo]

    def _method_class(self, scope: Scope, me: str) -> ast.ClassDef | None:
        """The class of the method whose first parameter is `me` (the innermost function with a
        parameter of that name)."""
        while scope is not None:
            owner = scope.owner
            if isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef)) and me in scope.local:
                parent = self.parents.get(owner)
                first = owner.args.args[0].arg if owner.args.args else None
                return parent if first == me and isinstance(parent, ast.ClassDef) else None
            scope = scope.parent
        return None

    def _class_attribute(self, cls: ast.ClassDef, attr: str, use: ast.AST) -> object:
        sites: list[tuple[ast.stmt, str]] = []
        for stmt in cls.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if stmt.args.args:
                    me = f"{stmt.args.args[0].arg}.{attr}"
                    sites += [(n, me) for n in own_nodes(stmt.body) if me in _statement_targets(n)]
            elif attr in _assigned([stmt]):
                sites.append((stmt, attr))
        if not sites:
            return MISSING
        values = []
        for stmt, key in sites:
            if not isinstance(stmt, ast.stmt):
                return Opaque(f"{key!r} is bound at {line_of(stmt)} by a {type(stmt).__name__}")
            scope = self.scope_before(stmt)
            self.bind(stmt, scope)
            values.append(self._resolve(scope.vars.get(key, MISSING), use))
        if isinstance(values[0], Opaque):
            return values[0]
        if not all(same(values[0], v) for v in values):
            return Opaque(f"{attr!r} is assigned different values in class {cls.name}")
        return values[0]
