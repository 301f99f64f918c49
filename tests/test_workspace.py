"""Workspace: layout, protected files, path rules (escapes, symlinks), read-before-write,
snapshot and cleanup. Real files in a temporary directory; no sandbox needed."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from importlib import resources
from pathlib import Path

import pytest

from agentcore.types import Task, ToolErrorKind
from agentcore.workspace import Workspace, WorkspaceConfig, WorkspaceError

SOURCE = "import torch\n\nclass Model(torch.nn.Module):\n    pass\n"
TASK = Task(task_id="level1/relu", source=SOURCE)
IS_ROOT = os.geteuid() == 0


@pytest.fixture
def root():
    path = Path(tempfile.mkdtemp(prefix="agentcore-ws-"))
    path.chmod(0o711)  # the sandbox uid must traverse it
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def ws(root):
    workspace = await Workspace.create(TASK, root, name="traj-0")
    yield workspace
    await workspace.cleanup()


def _template_files() -> set[str]:
    base = resources.files("agentcore") / "assets" / "template"
    return {entry.name for entry in base.iterdir() if entry.is_file()}


def _denied(fn, *args, **kwargs) -> ToolErrorKind:
    with pytest.raises(WorkspaceError) as info:
        fn(*args, **kwargs)
    return info.value.kind


# -- layout ---------------------------------------------------------------------------------


async def test_model_py_holds_the_task_source(ws):
    assert (ws.path / "model.py").read_text() == SOURCE


async def test_skill_md_and_template_files_are_copied(ws):
    names = {p.name for p in ws.path.iterdir()}
    assert {"SKILL.md", *_template_files()} <= names


async def test_kernels_dir_exists_and_is_empty(ws):
    assert list((ws.path / "kernels").iterdir()) == []


async def test_model_new_is_absent_at_start(ws):
    assert not (ws.path / "model_new.py").exists()


async def test_protected_set_is_task_files_and_template(ws):
    assert ws.protected == {"model.py", "SKILL.md", *_template_files()}


async def test_protected_files_are_read_only_on_disk(ws):
    modes = {rel: stat.S_IMODE((ws.path / rel).stat().st_mode) for rel in ws.protected}
    assert set(modes.values()) == {0o444}


async def test_each_workspace_gets_its_own_directory(root):
    a = await Workspace.create(TASK, root)
    b = await Workspace.create(TASK, root)
    assert a.path != b.path and a.path.parent == b.path.parent == root.resolve()


async def test_seeded_files_are_written(root):
    ws = await Workspace.create(TASK, root, files={"kernels/a.cu": "// a\n"})
    assert (ws.path / "kernels/a.cu").read_text() == "// a\n"


# -- path rules -----------------------------------------------------------------------------


async def test_relative_path_resolves_inside(ws):
    assert ws.resolve("kernels/x.cu") == ws.path / "kernels" / "x.cu"


async def test_absolute_path_inside_is_accepted(ws):
    assert ws.resolve(str(ws.path / "model.py")) == ws.path / "model.py"


async def test_parent_escape_is_denied(ws):
    assert _denied(ws.resolve, "../traj-1/model_new.py") is ToolErrorKind.DENIED


async def test_absolute_path_outside_is_denied(ws):
    assert _denied(ws.resolve, "/etc/passwd") is ToolErrorKind.DENIED


async def test_symlink_escape_is_denied(ws):
    (ws.path / "link").symlink_to("/etc")
    assert _denied(ws.resolve, "link/passwd") is ToolErrorKind.DENIED


async def test_symlinked_file_escape_is_denied_for_writing(ws, root):
    outside = root / "outside.txt"
    outside.write_text("x")
    (ws.path / "kernels" / "out.cu").symlink_to(outside)
    assert _denied(ws.resolve, "kernels/out.cu", write=True) is ToolErrorKind.DENIED


async def test_protected_file_is_denied_for_writing(ws):
    assert _denied(ws.resolve, "model.py", write=True) is ToolErrorKind.DENIED


async def test_symlink_to_protected_file_is_denied_for_writing(ws):
    (ws.path / "alias.py").symlink_to(ws.path / "model.py")
    assert _denied(ws.resolve, "alias.py", write=True) is ToolErrorKind.DENIED


async def test_protected_file_is_readable(ws):
    assert ws.resolve("model.py") == ws.path / "model.py"


async def test_workspace_dir_itself_is_not_writable_as_a_file(ws):
    assert _denied(ws.resolve, ".", write=True) is ToolErrorKind.INVALID_CALL


# -- read-before-write ----------------------------------------------------------------------


async def test_new_file_needs_no_read(ws):
    ws.check_read_before_write(ws.path / "model_new.py")


async def test_unread_existing_file_is_denied(ws):
    path = ws.path / "kernels" / "a.cu"
    path.write_text("old")
    assert _denied(ws.check_read_before_write, path) is ToolErrorKind.DENIED


async def test_read_file_may_be_written(ws):
    path = ws.path / "kernels" / "a.cu"
    path.write_text("old")
    ws.mark_read(path)
    ws.check_read_before_write(path)


async def test_file_changed_after_read_must_be_read_again(ws):
    path = ws.path / "kernels" / "a.cu"
    path.write_text("old")
    ws.mark_read(path)
    path.write_text("changed by bash")
    assert _denied(ws.check_read_before_write, path) is ToolErrorKind.DENIED


async def test_written_file_counts_as_read(ws):
    path = ws.resolve("model_new.py", write=True)
    await ws.write_text(path, "a")
    ws.check_read_before_write(path)


async def test_write_replaces_the_inode_so_hard_links_keep_their_content(ws):
    os.link(ws.path / "model.py", ws.path / "hard.py")
    path = ws.resolve("hard.py", write=True)
    ws.mark_read(path)
    await ws.write_text(path, "overwritten")
    assert (ws.path / "model.py").read_text() == SOURCE


async def test_write_creates_missing_parent_directories(ws):
    await ws.write_text(ws.resolve("kernels/sub/deep.cu", write=True), "x")
    assert (ws.path / "kernels/sub/deep.cu").read_text() == "x"


# -- ownership for an unprivileged sandbox --------------------------------------------------


@pytest.mark.skipif(not IS_ROOT, reason="chown to the sandbox uid needs root")
async def test_kernels_and_written_files_belong_to_the_sandbox_uid(root):
    ws = await Workspace.create(TASK, root, owner_uid=65534)
    await ws.write_text(ws.resolve("model_new.py", write=True), "x")
    owners = {(ws.path / p).stat().st_uid for p in ("kernels", "model_new.py")}
    assert owners == {65534}


@pytest.mark.skipif(not IS_ROOT, reason="chown to the sandbox uid needs root")
async def test_workspace_dir_is_sticky_and_ours_when_dropping_privileges(root):
    ws = await Workspace.create(TASK, root, owner_uid=65534)
    st = ws.path.stat()
    assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o1770)


@pytest.mark.skipif(
    not IS_ROOT, reason="only root can make a directory the sandbox uid cannot traverse"
)
async def test_untraversable_root_is_refused(root):
    hidden = root / "private"
    hidden.mkdir(mode=0o700)
    with pytest.raises(PermissionError):
        await Workspace.create(TASK, hidden, owner_uid=65534)


# -- snapshot and cleanup -------------------------------------------------------------------


async def test_snapshot_holds_agent_files_and_no_protected_ones(ws):
    await ws.write_text(ws.resolve("model_new.py", write=True), "class ModelNew: pass\n")
    await ws.write_text(ws.resolve("kernels/a.cu", write=True), "// a\n")
    snap = await ws.snapshot()
    assert snap.files == {"model_new.py": "class ModelNew: pass\n", "kernels/a.cu": "// a\n"}


async def test_snapshot_omits_binary_files(ws):
    (ws.path / "kernels" / "a.o").write_bytes(b"\x7fELF\0\0\0")
    snap = await ws.snapshot()
    assert snap.omitted == {"kernels/a.o": "binary"}


async def test_snapshot_omits_oversized_files(root):
    ws = await Workspace.create(TASK, root, config=WorkspaceConfig(snapshot_file_bytes=10))
    (ws.path / "big.txt").write_text("x" * 11)
    snap = await ws.snapshot()
    assert "big.txt" in snap.omitted and "big.txt" not in snap.files


async def test_snapshot_total_cap_keeps_solution_files_first(root):
    ws = await Workspace.create(TASK, root, config=WorkspaceConfig(snapshot_total_bytes=10))
    (ws.path / "aaa_notes.txt").write_text("n" * 8)
    (ws.path / "model_new.py").write_text("m" * 8)
    snap = await ws.snapshot()
    assert list(snap.files) == ["model_new.py"]


async def test_snapshot_skips_symlinks(ws):
    (ws.path / "link").symlink_to("/etc/hostname")
    snap = await ws.snapshot()
    assert "link" not in snap.files


async def test_snapshot_does_not_block_on_a_fifo(ws):
    os.mkfifo(ws.path / "pipe")
    snap = await ws.snapshot()
    assert snap.omitted["pipe"] == "not a regular file"


async def test_cleanup_removes_the_directory(root):
    ws = await Workspace.create(TASK, root)
    await ws.cleanup()
    assert not ws.path.exists()


async def test_cleanup_twice_is_harmless(root):
    ws = await Workspace.create(TASK, root)
    await ws.cleanup()
    await ws.cleanup()


async def test_cleanup_removes_read_only_directories(root):
    ws = await Workspace.create(TASK, root)
    locked = ws.path / "kernels" / "locked"
    locked.mkdir()
    (locked / "f").write_text("x")
    locked.chmod(0o500)
    await ws.cleanup()
    assert not ws.path.exists()
