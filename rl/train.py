"""`cuda-agent train`: one training run, from a recipe plus dotted overrides.

    cuda-agent train                     (single_gpu on a machine with a GPU, smoke_cpu without)
    cuda-agent train --recipe single_gpu --stage rft --set model.path=/models/qwen --set steps.rft=50
    cuda-agent train --recipe node_8gpu --out runs/r1 --resume
    cuda-agent train --recipe single_gpu --set engine.kind=sglang --set weight_sync.mode=sglang_tensor
        (the run starts an SGLang server per learner GPU; or give them: --set 'engine.urls=[...]')

With SGLang servers, `weight_sync.mode=sglang_tensor` has learner rank r push each update to
`engine.urls[r]` (colocated on its GPU: CUDA IPC handles, no copy through the host);
`sglang_disk` exports the actor to RUN/weights/vN and every server loads it from there.

The run directory (`--out`, or `--run-dir`) gets `.cuda-agent-run` (the command that made it and
when), `config.json` (the resolved config), `learner.log` (the ranks' output), `rollouts/` (every
trajectory, by stage and step), `ckpt/` (checkpoints, `latest`), `hf/` (the actor exported as a
Hugging Face model), `metrics.jsonl` and `tb/` (TensorBoard). `--resume` continues from the
latest checkpoint (after a crash or kill -9); without it a run directory with checkpoints is
refused, and so is a directory holding other files unless `--force` (the run then writes its own
files there; nothing else in it is deleted). Steps are numbered from 0 in the log, the progress
line, metrics.jsonl and the plots; checkpoint `step_000004` holds steps 0-3 and a resume starts
at step 4.

The loop is `train(run)` below; the parts of a step are in `rl/stages.py`, the open parts of the
run (kernel env, learner ranks, engine clients) in `rl/run.py`.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import orjson

from agentcore import runtime
from agentcore.cli import HelpFormatter, UsageError
from agentcore.signals import stop_on_signal
from rl.metrics import MetricsWriter, ProgressBar

if TYPE_CHECKING:  # these import torch and transformers: loaded when a run starts, not for --help
    from agentcore.types import Task
    from rl.config import TrainConfig
    from rl.run import Run
    from rl.stages import Collection, Stage

log = logging.getLogger("cuda-agent.train")

RECIPE_NAMES = ("smoke", "learning", "smoke_cpu", "single_gpu", "node_2gpu", "node_4gpu", "node_8gpu")
"""`rl.recipes.RECIPES`' names (a test keeps them equal), here so that parsing needs no torch."""
RUN_MARKER = ".cuda-agent-run"
"""The file that makes a directory a run's: `{"command": "train", "argv": [...], "time": ...}`."""
RUN_FILES = (RUN_MARKER, "config.json", "learner.log", "metrics.jsonl", "summary.json", "heldout.jsonl",
             "families_split.json", "ckpt", "hf",
             "hf.tmp", "hf.old", "rollouts", "batches", "tb", "tokenizer", "weights", "plots")
"""What a run writes in its directory; all that `clear_run` removes."""


def parse_args(argv: list[str]) -> tuple[TrainConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(prog="cuda-agent train", description=__doc__.split("\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--recipe", choices=RECIPE_NAMES,
                   help="named run (default: single_gpu on a machine with a GPU, smoke_cpu without one)")
    p.add_argument("--stage", choices=["single_turn", "rft", "value", "ppo", "smoke"],
                   help="what to train (default: the recipe's)")
    p.add_argument("--out", "--run-dir", dest="out", metavar="DIR",
                   help="run directory (default: the recipe's, runs/RECIPE)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="dotted override, repeatable")
    p.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    p.add_argument("--force", action="store_true",
                   help="write the run into a directory that holds other files (they are kept)")
    a = p.parse_args(argv)
    from rl.config import apply_overrides  # torch: after --help has answered
    from rl.recipes import RECIPES

    if a.recipe is None:
        a.recipe = default_recipe()
        machine = "no GPU" if a.recipe == "smoke_cpu" else "a GPU"
        print(f"cuda-agent train: recipe {a.recipe}, as this machine has {machine} (--recipe picks another)",
              file=sys.stderr)
    overrides = list(a.set)
    if a.stage:
        overrides.append(f"stage={a.stage}")
    if a.out:
        overrides.append(f"run_dir={a.out}")
    try:
        cfg = apply_overrides(RECIPES[a.recipe](), overrides)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return cfg, a


def default_recipe() -> str:
    """single_gpu where CUDA sees a GPU, else smoke_cpu (the CPU variant of the smoke run)."""
    import torch

    return "single_gpu" if torch.cuda.is_available() else "smoke_cpu"


async def train(run: Run) -> list[dict]:
    """Run the stage plan from wherever the run's checkpoints say; returns the metric rows written.

    A step: rollouts (scored by the orchestrator as each trajectory finishes) -> the samples they
    give -> learner update -> weight sync -> metrics, checkpoint. rft and value learn from one
    collection per stage instead; under `max_staleness > 0` the next step's rollouts generate
    while this step trains (one weight version behind when they are used). A held-out evaluation
    runs alongside the collection of the stage that follows it (`heldout_alongside`).
    """
    # torch and transformers come with it: imported by a run, not by `train --help`
    from rl import heldout, stages

    cfg = run.cfg
    start = await stages.restore(run)  # the step the latest checkpoint records, 0 for a fresh run
    version = (await stages.sync_weights(run)).version  # the engines start from the actor's weights
    tasks, plan = stages.training_tasks(cfg), stages.stage_plan(cfg)
    progress = ProgressBar(plan[-1].end, start_step=start)
    rows: list[dict] = []
    taught: Collection | None = None  # rft's collection (stored: read back), which PPO imitates under ppo.sft_coef
    with MetricsWriter(run.run_dir, start_step=start) as metrics:  # drops lines of steps >= start
        # the held-out split (data.heldout): before training and after each stage that moves the actor,
        # each time alongside the collection of the stage that follows (`early`)
        early = await heldout_alongside(run, tasks, f"before_{plan[0].name}", plan[0], version) if start == 0 else None
        for k, stage in enumerate(plan):
            collection, early = early, None  # rft, value: rolled out once, learnt from each step
            prefetch: stages.Background | None = None  # the next step's rollouts, made during this update
            for step in range(max(start, stage.first), stage.end):
                times: dict[str, float] = {}
                collected: dict[str, float] = {}  # a collection's rollout figures, in its first step's row
                t_step = time.perf_counter()
                if stage.name in stages.ROLLOUT_STAGES:  # roll out; the orchestrator scores each trajectory
                    trajs = prefetch.result if prefetch else await stages.step_rollouts(run, tasks, step, stage.name)
                    times["time/rollout_s"] = time.perf_counter() - t_step
                    samples = stages.usable_samples(trajs, version, cfg.max_staleness,
                                                    mixed_only=cfg.data.dynamic_tasks > 0)
                    if samples and stage.name == "ppo" and cfg.ppo.sft_coef > 0:  # rft's samples beside them
                        taught = taught or await stages.collect(run, tasks, "rft")
                        samples += taught.demonstrations(step - stage.first)
                    sync = True
                else:  # a batch of the stage's one collection
                    if collection is None:
                        collection = await stages.collect(run, tasks, stage.name)
                        t_step = time.perf_counter()  # the step's time leaves the collection out
                    if step == max(start, stage.first):
                        collected = collection.figures | {"time/collect_s": collection.seconds}
                    trajs, samples = None, collection.batch(step - stage.first)
                    sync = stage.name == "rft" and step + 1 == stage.end  # nothing generates between rft steps

                trained, synced = {}, None
                async with anyio.create_task_group() as tg:
                    prefetch = None
                    if stage.name in stages.ROLLOUT_STAGES and cfg.max_staleness > 0 and step + 1 < stage.end:
                        prefetch = stages.Background(tg, stages.step_rollouts, run, tasks, step + 1, stage.name)
                    if samples:  # release the colocated engines' memory -> update -> weight sync -> resume
                        async with stages.engines_released(run, times, weights=sync):
                            trained = await stages.update(run, stage, step, samples, times)
                            if sync:
                                synced = await stages.sync_weights(run, times)
                if prefetch:
                    times["time/overlapped_rollout_s"] = prefetch.seconds
                version = synced.version if synced else version
                times["time/step_s"] = time.perf_counter() - t_step

                row = stages.step_row(run, stage, step, trajs=trajs, collection=collection, samples=samples,
                                      trained=trained, synced=synced, times=times, version=version) | collected
                metrics.write(step, row)
                progress.update(step, row)
                rows.append(row)
                log.info("step %d (%s %d/%d): %s", step, stage.name, step - stage.first + 1,
                         stage.end - stage.first, stages.brief(row))
                if (step + 1) % cfg.checkpoint.every_steps == 0 or step + 1 == stage.end:
                    await stages.save_checkpoint(run, step + 1, stage.name)
            # `<=`: the checkpoint at a stage's end comes before its evaluation, so a run stopped
            # during that evaluation resumes at the stage's end and must do it (done labels are skipped)
            if stage.name in heldout.AFTER and start <= stage.end:
                following = plan[k + 1] if k + 1 < len(plan) else None
                early = await heldout_alongside(run, tasks, f"after_{stage.name}", following, version)
        await run.learner.wait_saved()  # the last checkpoint is committed (and exported) when train returns
    progress.close()
    return rows


async def heldout_alongside(run: Run, tasks: list[Task], label: str, following: Stage | None,
                            version: int) -> Collection | None:
    """The held-out evaluation `label` and, when the stage that follows learns from one collection
    (rft, value), that collection, at once; returns the collection. Nothing trains until both
    end, so both roll out the same weights (the rft teachers need only the tools and the GPU
    queue, not the policy's engine) and the held-out row is what it would be on its own."""
    from rl import heldout, stages

    async with anyio.create_task_group() as tg:
        tg.start_soon(partial(heldout.evaluate, run, label, version=version))
        collecting = None
        if following and following.name not in stages.ROLLOUT_STAGES and following.end > following.first:
            collecting = stages.Background(tg, stages.collect, run, tasks, following.name)
    return collecting.result if collecting else None


async def run_training(cfg: TrainConfig) -> list[dict]:
    from rl.run import open_run

    rows: list[dict] = []  # stays empty when a signal stops the run (its steps are on disk)
    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_on_signal, tg.cancel_scope, "cuda-agent train")
        async with open_run(cfg) as run:
            rows = await train(run)
        tg.cancel_scope.cancel()
    return rows


def main(argv: list[str]) -> int:
    cfg, a = parse_args(argv)
    run_dir = Path(cfg.run_dir)
    if problem := gpu_problem(cfg) or run_dir_problem(run_dir, "train", resume=a.resume, force=a.force):
        print(f"cuda-agent train: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    mark_run(run_dir, "train", argv)
    rows = runtime.run(run_training, cfg)
    print(f"cuda-agent train: {run_summary(run_dir, len(rows))}")
    return 0


def gpu_problem(cfg: TrainConfig) -> str | None:
    """Why this machine lacks the GPUs `cfg` places work on (a one-line error), or None."""
    gpus = set() if cfg.layout.cpu else set(cfg.layout.learner_gpus)
    if cfg.env == "real":
        gpus |= set(cfg.kernel_env.gpus or cfg.layout.verify_gpus)
    if not gpus:
        return None
    import torch

    needed, have = max(gpus) + 1, torch.cuda.device_count()
    if have >= needed:
        return None
    seen = f"CUDA sees only {have} here" if have else "CUDA sees no GPU on this machine"
    return f"recipe {cfg.recipe} places work on GPU(s) {sorted(gpus)} and {seen}; --recipe smoke_cpu runs on the CPU"


def run_dir_problem(run_dir: Path, command: str, *, resume: bool = False, force: bool = False) -> str | None:
    """Why `command` ("train" or "smoke") must not write a run into `run_dir`, or None.

    A missing or empty directory is fine. An earlier run's directory (it holds RUN_MARKER) is
    fine too, except that `train` without `resume` refuses one with checkpoints and `smoke`
    replaces only its own earlier runs. Any other directory with files is refused unless
    `force`; a run never deletes files other than its own (RUN_FILES)."""
    if run_dir.exists() and not run_dir.is_dir():
        return f"{run_dir} is a file, not a directory"
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return None
    made_by = run_command(run_dir)
    ckpt = run_dir / "ckpt"
    has_ckpt = ckpt.is_dir() and any(ckpt.iterdir())
    if command == "train":
        if has_ckpt and not resume:
            return f"{run_dir} has checkpoints; pass --resume to continue that run, or another --out"
        if made_by or has_ckpt or force:  # checkpoints and --resume: a run made before RUN_MARKER
            return None
        return (f"{run_dir} holds files and is not a run directory; pass --force to write the run "
                "there (the other files are kept), or another --out")
    if made_by == "smoke" or force:
        return None
    what = f"is a `cuda-agent {made_by}` run" if made_by else "holds files and is not an earlier smoke run"
    return (f"{run_dir} {what}; pass --force to write the smoke run there (only a run's own files, "
            "such as ckpt/ and metrics.jsonl, are replaced), or another --out")


def run_command(run_dir: Path) -> str | None:
    """The command whose run `run_dir` holds ("train", "smoke"; "unknown" for an unreadable
    marker), None for a directory without RUN_MARKER."""
    try:
        made = orjson.loads((run_dir / RUN_MARKER).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError):
        return "unknown"
    command = made.get("command") if isinstance(made, dict) else None
    return command if isinstance(command, str) else "unknown"


def mark_run(run_dir: Path, command: str, argv: list[str]) -> None:
    """Make `run_dir` a run's directory (RUN_MARKER: the command, its arguments and the time);
    an existing marker, the one of the command that made the directory, is kept."""
    run_dir.mkdir(parents=True, exist_ok=True)
    marker = run_dir / RUN_MARKER
    if not marker.exists():
        made = {"command": command, "argv": argv, "time": datetime.now().astimezone().isoformat(timespec="seconds")}
        marker.write_bytes(orjson.dumps(made) + b"\n")


def clear_run(run_dir: Path) -> None:
    """Remove what a run wrote in `run_dir` (RUN_FILES), and nothing else."""
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def run_summary(run_dir: Path, finished_rows: int) -> str:
    """What the run holds on disk: a signal leaves `rows` empty, the steps it did are in its files."""
    steps = _count_lines(run_dir / "metrics.jsonl")
    ckpt = latest_checkpoint(run_dir)
    ended = "finished" if finished_rows else "stopped"
    number = ckpt.removeprefix("step_")
    resume = f" (--resume starts at step {int(number)})" if number.isdigit() else ""
    return f"{ended}; {steps} step(s) in {run_dir}/metrics.jsonl, latest checkpoint {ckpt}{resume}"


def latest_checkpoint(run_dir: Path) -> str:
    """The name in RUN/ckpt/latest (`step_000007`: steps 0-6 are in it), or "none"."""
    latest = run_dir / "ckpt" / "latest"
    return latest.read_text().strip() if latest.exists() else "none"


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


__all__ = ["clear_run", "main", "mark_run", "parse_args", "run_dir_problem", "run_summary", "run_training", "train"]
