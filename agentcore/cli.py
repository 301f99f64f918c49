"""`cuda-agent`: one command, a subcommand per job.

Each subcommand lives with the package that owns it and is imported only when run, so
`cuda-agent rollout` never loads torch. Later packages add their rows to COMMANDS.
"""

from __future__ import annotations

import importlib
import sys

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


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items())
    return f"usage: cuda-agent <command> [options]\n\ncommands:\n{rows}\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"cuda-agent: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, func = COMMANDS[name][0].split(":")
    return int(getattr(importlib.import_module(module), func)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
