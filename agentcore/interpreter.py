"""Where the running Python lives, for sandboxes that hide parts of the host filesystem.

A sandbox that mounts a fresh tmpfs over /tmp (or over a hidden directory) also hides any
interpreter, virtualenv or site directory that lives there, and the process inside then fails
with `execvp ...: No such file or directory`. `interpreter_dirs` lists the directories the
interpreter needs; `covered` picks those that a set of tmpfs mounts would hide, and `bind_back` what
the sandbox binds back read-only so that they are visible again.

Example:
    for path in bind_back(interpreter_dirs(), ["/tmp", *hidden], keep_hidden=hidden):
        argv += ["--ro-bind", path, path]
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Iterable


def interpreter_dirs(*, with_sys_path: bool = False) -> list[str]:
    """The prefixes and site directories of this interpreter (and of the base interpreter of its
    virtualenv), resolved through symlinks; with `with_sys_path`, every directory on sys.path too
    (editable installs, PYTHONPATH), which a worker importing the project needs."""
    found = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    found += [os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable))]
    found += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    if with_sys_path:
        found += [p for p in sys.path if p]
    dirs = {os.path.realpath(p) for p in found if p and os.path.isdir(p)}
    dirs |= {os.path.abspath(p) for p in found if p and os.path.isdir(p)}
    return _outermost(dirs)


def covered(paths: Iterable[str], mounts: Iterable[str]) -> list[str]:
    """The paths that lie under one of `mounts` (each mount point hides what is below it)."""
    roots = [m.rstrip("/") for m in mounts if m and m != "/"]
    hidden = [p for p in paths if any(p == r or p.startswith(r + "/") for r in roots)]
    return _outermost(hidden)


def bind_back(paths: Iterable[str], mounts: Iterable[str], keep_hidden: Iterable[str] = ()) -> list[str]:
    """What to bind back read-only so that `paths` are visible under the tmpfs `mounts` while
    every path of `keep_hidden` stays hidden: a path that holds a hidden one is bound entry by
    entry around it (a virtualenv that also holds the workspaces keeps them covered)."""
    hidden = [os.path.abspath(h) for h in keep_hidden if h]
    out: list[str] = []
    for path in covered(paths, mounts):
        out += _around(path, hidden)
    return out


def _around(path: str, hidden: list[str]) -> list[str]:
    if any(path == h or path.startswith(h.rstrip("/") + "/") for h in hidden):
        return []
    if not any(h.startswith(path.rstrip("/") + "/") for h in hidden):
        return [path]
    if not os.path.isdir(path) or os.path.islink(path):
        return []
    return [p for entry in sorted(os.listdir(path)) for p in _around(os.path.join(path, entry), hidden)]


def _outermost(paths: Iterable[str]) -> list[str]:
    """Sorted, with every path that lies inside another one of them dropped."""
    kept: list[str] = []
    for path in sorted(set(paths)):
        if not any(path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


__all__ = ["bind_back", "covered", "interpreter_dirs"]
