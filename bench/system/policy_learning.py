"""Does PPO teach a pretrained policy kernels it was never shown? PPO against a control, per seed.

What it is: for each seed, one training run of the `learning` recipe from the named policy (rft on
the teacher trajectories of the `rl.data.families` training split but its tasks of shape s1 ->
value pretraining -> PPO on those s1 tasks, with real compile, verify and profile), then the control: the same PPO stage started from the same
post-value checkpoint with the actor's learning rate at 0. Such steps would move the critic
alone, and the held-out row reads only the actor, so the control's `after_ppo` row is that of the
post-value actor, which is the post-rft actor bit for bit (value pretraining trains the critic
alone). Under greedy decoding (the recipe's) that actor's row is the PPO run's `after_rft` row,
taken as it is (`Row.shared_from`); a sampled evaluation evaluates it again in a control run that
takes no PPO step. PPO minus control is then, per seed, what PPO's actor updates changed on the
held-out split. Written to
OUT: `learning.json` (every held-out row of every run), `learning.md` (the table per seed, the
mean and standard error over seeds of PPO minus control, and the two targets checked) and
`learning.png` (held-out mean reward and pass rate per seed: before rft, after rft, after PPO,
and the control). Each run is `cuda-agent train` in its own directory OUT/seed<k>/{ppo,control}
and resumes, so a rerun after an interruption redoes only what is missing. With `gpus`, seeds run
at once, one child process per entry (`python -m bench.system.policy_learning --seed K`, with
CUDA_VISIBLE_DEVICES set to its GPU, so its learner, engine and GPU queue all live there; its output
in OUT/seed<K>/seed.log). An entry may repeat: `--gpus 0,0,0` runs three seeds at once on one GPU,
whose small policy leaves it mostly idle; the GPU queues' machine-wide locks keep every timing job
alone on it (`rewards.queue.gpu_lock`), while the other seeds' engines and learners still share it,
each learner capped at an even share of 90% of its memory (`memory_share`).
The teachers' trajectories are scripted and every seed starts from the same weights, so seeds that
draw the same teachers (all of them, in `learning`) share seed 0's teacher collection
(`rollouts/rft_demos.jsonl`, copied; the run resumes past it) and its greedy before-rft row: a seed
run after seed 0 finds them, and the other lanes of a run with `gpus` start once seed 0 has them.
What it is not: a test (`tests/test_policy_learning.py` runs the plumbing on the CPU with the
fake environment and a tiny model; on that, the numbers mean nothing).

Targets: after rft the held-out pass rate is at least 30%; PPO beats the control on held-out mean
reward by more than two standard errors (of the per-seed differences).

    python -m bench.system.learning --policy smollm2-135m --seeds 3 --out runs/learning
    python -m bench.system.learning --policy smollm2-135m --seeds 3 --gpus 0,1,2   (seeds at once)
    python -m bench.system.learning --policy smollm2-135m --seeds 3 --gpus 0,0,0   (at once, one GPU)
    python -m bench.system.learning --policy smollm2-135m --seeds 1 --set steps.ppo=2   (shorter)
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import orjson
from msgspec import Struct

from agentcore import runtime
from bench.system.heldout_changes import Change, changes
from bench.system.heldout_changes import markdown_lines as change_lines
from bench.system.heldout_failures import Failure, failures, passed, ppo_failures, ppo_markdown_lines
from bench.system.heldout_failures import markdown_lines as failure_lines
from rl.config import TrainConfig, apply_overrides
from rl.heldout import FILE as HELDOUT_FILE
from rl.heldout import Row, append_row, expected_labels, read_rows
from rl.heldout import enabled as heldout_enabled
from rl.learner_client import free_port_run, learner_devices
from rl.metrics import read_metrics
from rl.recipes import learning, smoke_cpu
from rl.stages import demonstrations, ppo_tasks, stage_plan, training_tasks
from rl.train import mark_run, run_training

PASS_TARGET = 0.30
"""Held-out pass rate the policy must reach after rft."""
SE_MULTIPLE = 2.0
"""PPO must beat the control by more than this many standard errors."""
WALL_TARGET_S = 25 * 60.0
"""The whole benchmark (every seed, the model built from its wheel included) on one GPU."""
CPU_FAMILIES = ["data.tasks=families", "data.family_scale=0.01", "data.heldout=true", "data.demos=3", "data.ppo_shapes=[1]",
                "data.rft_policy_rollouts=false", "data.collect_tasks=2", "steps.rft=2", "steps.value=1",
                "steps.ppo=1", "rollout.max_context_tokens=8192"]
"""The smoke_cpu recipe on toy-sized family tasks: the plumbing of this benchmark on a CPU."""
FAILURE_ROWS = ("after_rft", "after_ppo")
"""The PPO run's held-out rows whose failed trajectories the report explains."""
PORTS_PER_LANE = 16
"""Seeds running at once: the child on the k-th GPU serves its learner on port_base + 16 k."""

log = logging.getLogger("cuda-agent.learning")


class PpoStep(Struct, frozen=True, kw_only=True):
    """One PPO step of a seed's run, on the training split (its metrics.jsonl)."""

    step: int
    reward_mean: float
    pass_rate: float
    reward_reach: float | None = None  # the reward's weight on each sample's first action (rl.learner.update)
    mixed_groups: float | None = None
    """The share of the step's groups whose rewards differ (`rollout/mixed_groups`, every group rolled out,
    dynamic sampling's included); runs before it: the share of samples learnt from (`train/mixed_groups`)."""
    groups: int | None = None  # groups rolled out (`rollout/groups`): more than tasks_per_step under dynamic sampling
    entropy: float | None = None  # the policy's mean entropy per action token, nats
    logprob_gap: float | None = None
    """Mean |learner - engine| log-prob per action token (`train/logprob_gap`): near 0 when the learner
    scores the tokens under the distribution the engine sampled them from (its temperature included)."""
    sft_loss: float | None = None
    """The NLL per action token of the step's batch of rft's demonstrations (`train/sft_loss`, under
    `ppo.sft_coef`): rising over the steps, PPO moves the policy away from what rft taught."""


class SeedResult(Struct, kw_only=True):
    """The held-out rows of one seed's two runs, by label, and the PPO run's steps."""

    seed: int
    ppo: dict[str, Row]
    control: dict[str, Row]
    wall_s: float
    ppo_steps: list[PpoStep] = []
    heldout_new: dict[str, str] = {}
    """What is new in each held-out task (`families_split.json`): "shape" or "chain" (trained ops),
    "op" (an op no training task has); empty when the run's tasks are not the families'."""
    failures: dict[str, list[Failure]] = {}
    """The PPO run's failed held-out trajectories after rft and after PPO, with their verdicts
    (`bench.system.heldout_failures`)."""
    ppo_failures: list[Failure] = []
    """The PPO run's failing samples in groups of mixed rewards (`heldout_failures.ppo_failures`)."""
    changes: list[Change] = []
    """The held-out tasks PPO moved (passed after rft and failed after PPO, or the other way) and the
    lines of code it changed in them (`bench.system.heldout_changes`)."""
    taught: int = 0
    """Teachers rft learnt from (`rl.stages.demonstrations`)."""
    ppo_pool: int = 0
    """Training tasks PPO drew its steps from (`rl.stages.ppo_tasks`)."""
    ppo_shapes: list[int] = []
    """The recipe's `data.ppo_shapes`: the shapes left to PPO, untaught ([]: every training task)."""
    ppo_temperature: float = 1.0
    """The PPO rollouts' sampling temperature (`rollout.temperature`), the learner's policy's too."""
    dynamic_tasks: int = 0
    """`data.dynamic_tasks`: the most tasks a PPO step draws on top of its own (0: no dynamic sampling)."""
    ppo_sft_coef: float = 0.0
    """`ppo.sft_coef`: the weight of rft's demonstrations' NLL in each PPO update (0: none)."""
    ppo_policy_coef: float = 1.0
    """`ppo.policy_coef`: the weight of PPO's surrogate in the actor's loss (0: the anchor's ablation)."""
    memory_gib: list[float] = []
    """The PPO run's learner on its GPU, at most over its updates: [peak allocated, cached] GiB
    (`train/gpu_peak_gib`, `train/gpu_reserved_gib`); [] on a CPU or before the first update."""


def seed_configs(base: TrainConfig, out: Path, seed: int, overrides: list[str]) -> tuple[TrainConfig, TrainConfig]:
    """(the PPO run, its control) of one seed; the control starts from the PPO run's checkpoint
    after the value stage with actor_lr 0. Its held-out row reads the actor alone, and PPO steps
    at actor_lr 0 leave the actor as that checkpoint has it (they would train only the critic),
    so the control takes none (`steps.ppo=0`). It runs only for a sampled evaluation
    (`control_rows`)."""
    common = [f"seed={seed}", f"data.seed={seed}", f"rollout.seed={1000 * seed}", f"model.seed={seed}",
              "checkpoint.keep=3", *overrides]
    ppo = apply_overrides(base, [*common, f"run_dir={out / f'seed{seed}' / 'ppo'}"])
    value_end = next(s.end for s in stage_plan(ppo) if s.name == "value")
    control = apply_overrides(base, [
        *common, f"run_dir={out / f'seed{seed}' / 'control'}", "stage=ppo", "optim.actor_lr=0.0", "steps.ppo=0",
        f"init_from={Path(ppo.run_dir) / 'ckpt' / f'step_{value_end:06d}'}",
    ])
    return ppo, control


def run_seed(base: TrainConfig, out: Path, seed: int, overrides: list[str]) -> SeedResult:
    t0 = time.monotonic()
    ppo, control = seed_configs(base, out, seed, overrides)
    share_demonstrations(ppo, out)
    if not _finished(ppo):
        _train(ppo, shared_base_row(ppo, out))
    if not _finished(control):
        if rows := control_rows(ppo):
            _write_rows(control, rows)
        else:  # a sampled evaluation: the control evaluates its actor itself
            _train(control)
    return seed_result(seed, ppo, control, time.monotonic() - t0)


def seed_result(seed: int, ppo: TrainConfig, control: TrainConfig, wall_s: float) -> SeedResult:
    """What a seed's two run directories hold."""
    return SeedResult(seed=seed, ppo=_by_label(ppo.run_dir), control=_by_label(control.run_dir), wall_s=wall_s,
                      ppo_steps=ppo_steps(ppo.run_dir), heldout_new=heldout_new(ppo.run_dir),
                      failures={label: failures(ppo.run_dir, label) for label in FAILURE_ROWS},
                      ppo_failures=ppo_failures(ppo.run_dir), changes=changes(ppo.run_dir),
                      taught=len(teachers(ppo)), ppo_pool=len(ppo_tasks(training_tasks(ppo), ppo)),
                      ppo_shapes=list(ppo.data.ppo_shapes), ppo_temperature=ppo.rollout.temperature,
                      dynamic_tasks=ppo.data.dynamic_tasks, ppo_sft_coef=ppo.ppo.sft_coef,
                      ppo_policy_coef=ppo.ppo.policy_coef,
                      memory_gib=learner_memory(ppo.run_dir))


def heldout_new(run_dir: str | Path) -> dict[str, str]:
    """task id -> what is new in it, from the run's `families_split.json` ({} without one, or a torn one)."""
    try:
        split = orjson.loads((Path(run_dir) / "families_split.json").read_bytes())
        return {str(t["task_id"]): str(t["new"]) for t in split["heldout"]}
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        return {}


def learner_memory(run_dir: str | Path) -> list[float]:
    """[peak allocated, cached] GiB of the run's learner at most over its updates; [] without them."""
    seen = [m for m in read_metrics(run_dir) if "train/gpu_peak_gib" in m]
    if not seen:
        return []
    return [max(float(m["train/gpu_peak_gib"]) for m in seen),
            max(float(m.get("train/gpu_reserved_gib", 0.0)) for m in seen)]


def ppo_steps(run_dir: str | Path) -> list[PpoStep]:
    """The PPO steps a run's metrics.jsonl records (none where it is missing)."""
    steps = []
    for m in read_metrics(run_dir):
        if m.get("stage") == "ppo" and "rollout/reward_mean" in m:
            steps.append(PpoStep(step=int(m["step"]), reward_mean=float(m["rollout/reward_mean"]),
                                 pass_rate=float(m.get("rollout/pass_rate", math.nan)),
                                 reward_reach=m.get("train/reward_reach"),
                                 mixed_groups=m.get("rollout/mixed_groups", m.get("train/mixed_groups")),
                                 groups=m.get("rollout/groups"), entropy=m.get("train/entropy"),
                                 logprob_gap=m.get("train/logprob_gap"), sft_loss=m.get("train/sft_loss")))
    return steps


def starting_row(ppo: TrainConfig) -> Row | None:
    """The control's `before_ppo` row, without evaluating: the control starts from the PPO run's
    post-value checkpoint, whose actor the PPO run evaluated as `after_rft` (value trains the
    critic alone), greedily and with the same rollout seed. None unless greedy and done."""
    rows = {r.label: r for r in read_rows(ppo.run_dir)}
    if "after_rft" not in rows or ppo.data.heldout_temperature != 0.0:
        return None
    return msgspec.structs.replace(rows["after_rft"], label="before_ppo", shared_from=str(ppo.run_dir))


def control_rows(ppo: TrainConfig) -> list[Row]:
    """The control's rows (`before_ppo`, `after_ppo`) without a run, when the PPO run evaluated the
    control's actor greedily: the post-rft actor is the post-value one bit for bit and no step at
    actor_lr 0 moves it, so the lr-0 run would end with the weights `after_rft` evaluated, and a
    greedy evaluation of the same weights is that row. Empty when the evaluation samples or the PPO
    run has no `after_rft` row yet."""
    start = starting_row(ppo)
    if start is None:
        return []
    return [start, msgspec.structs.replace(start, label="after_ppo")]


def _finished(cfg: TrainConfig) -> bool:
    return any(r.label == "after_ppo" for r in read_rows(cfg.run_dir))


def _write_rows(cfg: TrainConfig, rows: list[Row]) -> None:
    """`rows` as the whole held-out record of `cfg`'s run directory."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / HELDOUT_FILE).unlink(missing_ok=True)
    for row in rows:
        append_row(run_dir, row)


def shared_base_row(ppo: TrainConfig, out: Path) -> Row | None:
    """The pretrained policy's first held-out row (`before_rft`) from another seed's run, when it
    is greedy and under the same limits: every seed starts from the same weights, so the seeds
    run one after another on one GPU evaluate it once. None for a random-init model (its weights
    follow the seed) or a sampled evaluation."""
    label = expected_labels(ppo)[0]
    if not shares_base_row(ppo):
        return None
    limits = (ppo.rollout.max_turns, ppo.rollout.max_new_tokens, ppo.rollout.max_context_tokens, 0.0)
    for other in sorted(out.glob("seed*/ppo")):
        if other.resolve() == Path(ppo.run_dir).resolve():
            continue
        for row in read_rows(other):
            if (row.label == label and not row.shared_from
                    and (row.max_turns, row.max_new_tokens, row.max_context_tokens, row.temperature) == limits):
                return msgspec.structs.replace(row, shared_from=str(other))
    return None


def shares_base_row(cfg: TrainConfig) -> bool:
    """Whether `cfg`'s first held-out row may come from another seed's run: a named pretrained
    model (every seed starts from its weights), evaluated greedily."""
    return bool(cfg.model.path) and cfg.data.heldout_temperature == 0.0 and heldout_enabled(cfg)


DEMOS_FILE = Path("rollouts") / "rft_demos.jsonl"


def teachers(cfg: TrainConfig) -> set[str]:
    """The task ids of `cfg`'s rft teachers (none without demonstrations)."""
    return {d.task.task_id for d in demonstrations(cfg)} if cfg.data.demos > 0 else set()


def whole_demonstrations(path: Path, want: set[str]) -> bool:
    """Whether `path` is a finished collection of exactly the teachers `want`, one trajectory each."""
    if not path.exists():
        return False
    lines = path.read_bytes().splitlines()
    have = {orjson.loads(line)["group_id"] for line in lines if line.strip()}
    return have == want and len(lines) == len(want)


def shared_parts_ready(base: TrainConfig, out: Path, overrides: list[str], seed: int) -> bool:
    """Whether seed 0's run has what `seed`'s run would take from it: the whole teacher collection
    when both draw the same teachers, the first held-out row when `shared_base_row` would share it."""
    first, mine = (seed_configs(base, out, k, overrides)[0] for k in (0, seed))
    want = teachers(mine)
    if want and want == teachers(first) and not whole_demonstrations(Path(first.run_dir) / DEMOS_FILE, want):
        return False
    if shares_base_row(mine):
        return any(r.label == expected_labels(first)[0] for r in read_rows(first.run_dir))
    return True


def share_demonstrations(cfg: TrainConfig, out: Path) -> Path | None:
    """Copy another seed's finished rft demonstrations into this run (the store resumes past them)
    when they are of the same teachers and this run has none; the file copied, or None."""
    mine = Path(cfg.run_dir) / DEMOS_FILE
    if mine.exists() or cfg.data.demos <= 0:
        return None
    want = teachers(cfg)
    for other in sorted(out.glob(f"seed*/ppo/{DEMOS_FILE}")):
        if whole_demonstrations(other, want):
            mine.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(other, mine)
            log.info("%s: the rft demonstrations of %s", cfg.run_dir, other)
            return other
    return None


def _train(cfg: TrainConfig, first_row: Row | None = None) -> None:
    """Train `cfg` (resuming its checkpoint when there is one); a fresh run starts with
    `first_row` in its held-out rows (a label the run then does not evaluate)."""
    run_dir = Path(cfg.run_dir)
    resume = (run_dir / "ckpt" / "latest").exists()
    mark_run(run_dir, "train", ["bench.system.learning", cfg.run_dir])
    if not resume:  # a fresh run: start from the recipe's init; else --resume semantics
        for stale in ("metrics.jsonl", HELDOUT_FILE):
            (run_dir / stale).unlink(missing_ok=True)
        if first_row is not None:
            append_row(run_dir, first_row)
    runtime.run(run_training, cfg)


def _by_label(run_dir: str | Path) -> dict[str, Row]:
    return {r.label: r for r in read_rows(run_dir)}


def mean_se(xs: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (0 for one value)."""
    if not xs:
        return math.nan, math.nan
    if len(xs) == 1:
        return xs[0], 0.0
    return statistics.fmean(xs), statistics.stdev(xs) / math.sqrt(len(xs))


def verdicts(results: list[SeedResult], wall_s: float | None = None) -> dict[str, Any]:
    """The two targets, checked on the seeds that finished both runs, and the whole run's wall
    time (`wall_s`, when known) against WALL_TARGET_S."""
    done = [r for r in results if "after_ppo" in r.ppo and "after_ppo" in r.control]
    diffs = [_reward(r.ppo["after_ppo"]) - _reward(r.control["after_ppo"]) for r in done]
    mean, se = mean_se(diffs)
    after_rft = [r.ppo["after_rft"].pass_rate for r in results if "after_rft" in r.ppo]
    return {
        "seeds": len(results), "seeds_complete": len(done),
        "after_rft_pass_rate": mean_se(after_rft)[0] if after_rft else None,
        "pass_target_met": bool(after_rft) and mean_se(after_rft)[0] >= PASS_TARGET,
        "ppo_minus_control_mean": mean, "ppo_minus_control_se": se,
        "ppo_beats_control": len(done) >= 2 and mean > SE_MULTIPLE * se,
        "wall_s": wall_s, "wall_target_met": None if wall_s is None else wall_s <= WALL_TARGET_S,
    }


def changed_tasks(ppo: Row, control: Row) -> tuple[int, int, int]:
    """How many held-out tasks PPO's greedy answer scores differently from the control's: (higher,
    lower, tasks in both). Zero changes mean PPO did not move greedy decoding at all, whatever
    the rows' means say; an unscored answer counts as failed (-1)."""
    def score(rewards: list[float | None]) -> float:
        return sum(-1.0 if r is None else r for r in rewards) / max(len(rewards), 1)

    both = ppo.by_task.keys() & control.by_task.keys()
    deltas = [score(ppo.by_task[t]) - score(control.by_task[t]) for t in both]
    return sum(d > 0 for d in deltas), sum(d < 0 for d in deltas), len(both)


def _reward(row: Row) -> float:
    """Held-out mean reward of a row; an evaluation with nothing scored counts as all failed (-1)."""
    return -1.0 if row.reward_mean is None else row.reward_mean


def markdown(results: list[SeedResult], policy: str, v: dict[str, Any]) -> str:
    lines = [f"# Held-out learning: {policy}", ""]
    if results and (first := results[0]).ppo_pool:
        split = f" (`data.ppo_shapes={first.ppo_shapes}`: untaught)" if first.ppo_shapes else ""
        dynamic = f", up to {first.dynamic_tasks} more a step (dynamic sampling)" if first.dynamic_tasks else ""
        anchor = (f" Each PPO update also imitated a batch of rft's demonstrations, their NLL weighted "
                  f"{first.ppo_sft_coef:g} (`ppo.sft_coef`).") if first.ppo_sft_coef else ""
        if first.ppo_policy_coef != 1.0:
            anchor += (f" PPO's surrogate was weighted {first.ppo_policy_coef:g} (`ppo.policy_coef`)"
                       + (": the actor learnt from the demonstrations alone, the rollouts and their "
                          "rewards did not move it." if first.ppo_policy_coef == 0 else "."))
        lines += [f"rft learnt from {first.taught} teachers; PPO drew its steps from {first.ppo_pool} training "
                  f"tasks{split}{dynamic}, its rollouts sampled at temperature {first.ppo_temperature:g}.{anchor}",
                  ""]
    lines += [("Held-out mean reward / pass rate per seed (rewards: -1 failed, 1 correct, 2 faster than eager, "
               "3 also than torch.compile)."), "",
              ("| seed | before rft | after rft | after PPO | control (actor lr 0) | PPO - control "
               "| tasks PPO scores higher / lower | wall s |"),
              "|---|---|---|---|---|---|---|---|"]
    for r in results:
        cells = [_cell(r.ppo.get("before_rft")), _cell(r.ppo.get("after_rft")), _cell(r.ppo.get("after_ppo")),
                 _cell(r.control.get("after_ppo"))]
        diff, moved = "-", "-"
        if "after_ppo" in r.ppo and "after_ppo" in r.control:
            diff = f"{_reward(r.ppo['after_ppo']) - _reward(r.control['after_ppo']):+.3f}"
            higher, lower, both = changed_tasks(r.ppo["after_ppo"], r.control["after_ppo"])
            moved = f"{higher} / {lower} of {both}"
        wall = "-" if math.isnan(r.wall_s) else f"{r.wall_s:.0f}"
        lines.append(f"| {r.seed} | " + " | ".join(cells) + f" | {diff} | {moved} | {wall} |")
    if any(row.shared_from for r in results for row in (*r.ppo.values(), *r.control.values())):
        lines += ["", "\\* the same weights' greedy evaluation in another run, not repeated (`Row.shared_from`)."]
    rft = v["after_rft_pass_rate"]
    rft_text = "-" if rft is None else f"{100 * rft:.1f}%"
    lines += ["",
              (f"- after rft, held-out pass rate {rft_text} (target >= {100 * PASS_TARGET:.0f}%): "
               f"{'met' if v['pass_target_met'] else 'NOT met'}"),
              (f"- PPO - control, held-out mean reward: {v['ppo_minus_control_mean']:+.3f} +- "
               f"{v['ppo_minus_control_se']:.3f} (SE over {v['seeds_complete']} seeds; target > "
               f"{SE_MULTIPLE:.0f} SE): {'met' if v['ppo_beats_control'] else 'NOT met'}")]
    if v.get("wall_s") is not None:
        lines.append(f"- the whole run: {v['wall_s'] / 60:.1f} min (target <= {WALL_TARGET_S / 60:.0f} min): "
                     f"{'met' if v['wall_target_met'] else 'NOT met'}")
    if memory := [f"seed {r.seed} {r.memory_gib[0]:.1f} / {r.memory_gib[1]:.1f}" for r in results if r.memory_gib]:
        lines.append("- each learner on its GPU at most, GiB allocated / cached: " + ", ".join(memory))
    lines += _by_new_lines(results)
    trained = {t for r in results for t, kind in r.heldout_new.items() if kind in NEW_GROUPS[0][1]}
    lines += failure_lines(((r.seed, r.failures) for r in results), trained)
    lines += change_lines((r.seed, r.changes) for r in results)
    if steps := max((len(r.ppo_steps) for r in results), default=0):
        anchored = any(x.sft_loss is not None for r in results for x in r.ppo_steps)
        lines += ["", "PPO steps on the training split (rollout mean reward / pass rate), and over the steps: the "
                      "reward's weight on each sample's first action (`train/reward_reach`), the share of groups "
                      "whose rewards differ (`rollout/mixed_groups`), the groups rolled out a step (more than the "
                      "step's tasks under dynamic sampling), the policy's entropy per action token, and the "
                      "learner's mean log-prob gap to the engine's per action token (`train/logprob_gap`)" +
                      (", and the NLL per action token of the step's batch of rft's demonstrations at its first "
                       "and last step (`train/sft_loss`, `ppo.sft_coef`)" if anchored else "") + ":", "",
                  "| seed | " + " | ".join(f"step {k + 1}" for k in range(steps)) + " | reward reach | mixed groups "
                  "| groups | entropy | logprob gap |" + (" demonstrations' NLL |" if anchored else ""),
                  "|---" * (steps + 6 + anchored) + "|"]
        for r in results:
            cells = [f"{x.reward_mean:+.3f} / {100 * x.pass_rate:.0f}%" for x in r.ppo_steps]
            cells += ["-"] * (steps - len(cells))
            for field, form in (("reward_reach", "{:.3g}"), ("mixed_groups", "{:.0%}"), ("groups", "{:.3g}"),
                                ("entropy", "{:.3f}"), ("logprob_gap", "{:.3g}")):
                values = [getattr(x, field) for x in r.ppo_steps if getattr(x, field) is not None]
                cells.append(form.format(statistics.fmean(values)) if values else "-")
            if anchored:
                nll = [x.sft_loss for x in r.ppo_steps if x.sft_loss is not None]
                cells.append(f"{nll[0]:.3g} -> {nll[-1]:.3g}" if nll else "-")
            lines.append(f"| {r.seed} | " + " | ".join(cells) + " |")
    lines += ppo_markdown_lines((r.seed, r.ppo_failures) for r in results)
    return "\n".join([*lines, ""])


NEW_GROUPS = (("trained ops", ("shape", "chain")), ("new op", ("op",)))
"""How the report groups held-out tasks by what is new in them (`SeedResult.heldout_new`)."""


def passes_by_new(row: Row, new: dict[str, str]) -> dict[str, tuple[int, int]]:
    """group -> (trajectories passed, trajectories) of `row` over the held-out tasks of each of
    NEW_GROUPS (`heldout_failures.passed`)."""
    counts = {}
    for group, kinds in NEW_GROUPS:
        rewards = [r for task, rs in row.by_task.items() if new.get(task) in kinds for r in rs]
        counts[group] = (sum(map(passed, rewards)), len(rewards))
    return counts


def _by_new_lines(results: list[SeedResult]) -> list[str]:
    """The held-out passes per seed split by what is new in the task, and the room PPO has."""
    shown = [r for r in results if r.heldout_new]
    if not shown:
        return []
    labels = (("after rft", "ppo", "after_rft"), ("after PPO", "ppo", "after_ppo"), ("control", "control", "after_ppo"))
    lines = ["", ("Held-out passes (trajectories) by what is new in the task: trained ops in a new shape or chain, or "
                  "an op that no training task has. PPO trains on trained ops alone, so its room on correctness is "
                  "the trained-op tasks the post-rft policy fails; past that, only speed (rewards 2 and 3)."), "",
             "| seed | " + " | ".join(f"{name}: {group}" for name, _, _ in labels for group, _ in NEW_GROUPS)
             + " | room: trained-op tasks failed after rft |",
             "|---" * (1 + len(labels) * len(NEW_GROUPS) + 1) + "|"]
    for r in shown:
        cells = []
        for _, run, label in labels:
            row = (r.ppo if run == "ppo" else r.control).get(label)
            counts = passes_by_new(row, r.heldout_new) if row is not None else {}
            cells += [f"{counts[g][0]} / {counts[g][1]}" if g in counts else "-" for g, _ in NEW_GROUPS]
        room = "-"
        if (rft := r.ppo.get("after_rft")) is not None:
            trained = [t for t, kind in r.heldout_new.items() if kind in NEW_GROUPS[0][1] and t in rft.by_task]
            failed = sum(not any(map(passed, rft.by_task[t])) for t in trained)
            room = f"{failed} of {len(trained)}"
        lines.append(f"| {r.seed} | " + " | ".join(cells) + f" | {room} |")
    return lines


def _cell(row: Row | None) -> str:
    if row is None:
        return "-"
    return f"{_reward(row):+.3f} / {100 * row.pass_rate:.0f}%" + (" *" if row.shared_from else "")


def plot(results: list[SeedResult], path: Path) -> Path | None:
    """Held-out mean reward and pass rate per seed at each point; None without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    points = [("before rft", "ppo", "before_rft"), ("after rft", "ppo", "after_rft"),
              ("after PPO", "ppo", "after_ppo"), ("control", "control", "after_ppo")]
    fig = Figure(figsize=(9, 3.6))
    FigureCanvasAgg(fig)
    for k, (key, title) in enumerate([("reward", "held-out mean reward"), ("pass_rate", "held-out pass rate")]):
        ax = fig.add_subplot(1, 2, k + 1)
        for r in results:
            ys = []
            for _, run, label in points:
                row = getattr(r, run).get(label)
                ys.append(math.nan if row is None else (_reward(row) if key == "reward" else row.pass_rate))
            ax.plot(range(len(points)), ys, marker="o", label=f"seed {r.seed}")
        ax.set_xticks(range(len(points)), [p[0] for p in points])
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if k == 0:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def base_config(policy: str, *, cpu: bool = False) -> TrainConfig:
    """The learning recipe with `policy` as the model (the CPU plumbing: smoke_cpu on family tasks)."""
    base = apply_overrides(smoke_cpu(), CPU_FAMILIES) if cpu else learning()
    if policy != "tiny":  # the CPU plumbing's tiny random model is the recipe's own
        base = apply_overrides(base, [f"model.path={policy}", "model.hf_config=null"])
    return base


def main_policy(policy: str, seeds: int, out: Path, overrides: list[str], *, cpu: bool = False,
                gpus: list[str] | None = None, port_base: int | None = None) -> int:
    """Run every seed (with `gpus`, one child per GPU at once), then write learning.{json,md,png}
    in `out`; 0 when both targets are met. The children's learners listen from `port_base` on (None:
    a free range drawn at random, so that two benchmarks on one machine keep apart)."""
    _log_setup()
    t0 = time.monotonic()
    base = base_config(policy, cpu=cpu)
    out.mkdir(parents=True, exist_ok=True)
    if gpus:
        for gpu in gpus:  # a --gpus entry beyond the visible GPUs is an error before any seed starts
            child_device(gpu)
        if base.model.path:  # a named model is built once here, not by every child at once
            from rl.pretrained import resolve_model

            resolve_model(base.model.path)
        port_base = port_base or free_port_run(PORTS_PER_LANE * len(gpus))
        log.info("learners of the seeds at once from port %d (%d a GPU entry)", port_base, PORTS_PER_LANE)
        results = runtime.run(_seeds_on_gpus, policy, seeds, out, overrides, cpu, gpus, port_base)
    else:
        results = []
        for seed in range(seeds):
            results.append(run_seed(base, out, seed, overrides))
            _write(out, policy, results)
    return _report(out, policy, results, time.monotonic() - t0)


def main_report(policy: str, seeds: int, out: Path, overrides: list[str], *, cpu: bool = False) -> int:
    """Write learning.{json,md,png} in `out` from the seeds' run directories already there (a run cut
    short and copied back), training nothing: the same report, each seed's wall time unknown ("-");
    0 when both targets are met. `policy`, `overrides` and `cpu` must be the run's own: they name
    its directories and its task split."""
    _log_setup()
    base = base_config(policy, cpu=cpu)
    results = []
    for seed in range(seeds):
        ppo, control = seed_configs(base, out, seed, overrides)
        if Path(ppo.run_dir).is_dir():
            results.append(seed_result(seed, ppo, control, math.nan))
    if not results:
        raise SystemExit(f"learning report: no seed's run directory under {out} (expected {out / 'seed0' / 'ppo'})")
    return _report(out, policy, results)


def _report(out: Path, policy: str, results: list[SeedResult], wall_s: float | None = None) -> int:
    """The final report written and printed; 0 when both targets are met."""
    v = _write(out, policy, results, wall_s)
    print((out / "learning.md").read_text())
    return 0 if v["pass_target_met"] and v["ppo_beats_control"] else 1


async def _seeds_on_gpus(policy: str, seeds: int, out: Path, overrides: list[str], cpu: bool,
                         gpus: list[str], port_base: int) -> list[SeedResult]:
    """Seeds k, k + len(gpus), ... one after another on gpus[k], the lanes at once; the report is
    rewritten as each seed ends. A child that fails leaves its seed with the rows it wrote."""
    base, results = base_config(policy, cpu=cpu), []
    first_done = anyio.Event()

    async def lane(k: int, gpu: str) -> None:
        if k:  # seed 0's teachers and before-rft row serve the other seeds: their lanes start once they exist
            while not first_done.is_set() and not shared_parts_ready(base, out, overrides, k):
                with anyio.move_on_after(5.0):
                    await first_done.wait()
            log.info("lane %d (GPU %s) starts: what it takes from seed 0 %s", k, gpu,
                     "is there" if shared_parts_ready(base, out, overrides, k) else "did not come (seed 0 ended)")
        for seed in range(k, seeds, len(gpus)):
            t0 = time.monotonic()
            lane_sets = [f"layout.port_base={port_base + PORTS_PER_LANE * k}",
                         f"layout.learner_memory_share={memory_share(gpus, gpu)}"]
            code = await _child(policy, seed, out, [*lane_sets, *overrides], cpu, gpu)
            if code:
                log.error("seed %d on GPU %s exited with %d; see %s", seed, gpu, code, _seed_log(out, seed))
            ppo, control = seed_configs(base, out, seed, overrides)
            results.append(seed_result(seed, ppo, control, time.monotonic() - t0))
            results.sort(key=lambda r: r.seed)
            _write(out, policy, results)
            first_done.set()  # whatever seed 0 left, the others go on with it

    async with anyio.create_task_group() as tg:
        for k, gpu in enumerate(gpus):
            tg.start_soon(lane, k, gpu)
    return results


async def _child(policy: str, seed: int, out: Path, overrides: list[str], cpu: bool, gpu: str) -> int:
    """`python -m bench.system.policy_learning --seed SEED` on `gpu` alone; its exit status."""
    argv = [sys.executable, "-m", "bench.system.policy_learning", "--policy", policy, "--seed", str(seed),
            "--out", str(out), *(["--cpu"] if cpu else [])]
    for kv in overrides:
        argv += ["--set", kv]
    path = _seed_log(out, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    visible = child_device(gpu)
    log.info("seed %d on GPU %s (CUDA_VISIBLE_DEVICES=%s): %s", seed, gpu, visible, path)
    with path.open("ab") as f:
        done = await anyio.run_process(argv, stdout=f, stderr=f, check=False,
                                       env=dict(os.environ, CUDA_VISIBLE_DEVICES=visible))
    return done.returncode


def memory_share(gpus: list[str], gpu: str) -> float:
    """The share of `gpu`'s memory each of the seeds running on it at once may hold: 90% split
    evenly, the rest left to their GPU queues' workers. Without a cap, three seeds' learners on one
    H200 kept 74, 45 and 19 GiB cached after rft's first updates, and the third ran out of memory."""
    return round(0.9 / gpus.count(gpu), 3)


def child_device(gpu: str) -> str:
    """The CUDA_VISIBLE_DEVICES of the child for `--gpus` entry `gpu`, an index among the GPUs this
    process sees: under CUDA_VISIBLE_DEVICES=2,3, `--gpus 0,1` means GPUs 2 and 3."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = [d for d in (visible or "").split(",") if d.strip()]
    if not seen or not gpu.isdigit():
        return gpu
    if int(gpu) >= len(seen):
        raise SystemExit(f"--gpus {gpu}: this process sees {len(seen)} GPU(s) (CUDA_VISIBLE_DEVICES={visible})")
    return learner_devices((int(gpu),), visible)  # the mapping the learner's ranks use


def _seed_log(out: Path, seed: int) -> Path:
    return out / f"seed{seed}" / "seed.log"


def _log_setup() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)


def main_seed(argv: list[str] | None = None) -> int:
    """One seed in this process: the child that `main_policy(..., gpus=...)` starts per GPU."""
    p = argparse.ArgumentParser(prog="python -m bench.system.policy_learning", description=main_seed.__doc__)
    p.add_argument("--policy", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--cpu", action="store_true")
    a = p.parse_args(argv)
    _log_setup()
    log.info("seed %d: CUDA_VISIBLE_DEVICES=%s", a.seed, os.environ.get("CUDA_VISIBLE_DEVICES"))
    run_seed(base_config(a.policy, cpu=a.cpu), Path(a.out), a.seed, a.set)
    return 0


def _write(out: Path, policy: str, results: list[SeedResult], wall_s: float | None = None) -> dict[str, Any]:
    v = verdicts(results, wall_s)
    doc = {"policy": policy, "verdicts": v, "seeds": [msgspec.to_builtins(r) for r in results]}
    (out / "learning.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    (out / "learning.md").write_text(markdown(results, policy, v))
    plot(results, out / "learning.png")
    return v


__all__ = ["PpoStep", "SeedResult", "base_config", "child_device", "control_rows", "learner_memory", "main_policy",
           "main_report",
           "main_seed", "mean_se", "memory_share", "ppo_steps", "run_seed", "seed_configs", "share_demonstrations",
           "shared_base_row", "verdicts"]


if __name__ == "__main__":
    raise SystemExit(main_seed())
