"""Why held-out trajectories, and PPO's failing samples, failed: verdicts read from a run's rollouts.

What it is: `failures(run_dir, label)` reads `rollouts/heldout_<label>.jsonl` of a training run
(written by `rl.heldout.evaluate`) and returns one `Failure` per trajectory that did not pass
(reward below 1): its task, the verdict's status (compile_error, wrong_output, runtime_error,
hack, ...) and one line of the verdict's message that says why. `markdown_lines` turns the
failures of several seeds into the learning report's section: failed trajectories by status per
row, and each failed task of trained ops after rft (what PPO could still gain) with its reason.
`ppo_failures(run_dir)` gives the failing samples of PPO's groups of mixed rewards (what its updates
pushed down), and `ppo_markdown_lines` their most common reasons over the seeds.
What it is not: a judge; it reports the verdicts the final evaluation gave.

    rows = failures("runs/learning/seed0/ppo", "after_rft")
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from msgspec import Struct

from agentcore.store import read_trajectories
from agentcore.types import Trajectory
from rl.dynamic_sampling import mixed_groups

REASON_CHARS = 160
_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception)\b.*:|: error:|error: ")
_CUDA_ERROR = re.compile(r"cudaError\w+")
_BOILERPLATE = ("CUDA kernel errors might be", "For debugging consider", "Compile with `TORCH_USE_CUDA_DSA`")


class Failure(Struct, frozen=True, kw_only=True):
    """One held-out trajectory that did not pass."""

    task_id: str
    status: str
    reason: str


def reason_line(message: str) -> str:
    """The line of a verdict's message that says why: its last error line (a traceback's
    exception, a compiler's error), else the CUDA error a line names (a long message keeps its
    ends only, and may have lost the exception's line), else its first line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(_BOILERPLATE)]
    if errors := [line for line in lines if _ERROR_LINE.search(line)]:
        return errors[-1][:REASON_CHARS]
    if named := [m.group(0) for line in lines if (m := _CUDA_ERROR.search(line))]:
        return f"CUDA error {named[-1]}"
    return lines[0][:REASON_CHARS] if lines else ""


def failures(run_dir: str | Path, label: str) -> list[Failure]:
    """The failed trajectories of the held-out evaluation `label` of a run ([] without its file;
    `agentcore.store.read_trajectories` skips a line cut by a killed run)."""
    trajs = read_trajectories(Path(run_dir) / "rollouts" / f"heldout_{label}.jsonl")
    return [_failure(t) for t in trajs if not passed(t.reward)]


def ppo_failures(run_dir: str | Path) -> list[Failure]:
    """The samples below reward 1 in PPO's groups of mixed rewards (`rollouts/ppo_*.jsonl`, dynamic
    sampling's rounds included): the answers PPO's updates pushed down against their group's."""
    trajs = [t for path in sorted((Path(run_dir) / "rollouts").glob("ppo_*.jsonl")) for t in read_trajectories(path)]
    mixed = mixed_groups(trajs)
    return [_failure(t) for t in trajs if t.group_id in mixed and t.reward is not None and not passed(t.reward)]


def passed(reward: float | None) -> bool:
    """A trajectory that passed: a scored reward of at least 1 (a correct kernel)."""
    return reward is not None and reward >= 1.0


def verdict_status(traj: Trajectory) -> str:
    """The final evaluation's status of a trajectory (ok, compile_error, ...), else the rollout's own."""
    return str(traj.reward_info.get("status") or traj.status.value)


def _failure(traj: Trajectory) -> Failure:
    status = verdict_status(traj)
    message = str(traj.reward_info.get("message") or traj.error or "")
    return Failure(task_id=traj.task_id, status=status, reason=reason_line(message))


def ppo_markdown_lines(seeds: Iterable[tuple[int, list[Failure]]], top: int = 8) -> list[str]:
    """The report's section on PPO's failing samples: per seed their count by verdict status, then
    the `top` most common reasons over the seeds, with how many samples gave each."""
    seeds = [(seed, fs) for seed, fs in seeds if fs]
    if not seeds:
        return []
    statuses = sorted({f.status for _, fs in seeds for f in fs})
    lines = ["", "Why PPO's failing samples failed (reward below 1 in groups of mixed rewards: what its updates "
                 "pushed down):", "", "| seed | " + " | ".join(statuses) + " |", "|---" * (1 + len(statuses)) + "|"]
    for seed, fs in seeds:
        counts = Counter(f.status for f in fs)
        lines.append(f"| {seed} | " + " | ".join(str(counts[s]) for s in statuses) + " |")
    common = Counter((f.status, f.reason) for _, fs in seeds for f in fs).most_common(top)
    lines += ["", "Their most common reasons over the seeds:", ""]
    lines += [f"- {n} x {status}: {reason.replace('|', '/')}" for (status, reason), n in common]
    return lines


def markdown_lines(seeds: Iterable[tuple[int, dict[str, list[Failure]]]], trained: Iterable[str]) -> list[str]:
    """The report's section: per seed and row (label -> failures), the failed trajectories by
    verdict status; then every task of trained ops (`trained`) that failed after rft, with why."""
    seeds = [(seed, rows) for seed, rows in seeds if any(rows.values())]
    if not seeds:
        return []
    statuses = sorted({f.status for _, rows in seeds for fs in rows.values() for f in fs})
    lines = ["", "Why held-out trajectories failed: the final evaluation's verdict of each failed trajectory.", "",
             "| seed | row | " + " | ".join(statuses) + " |", "|---" * (2 + len(statuses)) + "|"]
    for seed, rows in seeds:
        for label, fs in rows.items():
            counts = Counter(f.status for f in fs)
            lines.append(f"| {seed} | {label.replace('_', ' ')} | " + " | ".join(str(counts[s]) for s in statuses) + " |")
    trained = set(trained)
    room = [(seed, f) for seed, rows in seeds for f in rows.get("after_rft", []) if f.task_id in trained]
    if room:
        lines += ["", "Tasks of trained ops failed after rft (what PPO could gain on correctness), and why:", ""]
        lines += [f"- seed {seed}, `{f.task_id}`: {f.status}: {f.reason.replace('|', '/')}" for seed, f in room]
    return lines


__all__ = ["Failure", "failures", "markdown_lines", "passed", "ppo_failures", "ppo_markdown_lines", "reason_line",
           "verdict_status"]
