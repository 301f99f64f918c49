"""bench.system.heldout_changes: the held-out tasks PPO moved and the lines it changed in them, read
from a run's stored rollouts (trajectories written as the store writes them)."""

from __future__ import annotations

import msgspec

from agentcore.types import Edit, EditFile, Status, Timings, Trajectory, Turn, WriteFile
from bench.system.heldout_changes import Change, LineChange, changes, line_changes, main, markdown_lines, written_files

SOFTMAX = "__global__ void k() {\n    float m = 0;\n    out[c] = expf(v - m) / s;\n}\n"


def traj(task_id: str, reward: float, calls, status: str = "ok") -> Trajectory:
    turns = [Turn(index=i, gen_start=0, gen_end=1, obs_end=1, text="", finish_reason="stop", weight_version=0,
                  calls=(call,)) for i, call in enumerate(calls)]
    return Trajectory(trajectory_id=f"{task_id}@heldout/0", task_id=task_id, group_id=f"{task_id}@heldout",
                      sample_index=0, prompt_ids=[1], response_ids=[2], logprobs=[-0.1], loss_mask=[1],
                      turns=turns, status=Status.TRUNCATED_TURNS, weight_version_min=0, weight_version_max=0,
                      timings=Timings(), reward=reward, reward_info={"status": status})


def write(run_dir, label: str, trajs: list[Trajectory]) -> None:
    path = run_dir / "rollouts" / f"heldout_{label}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(msgspec.json.encode(t) + b"\n" for t in trajs))


def test_written_files_replay_writes_and_edits_as_the_tools_apply_them():
    calls = [WriteFile(path="k.cu", content="a = 1;\nb = 1;\nb = 1;\n"),
             EditFile(path="k.cu", edits=(Edit(old_string="a = 1;", new_string="a = 2;"),)),
             EditFile(path="k.cu", edits=(Edit(old_string="b = 1;", new_string="b = 3;", replace_all=True),)),
             EditFile(path="k.cu", edits=(Edit(old_string="a = 2;", new_string="x"),
                                          Edit(old_string="gone", new_string="y"))),  # all or none
             EditFile(path="never_written.cu", edits=(Edit(old_string="a", new_string="b"),))]  # fmt: skip
    assert written_files(traj("t", 1.0, calls)) == {"k.cu": "a = 2;\nb = 3;\nb = 3;\n"}


def test_line_changes_give_each_files_differing_lines():
    after = SOFTMAX.replace("expf(v - m) / s", "v - m - logf(s)")
    got = line_changes({"k.cu": SOFTMAX, "model_new.py": "x"}, {"k.cu": after, "model_new.py": "x", "extra.cu": "y"})
    assert got == [LineChange(path="extra.cu", before="(none)", after="(written)"),
                   LineChange(path="k.cu", before="out[c] = expf(v - m) / s;", after="out[c] = v - m - logf(s);")]


def test_changes_are_the_tasks_whose_pass_differs_with_the_verdict_after(tmp_path):
    sibling = SOFTMAX.replace("expf(v - m) / s", "v - m - logf(s)")
    write(tmp_path, "after_rft", [traj("softmax", 1.0, [WriteFile(path="k.cu", content=SOFTMAX)]),
                                  traj("relu", 1.0, [WriteFile(path="k.cu", content="r")]),
                                  traj("mean", -1.0, [WriteFile(path="k.cu", content="y = acc;")], "wrong_output"),
                                  traj("only_before", 1.0, [])])
    write(tmp_path, "after_ppo", [traj("softmax", -1.0, [WriteFile(path="k.cu", content=sibling)], "wrong_output"),
                                  traj("relu", 2.0, [WriteFile(path="k.cu", content="r2")]),  # passed both times
                                  traj("mean", 1.0, [WriteFile(path="k.cu", content="y = acc / n;")])])
    got = changes(tmp_path)
    assert [(c.task_id, c.before, c.after, c.status) for c in got] == [
        ("mean", -1.0, 1.0, "ok"), ("softmax", 1.0, -1.0, "wrong_output")]
    assert got[1].lines == [LineChange(path="k.cu", before="out[c] = expf(v - m) / s;",
                                       after="out[c] = v - m - logf(s);")]
    text = "\n".join(markdown_lines([(2, got), (3, [])]))
    assert "- seed 2, `mean`, failed -> passed: `k.cu`: `y = acc;` -> `y = acc / n;`" in text
    assert ("- seed 2, `softmax`, passed -> failed (wrong_output): `k.cu`: `out[c] = expf(v - m) / s;` -> "
            "`out[c] = v - m - logf(s);`") in text
    assert "seed 3" not in text
    assert changes(tmp_path / "missing") == [] and markdown_lines([(0, [])]) == []


def test_code_cells_keep_backticks_and_pipes_from_breaking_the_list(tmp_path):
    got = line_changes({"k.cu": "a | b\n"}, {"k.cu": "`c`\n"})
    change = Change(task_id="t", before=1.0, after=-1.0, status="hack", lines=got)
    line = markdown_lines([(0, [change])])[-1]
    assert line.endswith("`k.cu`: `a / b` -> `'c'`")


def test_the_command_prints_the_section_or_one_line_without_a_run(tmp_path, capsys):
    assert main([str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().out.count("\n") == 1
    write(tmp_path, "after_rft", [traj("a", 1.0, [])])
    write(tmp_path, "after_ppo", [traj("a", 1.0, [])])
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == "no task moved\n"
