"""The agent's tools: one small function per ToolCall kind, and the text the model sees back.

What it is: `ToolBox.run(call)` carries out one call in one workspace and returns a ToolResult.
The file tools (read_file, write_file, edit_file, glob, grep) act on the workspace through its
path rules; bash runs in the sandbox; compile, verify and profile go to the KernelEnv. Every
mistake of the model (a bad path, a protected file, an unread file, an ambiguous edit, a bad
regex) comes back as a ToolError with a message that says what to do instead, never as an
exception. `render_result(result)` is the observation text for each result kind.

What it is not: a parser of model output or a scheduler. Calls of one trajectory run one after
another; concurrency limits (sandbox slots, compile slots, GPUs) belong to the caller and the
KernelEnv.

How it is used:
    tools = ToolBox(workspace, sandbox, kernel_env, task)
    result = await tools.run(ReadFile(path="model.py"))
    observation = render_result(result)
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import anyio
from msgspec import Struct

from agentcore.kernel_env import KernelEnv
from agentcore.sandbox import Sandbox, TokenCounter, truncate_middle
from agentcore.types import (
    Bash,
    CompileResult,
    Edit,
    EditFile,
    Finish,
    Glob,
    Grep,
    ProfileResult,
    ReadFile,
    Task,
    ToolCall,
    ToolError,
    ToolErrorKind,
    ToolOutput,
    ToolResult,
    VerifyResult,
    WriteFile,
)
from agentcore.workspace import Workspace, WorkspaceError, glob_regex, is_binary

log = logging.getLogger(__name__)

INVALID = ToolErrorKind.INVALID_CALL
DENIED = ToolErrorKind.DENIED
NOT_FOUND = ToolErrorKind.NOT_FOUND


class ToolBoxConfig(Struct, frozen=True, kw_only=True):
    output_tokens: int = 4096
    """Token budget of one file-tool result (bash has the sandbox's own budget)."""
    max_file_bytes: int = 4 * 1024 * 1024
    """read_file, write_file and edit_file refuse larger files; grep skips them."""
    line_chars: int = 2000
    """read_file cuts longer lines."""
    grep_max_matches: int = 200
    """grep stops after this many matching lines."""
    grep_line_chars: int = 300
    """grep shows at most this much of a matching line."""
    glob_max_results: int = 300
    """glob lists at most this many paths."""
    max_walk_entries: int = 100_000
    """glob and grep stop walking the workspace after this many entries."""


def _fail(kind: ToolErrorKind, message: str) -> ToolError:
    return ToolError(error=kind, message=message)


class ToolBox:
    """Runs tool calls for one trajectory in its workspace.

    Example:
        tools = ToolBox(workspace, Sandbox(), FakeKernelEnv(), task)
        await tools.run(ReadFile(path="model.py"))
        await tools.run(WriteFile(path="model_new.py", content=source))
        result = await tools.run(Compile())
    """

    def __init__(
        self,
        workspace: Workspace,
        sandbox: Sandbox,
        kernel_env: KernelEnv,
        task: Task,
        config: ToolBoxConfig = ToolBoxConfig(),
        count_tokens: TokenCounter | None = None,
    ) -> None:
        if workspace.owner_uid != sandbox.run_uid:
            raise ValueError(
                f"workspace owner uid {workspace.owner_uid} != sandbox uid {sandbox.run_uid}: "
                "create the workspace with owner_uid=sandbox.run_uid"
            )
        self.workspace = workspace
        self.sandbox = sandbox
        self.kernel_env = kernel_env
        self.task = task
        self.config = config
        self.count_tokens = count_tokens

    async def run(self, call: ToolCall) -> ToolResult:
        try:
            return await self._dispatch(call)
        except WorkspaceError as exc:
            return _fail(exc.kind, exc.message)
        except OSError as exc:  # e.g. a path component that is a file; the model can act on it
            log.info("tool %s: %r", type(call).__name__, exc)
            return _fail(
                ToolErrorKind.FAILED, f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
            )

    def render(self, result: ToolResult) -> str:
        return render_result(result)

    async def _dispatch(self, call: ToolCall) -> ToolResult:
        handlers = {
            Bash: self.bash,
            ReadFile: self.read_file,
            WriteFile: self.write_file,
            EditFile: self.edit_file,
            Glob: self.glob,
            Grep: self.grep,
        }
        if type(call) in handlers:
            return await handlers[type(call)](call)
        if isinstance(call, Finish):
            return ToolOutput(text="Finished. The workspace as it is now will be evaluated.")
        return await self.kernel_tool(str(call.__struct_config__.tag))

    def _clip(self, text: str) -> tuple[str, bool]:
        text, dropped = truncate_middle(text, self.config.output_tokens, self.count_tokens)
        return text, dropped > 0

    # -----------------------------------------------------------------------------------------

    async def bash(self, call: Bash) -> ToolResult:
        reason = self.sandbox.unavailable_reason()
        if reason is not None:
            return _fail(ToolErrorKind.FAILED, reason)
        res = await self.sandbox.run(call.command, self.workspace, call.timeout_s)
        if res.timed_out:
            return _fail(
                ToolErrorKind.TIMEOUT,
                f"command timed out after {res.seconds:.0f} s and was killed with all its "
                f"processes. Output before the kill:\n{res.output}",
            )
        return ToolOutput(
            text=res.output, exit_code=res.exit_code, truncated=res.truncated_bytes > 0
        )

    async def _read_text(self, path: Path, shown: str) -> str:
        """The text of an existing regular file, or a WorkspaceError the model can act on."""
        if not path.exists():
            raise WorkspaceError(NOT_FOUND, f"{shown} does not exist")
        st = path.stat()
        if stat.S_ISDIR(st.st_mode):
            raise WorkspaceError(INVALID, f"{shown} is a directory; list it with glob or bash ls")
        if not stat.S_ISREG(st.st_mode):
            raise WorkspaceError(INVALID, f"{shown} is not a regular file")
        if st.st_size > self.config.max_file_bytes:
            raise WorkspaceError(
                INVALID,
                f"{shown} is {st.st_size} bytes, over {self.config.max_file_bytes}; "
                "use bash (head, sed -n)",
            )
        data = await self.workspace.read_bytes(path)
        if is_binary(data):
            raise WorkspaceError(INVALID, f"{shown} is a binary file")
        return data.decode("utf-8", "replace")

    async def read_file(self, call: ReadFile) -> ToolResult:
        path = self.workspace.resolve(call.path)
        text = await self._read_text(path, call.path)
        self.workspace.mark_read(path)
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()
        if not lines:
            return ToolOutput(text=f"({call.path} is empty)")
        if call.offset >= len(lines):
            return _fail(
                INVALID, f"offset {call.offset} is past the end of {call.path} ({len(lines)} lines)"
            )
        text, cut = self._numbered(lines, call.offset, call.limit)
        return ToolOutput(text=text, truncated=cut)

    def _numbered(self, lines: list[str], offset: int, limit: int) -> tuple[str, bool]:
        """`cat -n` style, within the token budget; says where to continue if cut."""
        cap = self.config.line_chars
        count = self.count_tokens or (lambda s: (len(s.encode("utf-8", "replace")) + 3) // 4)
        budget = self.config.output_tokens - 32
        out, used, end = [], 0, min(len(lines), offset + limit)
        for i in range(offset, end):
            line = lines[i] if len(lines[i]) <= cap else lines[i][:cap] + " [... line cut ...]"
            row = f"{i + 1:6}\t{line}"
            used += count(row) + 1
            if used > budget and out:
                end = i
                break
            out.append(row)
        if end < len(lines):
            shown = f"lines {offset + 1}-{end} of {len(lines)}"
            out.append(f"[... {shown} shown; continue with offset={end} ...]")
        return "\n".join(out), end < len(lines)

    async def write_file(self, call: WriteFile) -> ToolResult:
        path = self.workspace.resolve(call.path, write=True)
        if path.is_dir():
            return _fail(INVALID, f"{call.path} is a directory")
        size = len(call.content.encode("utf-8", "replace"))
        if size > self.config.max_file_bytes:
            return _fail(INVALID, f"content is {size} bytes, over {self.config.max_file_bytes}")
        existed = path.exists()
        self.workspace.check_read_before_write(path)
        await self.workspace.write_text(path, call.content)
        verb = "Overwrote" if existed else "Created"
        lines = call.content.count("\n") + (not call.content.endswith("\n") and call.content != "")
        return ToolOutput(
            text=f"{verb} {self.workspace.relative(path)} ({lines} lines, {size} bytes)."
        )

    async def edit_file(self, call: EditFile) -> ToolResult:
        path = self.workspace.resolve(call.path, write=True)
        if not path.exists():
            return _fail(NOT_FOUND, f"{call.path} does not exist; create it with write_file")
        self.workspace.check_read_before_write(path)
        text = await self._read_text(path, call.path)
        replacements = 0
        for number, edit in enumerate(call.edits, 1):
            text, done = _apply_edit(text, edit, number, len(call.edits))
            replacements += done
        await self.workspace.write_text(path, text)
        rel = self.workspace.relative(path)
        return ToolOutput(
            text=f"Edited {rel}: {len(call.edits)} edit(s), {replacements} replacement(s)."
        )

    async def glob(self, call: Glob) -> ToolResult:
        pattern = self._relative_pattern(call.pattern)
        regex = glob_regex(pattern)
        matches = await anyio.to_thread.run_sync(self._glob, regex)
        if not matches:
            return ToolOutput(text=f"No files match {call.pattern}.")
        cap = self.config.glob_max_results
        text = "\n".join(matches[:cap])
        if len(matches) > cap:
            text += f"\n[... {len(matches) - cap} more not shown; narrow the pattern ...]"
        text, cut = self._clip(text)
        return ToolOutput(text=text, truncated=cut or len(matches) > cap)

    def _relative_pattern(self, pattern: str) -> str:
        pattern = pattern.strip()
        root = str(self.workspace.path)
        if pattern.startswith(root + "/"):
            pattern = pattern[len(root) + 1 :]
        if not pattern or pattern.startswith("/") or ".." in PurePosixPath(pattern).parts:
            raise WorkspaceError(
                DENIED, f"glob pattern {pattern!r} must be relative to the workspace, without '..'"
            )
        return pattern.removeprefix("./")

    def _glob(self, regex: re.Pattern[str]) -> list[str]:
        return sorted(
            rel
            for rel, _ in self.workspace.walk(self.workspace.path, self.config.max_walk_entries)
            if regex.fullmatch(rel)
        )

    async def grep(self, call: Grep) -> ToolResult:
        try:
            regex = re.compile(call.pattern)
        except re.error as exc:
            return _fail(INVALID, f"invalid regular expression {call.pattern!r}: {exc}")
        base = self.workspace.resolve(call.path)
        if not base.exists():
            return _fail(NOT_FOUND, f"{call.path} does not exist")
        name_filter = glob_regex(call.glob) if call.glob else None
        hits, more = await anyio.to_thread.run_sync(
            self._grep, regex, base, name_filter, call.glob or ""
        )
        if not hits:
            return ToolOutput(text="No matches.")
        text = "\n".join(hits)
        if more:
            text += (
                f"\n[... stopped after {len(hits)} matches; narrow the pattern, path or glob ...]"
            )
        text, cut = self._clip(text)
        return ToolOutput(text=text, truncated=cut or more)

    def _grep(
        self, regex: re.Pattern[str], base: Path, name_filter: re.Pattern[str] | None, glob: str
    ) -> tuple[list[str], bool]:
        files = (
            [(self.workspace.relative(base), base)]
            if base.is_file()
            else self.workspace.walk(base, self.config.max_walk_entries)
        )
        hits: list[str] = []
        for rel, path in files:
            if name_filter and not name_filter.fullmatch(rel if "/" in glob else path.name):
                continue
            for number, line in self._searchable_lines(path):
                if regex.search(line):
                    if len(hits) == self.config.grep_max_matches:
                        return hits, True
                    hits.append(f"{rel}:{number}:{line[: self.config.grep_line_chars]}")
        return hits, False

    def _searchable_lines(self, path: Path) -> Iterator[tuple[int, str]]:
        """Lines of a regular text file inside the workspace; nothing for binaries, big files,
        special files and symlinks that leave the workspace."""
        try:
            real = Path(os.path.realpath(path))
            st = real.stat()
        except OSError:
            return
        inside = real == self.workspace.path or self.workspace.path in real.parents
        if not inside or not stat.S_ISREG(st.st_mode) or st.st_size > self.config.max_file_bytes:
            return
        data = real.read_bytes()
        if is_binary(data):
            return
        for number, line in enumerate(data.decode("utf-8", "replace").split("\n"), 1):
            yield number, line[:10_000]  # bounds the cost of a pathological regex per line

    async def kernel_tool(self, name: str) -> ToolResult:
        """compile, verify, profile: the env reports model failures as results; if it raises,
        its infrastructure broke, and the model sees a failed tool."""
        run = {
            "compile": self.kernel_env.compile,
            "verify": self.kernel_env.verify,
            "profile": self.kernel_env.profile,
        }
        try:
            return await run[name](self.workspace.path, self.task)
        except Exception as exc:
            log.exception("kernel env %s failed for task %s", name, self.task.task_id)
            return _fail(
                ToolErrorKind.FAILED,
                f"{name} could not run ({type(exc).__name__}: {exc}); try again",
            )


def _apply_edit(text: str, edit: Edit, number: int, total: int) -> tuple[str, int]:
    """One exact replacement; a WorkspaceError aborts the whole call before anything is written."""
    where = f"edit {number} of {total}" + ("; no edit was applied" if total > 1 else "")
    if edit.old_string == "":
        raise WorkspaceError(INVALID, f"{where}: old_string is empty")
    if edit.old_string == edit.new_string:
        raise WorkspaceError(INVALID, f"{where}: old_string and new_string are identical")
    found = text.count(edit.old_string)
    if found == 0:
        raise WorkspaceError(
            INVALID, f"{where}: old_string not found (it must match exactly, whitespace included)"
        )
    if found > 1 and not edit.replace_all:
        raise WorkspaceError(
            INVALID,
            f"{where}: old_string occurs {found} times; "
            "add surrounding text to make it unique, or set replace_all",
        )
    return text.replace(edit.old_string, edit.new_string), found


# ---------------------------------------------------------------------------------------------
# What the model sees.


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f} ms"


def _speedup(base: float | None, candidate: float | None) -> str:
    if not base or not candidate:
        return ""
    return f" (speedup {base / candidate:.2f}x)"


def render_result(result: ToolResult, max_log_chars: int = 8000) -> str:
    """The observation text of one tool result."""
    match result:
        case ToolOutput(text=text, exit_code=code):
            body = text if text else "(no output)"
            return body if code is None else f"{body}\n[exit code {code}]"
        case ToolError(error=kind, message=message):
            return f"Error ({kind.value}): {message}"
        case CompileResult():
            return _render_compile(result, max_log_chars)
        case VerifyResult():
            return _render_verify(result)
        case ProfileResult():
            return _render_profile(result)
    raise TypeError(f"not a tool result: {type(result).__name__}")


def _render_compile(r: CompileResult, max_log_chars: int) -> str:
    if r.ok:
        return f"Compile OK ({r.built_units} built, {r.cached_units} cached, {r.seconds:.1f} s)."
    log_text, _ = truncate_middle(r.log, max_log_chars // 4)
    return f"Compile FAILED ({r.seconds:.1f} s):\n{log_text}"


def _render_verify(r: VerifyResult) -> str:
    if r.ok:
        err = "" if r.max_abs_err is None else f", max abs error {r.max_abs_err:.3g}"
        return f"Verify PASSED ({r.trials} trials{err})." + (f" {r.message}" if r.message else "")
    text = f"Verify FAILED: {r.message or 'outputs do not match the reference'}"
    if r.hack:
        text += (
            f"\nDetected reward hack: {r.hack}. Such a solution earns no reward; "
            "compute the result in your own kernels."
        )
    return text


def _render_profile(r: ProfileResult) -> str:
    if not r.ok:
        return f"Profile FAILED: {r.message}"
    lines = [
        f"candidate:     {_ms(r.candidate_ms)}",
        f"eager:         {_ms(r.eager_ms)}{_speedup(r.eager_ms, r.candidate_ms)}",
        f"torch.compile: {_ms(r.compile_ms)}{_speedup(r.compile_ms, r.candidate_ms)}",
    ]
    if r.compile_ms and r.candidate_ms:
        met = (r.compile_ms - r.candidate_ms) / r.compile_ms > 0.05
        lines.append("goal (>5% faster than torch.compile): " + ("met" if met else "not met yet"))
    if r.message:
        lines.append(r.message)
    return "Profile:\n" + "\n".join(lines)
