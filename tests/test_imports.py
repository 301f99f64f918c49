"""The shape of the tree: imports point bench -> rl -> rewards -> agentcore, with no circles;
agentcore and the trusted side of rewards never import torch; every module named in a string
(`python -m x` argv, `module:function` tables, preload lists) exists and respects the layering."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import agentcore
from agentcore.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["agentcore", "rewards", "rl", "bench"]
NAMED = re.compile(r"^(agentcore|rewards|rl|bench)(\.\w+)+(:\w+)?$")
"""A module (`rewards.queue.worker`), a `module:function`, or a dotted path into a module."""

# The rewards modules the trainer's event loop imports: GPU work reaches them through queues.
TRUSTED_REWARDS = [
    "rewards.env",
    "rewards.evaluate",
    "rewards.reward",
    "rewards.verdict",
    "rewards.queue.gpu_queue",
    "rewards.build.compile_pool",
]

# Files allowed to name a module of a higher layer in a string, and the packages they may name.
UPWARD_OK = {
    # The `cuda-agent` table: one command per package, each imported only when run.
    "agentcore/cli.py": set(ORDER),
    # `--env real` loads the rewards implementation of agentcore's KernelEnv by name, and
    # `--engine local` the rl package's embedded engine (torch), both only when asked for.
    "agentcore/rollout_cmd.py": {"rewards", "rl"},
}


def _sources() -> list[Path]:
    return [path for package in ORDER for path in sorted((ROOT / package).rglob("*.py"))]


def _layer(name: str) -> int:
    return ORDER.index(name.split(".")[0])


def _torch_modules_after_importing(names: list[str]) -> str:
    """The torch/cupy modules a fresh interpreter holds after importing `names`."""
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cupy'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_importing_every_agentcore_module_does_not_import_torch():
    names = [m.name for m in pkgutil.walk_packages(agentcore.__path__, "agentcore.")]
    assert _torch_modules_after_importing(names) == ""


def test_the_trusted_side_of_rewards_does_not_import_torch():
    assert _torch_modules_after_importing(TRUSTED_REWARDS) == ""


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_imports_point_one_way():
    wrong = []
    for rank, package in enumerate(ORDER):
        above = set(ORDER[rank + 1 :])
        for path in (ROOT / package).rglob("*.py"):
            bad = _imported_packages(path) & above
            if bad:
                wrong.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert wrong == []


# ---------------------------------------------------------------------------------------------
# Modules named in strings: launched with `-m`, looked up in tables, preloaded by the zygote


def _named_in_strings() -> list[tuple[str, int, str]]:
    """(file, line, name) for every string constant in the tree that names one of its modules."""
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAMED.match(node.value):
                found.append((str(path.relative_to(ROOT)), node.lineno, node.value))
    return found


def _module_spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:  # a parent is a module, not a package
        return None


def _resolves(name: str) -> bool:
    """`pkg.mod` and `pkg.mod:func` as launched; `pkg.mod.Class.method` as a qualified name."""
    module, colon, attr = name.partition(":")
    parts = module.split(".")
    cut = len(parts)
    while cut > (len(parts) if colon else 1) and _module_spec(".".join(parts[:cut])) is None:
        cut -= 1
    if _module_spec(".".join(parts[:cut])) is None:
        return False
    obj = importlib.import_module(".".join(parts[:cut])) if cut < len(parts) or colon else None
    for part in [*parts[cut:], *([attr] if colon else [])]:
        obj = getattr(obj, part, None)
        if obj is None:
            return False
    return True


def test_the_string_scan_sees_the_command_table():
    names = {name for _, _, name in _named_in_strings()}
    assert {spec for spec, _ in COMMANDS.values()} <= names


def test_every_module_named_in_a_string_resolves():
    missing = [f"{path}:{line} {name}" for path, line, name in _named_in_strings() if not _resolves(name)]
    assert missing == []


def test_strings_name_modules_at_or_below_their_layer():
    wrong = []
    for path, line, name in _named_in_strings():
        top = name.split(".")[0]
        if _layer(name) > _layer(path.replace("/", ".")) and top not in UPWARD_OK.get(path, ()):
            wrong.append(f"{path}:{line} names {name}")
    assert wrong == []


# ---------------------------------------------------------------------------------------------
# No import circles: module-level imports only (function-level and TYPE_CHECKING ones run late)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _run_at_import(body: list[ast.stmt]):
    """The statements of `body` that run when the module is imported, blocks flattened."""
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(stmt, ast.If):
            test = ast.unparse(stmt.test)
            if test not in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                yield from _run_at_import(stmt.body)
            yield from _run_at_import(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                yield from _run_at_import(block)
        elif isinstance(stmt, (ast.With, ast.ClassDef)):
            yield from _run_at_import(stmt.body)
        else:
            yield stmt


def _imports_at_load(path: Path, modules: set[str]) -> set[str]:
    """The tree's modules that importing `path` imports itself (a package's `__init__` for names)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for stmt in _run_at_import(ast.parse(path.read_text()).body):
        if isinstance(stmt, ast.Import):
            found.update(alias.name for alias in stmt.names if alias.name in modules)
        elif isinstance(stmt, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - stmt.level + 1] if stmt.level else []
            source = ".".join([*base, *([stmt.module] if stmt.module else [])])
            for alias in stmt.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in modules else source)
    return (found & modules) - {name}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_the_cycle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles():
    paths = _sources()
    modules = {_module_name(path) for path in paths}
    graph = {_module_name(path): _imports_at_load(path, modules) for path in paths}
    assert graph["rewards.queue.gpu_queue"] >= {"rewards.queue.jobs", "rewards.queue.worker_command"}
    assert _circles(graph) == []
