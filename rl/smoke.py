"""`cuda-agent smoke`: the quick end-to-end training run (the README's main job).

On a GPU, SmolLM2-135M (a pretrained chat model; `rl.pretrained` makes it once from its wheel)
is trained on the `rl.data.families` tasks: rejection fine-tuning on teacher trajectories -
honest CUDA solutions driven through the real tools and scored by the real environment - then
value pretraining and a few agentic PPO steps with real compile, verify and profile. The
held-out split (tasks never trained on, a third of them with an op no training task has) is
evaluated before rft, after rft and after ppo. Everything is the production path: learner rank
process with FSDP2, the embedded engine behind SGLang's HTTP API, the orchestrator, sandbox,
compile pool, GPU queue, checkpoints and the Hugging Face export. It prints the reward curve,
the held-out rows, the seconds of each phase (held-out evaluations, collections, each stage's
steps), then one line saying what ran and whether it passed (exit status 1 if not).
What it shows: the whole loop runs on real kernels and how the held-out rows move; three PPO
steps are too few to show PPO learning (`python -m bench.system.learning --policy smollm2-135m`
compares PPO with a control).

On a machine without a GPU it says so and runs the CPU variant (`smoke_cpu` recipe: a tiny random
model on two bundled demonstrations, learner on CPU, the fake kernel environment), which CI also runs.

--out is replaced only when it is missing, empty or an earlier smoke run's directory (its
`.cuda-agent-run` file says so); another directory with files needs --force, and even then only
the run's own files in it are replaced.

    cuda-agent smoke [--out DIR] [--force] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import orjson

from agentcore import runtime
from agentcore.cli import HelpFormatter
from rl.train import clear_run, latest_checkpoint, mark_run, run_dir_problem

if TYPE_CHECKING:
    from rl.config import TrainConfig
    from rl.heldout import Row

CPU_CANNOT_SHOW = (
    "CPU variant: no GPU, so no kernel was compiled, verified or timed; rewards come from the fake "
    "environment (a kernels/*.cu file and a ModelNew class pass, times are fixed), and a tiny model "
    "after {rft} RFT steps is not expected to earn them"
)


def has_gpu() -> bool:
    import torch

    return torch.cuda.is_available() and shutil.which("nvcc") is not None


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cuda-agent smoke", description=__doc__.split("\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--out", default="runs/smoke", metavar="DIR",
                   help="run directory; an earlier smoke run there is replaced")
    p.add_argument("--force", action="store_true",
                   help="use a --out that holds other files (only a run's own files in it are replaced)")
    p.add_argument("--cpu", action="store_true", help="run the CPU variant even where a GPU exists")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="dotted override, repeatable")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    from rl.config import apply_overrides  # torch: after --help has answered
    from rl.recipes import smoke, smoke_cpu

    gpu = has_gpu() and not a.cpu
    try:
        cfg = apply_overrides(smoke() if gpu else smoke_cpu(), [f"run_dir={a.out}", *a.set])
    except ValueError as exc:
        print(f"cuda-agent smoke: {exc}", file=sys.stderr)
        return 2
    out = Path(cfg.run_dir)
    if problem := run_dir_problem(out, "smoke", force=a.force):
        print(f"cuda-agent smoke: {problem}", file=sys.stderr)
        return 2
    if not gpu:
        print("cuda-agent smoke: no GPU (or no nvcc) on this machine: running the CPU variant "
              "(learner on CPU, fake kernel environment)", file=sys.stderr)
    clear_run(out)
    mark_run(out, "smoke", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from rl.heldout import read_rows as read_heldout
    from rl.heldout import table as heldout_table
    from rl.metrics import read_jsonl
    from rl.plot import print_reward_curve
    from rl.train import run_training

    t0 = time.monotonic()
    rows = runtime.run(run_training, cfg)
    wall_s = time.monotonic() - t0
    print(f"\ncuda-agent smoke ({'GPU' if gpu else 'CPU variant'}): {len(rows)} steps in {wall_s:.0f} s, run in {out}")
    print_reward_curve(rows)
    if held := read_heldout(out):
        print("\n" + heldout_table(held))
    spent = phase_seconds(read_jsonl(out / "metrics.jsonl"), held)  # on disk: a stopped run's steps too
    print(phase_line(spent, wall_s))
    passed, verdict = smoke_verdict(cfg, rows, out)
    print(verdict)
    if not gpu:
        print(CPU_CANNOT_SHOW.format(rft=cfg.steps.rft))
    summary = {"gpu": gpu, "wall_s": wall_s, "phases_s": spent, "steps": len(rows), "recipe": cfg.recipe,
               "passed": passed, "verdict": verdict, "rows": rows, "heldout": msgspec.to_builtins(read_heldout(out))}
    (out / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return 0 if passed else 1


def phase_seconds(rows: list[dict[str, Any]], held: list[Row]) -> dict[str, float]:
    """Seconds of each phase, in run order: the held-out evaluations (`Row.seconds`), each stage's
    collection (`time/collect_s`) and its steps (`time/step_s`: rollouts, update, weight sync).
    Start-up and checkpoints are in none. A held-out evaluation runs alongside the collection of
    the stage that follows it (`rl.train.heldout_alongside`), the entry after it here."""
    by_label = {r.label: r.seconds for r in held}
    spent = {f"held-out {label}": s for label, s in by_label.items() if label.startswith("before_")}
    for stage in dict.fromkeys(str(row.get("stage")) for row in rows):
        mine = [row for row in rows if row.get("stage") == stage]
        if collect := sum(float(row.get("time/collect_s") or 0.0) for row in mine):
            spent[f"{stage} collection"] = collect
        steps = sum(float(row.get("time/step_s") or 0.0) for row in mine)
        spent[f"{stage} {len(mine)} step{'s' * (len(mine) != 1)}"] = steps
        if f"after_{stage}" in by_label:
            spent[f"held-out after_{stage}"] = by_label[f"after_{stage}"]
    return spent


def phase_line(spent: dict[str, float], wall_s: float) -> str:
    """`phases (s): held-out before_rft 141 (alongside the rft collection), rft collection 235, ...`;
    the rest of the wall time is start-up and checkpoints."""
    names, parts, overlap = list(spent), [], 0.0
    for name, after in zip(names, [*names[1:], ""]):
        parts.append(f"{name} {spent[name]:.0f}")
        if name.startswith("held-out ") and after.endswith(" collection"):
            parts[-1] += f" (alongside the {after})"
            overlap += min(spent[name], spent[after])
    rest = wall_s - sum(spent.values()) + overlap
    return f"phases (s): {', '.join(parts + [f'start-up, checkpoints and the rest {rest:.0f}'])}; wall {wall_s:.0f}"


def smoke_verdict(cfg: TrainConfig, rows: list[dict[str, Any]], run_dir: Path) -> tuple[bool, str]:
    """(passed, one line): what the run did - trajectories rolled out and scored, updates,
    weight syncs, the checkpoint and Hugging Face export, the resume point - or what is missing."""
    from rl.heldout import enabled, expected_labels, read_rows
    from rl.stages import stage_plan

    planned = stage_plan(cfg)[-1].end
    rolled, scored, updated = Counter[str](), Counter[str](), Counter[str]()
    for row in rows:
        stage = str(row.get("stage"))
        for group in ("collect", "rollout"):
            rolled[stage] += int(row.get(f"{group}/trajectories") or 0)
            scored[stage] += int(row.get(f"{group}/scored") or 0)
        updated[stage] += bool(row.get("train/tokens"))
    ckpt = latest_checkpoint(run_dir)
    exported = (run_dir / "hf" / "config.json").exists()
    missing = []
    if len(rows) < planned:
        missing.append(f"{len(rows)} of {planned} steps finished")
    if not sum(scored.values()):
        missing.append("no trajectory was scored")
    if sum(updated.values()) < len(rows):
        missing.append(f"{len(rows) - sum(updated.values())} step(s) applied no update")
    if ckpt != f"step_{planned:06d}":
        missing.append(f"latest checkpoint {ckpt}, not step_{planned:06d}")
    if cfg.checkpoint.export_hf and not exported:
        missing.append(f"no Hugging Face export in {run_dir / 'hf'}")
    held = {r.label for r in read_rows(run_dir)}
    wanted = expected_labels(cfg) if enabled(cfg) else []
    if absent := [label for label in wanted if label not in held]:
        missing.append(f"no held-out evaluation {', '.join(absent)}")
    if missing:
        return False, "smoke FAILED: " + "; ".join(missing)
    n_rolled, n_scored = sum(rolled.values()), sum(scored.values())
    trajectories = (f"{n_rolled} trajectories rolled out and scored" if n_scored == n_rolled
                    else f"{n_rolled} trajectories rolled out, {n_scored} scored")
    syncs = sum(1 for row in rows if row.get("sync/version") is not None)
    export = f" and Hugging Face export {run_dir / 'hf'}" if exported else ""
    return True, (
        f"smoke passed: {trajectories} ({_by_stage(rolled)}), {sum(updated.values())} updates applied "
        f"({_by_stage(updated)}), {syncs} weight syncs to the engine, checkpoint {ckpt}{export} written, "
        f"{len(wanted)} held-out evaluations; "
        f"a resume starts at step {planned}, the end of the plan"
    )


def _by_stage(counts: Counter[str]) -> str:
    return ", ".join(f"{stage} {n}" for stage, n in counts.items() if n)
