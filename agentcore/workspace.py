"""The agent's workspace: one directory per trajectory, its protected files and its path rules.

What it is: `Workspace.create(task, root)` lays out `model.py` (the task's reference), `SKILL.md`,
the fixed template files (`binding_registry.h`, `binding.cpp`) and an empty `kernels/`; the agent
writes `model_new.py` and `kernels/*` itself. The protected files are read-only. `resolve` maps a
path the model wrote to a real path inside the workspace, refusing anything outside it (symlink
escapes included) and, for writing, a protected file. It also tracks read-before-write: an
existing file may be overwritten or edited only after the model read it and while it is unchanged
since. `snapshot()` returns the agent's files for the final evaluation and for storage.

What it is not: the tools themselves (tools.py) or the sandbox (sandbox.py). Path checks here
and a sandboxed bash that runs between tool calls, never during them, is what keeps the root-run
file tools from following a symlink planted by the agent.

How it is used: when the sandbox drops to an unprivileged uid, pass it as `owner_uid`: the
workspace root stays owned by us with mode 1770 and the sandbox's group (the sticky bit stops the
sandbox user deleting or renaming our protected files), `kernels/` and every file the tools write
belong to the sandbox user.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
import sys
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from pathlib import Path

import aiofiles
import anyio
from msgspec import Struct

from agentcore.types import Task, ToolErrorKind

TASK_FILES = ("model.py", "SKILL.md")


class WorkspaceError(Exception):
    """A model's mistake about a path (outside, protected, unread); the ToolBox shows `message`."""

    def __init__(self, kind: ToolErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class WorkspaceConfig(Struct, frozen=True, kw_only=True):
    snapshot_file_bytes: int = 256 * 1024
    """Larger files are left out of a snapshot (listed in `omitted`)."""
    snapshot_total_bytes: int = 4 * 1024 * 1024
    """A snapshot holds at most this many bytes of file content."""
    snapshot_skip_dirs: tuple[str, ...] = ("__pycache__", "build", ".git")
    """Directories never walked into by `snapshot` (build outputs, caches)."""


class WorkspaceSnapshot(Struct, frozen=True, kw_only=True):
    """The agent's text files (path relative to the workspace -> content), protected files aside."""

    task_id: str
    files: dict[str, str]
    omitted: dict[str, str] = {}
    total_bytes: int = 0


@cache
def _assets() -> dict[str, bytes]:
    """SKILL.md and every file of assets/template, keyed by their path in a workspace."""
    base = resources.files("agentcore") / "assets"
    found = {"SKILL.md": (base / "SKILL.md").read_bytes()}
    stack = [(base / "template", "")]
    while stack:
        folder, prefix = stack.pop()
        for entry in folder.iterdir():
            if entry.is_dir():
                stack.append((entry, f"{prefix}{entry.name}/"))
            elif entry.is_file():
                found[f"{prefix}{entry.name}"] = entry.read_bytes()
    return found


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._")[:64] or "task"


def _stamp(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def is_binary(data: bytes) -> bool:
    return b"\0" in data[:8192]


def can_traverse(folder: Path, uid: int) -> bool:
    """Whether `uid` (the sandbox's user) may pass through `folder`."""
    st = folder.stat()
    return bool(
        st.st_mode & stat.S_IXOTH
        or st.st_uid == uid
        or (st.st_gid == uid and st.st_mode & stat.S_IXGRP)
    )


def _check_traversable(path: Path, uid: int) -> None:
    """bwrap, running as `uid`, must reach the workspace through every ancestor."""
    for folder in reversed(path.parents):
        if not can_traverse(folder, uid):
            st = folder.stat()
            raise PermissionError(
                f"{folder} (mode {st.st_mode & 0o7777:o}) cannot be traversed by the sandbox uid "
                f"{uid}; put workspaces under a directory with o+x on every ancestor"
            )


class Workspace:
    """A trajectory's directory: task files (protected), the agent's files, and the path rules.

    Example:
        ws = await Workspace.create(task, Path("/var/lib/agent/ws"), name=trajectory_id)
        path = ws.resolve("model.py"); ws.mark_read(path)
        await ws.write_text(ws.resolve("model_new.py", write=True), source)
        final = await ws.snapshot()
        await ws.cleanup()
    """

    def __init__(
        self,
        path: Path,
        task: Task,
        protected: frozenset[str],
        owner_uid: int | None,
        config: WorkspaceConfig,
    ) -> None:
        self.path = path
        self.task = task
        self.protected = protected
        self.owner_uid = owner_uid
        self.config = config
        self._reads: dict[Path, tuple[int, int, int]] = {}

    @classmethod
    async def create(
        cls,
        task: Task,
        root: Path | str,
        *,
        name: str | None = None,
        owner_uid: int | None = None,
        files: Mapping[str, str] | None = None,
        config: WorkspaceConfig = WorkspaceConfig(),
    ) -> Workspace:
        """Make `root/name` (unique if no name) with the task's files; `files` seeds agent files,
        e.g. a snapshot's, for a re-evaluation."""
        assets = await anyio.to_thread.run_sync(_assets)
        path = await anyio.to_thread.run_sync(
            cls._make_dir, Path(root), name or _unique(task), owner_uid
        )
        protected = frozenset({"model.py", *assets})
        ws = cls(path, task, protected, owner_uid, config)
        await ws._write_protected("model.py", task.source.encode())
        for rel, data in assets.items():
            await ws._write_protected(rel, data)
        await ws.make_dirs(path / "kernels")
        for rel, content in (files or {}).items():
            await ws.write_text(ws.resolve(rel, write=True), content)
        await anyio.to_thread.run_sync(ws._seal)
        return ws

    @staticmethod
    def _make_dir(root: Path, name: str, owner_uid: int | None) -> Path:
        root.mkdir(parents=True, exist_ok=True)
        path = root / _safe_name(name)
        path.mkdir(mode=0o700)  # an existing directory is a bug: two trajectories, one name
        path = path.resolve()
        if owner_uid is not None:
            try:
                _check_traversable(path, owner_uid)
            except PermissionError:
                path.rmdir()
                raise
        return path

    def _seal(self) -> None:
        """Root dir: ours, group-writable for the sandbox, sticky so our files stay put."""
        if self.owner_uid is None:
            os.chmod(self.path, 0o755)
        else:
            os.chown(self.path, -1, self.owner_uid)
            os.chmod(self.path, 0o1770)

    async def _write_protected(self, rel: str, data: bytes) -> None:
        path = self.path / rel
        if path.parent != self.path:
            path.parent.mkdir(parents=True, exist_ok=True)
        async with aiofiles.open(path, "wb") as f:
            await f.write(data)
        os.chmod(path, 0o444)

    def protected_paths(self) -> list[Path]:
        return [self.path / rel for rel in sorted(self.protected)]

    # -----------------------------------------------------------------------------------------
    # Paths.

    def relative(self, path: Path) -> str:
        return path.relative_to(self.path).as_posix() if path != self.path else "."

    def resolve(self, path: str, *, write: bool = False) -> Path:
        """The real path of `path` (relative to the workspace, or absolute inside it).

        Raises WorkspaceError for a path outside the workspace after symlinks are followed,
        and with `write=True` for a protected file or the workspace directory itself."""
        if not path or "\0" in path:
            raise WorkspaceError(ToolErrorKind.INVALID_CALL, f"invalid path {path!r}")
        candidate = Path(path) if os.path.isabs(path) else self.path / path
        real = Path(os.path.realpath(candidate))
        if real != self.path and self.path not in real.parents:
            lexical = Path(os.path.normpath(candidate))
            how = (
                " through a symlink" if lexical == self.path or self.path in lexical.parents else ""
            )
            raise WorkspaceError(
                ToolErrorKind.DENIED,
                f"{path} is outside the workspace{how}; only {self.path} is accessible",
            )
        rel = self.relative(real)
        if write and rel in self.protected:
            raise WorkspaceError(
                ToolErrorKind.DENIED, f"{rel} is a protected file and cannot be modified"
            )
        if write and real == self.path:
            raise WorkspaceError(
                ToolErrorKind.INVALID_CALL, f"{path} is the workspace directory, not a file"
            )
        return real

    def mark_read(self, path: Path) -> None:
        """Record that the model has seen `path` as it is now."""
        self._reads[path] = _stamp(path)

    def check_read_before_write(self, path: Path) -> None:
        """An existing file may be replaced only if it was read and is unchanged since."""
        if not path.exists():
            return
        seen = self._reads.get(path)
        rel = self.relative(path)
        if seen is None:
            raise WorkspaceError(
                ToolErrorKind.DENIED,
                f"{rel} exists but has not been read; read it with read_file first",
            )
        if seen != _stamp(path):
            raise WorkspaceError(
                ToolErrorKind.DENIED,
                f"{rel} changed since it was last read; read it again before writing",
            )

    # -----------------------------------------------------------------------------------------
    # File I/O.

    async def make_dirs(self, folder: Path) -> None:
        """Create `folder` and missing parents inside the workspace, owned by the sandbox user."""
        missing = []
        while folder != self.path and not folder.exists():
            missing.append(folder)
            folder = folder.parent
        for new in reversed(missing):
            await anyio.to_thread.run_sync(os.mkdir, new, 0o755)
            self._own(new)

    async def read_bytes(self, path: Path) -> bytes:
        async with aiofiles.open(path, "rb") as f:
            return await f.read()

    async def write_text(self, path: Path, content: str) -> None:
        """Replace `path` atomically (a new inode: a hard link to a protected file stays intact),
        keep its mode, hand it to the sandbox user and count it as read."""
        await self.make_dirs(path.parent)
        mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o644
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            async with aiofiles.open(tmp, "x", encoding="utf-8", newline="") as f:
                await f.write(content)
            os.chmod(tmp, mode)
            self._own(tmp)
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        self.mark_read(path)

    def _own(self, path: Path) -> None:
        if self.owner_uid is not None:
            os.chown(path, self.owner_uid, self.owner_uid, follow_symlinks=False)

    def walk(self, base: Path, max_entries: int) -> Iterator[tuple[str, Path]]:
        """(workspace-relative path, path) of the files under `base`, sorted; symlinks are
        listed, never followed."""
        seen = 0
        for folder, dirs, names in os.walk(base):
            dirs.sort()
            for name in sorted(names):
                seen += 1
                if seen > max_entries:
                    return
                path = Path(folder) / name
                yield self.relative(path), path

    # -----------------------------------------------------------------------------------------
    # Snapshot and cleanup.

    async def snapshot(self) -> WorkspaceSnapshot:
        """The agent's text files, model_new.py and kernels/ first, within the size caps."""
        return await anyio.to_thread.run_sync(self._snapshot)

    def _snapshot(self) -> WorkspaceSnapshot:
        c = self.config
        files: dict[str, str] = {}
        omitted: dict[str, str] = {}
        total = 0
        for rel in sorted(self._agent_files(), key=lambda r: (not _is_solution(r), r)):
            path = self.path / rel
            reason, text = _snapshot_entry(path, c.snapshot_file_bytes)
            if text is not None and total + len(text.encode()) > c.snapshot_total_bytes:
                reason, text = "over the snapshot's total size cap", None
            if text is None:
                omitted[rel] = reason
                continue
            files[rel] = text
            total += len(text.encode())
        return WorkspaceSnapshot(
            task_id=self.task.task_id, files=files, omitted=omitted, total_bytes=total
        )

    def _agent_files(self) -> list[str]:
        found = []
        for folder, dirs, names in os.walk(self.path):
            dirs[:] = [d for d in dirs if d not in self.config.snapshot_skip_dirs]
            for name in names:
                rel = self.relative(Path(folder) / name)
                if rel not in self.protected:
                    found.append(rel)
        return found

    async def cleanup(self) -> None:
        """Delete the workspace directory; safe to call twice."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_remove_tree, self.path)


def _unique(task: Task) -> str:
    return f"{_safe_name(task.task_id)}-{secrets.token_hex(4)}"


def _is_solution(rel: str) -> bool:
    return rel == "model_new.py" or rel.startswith("kernels/")


def _snapshot_entry(path: Path, max_bytes: int) -> tuple[str, str | None]:
    """(reason it is left out, or "") and its text."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        return "symlink", None
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file", None
    if st.st_size > max_bytes:
        return f"too large ({st.st_size} bytes)", None
    data = path.read_bytes()
    if is_binary(data):
        return "binary", None
    try:
        return "", data.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8 text", None


def _remove_tree(path: Path) -> None:
    def retry(func, target, _exc):  # a directory the agent made read-only: open it, try again
        os.chmod(os.path.dirname(target), 0o700)
        if os.path.isdir(target) and not os.path.islink(target):
            os.chmod(target, 0o700)
        func(target)

    if not path.exists():
        return
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=retry)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob over '/'-separated relative paths: `*` and `?` stay within one part, `**` spans any
    number of directories, `[...]` is a character class."""
    parts = pattern.split("/")
    out = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
        else:
            out.append(_glob_part(part) + ("" if last else "/"))
    return re.compile("".join(out))


def _glob_part(part: str) -> str:
    out, i = [], 0
    while i < len(part):
        ch = part[i]
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[" and (end := part.find("]", i + 2)) != -1:
            body = part[i + 1 : end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)
