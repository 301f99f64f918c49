"""What a sandbox binds back so that an interpreter under a hidden directory still starts."""

from __future__ import annotations

import sys

from agentcore.interpreter import bind_back, covered, interpreter_dirs


def test_interpreter_dirs_hold_the_running_prefix_and_executable():
    dirs = interpreter_dirs()
    assert any(sys.prefix == d or sys.prefix.startswith(d + "/") for d in dirs)
    assert any(sys.executable.startswith(d + "/") for d in dirs)


def test_covered_keeps_only_the_outermost_paths_under_the_mounts():
    paths = ["/tmp/v", "/tmp/v/lib/site-packages", "/opt/python", "/tmpfoo/x"]
    assert covered(paths, ["/tmp"]) == ["/tmp/v"]


def test_the_root_mount_covers_nothing():
    assert covered(["/opt/python"], ["/"]) == []


def test_a_virtualenv_holding_a_hidden_dir_is_bound_around_it(tmp_path):
    venv = tmp_path / "venv"
    for sub in ("bin", "lib", "runs/ws-1", "runs/ws-2"):
        (venv / sub).mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    hidden = str(venv / "runs")
    binds = bind_back([str(venv)], [str(tmp_path), hidden], keep_hidden=[hidden])
    assert binds == [str(venv / "bin"), str(venv / "lib"), str(venv / "pyvenv.cfg")]


def test_a_path_inside_a_hidden_dir_is_not_bound_back(tmp_path):
    hidden = str(tmp_path / "reference")
    assert bind_back([hidden + "/python"], [hidden], keep_hidden=[hidden]) == []
