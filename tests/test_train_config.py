"""Training config: recipes resolve, dotted overrides apply and are checked, the config is saved
with the run; the task order of a step is a deterministic function of seed and step; the RFT
filter keeps exactly what the paper keeps. The command line: the default recipe is one the
machine runs, `--out`/`--run-dir`, `--help` without torch, and run directories that keep the
user's files."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agentcore.types import (
    Finish,
    Status,
    Task,
    Timings,
    ToolError,
    ToolErrorKind,
    Trajectory,
    Turn,
    WriteFile,
)
from rl import train as train_cmd
from rl.config import apply_overrides, load_config, save_config
from rl.recipes import RECIPES, smoke
from rl.selection import is_looping, rft_rejection
from rl.stages import collection_tasks, demonstrations, ppo_tasks, stage_plan, tasks_for_step, training_tasks


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_builds_and_round_trips(name, tmp_path):
    cfg = RECIPES[name]()
    save_config(cfg, tmp_path)
    assert load_config(tmp_path) == cfg


def test_dotted_overrides_reach_nested_fields():
    cfg = apply_overrides(smoke(), ["ppo.clip_high=0.3", "steps.ppo=7", "layout.learner_gpus=[0,1]", "run_dir=x"])
    assert cfg.ppo.clip_high == 0.3 and cfg.steps.ppo == 7
    assert cfg.layout.learner_gpus == (0, 1) and cfg.run_dir == "x"


@pytest.mark.parametrize("bad", ["ppo.nope=1", "nosuch.key=1", "steps.ppo=abc", "ppo.clip_high"])
def test_bad_overrides_name_the_key(bad):
    with pytest.raises(ValueError):
        apply_overrides(smoke(), [bad])


def test_smoke_plan_chains_rft_value_ppo_over_consecutive_global_steps():
    cfg = apply_overrides(smoke(), ["steps.rft=3", "steps.value=1", "steps.ppo=2"])
    assert [tuple(s) for s in stage_plan(cfg)] == [("rft", 0, 3), ("value", 3, 4), ("ppo", 4, 6)]


def _tasks(n):
    return [Task(task_id=f"t{i}", source="x") for i in range(n)]


def test_tasks_of_a_step_are_deterministic_and_cover_an_epoch():
    cfg = apply_overrides(smoke(), ["data.tasks_per_step=3"])
    tasks = _tasks(9)
    first = [[w.task.task_id for w in tasks_for_step(tasks, cfg, s)] for s in range(3)]
    again = [[w.task.task_id for w in tasks_for_step(tasks, cfg, s)] for s in range(3)]
    assert first == again
    assert sorted(t for step in first for t in step) == sorted(t.task_id for t in tasks)


def test_a_collection_takes_all_tasks_or_the_capped_step_zero_draw():
    tasks = _tasks(9)
    assert collection_tasks(tasks, apply_overrides(smoke(), ["data.collect_tasks=0"])) == tasks
    capped = apply_overrides(smoke(), ["data.collect_tasks=4", "data.tasks_per_step=2"])
    picked = collection_tasks(tasks, capped)
    assert len(picked) == 4 and len({t.task_id for t in picked}) == 4
    assert picked == collection_tasks(tasks, capped)  # deterministic
    assert collection_tasks(tasks, apply_overrides(smoke(), ["data.collect_tasks=20"])) == tasks


def test_ppo_shapes_split_the_families_tasks_between_rft_and_ppo():
    cfg = apply_overrides(smoke(), ["data.family_scale=0.01", "data.ppo_shapes=[1]"])
    tasks = training_tasks(cfg)
    ppo, taught = ppo_tasks(tasks, cfg), {d.task.task_id for d in demonstrations(cfg)}
    assert ppo and all(t.task_id.endswith("_s1") for t in ppo)
    assert taught and taught.isdisjoint(t.task_id for t in ppo) and len(taught) + len(ppo) == len(tasks)
    assert {t.metadata["family"] for t in ppo} == {"unary", "binary", "chain", "reduce", "norm"}
    drawn = {w.task.task_id for step in range(4) for w in tasks_for_step(ppo, cfg, step)}
    assert drawn <= {t.task_id for t in ppo}
    everything = apply_overrides(smoke(), ["data.family_scale=0.01"])
    assert ppo_tasks(tasks, everything) == tasks and len(demonstrations(everything)) == len(tasks)


@pytest.mark.parametrize("overrides, says", [
    (["data.ppo_shapes=[3]"], "bad override"),  # s3 is held out
    (["data.tasks=demos", "data.ppo_shapes=[1]"], "needs data.tasks=families"),
])  # fmt: skip
def test_bad_ppo_shapes_are_a_one_line_error(overrides, says):
    with pytest.raises((ValueError, SystemExit), match=says):
        training_tasks(apply_overrides(smoke(), overrides))


@pytest.mark.parametrize("share", ["0", "1.5", "-0.2"])
def test_a_learner_memory_share_outside_0_to_1_names_the_key(share):
    assert apply_overrides(smoke(), ["layout.learner_memory_share=0.3"]).layout.learner_memory_share == 0.3
    with pytest.raises(ValueError, match="learner_memory_share"):
        apply_overrides(smoke(), [f"layout.learner_memory_share={share}"])


def _traj(reward, turns, status=Status.COMPLETED):
    return Trajectory(
        trajectory_id="a/0/x", task_id="a", group_id="a", sample_index=0, prompt_ids=[1], response_ids=[2],
        logprobs=[0.0], loss_mask=[1], turns=turns, status=status, weight_version_min=0,
        weight_version_max=0, timings=Timings(), reward=reward,
    )


def _turn(i, calls=(), results=(), parse_error=None, text="t"):
    return Turn(index=i, gen_start=0, gen_end=1, obs_end=1, text=text, finish_reason="stop", weight_version=0,
                calls=calls, results=results, parse_error=parse_error)


def test_rft_keeps_rewarded_clean_trajectories():
    good = _traj(2.0, [_turn(0, (WriteFile(path="a", content="x"),)), _turn(1, (Finish(),))])
    assert rft_rejection(good) is None


def test_rft_drops_unrewarded_schema_violating_and_looping():
    assert rft_rejection(_traj(-1.0, [_turn(0)])) == "reward<=0"
    bad_call = ToolError(error=ToolErrorKind.INVALID_CALL, message="bad")
    assert rft_rejection(_traj(1.0, [_turn(0, results=(bad_call,))])) == "tool_schema"
    assert rft_rejection(_traj(1.0, [_turn(0, parse_error="x")])) == "tool_schema"
    loop = [_turn(i, (WriteFile(path="a", content="x"),)) for i in range(3)]
    assert is_looping(_traj(1.0, loop)) and rft_rejection(_traj(1.0, loop)) == "looping"
    assert rft_rejection(_traj(1.0, [_turn(0)], Status.TRUNCATED_TURNS)) == "status:truncated_turns"


@pytest.mark.parametrize("name", ["node_8gpu", "node_4gpu", "node_2gpu"])
def test_node_layouts_keep_verification_gpus_exclusive(name):
    cfg = RECIPES[name]()
    learner, verify = set(cfg.layout.learner_gpus), set(cfg.layout.verify_gpus)
    assert learner and verify and not learner & verify
    assert sorted(learner | verify) == list(range(len(learner | verify)))  # GPUs 0..n-1, none idle
    assert cfg.orchestrator.gpu_slots == len(verify)
    assert cfg.recipe == name and cfg.run_dir.endswith(name)


# -- the command line: recipe default, GPU check, run directory -------------------------------


def test_recipe_names_of_the_parser_are_the_recipes():
    assert sorted(train_cmd.RECIPE_NAMES) == sorted(RECIPES)


@pytest.mark.parametrize("cuda, recipe", [(False, "smoke_cpu"), (True, "single_gpu")])
def test_the_default_recipe_is_one_this_machine_runs(monkeypatch, capsys, cuda, recipe):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    cfg, _ = train_cmd.parse_args([])
    assert cfg.recipe == recipe
    assert f"recipe {recipe}" in capsys.readouterr().err


def test_a_gpu_recipe_on_a_machine_without_one_is_a_one_line_error(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    problem = train_cmd.gpu_problem(RECIPES["single_gpu"]())
    assert "CUDA sees no GPU" in problem and "--recipe smoke_cpu" in problem
    assert train_cmd.gpu_problem(RECIPES["smoke_cpu"]()) is None
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert "CUDA sees only 4" in train_cmd.gpu_problem(RECIPES["node_8gpu"]())


def test_out_and_run_dir_name_the_same_directory():
    for flag in ("--out", "--run-dir"):
        cfg, _ = train_cmd.parse_args(["--recipe", "smoke_cpu", flag, "runs/x"])
        assert cfg.run_dir == "runs/x"


def test_help_shows_defaults_without_importing_torch():
    code = ("import sys\nfrom agentcore.cli import main\n"
            "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False).stdout
    assert out.strip().endswith("False False")
    text = " ".join(out.split())
    assert "default: single_gpu on a machine with a GPU, smoke_cpu without one" in text
    assert "--out DIR, --run-dir DIR" in text


def test_train_refuses_a_directory_of_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    problem = train_cmd.run_dir_problem(tmp_path, "train")
    assert "is not a run directory" in problem and "--force" in problem
    assert train_cmd.run_dir_problem(tmp_path, "train", force=True) is None
    proc = subprocess.run([sys.executable, "-m", "agentcore.cli", "train", "--recipe", "smoke_cpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"cuda-agent train: {tmp_path} holds files")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_train_refuses_checkpoints_without_resume_and_takes_an_earlier_run(tmp_path):
    train_cmd.mark_run(tmp_path, "train", [])
    (tmp_path / "metrics.jsonl").write_text("")
    assert train_cmd.run_dir_problem(tmp_path, "train") is None  # an earlier run: a fresh run may reuse it
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "step_000002").mkdir()
    assert "--resume" in train_cmd.run_dir_problem(tmp_path, "train")
    assert train_cmd.run_dir_problem(tmp_path, "train", resume=True) is None


def test_smoke_replaces_only_its_own_earlier_runs(tmp_path):
    assert train_cmd.run_dir_problem(tmp_path / "new", "smoke") is None
    train_cmd.mark_run(tmp_path, "smoke", ["--out", str(tmp_path)])
    assert train_cmd.run_dir_problem(tmp_path, "smoke") is None
    (tmp_path / train_cmd.RUN_MARKER).unlink()
    train_cmd.mark_run(tmp_path, "train", [])
    assert "is a `cuda-agent train` run" in train_cmd.run_dir_problem(tmp_path, "smoke")


def test_clearing_a_run_keeps_the_users_files(tmp_path):
    train_cmd.mark_run(tmp_path, "smoke", [])
    for name in ("ckpt/step_000007", "hf", "tb"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "data").mkdir()
    train_cmd.clear_run(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "notes.txt"]


def test_the_rft_collection_scores_teachers_untimed_unless_asked():
    import types

    from rewards.evaluate import EvaluateConfig, FinalEvaluator
    from rl.run import Run

    run = types.SimpleNamespace(scorer=FinalEvaluator(None, EvaluateConfig(paired=True)))
    untimed = Run.untimed_scorer(run)
    assert untimed.config.timed is False and untimed.config.paired and run.scorer.config.timed
    fake = types.SimpleNamespace(scorer=object())  # the fake environment's scorer times nothing
    assert Run.untimed_scorer(fake) is fake.scorer
    assert smoke().data.time_demos is False
