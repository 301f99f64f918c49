"""Per-problem records of a KernelBench benchmark run: the one file every metric is computed from.

What it is: `ProblemRecord`, one JSON line per (problem, checkpoint) in `RUN/records.jsonl`,
written by the benchmark runner (`bench.kernelbench.run`) after the trusted final evaluation of
the trajectory's best candidate, and read back by the metrics and the report
(`bench.kernelbench.metrics`, `bench.kernelbench.report`). Every number in a report must be
reproducible from these lines alone. `append_record` writes a line and fsyncs it (a killed run
loses at most the problem in flight); `read_records` tolerates a torn last line.

What it is not: the trajectory (that is in the run's trajectory store, named by
`trajectory_id`), nor the metrics.

Example:
    append_record(path, ProblemRecord(level=1, problem_id=19, name="19_ReLU", ...))
    records = read_records(path)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import msgspec
from msgspec import Struct

Outcome = Literal["scored", "no_candidate", "error", "skipped"]


class ProblemRecord(Struct, frozen=True, kw_only=True):
    """One problem's result under one checkpoint (or one replayed solution set)."""

    level: int
    problem_id: int
    name: str
    """KernelBench's file stem, e.g. '19_ReLU'."""
    source: str
    """What produced the solution: a model path / checkpoint label, or 'replay:<dir>'."""
    outcome: Outcome
    """scored: a candidate went through the final evaluation; no_candidate: the trajectory never
    produced one (counted as not correct); error: infrastructure failure, message in `error`
    (not counted in any rate, reported separately, run again by a resumed run); skipped: not run
    (message says why)."""
    correct: bool = False
    status: str = ""
    """rewards.verdict.VerdictStatus value of the final evaluation ('' when not scored)."""
    hack: str | None = None
    """rewards.verdict.HackCategory value when the final evaluation flagged a hack."""
    message: str = ""
    eager_ms: float | None = None
    compile_ms: float | None = None
    candidate_ms: float | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    reward: float | None = None
    trajectory_id: str = ""
    seed: int | None = None
    turns: int = 0
    candidates: int = 0
    """Candidates the agent profiled in the trajectory (the best of them was evaluated)."""
    checkpoint_step: int | None = None
    wall_s: float = 0.0
    error: str | None = None
    env: Literal["real", "fake"] = "real"
    """The kernel environment that judged it; `fake` (CPU plumbing check) judges nothing real."""
    inconclusive: bool = False
    """Paired timing withheld a milestone: a speedup's interval straddled its threshold
    (reward_info["inconclusive"], rewards.reward.score_paired)."""
    rules: Literal["paper", "kernelbench"] = "paper"
    """The rule set that judged it (rewards.verdict.Rules)."""
    partial: str = ""
    """Under kernelbench rules, what torch did of the work of the evaluated candidate (the
    verdict's `partial_work`; '' when nothing): correct with this set is "partial", not a hack."""

    @property
    def key(self) -> tuple[int, int, int | None]:
        """(level, problem_id, checkpoint_step): what a resumed run skips."""
        return (self.level, self.problem_id, self.checkpoint_step)


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(ProblemRecord)


def append_record(path: str | Path, record: ProblemRecord) -> None:
    """Append one line and fsync it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(_encoder.encode(record) + b"\n")
        f.flush()
        os.fsync(f.fileno())


def read_records(path: str | Path) -> list[ProblemRecord]:
    """All complete lines of `path` ([] if it does not exist); a torn or corrupt line is skipped.
    A later line for the same key replaces an earlier one."""
    path = Path(path)
    if not path.exists():
        return []
    latest: dict[tuple[int, int, int | None], ProblemRecord] = {}
    for line in path.read_bytes().splitlines():
        try:
            record = _decoder.decode(line)
        except msgspec.DecodeError:
            continue
        latest[record.key] = record
    return list(latest.values())
