"""rl.plot: PNG curves from metrics.jsonl (`cuda-agent plot`) and the text reward curve."""

from __future__ import annotations

import io

from rl import plot
from rl.metrics import MetricsWriter

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


REWARDS = {"rollout/reward_mean": 0.5, "rollout/reward_min": -1.0, "rollout/reward_max": 3.0}


def write_run(run_dir, steps: int = 4, **keys) -> None:
    with MetricsWriter(run_dir, tensorboard=False) as w:
        for s in range(steps):
            w.write(s, {k: v * (s + 1) for k, v in keys.items()})


def test_plot_writes_only_figures_whose_keys_exist(tmp_path, capsys):
    write_run(tmp_path, **REWARDS, **{"train/entropy": 0.5, "time/rollout_s": 10.0})
    assert plot.main([str(tmp_path)]) == 0
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == ["entropy.png", "reward.png", "time.png"]
    assert all((tmp_path / "plots" / n).read_bytes().startswith(PNG_MAGIC) for n in names)
    assert "4 steps, 3 figures" in capsys.readouterr().out


def test_plots_option_picks_where_the_pngs_go(tmp_path):
    write_run(tmp_path / "run", **{"rollout/pass_rate": 0.1})
    assert plot.main(["--out", str(tmp_path / "run"), "--plots", str(tmp_path / "pngs")]) == 0
    assert [p.name for p in (tmp_path / "pngs").iterdir()] == ["rates.png"]


def test_the_run_directory_as_out_or_first_argument(tmp_path):
    write_run(tmp_path / "run", **{"rollout/pass_rate": 0.1})
    assert plot.main(["--out", str(tmp_path / "run")]) == 0
    assert plot.main([str(tmp_path / "run")]) == 0
    assert [p.name for p in (tmp_path / "run" / "plots").iterdir()] == ["rates.png"]


def test_two_different_run_directories_are_a_one_line_error(tmp_path, capsys):
    assert plot.main([str(tmp_path / "a"), "--out", str(tmp_path / "b")]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("cuda-agent plot: two run directories") and "--plots" in line


def test_bare_key_names_are_found_too(tmp_path):
    write_run(tmp_path, **{"explained_variance": 0.2, "mfu": 0.3})
    plot.main([str(tmp_path)])
    names = {p.name for p in (tmp_path / "plots").iterdir()}
    assert names == {"explained_variance.png", "throughput.png"}


def test_reward_panel_has_mean_line_and_min_max_band():
    from matplotlib.figure import Figure

    rows = [
        {
            "step": s,
            "rollout/reward_mean": float(s),
            "rollout/reward_min": -1.0,
            "rollout/reward_max": 3.0,
        }
        for s in range(3)
    ]
    ax = Figure().subplots()
    assert plot._draw_panel(ax, rows, plot.FIGURES[0].panels[0])
    assert len(ax.lines) == 1 and list(ax.lines[0].get_ydata()) == [0.0, 1.0, 2.0]
    assert len(ax.collections) == 1  # the fill_between band


def test_missing_run_dir_is_a_clear_error(tmp_path, capsys):
    assert plot.main([str(tmp_path / "nope")]) == 2
    assert "no run directory" in capsys.readouterr().err


def test_empty_run_dir_is_a_clear_error(tmp_path, capsys):
    assert plot.main([str(tmp_path)]) == 1
    assert "missing or has no steps" in capsys.readouterr().err
    assert not (tmp_path / "plots").exists()


def test_text_reward_curve_bars_follow_the_mean():
    rows = [
        {"step": 0, "rollout/reward_mean": -1.0, "rollout/pass_rate": 0.0},
        {"step": 1, "rollout/reward_mean": 1.0, "rollout/pass_rate": 0.5},
        {"step": 2, "rollout/reward_mean": 3.0},
    ]
    out = io.StringIO()
    text = plot.print_reward_curve(rows, width=8, out=out)
    assert out.getvalue() == text
    lines = text.splitlines()
    assert lines[1].split() == ["0", "-1.000", "0%", "........"]
    assert lines[2].split() == ["1", "1.000", "50%", "####...."]
    assert lines[3].split() == ["2", "3.000", "-", "########"]


def test_text_reward_curve_without_rewards():
    assert plot.print_reward_curve([{"step": 0}], out=io.StringIO()) == "no rewards logged yet\n"


def _rows(steps, **keys):
    return [{"step": s, **keys} for s in steps]


def _figure(name):
    return next(spec for spec in plot.FIGURES if spec.name == name)


def test_step_ticks_are_whole_numbers():
    fig = plot.render(_figure("reward"), _rows([5, 6], **{"rollout/reward_mean": -1.0}))
    [ax] = fig.axes
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_share_panels_show_zero_to_one_whatever_the_values():
    fig = plot.render(_figure("rates"), _rows([0, 1], **{"rollout/pass_rate": 0.0}))
    [ax] = fig.axes
    low, high = ax.get_ylim()
    assert -0.05 < low <= 0 and 1 <= high < 1.05
    assert list(ax.get_yticks()) == [0, 0.25, 0.5, 0.75, 1]


def test_axis_labels_and_titles_fit_inside_the_image():
    rows = _rows(range(3), **{"train/sft_loss": 7.5, "train/policy_loss": 0.1, "train/value_loss": 0.03})
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plot.render(_figure("losses"), rows)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # as savefig does: the layout is applied
    renderer, box = canvas.get_renderer(), fig.bbox
    for ax in fig.axes:
        for text in (ax.xaxis.label, ax.yaxis.label, ax.title):
            extent = text.get_window_extent(renderer)
            assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and box.y0 <= extent.y0 and extent.y1 <= box.y1


def test_the_rft_loss_is_plotted(tmp_path):
    write_run(tmp_path, **{"train/sft_loss": 7.5})
    assert plot.main([str(tmp_path)]) == 0
    assert [p.name for p in (tmp_path / "plots").iterdir()] == ["losses.png"]
    [ax] = plot.render(_figure("losses"), _rows([0, 1], **{"train/sft_loss": 7.5})).axes
    assert ax.get_title() == "RFT loss"


def test_panels_without_data_are_left_out_of_the_figure():
    fig = plot.render(_figure("throughput"), _rows([0, 1], **{"perf/tokens_per_s": 100.0}))
    assert [ax.get_title() for ax in fig.axes] == ["Training throughput"]
