"""`cuda-agent bench --suite kernelbench`: benchmark a model, or replay a solution set, on KernelBench.

    cuda-agent bench --suite kernelbench --levels 1,2,3 --engine local --model HF_DIR --out runs/b
    cuda-agent bench --suite kernelbench --engine sglang --url http://h:30000 --tokenizer HF_DIR
    cuda-agent bench --suite kernelbench --replay rl/demos --wrappers --out runs/replay
    cuda-agent bench --suite kernelbench --replay rl/demos --out runs/replay --recheck-baselines
    cuda-agent bench --write-wrappers DIR [--levels 1,2,3]
    cuda-agent bench --watch RUN_DIR [...]            (bench.kernelbench.watch)

Writes OUT/records.jsonl (one line per problem; a rerun resumes; `--redo 1/6,3/28` judges those
problems again, their old lines set aside in OUT/*.redone.jsonl), OUT/trajectories.jsonl, the
resolved config, and the report (`bench.kernelbench.report.write_report`); prints one line per
problem (verdict, hack category, speedups) and the summary. Level 4 is skipped with a message:
its Models load HuggingFace hub weights. `--replay PATH` (repeatable; implies `--engine replay`)
takes our workspaces or KernelBench single-file solutions (`level1/19_ReLU.py`); `--wrappers`
adds generated reference wrappers for every problem no earlier set covers (all must be rejected).
`--rules` picks the rule set (`rewards.verdict.Rules`); `--rules both` runs once per rule set and
compares them (`bench.kernelbench.rules_report`). `--recheck-baselines` then times every selected
problem's eager and torch.compile baselines once more in fresh processes
(`bench.kernelbench.recheck`): OUT/baseline_recheck.jsonl, and the share within 10% in the
report; on a finished OUT it only rechecks (also resumable).

`--env real` (the default) first checks the machine (`rewards.build.toolchain.check_gpu_machine`:
a CUDA build of torch, nvcc, a GPU) and refuses in one line, with the fix; an environment error
during the run (`MachineError`) stops it, exit 2, leaving its problems to a rerun. `--env fake`
is a plumbing check: stdout and the report say so, and show no rate. `--workers` (old name
`--concurrency`) is `cuda-agent rollout`'s name for the trajectories in flight.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections import Counter
from pathlib import Path

import anyio

from agentcore import runtime
from agentcore.cli import HelpFormatter, checked_dir, checked_url
from agentcore.signals import stop_on_signal
from bench.kernelbench.recheck import NoGpuError
from bench.system.records import ProblemRecord
from rewards.build.toolchain import MachineError, ToolchainError, check_gpu_machine

FAKE_ENV_LINE = ("cuda-agent bench: --env fake is a plumbing check, not a result: the fake environment compiles "
                 "and runs nothing and passes any kernel with made-up times; run --env real on a GPU machine "
                 "for pass rates and speedups")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _problem_keys(text: str) -> tuple[tuple[int, int], ...]:
    """"1/6,3/28" -> ((1, 6), (3, 28))."""
    keys = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        level, _, problem_id = item.partition("/")
        if not (level.isdigit() and problem_id.isdigit()):
            raise ValueError(f"--redo takes LEVEL/PROBLEM_ID items such as 1/6,3/28, not {item!r}")
        keys.append((int(level), int(problem_id)))
    return tuple(keys)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cuda-agent bench", description=__doc__.split("\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--suite", choices=["kernelbench"], default="kernelbench", help="benchmark suite")
    p.add_argument("--problems", default="", help="KernelBench problems.jsonl (default: $KERNELBENCH_PROBLEMS, else the copy shipped with the package)")
    p.add_argument("--levels", default="1,2,3", help="KernelBench levels (4 is skipped: hub weights)")
    p.add_argument("--problem-ids", default="", help="only these problem ids, e.g. 19,23")
    p.add_argument("--redo", default="", metavar="L/ID,...",
                   help="judge these problems again although OUT has their records, e.g. 1/6,3/28 (once, not on a resume)")
    p.add_argument("--engine", choices=["local", "sglang", "replay"], help="default: replay with --replay, else local")
    p.add_argument("--model", default="", help="HF model directory or a named model (smollm2-135m): the local engine's, or the one an SGLang server the bench starts serves (--engine sglang without --url); the default tokenizer")
    p.add_argument("--url", action="append", default=[], help="SGLang server URL (repeatable)")
    p.add_argument("--tokenizer", default="", help="tokenizer directory (default: --model)")
    p.add_argument("--family", default="hermes", help="tool-call format: hermes, qwen3_coder")
    p.add_argument("--replay", action="append", default=[], metavar="PATH", help="solution set to replay (repeatable)")
    p.add_argument("--wrappers", action="store_true", help="also replay generated reference wrappers")
    p.add_argument("--no-replay-checks", action="store_true",
                   help="replayed trajectories only compile (the final evaluation still verifies and times)")
    p.add_argument("--write-wrappers", metavar="DIR", help="only write the wrapper workspaces to DIR and exit")
    p.add_argument("--out", default="runs/bench", help="output directory (a rerun resumes)")
    p.add_argument("--max-turns", type=int, default=200, help="turn limit of a trajectory (the paper's)")
    p.add_argument("--samples", type=int, default=1, help="trajectories per problem (the best is recorded)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling")
    p.add_argument("--max-new-tokens", type=int, default=8192, help="cap on one model turn")
    p.add_argument("--seed", type=int, default=0, help="base seed; each trajectory's derives from it")
    p.add_argument("--checkpoint-step", type=int, default=None, help="training step of the model, for the records")
    p.add_argument("--workers", "--concurrency", dest="workers", type=int, default=256,
                   help="concurrent trajectories (as in cuda-agent rollout; --concurrency is the old name)")
    p.add_argument("--gpus", default="", help="verification GPUs, e.g. 0,1 (default: all)")
    p.add_argument("--lanes-per-gpu", type=int, default=1,
                   help="GPU worker processes per GPU: verifications share a GPU, profiling has it alone")
    p.add_argument("--engine-device", default="auto", help="local engine device: auto, cuda:0, cpu")
    p.add_argument("--rules", choices=["paper", "kernelbench", "both"], default="paper",
                   help="paper: the candidate's kernels do all the work; kernelbench: torch may do part of it; "
                        "both: one run per rule set (OUT/paper, OUT/kernelbench) and OUT/rules_report.md")
    p.add_argument("--env", choices=["real", "fake"], default="real",
                   help="kernel environment: real (nvcc and a GPU) or fake (a CPU plumbing check that compiles "
                        "and runs nothing: no result)")
    p.add_argument("--allow-unsandboxed", action="store_true", help="run bash without bwrap")
    p.add_argument("--keep-workspaces", action="store_true", help="keep each trajectory's workspace (OUT/workspaces)")
    p.add_argument("--no-report", action="store_true", help="skip report.md and the plots")
    p.add_argument("--recheck-baselines", action="store_true",
                   help="after the run, time each problem's eager/compile baselines again in fresh processes")
    p.add_argument("--watch", metavar="RUN_DIR", help="benchmark a training run's checkpoints as they appear")
    return p


def to_config(a: argparse.Namespace):
    from bench.kernelbench.problems import parse_levels
    from bench.kernelbench.run import BenchConfig

    engine = a.engine or ("replay" if a.replay or a.wrappers else "local")
    for url in a.url:
        checked_url(url)
    if a.tokenizer:
        checked_dir(a.tokenizer, "--tokenizer")
    return BenchConfig(
        problems_path=a.problems, levels=parse_levels(a.levels), problem_ids=_ints(a.problem_ids), engine=engine,
        redo=_problem_keys(a.redo),
        model_path=a.model, urls=tuple(a.url), tokenizer=a.tokenizer, family=a.family,
        replay_paths=tuple(a.replay), replay_wrappers=a.wrappers, replay_checks=not a.no_replay_checks,
        out_dir=a.out, max_turns=a.max_turns, samples=a.samples, temperature=a.temperature, top_p=a.top_p,
        max_new_tokens=a.max_new_tokens, seed=a.seed, checkpoint_step=a.checkpoint_step,
        workers=a.workers, gpus=_ints(a.gpus), lanes_per_gpu=a.lanes_per_gpu, engine_device=a.engine_device,
        env=a.env,
        allow_unsandboxed=a.allow_unsandboxed, keep_workspaces=a.keep_workspaces,
        recheck_baselines=a.recheck_baselines, rules="paper" if a.rules == "both" else a.rules,
    )


def _check(p: argparse.ArgumentParser, config) -> None:
    if config.engine == "replay" and not (config.replay_paths or config.replay_wrappers):
        p.error("--engine replay needs --replay PATH or --wrappers")
    if config.engine == "local" and not config.model_path:
        p.error("--engine local needs --model HF_DIR")
    if config.engine == "sglang" and not (config.urls or config.model_path):
        p.error("--engine sglang needs --url, or --model for a server the bench starts")
    if config.engine == "sglang" and not (config.tokenizer or config.model_path):
        p.error("--engine sglang needs --tokenizer (the servers run with --skip-tokenizer-init)")
    if config.recheck_baselines and config.env == "fake":
        p.error("--recheck-baselines times on the GPU: it needs --env real")


def _fmt(x: float | None, unit: str = "x") -> str:
    return "-" if x is None else f"{x:.2f}{unit}"


def print_table(records: list[ProblemRecord], out=None) -> None:
    """One line per problem, then counts: the plain table (the report has the full one)."""
    out = out or sys.stdout
    for r in records:
        verdict = r.status or r.outcome
        times = (f"eager {_fmt(r.speedup_vs_eager)} compile {_fmt(r.speedup_vs_compile)}" if r.env != "fake"
                 else "fake env: not compiled, not timed")
        print(f"L{r.level} {r.name:<48.48} {verdict:<14} {r.hack or '-':<22} {times}", file=out)
    counts = Counter(r.outcome for r in records)
    if any(r.env == "fake" for r in records):
        print(f"\n{len(records)} problems went through rollout, scoring and recording: {dict(counts)}", file=out)
        print(FAKE_ENV_LINE, file=out)
        return
    correct = sum(r.correct and not r.hack for r in records)
    hacks = Counter(r.hack for r in records if r.hack)
    print(f"\n{len(records)} problems: {dict(counts)}; correct {correct}; hacks {dict(hacks)}", file=out)


def report(out_dir: str, records: list[ProblemRecord]) -> str | None:
    """The single call site of the report: bench.kernelbench.report.write_report if present."""
    try:
        write_report = importlib.import_module("bench.kernelbench.report").write_report
    except (ImportError, AttributeError):
        return None
    return str(write_report(out_dir, records))


async def _run(config) -> list[ProblemRecord] | None:
    """run_benchmark (and the baseline recheck) until it ends (its records) or SIGINT/SIGTERM
    stops it (None)."""
    from bench.kernelbench.recheck import recheck_baselines, summarize_recheck
    from bench.kernelbench.run import run_benchmark

    records: list[ProblemRecord] | None = None
    finished = False
    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_on_signal, tg.cancel_scope, "cuda-agent bench")
        records = await run_benchmark(config)
        if config.recheck_baselines:
            s = summarize_recheck(await recheck_baselines(config))
            share = "-" if s.both_within is None else f"{100 * s.both_within:.1f}%"
            print(f"baseline recheck: {s.problems} problems timed twice, {s.errors} failed; eager and compile "
                  f"both within {100 * (s.agree_ratio - 1):.0f}%: {share}", file=sys.stderr)
        finished = True
        tg.cancel_scope.cancel()
    return records if finished else None


def main(argv: list[str]) -> int:
    if "--watch" in argv:
        from bench.kernelbench.watch import main_watch

        return main_watch(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    p = build_parser()
    a = p.parse_args(argv)
    try:
        config = to_config(a)
    except ValueError as exc:
        p.error(str(exc))
    if a.write_wrappers:
        return _write_wrappers(config, Path(a.write_wrappers))
    if a.rules == "both":
        from bench.kernelbench.rules_report import main_both

        return main_both(argv, main, a.out)
    _check(p, config)
    if config.env == "fake":
        print(FAKE_ENV_LINE, flush=True)
    elif problem := machine_problem(config.gpus):
        print(f"cuda-agent bench: this machine cannot run --env real: {problem} (--env fake runs a CPU plumbing "
              "check instead)", file=sys.stderr)
        return 2
    try:
        records = runtime.run(_run, config)
    except MachineError as exc:
        print(f"cuda-agent bench: environment error (this machine, not the kernels), stopped: {exc}; the "
              "problems it stopped have no record and the same command retries them", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError, NoGpuError, ToolchainError) as exc:
        print(f"cuda-agent bench: {exc}", file=sys.stderr)
        return 2
    if records is None:
        print(f"cuda-agent bench: stopped; finished problems are in {config.out_dir}/records.jsonl, "
              "the same command resumes", file=sys.stderr)
        return 130
    print_table(records)
    if not a.no_report and records and (path := report(config.out_dir, records)):
        print(f"report: {path}")
    errors = sum(r.outcome == "error" for r in records)
    return 1 if records and errors == len(records) else 0


def machine_problem(gpus: tuple[int, ...]) -> str | None:
    """Why this machine cannot verify and time kernels (one line, with the fix), or None."""
    try:
        check_gpu_machine(gpus)
    except MachineError as exc:
        return str(exc)
    return None


def _write_wrappers(config, root: Path) -> int:
    from bench.kernelbench.problems import default_problems_path, load_problems
    from bench.kernelbench.wrappers import write_wrappers

    selection = load_problems(config.problems_path or default_problems_path(), config.levels, config.problem_ids)
    paths = write_wrappers(selection.problems, root)
    print(f"wrote {len(paths)} wrapper workspaces to {root}")
    return 0
