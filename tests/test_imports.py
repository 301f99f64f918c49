"""Layering: agentcore never imports torch; imports point bench -> rl -> rewards -> agentcore."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import agentcore

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["agentcore", "rewards", "rl", "bench"]


def test_importing_every_agentcore_module_does_not_import_torch():
    names = [m.name for m in pkgutil.walk_packages(agentcore.__path__, "agentcore.")]
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cupy'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


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
