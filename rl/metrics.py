"""Training metrics: what a step's rollouts looked like, where the numbers go, a progress line.

What it is: `step_metrics` turns a step's trajectories into flat scalars for the `rollout/`
group (reward statistics, milestone rates, truncation, turns, parse errors, hacks, staleness);
`MetricsWriter` appends every step's scalars to `RUN/metrics.jsonl` (one JSON object a line,
fsync'd) and to TensorBoard under `RUN/tb`; `read_metrics` reads the lines back; `ProgressBar`
draws one line per step on stderr. What it is not: the learner's own numbers (`rl/learner/update.py`
returns those; the trainer adds them under `train/`), nor plotting (`rl/plot.py` reads these).

Key names are `group/name`. Groups the plots know (`rl/plot.py`): `rollout/` (step_metrics),
`train/` (ppo_step's metrics: policy_loss, entropy, clipfrac, ratio_mean, ratio_max,
logprob_gap, explained_variance, ...), `time/` (rollout_s, train_s, weight_sync_s),
`gpu_queue/` (busy_fraction, ..., per job kind `gpu_queue/verify/run_s`), `compile_pool/` (builds,
build_s_mean, process_s_mean, slot_wait_s_mean, ...), `loop_lag/` (max_ms, mean_ms), `perf/` (tokens_per_s, mfu).

Example:
    writer = MetricsWriter(run_dir, start_step=resumed_step)
    bar = ProgressBar(total_steps, start_step=resumed_step)
    for step in range(resumed_step, total_steps):
        rollout = step_metrics(trajectories, max_response_tokens=32768, current_version=version)
        row = {"rollout": rollout, "train": train_metrics, "time/rollout_s": rollout_s}
        bar.update(step, writer.write(step, row))
    writer.close(); bar.close()
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import orjson

from agentcore.types import Status, Trajectory

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
_RESERVED = ("step", "time")  # every line's own keys
MILESTONES = (-1, 1, 2, 3)  # rewards/reward.py: fail, correct, beats eager, beats both

Scalars = Mapping[str, Any]  # name -> number, or a nested group of them


# ---------------------------------------------------------------------------------------------
# Rollout metrics.


def step_metrics(
    trajectories: Sequence[Trajectory],
    *,
    max_response_tokens: int | None,
    current_version: int | None = None,
) -> dict[str, float]:
    """Flat scalars of one step's trajectories, unprefixed: the caller files them under
    `rollout/` (`{"rollout": step_metrics(...)}` or `f"rollout/{key}"`).

    Rates over rewards use the scored trajectories (reward not None). The milestone rates read
    `reward_info["milestone"]` when the final evaluator wrote it (rewards/verdict.py
    `reward_info`), so they stay right under the raw-speedup reward too; without it they fall
    back to the milestone values: pass = reward > 0, beats eager = reward >= 2, beats both =
    reward == 3. `max_response_tokens` adds the share of responses that filled the budget;
    `current_version` adds how many weight versions behind the oldest token of a trajectory is.
    """
    n = len(trajectories)
    out: dict[str, float] = {"trajectories": float(n)}
    if n == 0:
        return out
    out |= _reward_metrics(trajectories)
    out |= _shape_metrics(trajectories, max_response_tokens)
    out |= _hack_metrics(trajectories)
    if current_version is not None:
        behind = [current_version - t.weight_version_min for t in trajectories]
        out["staleness_max"] = float(max(behind))
        out["staleness_mean"] = statistics.fmean(behind)
    return out


def _reward_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    scored = [t for t in trajectories if t.reward is not None]
    out: dict[str, float] = {"scored": float(len(scored))}
    if not scored:
        return out
    rewards = [float(t.reward) for t in scored]  # type: ignore[arg-type]
    out |= {
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards),
        "reward_min": min(rewards),
        "reward_max": max(rewards),
    }
    counts = Counter(rewards)
    for value in MILESTONES:
        out[f"reward_count/{value}"] = float(counts.pop(float(value), 0))
    if counts:  # speedup-mode rewards are continuous: count them, do not make a key per value
        out["reward_count/other"] = float(sum(counts.values()))
    levels = [_milestone(t) for t in scored]
    out["pass_rate"] = _share(level >= 1 for level in levels)
    out["faster_than_eager_rate"] = _share(level >= 2 for level in levels)
    out["faster_than_compile_rate"] = _share(level == 3 for level in levels)
    return out


def _milestone(traj: Trajectory) -> int:
    """0 for a failure, else the milestone 1..3 (see step_metrics)."""
    if "milestone" in traj.reward_info:
        level = traj.reward_info["milestone"]
        return int(level) if isinstance(level, (int, float)) else 0
    reward = float(traj.reward)  # type: ignore[arg-type]
    if reward == 3:
        return 3
    return 2 if reward >= 2 else (1 if reward > 0 else 0)


def _shape_metrics(
    trajectories: Sequence[Trajectory], max_response_tokens: int | None
) -> dict[str, float]:
    turns = [t for traj in trajectories for t in traj.turns]
    out = {
        "truncated_frac": _share(_truncated_by_length(t) for t in trajectories),
        "turns_mean": statistics.fmean(len(t.turns) for t in trajectories),
        "response_tokens_mean": statistics.fmean(len(t.response_ids) for t in trajectories),
        "generated_tokens_mean": statistics.fmean(t.generated_tokens for t in trajectories),
        "parse_error_rate": _share(t.parse_error is not None for t in turns) if turns else 0.0,
    }
    if max_response_tokens:
        full = (len(t.response_ids) >= max_response_tokens for t in trajectories)
        out["response_clip_frac"] = _share(full)
    statuses = Counter(t.status for t in trajectories)
    for status in Status:
        if statuses[status]:
            out[f"status/{status.value}"] = statuses[status] / len(trajectories)
    return out


def _truncated_by_length(traj: Trajectory) -> bool:
    """The context budget ended it, or some turn stopped at max_new_tokens."""
    if traj.status is Status.TRUNCATED_LENGTH:
        return True
    return any(turn.finish_reason == "length" for turn in traj.turns)


def _hack_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Share of trajectories whose final evaluation named a hack, overall and per category."""
    hacks = [t.reward_info.get("hack") for t in trajectories]
    named = Counter(str(h) for h in hacks if h)
    n = len(trajectories)
    out = {"hack_rate": sum(named.values()) / n}
    out |= {f"hack_rate/{category}": count / n for category, count in sorted(named.items())}
    return out


def _share(flags: Any) -> float:
    flags = list(flags)
    return sum(map(bool, flags)) / len(flags) if flags else 0.0


# ---------------------------------------------------------------------------------------------
# Storage.


def flatten(scalars: Scalars, prefix: str = "") -> dict[str, float | str | None]:
    """`{"train": {"loss": 1}}` -> `{"train/loss": 1.0}`; bools become 0/1, NaN and infinities
    None (JSON has no NaN), strings (a stage name) stay as they are, anything else is dropped."""
    out: dict[str, float | str | None] = {}
    for key, value in scalars.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out |= flatten(value, f"{name}/")
        elif isinstance(value, str):
            out[name] = value
        elif isinstance(value, (bool, int, float)) or _is_scalar_tensor(value):
            number = float(value)
            out[name] = number if math.isfinite(number) else None
    return out


def _is_scalar_tensor(value: Any) -> bool:
    return hasattr(value, "item") and getattr(value, "ndim", None) == 0


class MetricsWriter:
    """Appends one line per step to RUN/metrics.jsonl and the same scalars to TensorBoard.

    Each line is `{"step": s, "time": unix_s, **scalars}`, flushed and fsync'd before `write`
    returns, so a killed run keeps every finished step. `start_step` is the step the run resumes
    at: existing lines with step >= start_step are dropped (0, a fresh run, keeps none), so the
    curve of a resumed run has no duplicates. RUN/tb mirrors the file: its event files are
    rewritten from the kept lines when the writer opens, so TensorBoard (and any reader of the
    event files) sees each step once after a resume, and a fresh run in an old directory starts
    a new curve there too.

    Example:
        with MetricsWriter(run_dir, start_step=12) as writer:
            writer.write(12, {"rollout/reward_mean": 1.5, "train": {"policy_loss": 0.02}})
    """

    def __init__(self, run_dir: str | Path, *, start_step: int = 0, tensorboard: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        kept = _keep_before(self.path, start_step)
        self._file = open(self.path, "ab")
        self._tb = _summary_writer(self.run_dir / TB_DIR, kept) if tensorboard else None

    def write(self, step: int, scalars: Scalars) -> dict[str, float | str | None]:
        """Record one step; returns the flattened values that were written. `step` and `time`
        are the line's own: same-named keys in `scalars` are left out."""
        flat = {k: v for k, v in flatten(scalars).items() if k not in _RESERVED}
        line = {"step": step, "time": time.time()} | flat
        self._file.write(orjson.dumps(line) + b"\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._tb is not None:
            _add_scalars(self._tb, line)
            self._tb.flush()
        return flat

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _summary_writer(log_dir: Path, rows: list[dict[str, Any]]) -> Any:
    """A SummaryWriter on `log_dir` whose only events are `rows` (the lines metrics.jsonl kept).

    Earlier event files are removed rather than purged with `purge_step`: a purge is a marker
    that some readers apply and others do not, so their curves would show the re-run steps twice.
    """
    # Imported here: torch + tensorboard take seconds to import, and `cuda-agent plot` and the
    # readers of metrics.jsonl need neither.
    from torch.utils.tensorboard import SummaryWriter

    for old in log_dir.glob("events.out.tfevents.*"):
        old.unlink()
    writer = SummaryWriter(log_dir=str(log_dir))
    for row in rows:
        _add_scalars(writer, row)
    writer.flush()
    return writer


def _add_scalars(writer: Any, line: Mapping[str, Any]) -> None:
    """A metrics.jsonl line's numbers as TensorBoard scalars at its step and time."""
    step, walltime = line["step"], line.get("time")
    for name, value in line.items():
        if name not in _RESERVED and isinstance(value, float):
            writer.add_scalar(name, value, step, walltime=walltime)


def _keep_before(path: Path, start_step: int) -> list[dict[str, Any]]:
    """Rewrite `path` with only the well-formed lines of steps before `start_step` (atomic);
    returns those lines."""
    if not path.exists():
        return []
    rows = [row for row in _rows(path) if row["step"] < start_step]
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "wb") as f:
        f.writelines(orjson.dumps(row) + b"\n" for row in rows)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return rows


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, in order; a torn last line (a crash mid-write) and
    other junk are skipped, and a missing file has none."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    for raw in path.read_bytes().splitlines():
        try:
            row = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _rows(path: Path) -> list[dict[str, Any]]:
    """The metric rows of a file: objects with an integer step."""
    return [row for row in read_jsonl(path) if isinstance(row.get("step"), int)]


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of RUN/metrics.jsonl in file order (empty when the file does not exist)."""
    path = Path(run_dir) / METRICS_FILE
    return _rows(path) if path.exists() else []


# ---------------------------------------------------------------------------------------------
# Progress.


def format_progress(
    step: int, total: int, scalars: Mapping[str, Any], step_s: float | None, eta_s: float | None
) -> str:
    """`[step 3 (4/100)] reward 1.25 pass 62% | 41.2s/step | ETA 1h07m` after step 3 of 0..99
    (missing parts left out). Steps are numbered from 0 as in metrics.jsonl, the log and the
    checkpoints; the fraction counts the steps done."""
    parts = [f"[step {step} ({step + 1}/{total})]"]
    if (reward := _get(scalars, "reward_mean")) is not None:
        parts.append(f"reward {reward:.2f}")
    if (passed := _get(scalars, "pass_rate")) is not None:
        parts.append(f"pass {passed:.0%}")
    line = " ".join(parts)
    if step_s is not None:
        line += f" | {step_s:.1f}s/step"
    if eta_s is not None:
        line += f" | ETA {_duration(eta_s)}"
    return line


def _get(scalars: Mapping[str, Any], name: str) -> Any:
    """`rollout/<name>` as the trainer logs it, or the bare name of step_metrics' output."""
    value = scalars.get(f"rollout/{name}", scalars.get(name))
    return value if isinstance(value, (int, float)) else None


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class ProgressBar:
    """One progress line per training step on stderr: rewritten in place on a terminal, a new
    plain line per step otherwise (CI logs). Same look as agentcore.progress's rollout line.

    Example:
        bar = ProgressBar(total_steps=100, start_step=0)
        bar.update(0, {"rollout/reward_mean": -0.5, "rollout/pass_rate": 0.25})
        bar.close()
    """

    def __init__(
        self,
        total_steps: int,
        *,
        start_step: int = 0,
        out: TextIO = sys.stderr,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.out, self.clock = total_steps, out, clock
        self._tty = out.isatty()
        self._first_step = start_step
        self._started = clock()
        self._drawn = False

    def update(self, step: int, scalars: Mapping[str, Any]) -> str:
        """Show that `step` (0-based) finished; returns the line."""
        done = step + 1 - self._first_step
        step_s = (self.clock() - self._started) / done if done > 0 else None
        eta = step_s * max(self.total - step - 1, 0) if step_s is not None else None
        line = format_progress(step, self.total, scalars, step_s, eta)
        if self._tty:
            self.out.write("\r\x1b[2K" + line)
        else:
            self.out.write(line + "\n")
        self.out.flush()
        self._drawn = True
        return line

    def close(self) -> None:
        if self._tty and self._drawn:
            self.out.write("\n")
            self.out.flush()
        self._drawn = False
