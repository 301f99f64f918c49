"""`cuda-agent plot --out RUN [--plots DIR]`: the training curves of a run, as PNG files.

What it is: reads RUN/metrics.jsonl (`rl/metrics.py`) and draws one figure per topic with
matplotlib's Agg canvas (no display, no pyplot state): reward with its min/max band, the count
of each reward value, milestone rates, entropy, critic explained variance, the losses (policy,
value, and the RFT stage's SFT loss), truncated share, PPO clipping, the train-vs-rollout
log-prob gap, the time split of a step, throughput and MFU. A panel is drawn only when one of
its keys was logged, a figure only when one of its panels is. Steps are the integers of
metrics.jsonl (from 0); shares are drawn on a fixed [0, 1] axis. Also `print_reward_curve`,
the compact text curve the smoke run prints in the terminal. What it is not: a dashboard
(TensorBoard reads RUN/tb).

Keys are looked up as written by the trainer (`train/entropy`); a bare name (`entropy`) logged
without its group is accepted too.

    cuda-agent plot --out runs/smoke            # -> runs/smoke/plots/*.png
    cuda-agent plot runs/smoke --plots /tmp/p   # the run directory may also come first
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from msgspec import Struct

from agentcore.cli import HelpFormatter, UsageError
from rl.metrics import METRICS_FILE, read_metrics

Rows = Sequence[dict[str, Any]]


class Panel(Struct, frozen=True, kw_only=True):
    """One axes: lines for `series` (key, label), an optional shaded (low key, high key) band;
    `share` fixes the y axis to [0, 1] (rates, fractions), `counts` gives it whole-number ticks."""

    title: str
    series: tuple[tuple[str, str], ...]
    band: tuple[str, str] | None = None
    ylabel: str = ""
    stacked: bool = False
    share: bool = False
    counts: bool = False


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
                share=True,
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
                counts=True,
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
            Panel(title="RFT loss", series=(("train/sft_loss", "SFT loss (rft stage)"),),
                  ylabel="nats/token"),
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
                share=True,
            ),
        ),
    ),
    Figure(
        name="clipping",
        panels=(
            Panel(title="Clip fraction", series=(("train/clipfrac", "clipfrac"),),
                  ylabel="share of action tokens", share=True),
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
            Panel(title="Training throughput", series=(("perf/tokens_per_s", "tokens/s"),),
                  ylabel="tokens/s"),
            Panel(title="MFU", series=(("perf/mfu", "MFU"),), ylabel="share of peak FLOP/s",
                  share=True),
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


def _has_data(rows: Rows, panel: Panel) -> bool:
    return any(column(rows, key) for key, _ in panel.series)


def _draw_panel(ax: Any, rows: Rows, panel: Panel) -> bool:
    from matplotlib.ticker import MaxNLocator

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
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.ticklabel_format(axis="y", useOffset=False)  # 1.0001, not "+1" above the axis and 0.0001
    if panel.share:  # a little room so lines at exactly 0 or 1 stay visible
        ax.set_ylim(-0.03, 1.03)
        ax.set_yticks([0, 0.25, 0.5, 0.75, 1])
    if panel.counts:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
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
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in FIGURES:
        if (fig := render(spec, rows)) is not None:
            path = out_dir / f"{spec.name}.png"
            fig.savefig(path, dpi=100)
            written.append(path)
    return written


def render(spec: Figure, rows: Rows) -> Any:
    """The matplotlib Figure of `spec` with the panels that have data; None when none has."""
    from matplotlib.figure import Figure as MplFigure  # Agg canvas on save, no pyplot

    panels = [panel for panel in spec.panels if _has_data(rows, panel)]
    if not panels:
        return None
    # constrained layout: titles, tick labels and axis labels inside the image
    fig = MplFigure(figsize=(5.5 * len(panels), 3.8), layout="constrained")
    for ax, panel in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        _draw_panel(ax, rows, panel)
    return fig


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cuda-agent plot", description=__doc__.split("\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("run", nargs="?", type=Path, metavar="RUN", help="the run directory (same as --out)")
    parser.add_argument("--out", type=Path, metavar="RUN",
                        help="the run directory: the --out of `cuda-agent train` or `smoke`")
    parser.add_argument("--plots", type=Path, metavar="DIR", help="where the PNGs go (default: RUN/plots)")
    args = parser.parse_args(argv)
    if args.run and args.out and args.run != args.out:
        raise UsageError(f"two run directories, {args.run} and --out {args.out}; "
                         "give one (the PNGs' directory is --plots)")
    args.out = args.out or args.run
    if args.out is None:
        raise UsageError("which run? give its directory: cuda-agent plot --out RUN")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except UsageError as exc:
        print(f"cuda-agent plot: {exc}", file=sys.stderr)
        return 2
    run_dir: Path = args.out
    if not run_dir.is_dir():
        print(f"cuda-agent plot: no run directory at {run_dir}", file=sys.stderr)
        return 2
    rows = read_metrics(run_dir)
    if not rows:
        print(
            f"cuda-agent plot: {run_dir / METRICS_FILE} is missing or has no steps", file=sys.stderr
        )
        return 1
    written = draw(rows, args.plots or run_dir / "plots")
    print(f"{len(rows)} steps, {len(written)} figures:")
    for path in written:
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
