"""Training config: recipes resolve, dotted overrides apply and are checked, the config is saved
with the run; the task order of a step is a deterministic function of seed and step; the RFT
filter keeps exactly what the paper keeps."""

from __future__ import annotations

import pytest

from agentcore.types import Finish, Status, Timings, ToolError, ToolErrorKind, Trajectory, Turn, WriteFile
from rl.config import apply_overrides, load_config, save_config
from rl.recipes import RECIPES, smoke
from rl.selection import is_looping, rft_rejection
from rl.stages import collection_tasks, stage_plan, tasks_for_step
from agentcore.types import Task


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


def test_smoke_plan_chains_rft_value_ppo():
    assert [name for name, _ in stage_plan(smoke())] == ["rft", "value", "ppo"]


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
    assert collection_tasks(tasks, smoke()) == tasks
    capped = apply_overrides(smoke(), ["data.collect_tasks=4", "data.tasks_per_step=2"])
    picked = collection_tasks(tasks, capped)
    assert len(picked) == 4 and len({t.task_id for t in picked}) == 4
    assert picked == collection_tasks(tasks, capped)  # deterministic
    assert collection_tasks(tasks, apply_overrides(smoke(), ["data.collect_tasks=20"])) == tasks


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
