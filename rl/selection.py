"""Which trajectories a stage learns from.

What it is: rejection fine-tuning's filter (the paper: keep reward > 0, drop looping and
tool-schema-violating trajectories) as a function that returns the reason a trajectory is
dropped, so the run can log how many fell to each reason.
What it is not: the reward (`rewards`) or the SFT loss (`rl/learner/update.py`).

Example:
    kept, dropped = select_for_rft(trajectories)   # dropped: {"reward<=0": 3, "looping": 1}
"""

from __future__ import annotations

from collections import Counter

import msgspec

from agentcore.types import Status, ToolError, ToolErrorKind, Trajectory

LOOP_REPEATS = 3
"""The same tool call this many turns in a row, or the same assistant text, is a loop."""


def rft_rejection(traj: Trajectory) -> str | None:
    """Why `traj` is not kept for rejection fine-tuning, or None when it is."""
    if traj.reward is None or traj.reward <= 0:
        return "reward<=0"
    if traj.status is not Status.COMPLETED:
        return f"status:{traj.status.value}"
    if any(t.parse_error for t in traj.turns) or any(
        isinstance(r, ToolError) and r.error is ToolErrorKind.INVALID_CALL for t in traj.turns for r in t.results
    ):
        return "tool_schema"
    if is_looping(traj):
        return "looping"
    return None


def is_looping(traj: Trajectory, repeats: int = LOOP_REPEATS) -> bool:
    """The same calls (or, for turns without calls, the same text) `repeats` turns in a row."""
    keys = [msgspec.json.encode(t.calls) if t.calls else t.text.encode() for t in traj.turns]
    run = 1
    for prev, cur in zip(keys, keys[1:]):
        run = run + 1 if cur == prev else 1
        if run >= repeats:
            return True
    return False


def select_for_rft(trajectories: list[Trajectory]) -> tuple[list[Trajectory], Counter[str]]:
    kept, dropped = [], Counter()
    for traj in trajectories:
        reason = rft_rejection(traj)
        if reason is None:
            kept.append(traj)
        else:
            dropped[reason] += 1
    return kept, dropped
