"""`cuda-agent`: one command, a subcommand per job.

Each subcommand lives with the package that owns it and is imported only when run, so
`cuda-agent rollout` never loads torch. Later packages add their rows to COMMANDS. The helpers
below are shared by the subcommands' parsers: `HelpFormatter` shows defaults in `--help`, and
`UsageError` (raised by `checked_url`, `checked_dir`) is printed as one line, exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

# name -> (module:function, one-line help). The function takes argv and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "rollout": ("agentcore.rollout_cmd:main", "run the agent over a task file and store trajectories"),
    "smoke": ("rl.smoke:main", "the quick end-to-end training run: tiny model, RFT on demonstrations, PPO steps"),
    "eval": ("rewards.eval_cmd:main", "evaluate one solution the way the trainer does"),
    "train": ("rl.train:main", "train the agent: a recipe, a stage, dotted overrides, --resume"),
    "plot": ("rl.plot:main", "draw a run's training curves to PNG"),
    "synth": ("rl.data.synth_cmd:main", "synthesize training tasks: compose, decontaminate, GPU-filter, report"),
    "bench": ("bench.kernelbench.cli:main", "benchmark a model (or replay a solution set) on KernelBench"),
}


class UsageError(ValueError):
    """A bad command-line value; `main` prints it as one line (no usage, no traceback), exit 2."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to an option's help, except where the default is nothing (None,
    False, an empty string or list) or the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        nothing = action.default is None or action.default is False or action.default in ("", [])  # 0 is shown
        if nothing or action.required or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def checked_url(url: str, flag: str = "--url") -> str:
    """`url` if it is an http(s) URL with a host (and a numeric port, if any), else UsageError."""
    parts = urlsplit(url)
    try:
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port is None or parts.port > 0)
    except ValueError:  # a port that is not a number, or out of range
        ok = False
    if not ok:
        raise UsageError(f"{flag} {url!r} is not a server URL (like http://127.0.0.1:30000)")
    return url


def checked_dir(path: str, flag: str) -> str:
    """`path` if it is a directory, else UsageError naming the flag."""
    if not Path(path).is_dir():
        what = "not a directory" if Path(path).exists() else "no such directory"
        raise UsageError(f"{flag} {path}: {what}")
    return path


def version() -> str:
    """The installed package's version, or pyproject.toml's in a source tree that is not installed."""
    try:
        return importlib.metadata.version("cuda-agent")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
        return str(pyproject["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items())
    return (
        f"usage: cuda-agent <command> [options]   (cuda-agent <command> --help: its options)\n"
        f"       cuda-agent --version\n\ncommands:\n{rows}\n"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"cuda-agent {version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"cuda-agent: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, func = COMMANDS[name][0].split(":")
    try:
        return int(getattr(importlib.import_module(module), func)(rest) or 0)
    except UsageError as exc:
        print(f"cuda-agent {name}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # Run the module under its own name: the commands raise `agentcore.cli.UsageError`, which
    # is not this `__main__` copy's class.
    sys.exit(importlib.import_module("agentcore.cli").main())
