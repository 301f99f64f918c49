"""`bench.system.job_phases` reads the final evaluations' job records out of rollout files."""

from __future__ import annotations

import orjson
import pytest

from bench.system import job_phases


def _line(**info) -> bytes:
    return orjson.dumps({"trajectory_id": "t", "reward_info": info}) + b"\n"


def test_medians_per_phase_skip_short_phases_and_bad_lines(tmp_path, capsys):
    path = tmp_path / "rft_demos.jsonl"
    path.write_bytes(
        _line(**{"breakdown.verify_held_s": 8.0, "breakdown.verify_ms.trial.judge": 6000.0,
                 "breakdown.verify_ms.close": 5.0, "breakdown.untimed": True, "reward": 1.0})
        + b"{not json\n\n"
        + _line(**{"breakdown.verify_held_s": 2.0, "breakdown.verify_ms.trial.judge": 1000.0,
                   "breakdown.profile_ms.child.reference.compile": 900.0})
        + orjson.dumps({"reward_info": None}) + b"\n"
    )
    s = job_phases.summary(path, min_ms=40.0)["phases"]
    assert s["verify_held_s"] == {"n": 2, "median": 5.0, "max": 8.0}
    assert s["verify_ms.trial.judge"]["median"] == 3500.0
    assert s["profile_ms.child.reference.compile"]["n"] == 1
    assert "verify_ms.close" not in s and "untimed" not in str(s) and "reward" not in s
    assert "not a JSON line" in capsys.readouterr().err


def test_a_missing_file_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        job_phases.main([str(tmp_path / "nope.jsonl")])
    assert "no such file" in capsys.readouterr().err
