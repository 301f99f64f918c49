"""Child processes that die with the process that started them, even when it is SIGKILLed.

What it is: `lifeline_argv(argv)` wraps a command line so that the program gets SIGKILL from the
kernel the moment its parent exits: `python -m agentcore.lifeline --parent PID -- PROGRAM ARGS...`
sets Linux's PR_SET_PDEATHSIG (kept across exec), exits at once if PID is already gone (the parent
died before the flag was set), then execs PROGRAM in its place, so the pid, the process group and
the signals the caller sends are PROGRAM's. `die_with_parent()` does the same from inside a Python
process (a torchrun worker, whose parent is the torchrun agent).

Why: the learner ranks and SGLang servers run in sessions of their own (one killpg stops each of
them cleanly), so a `kill -9` of `cuda-agent train` would leave them running, holding their GPUs
and ports, in the way of `--resume`.

What it is not: a process supervisor. It reaches only the processes it wraps (their own children
need their own lifeline), the signal follows the parent *thread* that forked the child (spawn from
the event loop's thread, never from a worker thread that may exit), and off Linux it does nothing.

    argv = lifeline_argv([sys.executable, "-m", "rl.learner.rank", "--run-dir", run_dir])
    process = await anyio.open_process(argv, start_new_session=True)
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None) -> bool:
    """Ask the kernel for SIGKILL when this process's parent exits; exit now if `parent` (the pid
    expected as parent) is already gone. False where the platform has no such request."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            armed = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0
        except (OSError, AttributeError):
            armed = False
    if parent is not None and os.getppid() != parent:
        os._exit(1)  # orphaned between fork and prctl: the signal will never come
    return armed


def lifeline_argv(argv: list[str], parent: int | None = None) -> list[str]:
    """`argv` run through the lifeline: killed when `parent` (default: this process) exits."""
    pid = os.getpid() if parent is None else parent
    return [sys.executable, "-m", "agentcore.lifeline", "--parent", str(pid), "--", *argv]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentcore.lifeline", description=__doc__.split("\n")[0])
    parser.add_argument("--parent", type=int, required=True, help="pid of the parent to die with")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    die_with_parent(args.parent)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"agentcore.lifeline: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
