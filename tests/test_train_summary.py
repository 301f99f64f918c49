"""The closing line of `cuda-agent train` reports what is on disk, also after a signal."""

from rl.train import run_summary


def test_a_stopped_run_reports_the_steps_and_checkpoint_on_disk(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest").write_text("step_000004\n")
    (tmp_path / "metrics.jsonl").write_text('{"step":0}\n{"step":1}\n\n{"step":2}\n')
    line = run_summary(tmp_path, finished_rows=0)
    assert line.startswith("stopped; 3 step(s)")
    assert "latest checkpoint step_000004" in line


def test_a_fresh_directory_has_no_steps_and_no_checkpoint(tmp_path):
    line = run_summary(tmp_path, finished_rows=2)
    assert line.startswith("finished; 0 step(s)")
    assert line.endswith("latest checkpoint none")
