"""The held-out evaluation: the policy on tasks it never trained on, at the run's stage boundaries.

What it is: with `data.tasks=families` and `data.heldout`, `evaluate(run, label)` rolls the current
policy out on the held-out split of `rl.data.families` (`data.heldout_samples` trajectories per
task at `data.heldout_temperature`, 0 = greedy, with the rollout's seed), each scored like a
training trajectory by the run's scorer (the real final evaluation on a GPU), and appends one row
to RUN/heldout.jsonl: the label (`before_rft`, `after_rft`, `after_ppo` in a smoke run), the weight version,
pass rate, mean reward, the share faster than eager, and the rollout figures. The trajectories are
in `rollouts/heldout_<label>.jsonl`; a resumed run finds a label already in heldout.jsonl and does
not evaluate it again. `read_rows` and `table` give the rows back and print them.
What it is not: training data (nothing here reaches the learner) or the KernelBench benchmark
(`cuda-agent bench`).

Example:
    row = await heldout.evaluate(run, "after_rft")
    print(heldout.table(heldout.read_rows(run.run_dir)))
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import msgspec
from msgspec import Struct

from agentcore.orchestrator import WorkItem
from agentcore.types import Task, Trajectory
from rl.config import TrainConfig
from rl.data import families
from rl.metrics import read_jsonl, step_metrics
from rl.run import Run
from rl.stages import UNUSABLE, stage_plan

log = logging.getLogger("cuda-agent.train")

FILE = "heldout.jsonl"


class HeldoutError(RuntimeError):
    """A held-out evaluation whose rollouts did not all reach the policy's own end: no row."""


AFTER = ("single_turn", "rft", "ppo")
"""The stages that move the actor: the loop evaluates after each, and before its first stage
(labels `before_<first stage>`, `after_<stage>`)."""


def enabled(cfg: TrainConfig) -> bool:
    return cfg.data.heldout and cfg.data.tasks == "families"


def expected_labels(cfg: TrainConfig) -> list[str]:
    """The labels a whole run of `cfg`'s stage plan writes."""
    plan = stage_plan(cfg)
    return [f"before_{plan[0].name}", *(f"after_{s.name}" for s in plan if s.name in AFTER)]


def heldout_tasks(cfg: TrainConfig) -> list[Task]:
    return list(families.split_for(cfg.data).heldout)


class Row(Struct, frozen=True, kw_only=True):
    """One held-out evaluation: a line of RUN/heldout.jsonl."""

    label: str
    weight_version: int
    tasks: int
    trajectories: int
    pass_rate: float
    reward_mean: float | None
    """None when nothing was scored."""
    faster_than_eager_rate: float
    scored: float
    parse_error_rate: float | None
    turns_mean: float | None
    by_task: dict[str, list[float | None]]
    """Each task's trajectory rewards (None: not scored)."""
    max_turns: int = 0
    max_new_tokens: int = 0
    max_context_tokens: int = 0
    temperature: float = 0.0
    """The limits and temperature the rollouts ran under: the run's `rollout`, at
    `data.heldout_temperature` (0: not recorded)."""
    seconds: float = 0.0
    """Wall time of the evaluation: rollouts and final evaluations."""
    shared_from: str = ""
    """Not evaluated in this run: the run directory whose evaluation of the same weights this row
    is (a greedy evaluation of the same actor gives the same rollouts)."""


def read_rows(run_dir: str | Path) -> list[Row]:
    """The rows of RUN/heldout.jsonl (a torn last line, or one that is not a row, is skipped)."""
    rows = []
    for raw in read_jsonl(Path(run_dir) / FILE):
        try:
            rows.append(msgspec.convert(raw, Row))
        except msgspec.ValidationError:
            continue
    return rows


async def evaluate(run: Run, label: str, *, version: int) -> Row | None:
    """Evaluate the held-out split now and append the row; None when disabled or already done."""
    cfg = run.cfg
    if not enabled(cfg) or any(r.label == label for r in read_rows(run.run_dir)):
        return None
    items = [WorkItem(task=t, group_id=f"{t.task_id}@heldout", samples=cfg.data.heldout_samples)
             for t in heldout_tasks(cfg)]
    rollout = msgspec.structs.replace(cfg.rollout, temperature=cfg.data.heldout_temperature)
    at_once = min(cfg.orchestrator.workers, cfg.orchestrator.model_slots, len(items) * cfg.data.heldout_samples)
    log.info("heldout_%s: %d rollouts, up to %d at once, each up to %d turns x %d new tokens (temperature %g)", label,
             len(items) * cfg.data.heldout_samples, at_once, rollout.max_turns, rollout.max_new_tokens,
             rollout.temperature)
    t0 = time.perf_counter()
    trajs = await run.rollouts(items, tag=f"heldout_{label}", rollout=rollout)
    seconds = time.perf_counter() - t0
    if why := infrastructure_failures(trajs):
        raise HeldoutError(f"held-out evaluation {label}: {why}; no row written, a resumed run evaluates it again")
    figures = step_metrics(trajs, max_response_tokens=None)
    by_task: dict[str, list[float | None]] = {}
    for t in trajs:
        by_task.setdefault(t.task_id, []).append(t.reward)
    row = Row(
        label=label,
        weight_version=version,
        tasks=len(items),
        trajectories=len(trajs),
        pass_rate=figures.get("pass_rate", 0.0),
        reward_mean=figures.get("reward_mean"),
        faster_than_eager_rate=figures.get("faster_than_eager_rate", 0.0),
        scored=figures.get("scored", 0.0),
        parse_error_rate=figures.get("parse_error_rate"),
        turns_mean=figures.get("turns_mean"),
        by_task=by_task,
        max_turns=rollout.max_turns,
        max_new_tokens=rollout.max_new_tokens,
        max_context_tokens=rollout.max_context_tokens,
        temperature=rollout.temperature,
        seconds=seconds,
    )
    append_row(run.run_dir, row)
    return row


def infrastructure_failures(trajs: list[Trajectory]) -> str:
    """'' when every trajectory ended by the policy's doing, else how many did not and the first
    one's error: the ends training cannot learn from (`stages.UNUSABLE`: the model server or the
    harness failed, the run stopped) would read here as the policy failing the task."""
    bad = [t for t in trajs if t.status in UNUSABLE]
    if not bad:
        return ""
    return f"{len(bad)} of {len(trajs)} rollouts ended in {bad[0].status.value}: {(bad[0].error or '').splitlines()[0][:200]}"


def append_row(run_dir: Path, row: Row) -> None:
    """Add `row` to RUN/heldout.jsonl (a label found there is not evaluated again)."""
    with (Path(run_dir) / FILE).open("ab") as f:
        f.write(msgspec.json.encode(row) + b"\n")


def table(rows: list[Row]) -> str:
    """The rows as a small text table: pass rate, mean reward, share faster than eager, the
    rollouts' turn and new-token limits, seconds."""
    lines = [f"{'held-out':<12} {'pass rate':>9} {'mean reward':>11} {'faster than eager':>17} {'trajectories':>12} "
             f"{'turns x new tokens':>18} {'seconds':>7}"]
    for r in rows:
        mean = "-" if r.reward_mean is None else f"{r.reward_mean:+.3f}"
        limits = f"{r.max_turns} x {r.max_new_tokens}" if r.max_turns else "-"
        lines.append(f"{r.label:<12} {100 * r.pass_rate:>8.1f}% {mean:>11} "
                     f"{100 * r.faster_than_eager_rate:>16.1f}% {r.trajectories:>12} {limits:>18} {r.seconds:>7.0f}")
    return "\n".join(lines)


__all__ = ["AFTER", "FILE", "Row", "append_row", "enabled", "evaluate", "expected_labels", "heldout_tasks", "read_rows", "table"]
