"""rl.metrics: rollout scalars from trajectories, the metrics.jsonl + TensorBoard writer, the
progress line."""

from __future__ import annotations

import io
import math

import orjson
import pytest

from agentcore.types import Status, Timings, Trajectory, Turn
from rl.metrics import MetricsWriter, ProgressBar, flatten, read_metrics, step_metrics


def turn(index: int, *, finish: str = "stop", parse_error: str | None = None) -> Turn:
    return Turn(
        index=index,
        gen_start=0,
        gen_end=1,
        obs_end=1,
        text="",
        finish_reason=finish,  # type: ignore[arg-type]
        weight_version=0,
        parse_error=parse_error,
    )


def traj(
    reward: float | None,
    *,
    status: Status = Status.COMPLETED,
    turns: list[Turn] | None = None,
    response: int = 4,
    version_min: int = 0,
    info: dict | None = None,
) -> Trajectory:
    return Trajectory(
        trajectory_id="t",
        task_id="task",
        group_id="g",
        sample_index=0,
        prompt_ids=[1, 2],
        response_ids=list(range(response)),
        logprobs=[0.0] * response,
        loss_mask=[1] * response,
        turns=turns if turns is not None else [turn(0)],
        status=status,
        weight_version_min=version_min,
        weight_version_max=version_min,
        timings=Timings(),
        reward=reward,
        reward_info=info or {},
    )


# -- step_metrics ------------------------------------------------------------------------------


def test_reward_statistics_over_scored_trajectories():
    m = step_metrics([traj(-1), traj(1), traj(3), traj(None)], max_response_tokens=None)
    assert m["trajectories"] == 4 and m["scored"] == 3
    assert m["reward_mean"] == pytest.approx(1.0)
    assert m["reward_std"] == pytest.approx(math.sqrt(8 / 3))
    assert (m["reward_min"], m["reward_max"]) == (-1, 3)


def test_reward_histogram_counts_each_milestone_value():
    m = step_metrics([traj(r) for r in (-1, -1, 1, 2, 2, 2, 3)], max_response_tokens=None)
    counts = {v: m[f"reward_count/{v}"] for v in (-1, 1, 2, 3)}
    assert counts == {-1: 2, 1: 1, 2: 3, 3: 1}
    assert "reward_count/other" not in m


def test_continuous_rewards_are_counted_as_other_not_one_key_each():
    m = step_metrics([traj(0.37), traj(1.2), traj(-1)], max_response_tokens=None)
    assert m["reward_count/other"] == 2
    assert not [k for k in m if k.startswith("reward_count/0")]


def test_milestone_rates_from_reward_values():
    m = step_metrics([traj(r) for r in (-1, 1, 2, 3)], max_response_tokens=None)
    assert m["pass_rate"] == 0.75
    assert m["faster_than_eager_rate"] == 0.5
    assert m["faster_than_compile_rate"] == 0.25


def test_milestone_rates_prefer_reward_info_milestone():
    # speedup-mode rewards (log s) say nothing about milestones; reward_info does
    ts = [
        traj(-0.2, info={"milestone": 1}),
        traj(0.9, info={"milestone": 3}),
        traj(-1, info={"milestone": None}),
    ]
    m = step_metrics(ts, max_response_tokens=None)
    assert m["pass_rate"] == pytest.approx(2 / 3)
    assert m["faster_than_compile_rate"] == pytest.approx(1 / 3)


def test_truncated_share_counts_length_status_and_length_turns():
    ts = [
        traj(1, status=Status.TRUNCATED_LENGTH),
        traj(1, turns=[turn(0), turn(1, finish="length")], status=Status.TRUNCATED_TURNS),
        traj(1, status=Status.TRUNCATED_TURNS),
        traj(1),
    ]
    m = step_metrics(ts, max_response_tokens=None)
    assert m["truncated_frac"] == 0.5
    assert m["status/truncated_turns"] == 0.5
    assert m["status/completed"] == 0.25


def test_turns_tokens_and_response_clip():
    ts = [traj(1, turns=[turn(0), turn(1)], response=10), traj(1, turns=[turn(0)], response=4)]
    m = step_metrics(ts, max_response_tokens=10)
    assert m["turns_mean"] == 1.5
    assert m["response_tokens_mean"] == 7
    assert m["response_clip_frac"] == 0.5
    assert "response_clip_frac" not in step_metrics(ts, max_response_tokens=None)


def test_parse_error_rate_is_per_turn():
    ts = [traj(1, turns=[turn(0, parse_error="bad json"), turn(1), turn(2), turn(3)])]
    assert step_metrics(ts, max_response_tokens=None)["parse_error_rate"] == 0.25


def test_hack_rate_by_category():
    ts = [
        traj(-1, info={"hack": "torch_compute"}),
        traj(-1, info={"hack": "torch_compute"}),
        traj(-1, info={"hack": "side_stream"}),
        traj(1, info={"hack": None}),
    ]
    m = step_metrics(ts, max_response_tokens=None)
    assert m["hack_rate"] == 0.75
    assert m["hack_rate/torch_compute"] == 0.5
    assert m["hack_rate/side_stream"] == 0.25


def test_staleness_only_with_current_version():
    ts = [traj(1, version_min=3), traj(1, version_min=5)]
    m = step_metrics(ts, max_response_tokens=None, current_version=6)
    assert m["staleness_max"] == 3 and m["staleness_mean"] == 2
    assert "staleness_max" not in step_metrics(ts, max_response_tokens=None)


def test_no_trajectories_gives_just_the_count():
    assert step_metrics([], max_response_tokens=100) == {"trajectories": 0.0}


# -- MetricsWriter -----------------------------------------------------------------------------


def test_flatten_nests_groups_and_cleans_values():
    flat = flatten(
        {"train": {"loss": 1, "ok": True, "xs": [1]}, "perf/mfu": float("nan"), "stage": "ppo"}
    )
    assert flat == {"train/loss": 1.0, "train/ok": 1.0, "perf/mfu": None, "stage": "ppo"}


def test_writer_appends_one_line_per_step(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.write(0, {"rollout/reward_mean": 1.0})
        w.write(1, {"rollout": {"reward_mean": 2.0}, "time/train_s": 3.5})
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[1]["rollout/reward_mean"] == 2.0 and rows[1]["time/train_s"] == 3.5
    assert all(isinstance(r["time"], float) for r in rows)


def test_step_and_time_in_the_scalars_do_not_override_the_lines_own(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.write(4, {"step": 99.0, "time": 0.0, "stage": "ppo", "x": 1})
    (row,) = read_metrics(tmp_path)
    assert row["step"] == 4 and row["time"] > 0 and row["stage"] == "ppo"


def test_resume_drops_steps_at_or_after_the_resumed_step(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        for step in range(5):
            w.write(step, {"x": step})
    with MetricsWriter(tmp_path, start_step=3, tensorboard=False) as w:
        w.write(3, {"x": 30})
    rows = read_metrics(tmp_path)
    assert [(r["step"], r["x"]) for r in rows] == [(0, 0), (1, 1), (2, 2), (3, 30)]


def test_fresh_run_in_an_old_dir_starts_a_new_curve(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.write(0, {"x": 1})
    MetricsWriter(tmp_path, tensorboard=False).close()
    assert read_metrics(tmp_path) == []


def test_torn_last_line_is_skipped_and_dropped_on_resume(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.write(0, {"x": 1})
    with open(tmp_path / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 1, "x"')  # killed mid-write
    assert [r["step"] for r in read_metrics(tmp_path)] == [0]
    MetricsWriter(tmp_path, start_step=1, tensorboard=False).close()
    assert (tmp_path / "metrics.jsonl").read_bytes().count(b"\n") == 1


def test_nan_is_written_as_null(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.write(0, {"train/value_loss": float("inf")})
    line = (tmp_path / "metrics.jsonl").read_bytes()
    assert orjson.loads(line)["train/value_loss"] is None


def test_tensorboard_gets_the_same_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsWriter(tmp_path) as w:
        w.write(0, {"rollout/reward_mean": 0.5, "train": {"entropy": 1.25}, "stage": "ppo"})
        w.write(1, {"rollout/reward_mean": 1.5, "train": {"entropy": 1.0}})
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"rollout/reward_mean", "train/entropy"}
    events = acc.Scalars("rollout/reward_mean")
    assert [(e.step, e.value) for e in events] == [(0, 0.5), (1, 1.5)]


def _tb_steps(tb_dir, tag: str) -> list[int]:
    """Every step of `tag` in the raw event files, duplicates included (no reader-side purge)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps = []
    for path in sorted(tb_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            steps += [event.step for v in event.summary.value if v.tag == tag]
    return sorted(steps)


def test_tensorboard_has_each_step_once_after_a_resume(tmp_path):
    with MetricsWriter(tmp_path) as w:
        for step in range(5):
            w.write(step, {"x": step})
    with MetricsWriter(tmp_path, start_step=3) as w:  # steps 3 and 4 are done again
        for step in (3, 4):
            w.write(step, {"x": 10 * step})
    assert _tb_steps(tmp_path / "tb", "x") == [0, 1, 2, 3, 4]


def test_a_fresh_run_in_an_old_dir_starts_a_new_tensorboard_curve(tmp_path):
    with MetricsWriter(tmp_path) as w:
        w.write(0, {"x": 1})
        w.write(1, {"x": 2})
    with MetricsWriter(tmp_path) as w:
        w.write(0, {"x": 5})
    assert _tb_steps(tmp_path / "tb", "x") == [0]


def test_read_metrics_of_missing_dir_is_empty(tmp_path):
    assert read_metrics(tmp_path / "nope") == []


# -- ProgressBar -------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_plain_lines_with_time_per_step_and_eta():
    out, clock = io.StringIO(), FakeClock()
    bar = ProgressBar(10, out=out, clock=clock)
    clock.now += 20
    bar.update(0, {"rollout/reward_mean": 1.25, "rollout/pass_rate": 0.625})
    clock.now += 40
    bar.update(1, {"reward_mean": 2.0})  # step_metrics' own, unprefixed names
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "[step 0 (1/10)] reward 1.25 pass 62% | 20.0s/step | ETA 3m00s"
    assert lines[1] == "[step 1 (2/10)] reward 2.00 | 30.0s/step | ETA 4m00s"


def test_progress_counts_from_the_resumed_step():
    out, clock = io.StringIO(), FakeClock()
    bar = ProgressBar(100, start_step=40, out=out, clock=clock)
    clock.now += 60
    line = bar.update(40, {})
    assert line == "[step 40 (41/100)] | 60.0s/step | ETA 59m00s"


def test_progress_rewrites_one_line_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    bar = ProgressBar(2, out=out, clock=FakeClock())
    bar.update(0, {})
    bar.update(1, {})
    bar.close()
    text = out.getvalue()
    assert text.count("\r\x1b[2K") == 2 and text.count("\n") == 1
