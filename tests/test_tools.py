"""ToolBox: each tool's behaviour and its errors as values, with a real workspace, FakeKernelEnv,
and bash in plain (unsandboxed) mode so these tests need no bwrap; test_sandbox.py covers bwrap."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from agentcore.kernel_env import FakeKernelEnv
from agentcore.sandbox import Sandbox, SandboxConfig
from agentcore.tools import ToolBox, ToolBoxConfig, render_result
from agentcore.types import (
    Bash,
    Compile,
    CompileResult,
    Edit,
    EditFile,
    Finish,
    Glob,
    Grep,
    Profile,
    ProfileResult,
    ReadFile,
    Task,
    ToolError,
    ToolErrorKind,
    ToolOutput,
    Verify,
    VerifyResult,
    WriteFile,
)
from agentcore.workspace import Workspace, glob_regex

SOURCE = (
    "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
    "        return x.relu()\n"
)
TASK = Task(task_id="relu", source=SOURCE)
PLAIN = SandboxConfig(bwrap_path="/nonexistent/bwrap", allow_unsandboxed=True, timeout_s=10)


@pytest.fixture
def root():
    path = Path(tempfile.mkdtemp(prefix="agentcore-tools-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _toolbox(root: Path, sandbox_config=PLAIN, env=None, **config) -> ToolBox:
    sandbox = Sandbox(sandbox_config)
    ws = await Workspace.create(TASK, root, owner_uid=sandbox.run_uid)
    return ToolBox(ws, sandbox, env or FakeKernelEnv(), TASK, ToolBoxConfig(**config))


@pytest.fixture
async def tools(root):
    return await _toolbox(root)


def _error(result) -> ToolErrorKind | None:
    return result.error if isinstance(result, ToolError) else None


async def _put(tools: ToolBox, rel: str, text: str) -> None:
    """A file that exists before the model reads it (e.g. written by bash)."""
    path = tools.workspace.path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# -- read_file ------------------------------------------------------------------------------


async def test_read_numbers_lines_like_cat_n(tools):
    result = await tools.run(ReadFile(path="model.py"))
    assert result.text.splitlines()[0] == "     1\timport torch"


async def test_read_window_starts_at_offset(tools):
    await _put(tools, "n.txt", "".join(f"line{i}\n" for i in range(10)))
    result = await tools.run(ReadFile(path="n.txt", offset=3, limit=2))
    assert result.text.splitlines()[:2] == ["     4\tline3", "     5\tline4"]


async def test_read_window_says_where_to_continue(tools):
    await _put(tools, "n.txt", "".join(f"line{i}\n" for i in range(10)))
    result = await tools.run(ReadFile(path="n.txt", offset=3, limit=2))
    assert "offset=5" in result.text.splitlines()[-1]


async def test_read_stays_within_the_token_budget(root):
    tools = await _toolbox(root, output_tokens=200)
    await _put(tools, "big.txt", "".join(f"{'x' * 70} {i}\n" for i in range(1000)))
    result = await tools.run(ReadFile(path="big.txt"))
    assert len(result.text) < 1000 and result.truncated


async def test_read_missing_file_is_not_found(tools):
    assert _error(await tools.run(ReadFile(path="nope.py"))) is ToolErrorKind.NOT_FOUND


async def test_read_outside_workspace_is_denied(tools):
    assert _error(await tools.run(ReadFile(path="/etc/passwd"))) is ToolErrorKind.DENIED


async def test_read_binary_file_is_refused(tools):
    (tools.workspace.path / "a.o").write_bytes(b"\x7fELF\0\1\2")
    assert _error(await tools.run(ReadFile(path="a.o"))) is ToolErrorKind.INVALID_CALL


async def test_read_directory_is_refused(tools):
    assert _error(await tools.run(ReadFile(path="kernels"))) is ToolErrorKind.INVALID_CALL


async def test_read_offset_past_end_is_refused(tools):
    assert (
        _error(await tools.run(ReadFile(path="model.py", offset=100))) is ToolErrorKind.INVALID_CALL
    )


# -- write_file -----------------------------------------------------------------------------


async def test_write_creates_a_new_file(tools):
    await tools.run(WriteFile(path="model_new.py", content="class ModelNew: pass\n"))
    assert (tools.workspace.path / "model_new.py").read_text() == "class ModelNew: pass\n"


async def test_write_creates_parent_directories(tools):
    result = await tools.run(WriteFile(path="kernels/fused/k.cu", content="// k\n"))
    assert isinstance(result, ToolOutput)


async def test_write_of_unread_existing_file_is_denied(tools):
    await _put(tools, "kernels/a.cu", "old")
    assert (
        _error(await tools.run(WriteFile(path="kernels/a.cu", content="new")))
        is ToolErrorKind.DENIED
    )


async def test_write_after_read_overwrites(tools):
    await _put(tools, "kernels/a.cu", "old")
    await tools.run(ReadFile(path="kernels/a.cu"))
    await tools.run(WriteFile(path="kernels/a.cu", content="new"))
    assert (tools.workspace.path / "kernels/a.cu").read_text() == "new"


async def test_second_write_of_own_file_needs_no_read(tools):
    await tools.run(WriteFile(path="model_new.py", content="a"))
    assert isinstance(await tools.run(WriteFile(path="model_new.py", content="b")), ToolOutput)


async def test_write_to_protected_file_is_denied(tools):
    await tools.run(ReadFile(path="model.py"))
    assert _error(await tools.run(WriteFile(path="model.py", content="x"))) is ToolErrorKind.DENIED


async def test_denied_write_leaves_protected_file_intact(tools):
    await tools.run(WriteFile(path="SKILL.md", content="x"))
    assert (tools.workspace.path / "SKILL.md").read_text() != "x"


async def test_write_through_symlink_escape_is_denied(tools, root):
    (tools.workspace.path / "kernels" / "esc.cu").symlink_to(root / "victim.txt")
    await tools.run(WriteFile(path="kernels/esc.cu", content="x"))
    assert not (root / "victim.txt").exists()


async def test_write_into_a_file_as_directory_is_an_error_value(tools):
    await tools.run(WriteFile(path="f", content="x"))
    assert isinstance(await tools.run(WriteFile(path="f/g", content="y")), ToolError)


# -- edit_file ------------------------------------------------------------------------------


async def _edit(tools, *edits: Edit, path="kernels/a.cu", text="a = 1;\nb = 1;\n"):
    await _put(tools, path, text)
    await tools.run(ReadFile(path=path))
    return await tools.run(EditFile(path=path, edits=edits))


async def test_edit_replaces_a_unique_string(tools):
    await _edit(tools, Edit(old_string="a = 1", new_string="a = 2"))
    assert (tools.workspace.path / "kernels/a.cu").read_text() == "a = 2;\nb = 1;\n"


async def test_edit_of_ambiguous_string_is_refused(tools):
    result = await _edit(tools, Edit(old_string="= 1", new_string="= 2"))
    assert _error(result) is ToolErrorKind.INVALID_CALL and "2 times" in result.message


async def test_edit_replace_all_replaces_every_occurrence(tools):
    await _edit(tools, Edit(old_string="= 1", new_string="= 3", replace_all=True))
    assert (tools.workspace.path / "kernels/a.cu").read_text() == "a = 3;\nb = 3;\n"


async def test_edit_with_missing_string_is_refused(tools):
    result = await _edit(tools, Edit(old_string="c = 1", new_string="c = 2"))
    assert _error(result) is ToolErrorKind.INVALID_CALL


async def test_edits_are_all_or_nothing(tools):
    await _edit(
        tools, Edit(old_string="a = 1", new_string="a = 2"), Edit(old_string="zzz", new_string="y")
    )
    assert (tools.workspace.path / "kernels/a.cu").read_text() == "a = 1;\nb = 1;\n"


async def test_edits_apply_in_sequence(tools):
    await _edit(
        tools,
        Edit(old_string="a = 1", new_string="a = 2"),
        Edit(old_string="a = 2", new_string="a = 5"),
    )
    assert (tools.workspace.path / "kernels/a.cu").read_text() == "a = 5;\nb = 1;\n"


async def test_edit_with_identical_strings_is_refused(tools):
    assert (
        _error(await _edit(tools, Edit(old_string="a", new_string="a")))
        is ToolErrorKind.INVALID_CALL
    )


async def test_edit_of_unread_file_is_denied(tools):
    await _put(tools, "kernels/a.cu", "a = 1;\n")
    result = await tools.run(
        EditFile(path="kernels/a.cu", edits=(Edit(old_string="1", new_string="2"),))
    )
    assert _error(result) is ToolErrorKind.DENIED


async def test_edit_of_missing_file_is_not_found(tools):
    result = await tools.run(
        EditFile(path="nope.cu", edits=(Edit(old_string="1", new_string="2"),))
    )
    assert _error(result) is ToolErrorKind.NOT_FOUND


async def test_edit_of_protected_file_is_denied(tools):
    await tools.run(ReadFile(path="model.py"))
    result = await tools.run(
        EditFile(path="model.py", edits=(Edit(old_string="relu", new_string="gelu"),))
    )
    assert _error(result) is ToolErrorKind.DENIED


# -- glob and grep --------------------------------------------------------------------------


async def test_glob_double_star_recurses(tools):
    await _put(tools, "kernels/a.cu", "")
    await _put(tools, "kernels/sub/b.cu", "")
    result = await tools.run(Glob(pattern="**/*.cu"))
    assert result.text.splitlines() == ["kernels/a.cu", "kernels/sub/b.cu"]


async def test_glob_single_star_stays_in_one_directory(tools):
    await _put(tools, "kernels/sub/b.cu", "")
    result = await tools.run(Glob(pattern="kernels/*.cu"))
    assert result.text.startswith("No files match")


async def test_glob_refuses_parent_directories(tools):
    assert _error(await tools.run(Glob(pattern="../*"))) is ToolErrorKind.DENIED


async def test_glob_output_is_bounded(root):
    tools = await _toolbox(root, glob_max_results=5)
    for i in range(20):
        await _put(tools, f"kernels/k{i:02}.cu", "")
    result = await tools.run(Glob(pattern="kernels/*"))
    assert len(result.text.splitlines()) == 6 and result.truncated


def test_glob_regex_matches_zero_directories_for_double_star():
    assert glob_regex("**/*.cu").fullmatch("a.cu")


async def test_grep_reports_path_line_and_text(tools):
    result = await tools.run(Grep(pattern=r"return x\.relu"))
    assert result.text == "model.py:5:        return x.relu()"


async def test_grep_invalid_regex_is_refused(tools):
    assert _error(await tools.run(Grep(pattern="("))) is ToolErrorKind.INVALID_CALL


async def test_grep_glob_filters_files(tools):
    await _put(tools, "kernels/a.cu", "relu here\n")
    result = await tools.run(Grep(pattern="relu", glob="*.cu"))
    assert result.text == "kernels/a.cu:1:relu here"


async def test_grep_skips_binary_files(tools):
    (tools.workspace.path / "kernels/a.o").write_bytes(b"relu\0\0")
    result = await tools.run(Grep(pattern="relu", path="kernels"))
    assert result.text == "No matches."


async def test_grep_does_not_follow_symlinks_out(tools, root):
    (root / "secret.txt").write_text("relu secret\n")
    (tools.workspace.path / "kernels" / "s.txt").symlink_to(root / "secret.txt")
    result = await tools.run(Grep(pattern="secret", path="kernels"))
    assert result.text == "No matches."


async def test_grep_output_is_bounded(root):
    tools = await _toolbox(root, grep_max_matches=10)
    await _put(tools, "many.txt", "hit\n" * 100)
    result = await tools.run(Grep(pattern="hit"))
    assert len(result.text.splitlines()) == 11 and result.truncated


async def test_grep_outside_workspace_is_denied(tools):
    assert _error(await tools.run(Grep(pattern="root", path="/etc"))) is ToolErrorKind.DENIED


# -- bash -----------------------------------------------------------------------------------


async def test_bash_runs_in_the_workspace(tools):
    result = await tools.run(Bash(command="ls model.py"))
    assert (result.text, result.exit_code) == ("model.py\n", 0)


async def test_bash_without_bwrap_is_refused_unless_opted_out(root):
    tools = await _toolbox(root, SandboxConfig(bwrap_path="/nonexistent/bwrap"))
    result = await tools.run(Bash(command="echo hi"))
    assert _error(result) is ToolErrorKind.FAILED and "bwrap" in result.message


async def test_bash_timeout_is_an_error_value(tools):
    result = await tools.run(Bash(command="sleep 30", timeout_s=0.5))
    assert _error(result) is ToolErrorKind.TIMEOUT


async def test_bash_output_is_truncated_with_a_marker(root):
    tools = await _toolbox(
        root, SandboxConfig(bwrap_path="/x", allow_unsandboxed=True, output_tokens=100)
    )
    result = await tools.run(Bash(command="seq 1 100000"))
    assert result.truncated and "bytes truncated" in result.text


# -- kernel tools and finish ----------------------------------------------------------------


async def test_compile_verify_profile_go_to_the_kernel_env(root):
    env = FakeKernelEnv()
    tools = await _toolbox(root, env=env)
    for call in (Compile(), Verify(), Profile()):
        await tools.run(call)
    assert env.calls == {"compile": 1, "verify": 1, "profile": 1}


async def test_compile_result_is_passed_through(tools):
    assert isinstance(await tools.run(Compile()), CompileResult)


class _BrokenEnv(FakeKernelEnv):
    async def verify(self, workspace, task):
        raise ConnectionError("gpu queue down")


async def test_kernel_env_exception_becomes_failed_tool(root):
    tools = await _toolbox(root, env=_BrokenEnv())
    assert _error(await tools.run(Verify())) is ToolErrorKind.FAILED


async def test_finish_is_acknowledged(tools):
    assert isinstance(await tools.run(Finish(summary="done")), ToolOutput)


async def test_mismatched_owner_is_a_bug(root):
    sandbox = Sandbox(PLAIN)
    ws = await Workspace.create(TASK, root, owner_uid=12345)
    with pytest.raises(ValueError):
        ToolBox(ws, sandbox, FakeKernelEnv(), TASK)


# -- rendering ------------------------------------------------------------------------------


def test_render_bash_output_shows_exit_code():
    assert render_result(ToolOutput(text="boom\n", exit_code=2)) == "boom\n\n[exit code 2]"


def test_render_error_names_its_kind():
    text = render_result(ToolError(error=ToolErrorKind.DENIED, message="model.py is protected"))
    assert text == "Error (denied): model.py is protected"


def test_render_compile_ok():
    assert render_result(CompileResult(ok=True, built_units=2, seconds=1.25)).startswith(
        "Compile OK"
    )


def test_render_compile_failure_trims_the_log():
    text = render_result(CompileResult(ok=False, log="error: x\n" * 100_000), max_log_chars=4000)
    assert text.startswith("Compile FAILED") and len(text) < 5000


def test_render_verify_failure_names_the_hack():
    text = render_result(VerifyResult(ok=False, message="torch op used", hack="torch_compute"))
    assert "torch_compute" in text


def test_render_profile_shows_speedup_over_compile():
    text = render_result(ProfileResult(ok=True, candidate_ms=1.0, eager_ms=3.0, compile_ms=2.0))
    assert "(speedup 2.00x)" in text.splitlines()[3] and text.endswith("met")
