"""Which imports of a single-file solution only feed load_inline's build settings.

What it is: `build_only_imports(tree, aliases, calls, ignored) -> tuple[str, ...]` reads the
original model_new.py (before `rewards.inline.rewrite`) and returns `("os",)` when every use of
`os` is `os.getpid()`, `os.path.*` or a statement `os.makedirs(D, exist_ok=True)`, each value
they make flows only into arguments of load_inline that the build ignores
(`rewards.inline.extract.IGNORED_ARGS`: `name=`, `build_directory=`, `verbose=`, the extra_* flags
and the other build options, which the compile pool sets), directly or through names bound to
such values (`D = os.path.join(...)`), and D of the makedirs is such a name or the string given
as `build_directory=`. `rewards.static.python.check_model_new` then notes the import instead of
blocking on it. Any other use (`os.environ`, files, processes, a value that reaches forward, the
model or a condition) leaves it blocking.
What it is not: a general data-flow analysis: values pass only through f-strings, `+`, lists and
tuples, `str()` and `os.path.*` calls; names are followed by their identifier in the whole file.

Example:
    build_only_imports(ast.parse(source), aliases, load_inline_calls, IGNORED_ARGS)  # ("os",) or ()
"""

from __future__ import annotations

import ast

from rewards.inline.fold import dotted
from rewards.static.pyscope import parent_map

_CARRIERS = (ast.JoinedStr, ast.FormattedValue, ast.BinOp, ast.List, ast.Tuple)


class _Flow:
    """Where the values of one file go, for the names bound by plain assignments."""

    def __init__(
        self, tree: ast.Module, aliases: dict[str, str], calls: list[ast.Call], ignored: frozenset[str]
    ) -> None:
        self.aliases, self.ignored = aliases, ignored
        self.calls = {id(c) for c in calls}
        self.build_dirs = {k.value.value for c in calls for k in c.keywords
                           if k.arg == "build_directory" and isinstance(k.value, ast.Constant)}  # fmt: skip
        self.parents = parent_map(tree)
        self.loads: dict[str, list[ast.Name]] = {}
        self.bound: set[str] = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                self.loads.setdefault(n.id, []).append(n)
            elif isinstance(n, ast.Assign):
                self.bound |= {t.id for t in n.targets if isinstance(t, ast.Name)}

    def sink(self, node: ast.AST) -> str | tuple[str, ...] | None:
        """Where the value of `node` goes: "build" (an ignored argument of a load_inline call),
        the names of the plain assignment it is the value of, or None (anywhere else)."""
        while True:
            parent = self.parents.get(id(node))
            if isinstance(parent, ast.keyword):
                call = self.parents.get(id(parent))
                return "build" if id(call) in self.calls and parent.arg in self.ignored else None
            if isinstance(parent, ast.Call):
                if id(parent) in self.calls:
                    return "build" if parent.args and parent.args[0] is node else None  # name, positional
                func = dotted(parent.func, self.aliases) or ""
                if node is parent.func or not (func.startswith("os.path.") or func == "str"):
                    return None
            elif isinstance(parent, ast.Assign) and node is parent.value:
                targets = tuple(t.id for t in parent.targets if isinstance(t, ast.Name))
                return targets if len(targets) == len(parent.targets) else None
            elif not isinstance(parent, _CARRIERS):
                return None
            node = parent

    def makedirs_target(self, call: ast.Call) -> ast.expr | None:
        """D of a statement `os.makedirs(D, exist_ok=True)`, else None."""
        exist_ok = [k for k in call.keywords if k.arg == "exist_ok"]
        statement = isinstance(self.parents.get(id(call)), ast.Expr)
        if statement and len(call.args) == 1 and len(call.keywords) == 1 and exist_ok \
                and isinstance(exist_ok[0].value, ast.Constant) and exist_ok[0].value.value is True:
            return call.args[0]
        return None

    def makes_build_dir(self, call: ast.Call, names: set[str]) -> bool:
        """`call` is `os.makedirs(D, exist_ok=True)` of a build directory: D is one of `names` or
        the same string as a load_inline call's `build_directory=`."""
        target = self.makedirs_target(call)
        if isinstance(target, ast.Name):
            return target.id in names
        return isinstance(target, ast.Constant) and isinstance(target.value, str) and target.value in self.build_dirs

    def build_names(self) -> set[str]:
        """Names whose every read feeds the build (or the makedirs of a build directory) and one
        read reaches a load_inline call."""
        names = set(self.bound)
        while True:  # the largest set whose reads stay inside it
            kept = {n for n in names if all(self._read_ok(load, names) for load in self.loads.get(n, ()))}
            if kept == names:
                break
            names = kept
        reach: set[str] = set()
        while True:  # of those, the names a read of which reaches a build argument
            more = {n for n in names - reach for load in self.loads.get(n, ()) if self.feeds(load, reach)}
            if not more:
                return reach
            reach |= more

    def feeds(self, node: ast.AST, names: set[str]) -> bool:
        """The value of `node` goes into the build, or only into assignments to `names`."""
        sink = self.sink(node)
        return sink == "build" or (isinstance(sink, tuple) and set(sink) <= names)

    def _read_ok(self, load: ast.Name, names: set[str]) -> bool:
        if self.feeds(load, names):
            return True
        call = self.parents.get(id(load))
        return isinstance(call, ast.Call) and dotted(call.func, self.aliases) == "os.makedirs" \
            and self.makedirs_target(call) is load


def build_only_imports(
    tree: ast.Module, aliases: dict[str, str], calls: list[ast.Call], ignored: frozenset[str]
) -> tuple[str, ...]:
    """("os",) when every use of os in the file only feeds the arguments named in `ignored` of
    the load_inline `calls` (see the module docstring); () otherwise, and when nothing imports os."""
    names = {local for local, full in aliases.items() if full.split(".")[0] == "os"}
    if not names:
        return ()
    if any(isinstance(n, ast.Name) and n.id in names and not isinstance(n.ctx, ast.Load) for n in ast.walk(tree)):
        return ()  # the name is rebound: its uses need not be os's
    flow = _Flow(tree, aliases, calls, ignored)
    build = flow.build_names()
    for use in (load for name in names for load in flow.loads.get(name, ())):
        expr = use
        while isinstance(parent := flow.parents.get(id(expr)), ast.Attribute) and parent.value is expr:
            expr = parent
        full = dotted(expr, aliases) or ""
        call = flow.parents.get(id(expr))
        call = call if isinstance(call, ast.Call) and call.func is expr else None
        if full == "os.makedirs" and call is not None:
            ok = flow.makes_build_dir(call, build)
        elif full == "os.getpid" and call is not None and not call.args and not call.keywords:
            ok = flow.feeds(call, build)
        elif full.startswith("os.path."):
            ok = flow.feeds(call or expr, build)
        else:
            ok = False
        if not ok:
            return ()
    return ("os",)
