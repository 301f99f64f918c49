"""`BenchConfig`: everything a KernelBench benchmark run depends on, and the names derived from it.

What it is: the runner's config (saved as OUT/config.json, or config_step<N>.json for a training
checkpoint), `seed_of` (each trajectory's recorded sampling seed), `group_id` (the orchestrator's
group of a problem) and `source_label` (ProblemRecord.source of the run). What it is not: the
runner (`bench.kernelbench.run`, which re-exports these names) or the command line (`.cli`).

Example:
    config = BenchConfig(engine="replay", replay_paths=("rl/demos",), levels=(1,), out_dir="runs/b")
"""

from __future__ import annotations

import zlib
from typing import Literal

from msgspec import Struct

from agentcore.sglang.launcher import SGLangLaunch
from bench.kernelbench.problems import Problem


class BenchConfig(Struct, frozen=True, kw_only=True):
    """Everything a benchmark run depends on; saved as OUT/config.json (config_step<N>.json)."""

    problems_path: str = ""
    """KernelBench problems.jsonl; '' means $KERNELBENCH_PROBLEMS, else the copy shipped with the package."""
    levels: tuple[int, ...] = (1, 2, 3)
    """Levels to run; 4 is reported as skipped (hub weights)."""
    problem_ids: tuple[int, ...] = ()
    """Only these problem ids within the levels; empty: all."""
    redo: tuple[tuple[int, int], ...] = ()
    """(level, problem_id) of problems to judge again although OUT holds their record: their
    records and trajectories are set aside (`records.redone.jsonl`, `trajectories.redone.jsonl`)
    before the run (after an evaluator change). Give it once: a resume with it judges them anew."""
    engine: Literal["local", "sglang", "replay"] = "local"
    """local: the embedded engine on `model_path`; sglang: servers at `urls`, or one the bench starts
    on `model_path`; replay: solutions."""
    model_path: str = ""
    """HF model directory (local engine; also the default tokenizer)."""
    urls: tuple[str, ...] = ()
    """SGLang server URLs (sglang engine), routed stickily per trajectory."""
    tokenizer: str = ""
    """Tokenizer directory; '' means model_path, or the built-in tiny one for replay."""
    family: str = "hermes"
    """Tool-call format: hermes, qwen3_coder."""
    replay_paths: tuple[str, ...] = ()
    """Solution sets to replay (workspaces or single-file solutions); the first holding a problem wins."""
    replay_wrappers: bool = False
    """Also replay generated reference wrappers (after replay_paths), for every selected problem."""
    replay_checks: bool = True
    """Replayed trajectories call verify and profile too (else compile only; the final evaluation
    still verifies and times, at half the GPU time)."""
    out_dir: str = "runs/bench"
    """records.jsonl, trajectories.jsonl, config; shared by checkpoints (records carry the step)."""
    max_turns: int = 200
    """Turn limit (200 in the paper's evaluation)."""
    max_context_tokens: int = 131072
    """Context budget of a trajectory."""
    samples: int = 1
    """Trajectories per problem; the record is the best of them."""
    temperature: float = 1.0
    """Fixed sampling temperature."""
    top_p: float = 1.0
    """Fixed nucleus sampling."""
    max_new_tokens: int = 8192
    """Cap on one model turn."""
    seed: int = 0
    """Base seed; each trajectory's seed derives from it, the problem and the sample index."""
    checkpoint_step: int | None = None
    """Training step of the evaluated checkpoint (None: not from a training run)."""
    workers: int = 256
    """Trajectories in flight (orchestrator workers and model slots), as `cuda-agent rollout --workers`."""
    compile_slots: int = 16
    """Concurrent compile calls."""
    gpus: tuple[int, ...] = ()
    """GPUs for verification and profiling; empty: every GPU torch sees."""
    lanes_per_gpu: int = 1
    """GPU worker processes per GPU (`rewards.env.EnvConfig.lanes_per_gpu`): verifications share
    a GPU, profiling has it alone."""
    engine_device: str = "auto"
    """Device of the local engine, or of the SGLang server the bench starts: auto, cuda, cuda:1, cpu."""
    sglang: SGLangLaunch = SGLangLaunch(mem_fraction_static=0.5)
    """engine sglang without urls: the server the bench starts on `model_path` (stopped at the end)."""
    env: Literal["real", "fake"] = "real"
    """Kernel environment: real (nvcc + GPU queue) or the fake one (a CPU plumbing check: it
    compiles and runs nothing, so its records are no result); an out_dir holds runs of one env."""
    allow_unsandboxed: bool = False
    """Run the agent's bash without bubblewrap."""
    keep_workspaces: bool = False
    """Keep each trajectory's workspace (under OUT/workspaces)."""
    progress: bool = True
    """Show the live progress line on stderr."""
    rules: Literal["paper", "kernelbench"] = "paper"
    """The rule set of the evaluation (rewards.verdict.Rules); `cuda-agent bench --rules both` runs
    one benchmark per rule set, in OUT/paper and OUT/kernelbench."""
    recheck_baselines: bool = False
    """After the run, time every selected problem's eager and torch.compile baselines again in fresh
    worker processes (`bench.kernelbench.recheck`, `cuda-agent bench --recheck-baselines`)."""


def seed_of(config: BenchConfig, problem: Problem, sample: int) -> int:
    """The trajectory's base sampling seed (turn t samples with seed + t)."""
    return zlib.crc32(f"{config.seed}:{problem.level}:{problem.problem_id}:{sample}".encode()) & 0x3FFFFFFF


def group_id(problem: Problem, config: BenchConfig) -> str:
    step = "final" if config.checkpoint_step is None else f"step{config.checkpoint_step}"
    return f"{problem.task_id}@{step}"


def source_label(config: BenchConfig) -> str:
    """ProblemRecord.source of the whole run (the metrics summarise per source and step)."""
    if config.engine == "replay":
        return "replay:" + ",".join([*config.replay_paths, *(["wrappers"] if config.replay_wrappers else [])])
    return config.model_path or ",".join(config.urls)


__all__ = ["BenchConfig", "group_id", "seed_of", "source_label"]
