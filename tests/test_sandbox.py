"""Sandbox: escapes are tried for real and must be contained. Each test asserts one property.

The tests that run bwrap skip with the reason when bwrap is missing or cannot create its
namespaces here (CI installs it); the output-capping helpers and the mount order are tested
without it. Timeouts and the fork bomb are kept to a few seconds for a 2-core CI box.
"""

from __future__ import annotations

import os
import resource
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import anyio
import pytest

from agentcore.sandbox import (
    OutputCapture,
    Sandbox,
    SandboxConfig,
    SandboxUnavailable,
    bwrap_options,
    fit_tokens,
    truncate_middle,
)
from agentcore.types import Task
from agentcore.workspace import Workspace
from tests.fakes.tmp_venv import make_venv

TASK = Task(task_id="sandbox", source="print('reference')\n")
CONFIG = SandboxConfig(timeout_s=20, max_procs=64)


def _bwrap_problem() -> str | None:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    drop = {"user": 65534, "group": 65534, "extra_groups": []} if os.geteuid() == 0 else {}
    argv = [
        bwrap,
        "--ro-bind",
        "/",
        "/",
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "true",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, **drop)
    if proc.returncode != 0:
        return f"bwrap cannot create its namespaces here: {proc.stderr.strip()}"
    return None


BWRAP_PROBLEM = _bwrap_problem()
needs_bwrap = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=str(BWRAP_PROBLEM))


@pytest.fixture
def root():
    path = Path(tempfile.mkdtemp(prefix="agentcore-sandbox-"))
    path.chmod(0o711)  # the sandbox uid must traverse it
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _setup(root: Path, config: SandboxConfig = CONFIG, name: str = "traj-0"):
    sandbox = Sandbox(config)
    ws = await Workspace.create(TASK, root, name=name, owner_uid=sandbox.run_uid)
    return sandbox, ws


@pytest.fixture
async def box(root):
    return await _setup(root)


async def run(box, command: str, timeout_s: float | None = None):
    sandbox, ws = box
    return await sandbox.run(command, ws, timeout_s)


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


async def _eventually_none(marker: str, wait_s: float = 5.0) -> list[int]:
    """The pid namespace is torn down by the kernel just after its init dies."""
    with anyio.move_on_after(wait_s):
        while _processes_with(marker):
            await anyio.sleep(0.05)
    return _processes_with(marker)


# -- the filesystem -------------------------------------------------------------------------


@needs_bwrap
async def test_writes_inside_the_workspace_persist(box):
    await run(box, "mkdir -p kernels && echo ok > kernels/out.txt")
    assert (box[1].path / "kernels/out.txt").read_text() == "ok\n"


@needs_bwrap
@pytest.mark.parametrize(
    "target", ["/etc/agentcore-escape", "/usr/agentcore-escape", "/var/tmp/agentcore-escape"]
)
async def test_writes_outside_the_workspace_fail(box, target):
    result = await run(box, f"echo pwned > {target}")
    assert result.exit_code != 0 and not os.path.exists(target)


@needs_bwrap
async def test_workspace_parent_is_not_writable(box, root):
    await run(box, "echo pwned > ../escaped.txt")
    assert not (root / "escaped.txt").exists()


@needs_bwrap
async def test_sibling_workspaces_are_invisible(root):
    _, other = await _setup(root, name="traj-other")
    (other.path / "model_new.py").write_text("someone else's solution")
    result = await run(await _setup(root, name="traj-mine"), "ls ..")
    assert result.output.split() == ["traj-mine"]


@needs_bwrap
async def test_host_root_home_is_not_writable(box):
    result = await run(box, "touch /root/agentcore-escape")
    assert result.exit_code != 0


@needs_bwrap
async def test_host_shadow_file_is_not_readable(box):
    result = await run(box, "cat /etc/shadow")
    assert result.exit_code != 0


@needs_bwrap
async def test_tmp_is_private_from_the_host(box):
    name = f"/tmp/agentcore-host-{secrets.token_hex(4)}"
    Path(name).write_text("host secret")
    try:
        result = await run(box, f"cat {name}")
    finally:
        os.unlink(name)
    assert result.exit_code != 0


@needs_bwrap
async def test_tmp_writes_do_not_reach_the_host(box):
    name = f"/tmp/agentcore-sandbox-{secrets.token_hex(4)}"
    await run(box, f"echo x > {name}")
    assert not os.path.exists(name)


# -- protected files ------------------------------------------------------------------------


@needs_bwrap
@pytest.mark.parametrize(
    "command",
    [
        "echo x >> model.py",
        "echo x > model.py",
        "sed -i s/reference/hacked/ model.py",
        "chmod 666 model.py",
    ],
)
async def test_protected_file_cannot_be_modified(box, command):
    await run(box, command)
    path = box[1].path / "model.py"
    assert (path.read_text(), path.stat().st_mode & 0o777) == (TASK.source, 0o444)


@needs_bwrap
@pytest.mark.parametrize(
    "command", ["rm -f model.py", "mv model.py moved.py", "mv SKILL.md /tmp/x", "rm -f binding.cpp"]
)
async def test_protected_file_cannot_be_deleted_or_renamed(box, command):
    await run(box, command)
    assert {"model.py", "SKILL.md", "binding.cpp"} <= {p.name for p in box[1].path.iterdir()}


# -- network, processes, environment --------------------------------------------------------


@needs_bwrap
async def test_host_loopback_service_is_unreachable(box):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"
        result = await run(box, f'python3 -c "{code}"')
    finally:
        server.close()
    assert result.exit_code != 0


@needs_bwrap
async def test_external_network_is_unreachable(box):
    code = "import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)"
    result = await run(box, f'python3 -c "{code}"')
    assert result.exit_code != 0


@needs_bwrap
async def test_pid_namespace_hides_host_processes(box):
    result = await run(box, "ls /proc | grep -c '^[0-9]'")
    assert int(result.output) < 10


@needs_bwrap
async def test_environment_is_clean(box, monkeypatch):
    monkeypatch.setenv("AGENTCORE_HOST_SECRET", "hunter2")
    result = await run(box, "env")
    assert "hunter2" not in result.output


@needs_bwrap
@pytest.mark.skipif(
    BWRAP_PROBLEM is None and "--disable-userns" not in bwrap_options(shutil.which("bwrap")),
    reason="bwrap older than 0.8 has no --disable-userns",
)
async def test_new_user_namespaces_are_refused(box):
    result = await run(box, "unshare -U true")
    assert result.exit_code != 0


# -- limits ---------------------------------------------------------------------------------


@needs_bwrap
async def test_fork_bomb_hits_the_process_cap(root):
    box = await _setup(root, SandboxConfig(max_procs=32))
    result = await run(box, "b(){ b | b & }; b; sleep 2", timeout_s=3)
    assert "Resource temporarily unavailable" in result.output


@needs_bwrap
async def test_fork_bomb_leaves_no_processes_behind(root):
    box = await _setup(root, SandboxConfig(max_procs=32))
    marker = f"bomb_{secrets.token_hex(6)}"
    (box[1].path / f"{marker}.sh").write_text("b(){ b | b & }; b; sleep 30\n")
    await run(box, f"bash {marker}.sh", timeout_s=2)
    assert await _eventually_none(marker) == []


@needs_bwrap
async def test_endless_loop_hits_the_wall_timeout(box):
    result = await run(box, "while :; do :; done", timeout_s=1)
    assert result.timed_out


@needs_bwrap
async def test_timeout_kills_the_whole_process_group(box):
    marker = f"sleeper_{secrets.token_hex(6)}"
    await run(box, f"(exec -a {marker} sleep 60) & (exec -a {marker} sleep 60) & wait", timeout_s=1)
    assert await _eventually_none(marker) == []


@needs_bwrap
async def test_background_processes_die_with_the_command(box):
    marker = f"bg_{secrets.token_hex(6)}"
    result = await run(
        box, f"(exec -a {marker} sleep 60) > /dev/null 2>&1 &\necho started", timeout_s=5
    )
    assert not result.timed_out and await _eventually_none(marker) == []


@needs_bwrap
async def test_cpu_seconds_are_capped(root):
    box = await _setup(root, SandboxConfig(cpu_s=1))
    result = await run(box, "while :; do :; done", timeout_s=15)
    assert not result.timed_out and result.exit_code != 0


@needs_bwrap
async def test_file_size_is_capped(root):
    box = await _setup(root, SandboxConfig(file_size_mib=1))
    await run(box, "head -c 4M /dev/zero > big.bin")
    assert (box[1].path / "big.bin").stat().st_size <= 1 << 20


@needs_bwrap
async def test_address_space_is_capped(root):
    box = await _setup(root, SandboxConfig(mem_gib=0.5))
    result = await run(box, "python3 -c 'b = bytearray(1 << 30)'")
    assert "MemoryError" in result.output


@needs_bwrap
async def test_concurrent_sandboxes_have_separate_process_caps(root):
    holder, other = (
        await _setup(root, SandboxConfig(max_procs=40), "a"),
        await _setup(root, SandboxConfig(max_procs=40), "b"),
    )
    spawn = "for i in $(seq 25); do sleep {s} & done; wait; echo spawned"
    async with anyio.create_task_group() as tg:
        tg.start_soon(run, holder, spawn.format(s=3))
        await anyio.sleep(1)  # the holder's 25 sleepers are alive now
        result = await run(other, spawn.format(s=0.5))
    assert "spawned" in result.output and "retry" not in result.output


# -- output ---------------------------------------------------------------------------------


@needs_bwrap
async def test_gigabytes_of_output_are_capped_without_buffering(box):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    result = await run(box, "head -c 3G /dev/zero")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert len(result.output) < 64 * 1024 and grown_mib < 200


@needs_bwrap
async def test_endless_output_reports_the_dropped_bytes(box):
    result = await run(box, "yes", timeout_s=2)
    assert result.truncated_bytes > 1 << 20 and "bytes truncated" in result.output


@needs_bwrap
async def test_output_keeps_head_and_tail(box):
    result = await run(box, "seq 1 200000")
    lines = result.output.splitlines()
    assert (lines[0], lines[-1]) == ("1", "200000")


@needs_bwrap
async def test_stderr_is_merged_into_the_output(box):
    result = await run(box, "echo out; echo err >&2")
    assert result.output == "out\nerr\n"


@needs_bwrap
async def test_statistics_count_runs_and_timeouts(box):
    await run(box, "true")
    await run(box, "sleep 5", timeout_s=0.3)
    stats = box[0].statistics()
    assert (stats.runs, stats.timeouts, stats.running) == (2, 1, 0)


# -- without bwrap, and the pieces that need no bwrap ---------------------------------------


async def test_missing_bwrap_refuses_to_run(root):
    sandbox, ws = await _setup(root, SandboxConfig(bwrap_path="/nonexistent/bwrap"))
    with pytest.raises(SandboxUnavailable):
        await sandbox.run("true", ws)


async def test_unsandboxed_opt_in_runs_plain_bash_with_the_timeout(root):
    sandbox, ws = await _setup(
        root, SandboxConfig(bwrap_path="/nonexistent/bwrap", allow_unsandboxed=True)
    )
    result = await sandbox.run("sleep 10", ws, timeout_s=0.5)
    assert result.timed_out


async def test_mount_order_puts_the_workspace_after_tmpfs_and_protected_files_last(root):
    sandbox, ws = await _setup(root)
    argv = sandbox.argv("true", ws) if sandbox.bwrap else pytest.skip(BWRAP_PROBLEM or "no bwrap")
    ws_bind = argv.index("--bind")
    assert argv.index("/tmp") < ws_bind < argv.index(str(ws.path / "model.py"))


def test_capture_keeps_head_and_tail_and_counts_the_middle():
    capture = OutputCapture(8)
    for chunk in (b"abcd", b"0123456789", b"wxyz"):
        capture.feed(chunk)
    assert capture.parts() == (b"abcd", b"wxyz", 10)


def test_fit_tokens_respects_a_custom_counter():
    words = lambda s: len(s.split())  # noqa: E731
    text, dropped = fit_tokens(" ".join(["w"] * 500), "", 0, 50, words)
    assert words(text) <= 50 and dropped > 0


def test_truncate_middle_leaves_short_text_alone():
    assert truncate_middle("short", 100) == ("short", 0)


def test_fit_tokens_counts_bytes_cut_before_counting():
    text, dropped = fit_tokens("a" * 10_000, "b" * 10_000, 0, 100)
    assert dropped == 20_000 - len(text.split("\n")[0]) - len(text.split("\n")[-1])


@needs_bwrap
async def test_hidden_host_paths_are_empty(root):
    secret_dir = root / "project"
    secret_dir.mkdir(mode=0o755)
    (secret_dir / "grader.py").write_text("answers")
    box = await _setup(root, SandboxConfig(hide_paths=(str(secret_dir),)))
    result = await run(box, f"ls -A {secret_dir}")
    assert result.output == ""


AGENT_IN_VENV = """
import sys, anyio
from pathlib import Path
from agentcore.sandbox import Sandbox, SandboxConfig
from agentcore.types import Task
from agentcore.workspace import Workspace

async def main():
    sandbox = Sandbox(SandboxConfig(timeout_s=20))
    ws = await Workspace.create(Task(task_id="t", source="x = 1\\n"), Path(sys.argv[1]), name="traj-0",
                                owner_uid=sandbox.run_uid)
    result = await sandbox.run("echo started; python3 -c 'print(6 * 7)'", ws)
    print(result.exit_code, result.output.strip().replace("\\n", " "))

anyio.run(main)
"""


@needs_bwrap
@pytest.mark.parametrize("mode", [0o755, 0o700])  # 0o700: mktemp -d's, which the sandbox's user cannot enter
def test_the_sandbox_starts_from_a_virtualenv_under_tmp(root, mode):
    """Run from a virtualenv under /tmp (the sandbox mounts a /tmp of its own, and binds the
    interpreter back where the sandbox's user may enter it), commands run and python3 works."""
    venv_root = Path(tempfile.mkdtemp(prefix="venv-sandbox-", dir="/tmp"))
    try:
        python = make_venv(venv_root)
        venv_root.chmod(mode)
        out = subprocess.run([str(python), "-c", AGENT_IN_VENV, str(root)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip().splitlines()[-1].split() == ["0", "started", "42"]
    finally:
        shutil.rmtree(venv_root, ignore_errors=True)
