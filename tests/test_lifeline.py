"""agentcore.lifeline: a wrapped child in a session of its own dies when its parent is SIGKILLed;
an unwrapped one (the control) lives on. Real processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from agentcore.lifeline import lifeline_argv

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

# The parent: starts `sleep` in its own session (as the trainer starts ranks and servers), prints
# the child's pid, then waits to be killed.
PARENT = """
import subprocess, sys, time
from agentcore.lifeline import lifeline_argv
argv = ["sleep", "600"]
if sys.argv[1] == "wrapped":
    argv = lifeline_argv(argv)
child = subprocess.Popen(argv, start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [part.decode() for part in f.read().split(b"\0") if part]


def _child_after_parent_killed(mode: str) -> int:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 10
    while _cmdline(child) != ["sleep", "600"]:  # the wrapper has exec'd the program in its place
        assert time.monotonic() < deadline, _cmdline(child)
        time.sleep(0.02)
    parent.kill()
    parent.wait()
    return child


def test_a_wrapped_child_dies_with_its_sigkilled_parent():
    child = _child_after_parent_killed("wrapped")
    deadline = time.monotonic() + 10
    while _alive(child):
        assert time.monotonic() < deadline, "the wrapped child outlived its parent"
        time.sleep(0.05)


def test_an_unwrapped_child_outlives_its_parent():
    child = _child_after_parent_killed("plain")
    try:
        time.sleep(0.5)
        assert _alive(child)
    finally:
        os.kill(child, signal.SIGKILL)


def test_an_orphan_exits_before_running_the_command(tmp_path):
    marker = tmp_path / "ran"
    argv = lifeline_argv(["touch", str(marker)], parent=1)  # pid 1 is not our parent
    proc = subprocess.run(argv, env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=30)
    assert proc.returncode == 1 and not marker.exists()


def _lifeline(*args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "agentcore.lifeline", "--parent", str(os.getpid()), *args]
    return subprocess.run(argv, env={**os.environ, "PYTHONPATH": os.getcwd()}, capture_output=True, text=True,
                          timeout=30)


def test_missing_or_unknown_programs_are_errors():
    missing = _lifeline("--")
    assert missing.returncode == 2 and "no command" in missing.stderr
    unknown = _lifeline("--", "/no/such/program")
    assert unknown.returncode == 127 and "cannot run /no/such/program" in unknown.stderr
    ran = _lifeline("--", sys.executable, "-c", "print('here')")
    assert ran.returncode == 0 and ran.stdout == "here\n"
