"""`cuda-agent plot RUN_DIR [--out DIR]`: the training curves of a run, as PNG files.

What it is: reads RUN/metrics.jsonl (`rl/metrics.py`) and draws one figure per topic with
matplotlib's Agg canvas (no display, no pyplot state): reward with its min/max band, the count
of each reward value, milestone rates, entropy, critic explained variance, truncated share, PPO
clipping, the train-vs-rollout log-prob gap, the time split of a step, throughput and MFU. A
figure is drawn only when at least one of its keys was logged. Also `print_reward_curve`, the
compact text curve the smoke run prints in the terminal. What it is not: a dashboard
(TensorBoard reads RUN/tb).

Keys are looked up as written by the trainer (`train/entropy`); a bare name (`entropy`) logged
without its group is accepted too.

    cuda-agent plot runs/smoke              # -> runs/smoke/plots/*.png
    cuda-agent plot runs/smoke --out /tmp/p
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from msgspec import Struct

from rl.metrics import METRICS_FILE, read_metrics

Rows = Sequence[dict[str, Any]]


class Panel(Struct, frozen=True, kw_only=True):
    """One axes: lines for `series` (key, label), an optional shaded (low key, high key) band."""

    title: str
    series: tuple[tuple[str, str], ...]
    band: tuple[str, str] | None = None
    ylabel: str = ""
    stacked: bool = False


class Figure(Struct, frozen=True, kw_only=True):
    """One PNG: `name`.png with its panels side by side."""

    name: str
    panels: tuple[Panel, ...]


FIGURES: tuple[Figure, ...] = (
    Figure(
        name="reward",
        panels=(
            Panel(
                title="Reward",
                series=(("rollout/reward_mean", "mean"),),
                band=("rollout/reward_min", "rollout/reward_max"),
                ylabel="reward",
            ),
        ),
    ),
    Figure(
        name="rates",
        panels=(
            Panel(
                title="Milestone rates",
                ylabel="share of trajectories",
                series=(
                    ("rollout/pass_rate", "correct (reward > 0)"),
                    ("rollout/faster_than_eager_rate", "faster than eager"),
                    ("rollout/faster_than_compile_rate", "faster than torch.compile"),
                ),
            ),
        ),
    ),
    Figure(
        name="reward_counts",
        panels=(
            Panel(
                title="Rewards per step",
                ylabel="trajectories",
                stacked=True,
                series=(
                    ("rollout/reward_count/-1", "-1 failed"),
                    ("rollout/reward_count/1", "1 correct"),
                    ("rollout/reward_count/2", "2 beats eager"),
                    ("rollout/reward_count/3", "3 beats both"),
                    ("rollout/reward_count/other", "other"),
                ),
            ),
        ),
    ),
    Figure(
        name="entropy",
        panels=(
            Panel(
                title="Policy entropy", series=(("train/entropy", "entropy"),), ylabel="nats/token"
            ),
        ),
    ),
    Figure(
        name="explained_variance",
        panels=(
            Panel(
                title="Critic explained variance",
                series=(("train/explained_variance", "explained variance"),),
            ),
        ),
    ),
    Figure(
        name="losses",
        panels=(
            Panel(title="Policy loss", series=(("train/policy_loss", "policy"),)),
            Panel(title="Value loss", series=(("train/value_loss", "value"),)),
        ),
    ),
    Figure(
        name="truncated",
        panels=(
            Panel(
                title="Truncated by length",
                series=(
                    ("rollout/truncated_frac", "truncated"),
                    ("rollout/response_clip_frac", "response at budget"),
                ),
                ylabel="share of trajectories",
            ),
        ),
    ),
    Figure(
        name="clipping",
        panels=(
            Panel(title="Clip fraction", series=(("train/clipfrac", "clipfrac"),)),
            Panel(
                title="Importance ratio",
                series=(
                    ("train/ratio_mean", "mean"),
                    ("train/ratio_max", "max"),
                    ("train/tis_mean", "TIS weight mean"),
                ),
            ),
        ),
    ),
    Figure(
        name="logprob_gap",
        panels=(
            Panel(
                title="Train vs rollout log-prob gap",
                series=(("train/logprob_gap", "mean |diff|"),),
                ylabel="nats/token",
            ),
        ),
    ),
    Figure(
        name="time",
        panels=(
            Panel(
                title="Time per step",
                ylabel="seconds",
                stacked=True,
                series=(
                    ("time/rollout_s", "rollout"),
                    ("time/train_s", "train"),
                    ("time/weight_sync_s", "weight sync"),
                ),
            ),
        ),
    ),
    Figure(
        name="throughput",
        panels=(
            Panel(title="Training throughput", series=(("perf/tokens_per_s", "tokens/s"),)),
            Panel(title="MFU", series=(("perf/mfu", "MFU"),)),
        ),
    ),
)


def column(rows: Rows, key: str) -> tuple[list[int], list[float]] | None:
    """(steps, values) of `key` (or of its bare name), None when it was never logged."""
    for name in (key, key.rsplit("/", 1)[-1]):
        points = [(r["step"], r[name]) for r in rows if isinstance(r.get(name), (int, float))]
        if points:
            steps, values = zip(*points)
            return list(steps), [float(v) for v in values]
    return None


def _draw_panel(ax: Any, rows: Rows, panel: Panel) -> bool:
    found = [(label, col) for key, label in panel.series if (col := column(rows, key))]
    if not found:
        return False
    if panel.band and (lo := column(rows, panel.band[0])) and (hi := column(rows, panel.band[1])):
        common = sorted(set(lo[0]) & set(hi[0]))
        low, high = dict(zip(*lo)), dict(zip(*hi))
        ax.fill_between(
            common,
            [low[s] for s in common],
            [high[s] for s in common],
            alpha=0.25,
            label="min..max",
        )
    if panel.stacked:
        _stack(ax, found)
    else:
        for label, (steps, values) in found:
            ax.plot(steps, values, marker="." if len(steps) < 50 else None, label=label)
    ax.set_title(panel.title)
    ax.set_xlabel("step")
    if panel.ylabel:
        ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    if len(found) > 1 or panel.band:
        ax.legend(fontsize="small")
    return True


def _stack(ax: Any, found: list[tuple[str, tuple[list[int], list[float]]]]) -> None:
    """Stacked areas over the steps any series has; a series missing at a step counts 0."""
    steps = sorted({s for _, (xs, _) in found for s in xs})
    layers = [[dict(zip(xs, ys)).get(s, 0.0) for s in steps] for _, (xs, ys) in found]
    ax.stackplot(steps, layers, labels=[label for label, _ in found], alpha=0.8)


def draw(rows: Rows, out_dir: Path) -> list[Path]:
    """Write one PNG per figure that has data; returns the paths written."""
    from matplotlib.figure import Figure as MplFigure  # Agg canvas on save, no pyplot

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in FIGURES:
        fig = MplFigure(figsize=(5.5 * len(spec.panels), 3.8))
        # fixed margins: a layout engine would draw every figure twice
        fig.subplots_adjust(
            left=0.12 / len(spec.panels), right=0.98, bottom=0.14, top=0.9, wspace=0.25
        )
        axes = fig.subplots(1, len(spec.panels), squeeze=False)[0]
        drawn = [_draw_panel(ax, rows, panel) for ax, panel in zip(axes, spec.panels)]
        if not any(drawn):
            continue
        for ax, ok in zip(axes, drawn):
            if not ok:
                ax.set_axis_off()
        path = out_dir / f"{spec.name}.png"
        fig.savefig(path, dpi=100)
        written.append(path)
    return written


def print_reward_curve(rows: Rows, *, width: int = 30, out: TextIO | None = None) -> str:
    """Print one line per step: step, mean reward, pass rate and a bar of the mean reward on
    the milestone scale [-1, 3] (widened to the data). Returns the text."""
    steps, means = column(rows, "rollout/reward_mean") or ([], [])
    passes = dict(zip(*(column(rows, "rollout/pass_rate") or ([], []))))
    if not steps:
        text = "no rewards logged yet\n"
    else:
        lo, hi = min(-1.0, *means), max(3.0, *means)
        lines = [f"{'step':>5}  {'reward':>7}  {'pass':>5}  curve"]
        for step, mean in zip(steps, means):
            n = round((mean - lo) / (hi - lo) * width)
            rate = f"{passes[step]:.0%}" if step in passes else "-"
            lines.append(f"{step:>5}  {mean:>7.3f}  {rate:>5}  {'#' * n}{'.' * (width - n)}")
        text = "\n".join(lines) + "\n"
    (out or sys.stdout).write(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cuda-agent plot", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run directory with metrics.jsonl")
    parser.add_argument("--out", type=Path, default=None, help="where the PNGs go (RUN_DIR/plots)")
    args = parser.parse_args(argv)
    run_dir: Path = args.run_dir
    if not run_dir.is_dir():
        print(f"cuda-agent plot: no run directory at {run_dir}", file=sys.stderr)
        return 2
    rows = read_metrics(run_dir)
    if not rows:
        print(
            f"cuda-agent plot: {run_dir / METRICS_FILE} is missing or has no steps", file=sys.stderr
        )
        return 1
    written = draw(rows, args.out or run_dir / "plots")
    print(f"{len(rows)} steps, {len(written)} figures:")
    for path in written:
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
