"""Dynamic sampling (`rl.dynamic_sampling`, `data.dynamic_tasks`): a PPO step tops its groups up
with more tasks of its pool until `tasks_per_step` groups are mixed, at most `dynamic_tasks` more,
and learns from the mixed groups alone. The policy's rollouts are the edge faked in the first tests
(a table of each task's rewards); the last runs the CPU training loop with the real tiny policy."""

from __future__ import annotations

from pathlib import Path

import anyio

from agentcore.types import Status, Task, Timings, Trajectory, trajectory_decoder
from rl.config import apply_overrides
from rl.dynamic_sampling import learning_trajectories, mixed_groups, more_items, topped_up
from rl.recipes import smoke, smoke_cpu
from rl.stages import step_rollouts, tasks_for_step, usable_samples


def task(i: int) -> Task:
    return Task(task_id=f"t{i}", source="x")


def traj(item, k: int, reward: float | None) -> Trajectory:
    return Trajectory(trajectory_id=f"{item.group_id}/{k}", task_id=item.task.task_id, group_id=item.group_id,
                      sample_index=k, prompt_ids=[1], response_ids=[2, 3], logprobs=[-0.1, -0.2], loss_mask=[1, 1],
                      turns=[], status=Status.COMPLETED, weight_version_min=0, weight_version_max=0,
                      timings=Timings(), reward=reward)


class FakeRun:
    """The policy and the verifier as a table: each task's rewards, one per sample."""

    def __init__(self, cfg, rewards: dict[str, list[float]]):
        self.cfg, self.rewards, self.tags = cfg, rewards, []

    async def rollouts(self, items, *, tag):
        self.tags.append((tag, [item.task.task_id for item in items]))
        return [traj(item, k, self.rewards[item.task.task_id][k]) for item in items for k in range(item.samples)]


def cfg_with(*overrides: str):
    return apply_overrides(smoke(), ["data.tasks_per_step=3", "data.samples_per_task=2", *overrides])


def test_mixed_groups_are_those_whose_scored_rewards_differ():
    items = tasks_for_step([task(i) for i in range(3)], cfg_with(), 0)
    trajs = [traj(items[0], 0, 1.0), traj(items[0], 1, -1.0), traj(items[1], 0, 1.0), traj(items[1], 1, 1.0),
             traj(items[2], 0, None), traj(items[2], 1, 2.0)]
    assert mixed_groups(trajs) == {items[0].group_id}
    assert learning_trajectories(trajs) == trajs[:2]


async def test_a_step_short_of_mixed_groups_draws_more_tasks_until_enough_are_mixed():
    pool = [task(i) for i in range(10)]
    rewards = {f"t{i}": ([1.0, -1.0] if i % 2 else [1.0, 1.0]) for i in range(10)}  # odd tasks mixed
    cfg = cfg_with("data.dynamic_tasks=6")
    run = FakeRun(cfg, rewards)
    items = tasks_for_step(pool, cfg, 5)
    trajs = await topped_up(run, pool, 5, items, await run.rollouts(items, tag="ppo_000005"))
    drawn = [t for _, ids in run.tags for t in ids]
    assert len(drawn) == len(set(drawn)) <= 3 + 6  # no task twice in a step, at most 6 more
    assert len(mixed_groups(trajs)) >= 3 or len(drawn) == 9
    assert [tag for tag, _ in run.tags][1:] == [f"ppo_000005_more{r}" for r in range(1, len(run.tags))]
    assert all(t.group_id.endswith("@5") for t in trajs)
    samples = usable_samples(trajs, 0, 0, mixed_only=True)
    assert {s.group_id for s in samples} == mixed_groups(trajs)
    assert len(usable_samples(trajs, 0, 0)) == len(trajs)  # off: every usable sample


async def test_the_bound_holds_when_no_group_is_mixed_and_a_full_step_draws_nothing_more():
    pool = [task(i) for i in range(10)]
    cfg = cfg_with("data.dynamic_tasks=4")
    uniform = FakeRun(cfg, {f"t{i}": [1.0, 1.0] for i in range(10)})
    items = tasks_for_step(pool, cfg, 0)
    trajs = await topped_up(uniform, pool, 0, items, await uniform.rollouts(items, tag="ppo_000000"))
    assert sum(len(ids) for _, ids in uniform.tags) == 3 + 4 and len(trajs) == 2 * 7
    assert usable_samples(trajs, 0, 0, mixed_only=True) == []

    mixed = FakeRun(cfg, {f"t{i}": [1.0, -1.0] for i in range(10)})
    trajs = await topped_up(mixed, pool, 0, items, await mixed.rollouts(items, tag="ppo_000000"))
    assert len(mixed.tags) == 1 and len(trajs) == 6


def test_more_tasks_are_seeded_by_step_and_round_and_skip_what_the_step_drew():
    pool, cfg = [task(i) for i in range(10)], cfg_with()
    first = more_items(pool, cfg, 3, {"t0", "t1"}, 4, 1)
    assert first == more_items(pool, cfg, 3, {"t0", "t1"}, 4, 1)
    assert not {"t0", "t1"} & {w.task.task_id for w in first} and len(first) == 4
    assert more_items(pool, cfg, 3, {t.task_id for t in pool}, 4, 1) == []


async def test_the_step_rollouts_of_ppo_top_up_only_when_asked():
    pool = [task(i) for i in range(10)]
    rewards = {f"t{i}": [1.0, 1.0] for i in range(10)}
    off = FakeRun(cfg_with(), rewards)
    await step_rollouts(off, pool, 0, "ppo")
    assert len(off.tags) == 1
    on = FakeRun(cfg_with("data.dynamic_tasks=2"), rewards)
    await step_rollouts(on, pool, 0, "ppo")
    assert [tag for tag, _ in on.tags] == ["ppo_000000", "ppo_000000_more1"]


async def test_the_cpu_training_loop_tops_up_and_learns_from_the_mixed_groups_alone(tmp_path):
    # the tiny random-weight policy fails every families task: no group is mixed, so each step
    # draws its 2 more tasks, and the update has no sample to learn from
    run_dir = tmp_path / "run"
    cfg = apply_overrides(smoke_cpu(), [
        f"run_dir={run_dir}", "stage=ppo", "steps.ppo=2", "checkpoint.export_hf=false", "data.tasks=families",
        "data.family_scale=0.01", "data.tasks_per_step=2", "data.samples_per_task=2", "data.dynamic_tasks=2",
        "rollout.max_context_tokens=8192",
    ])  # fmt: skip
    from rl.train import run_training

    with anyio.fail_after(600):
        rows = await run_training(cfg)
    assert [r["stage"] for r in rows] == ["ppo", "ppo"]
    for row in rows:
        files = sorted(Path(run_dir, "rollouts").glob(f"ppo_{row['step']:06d}*.jsonl"))
        trajs = [trajectory_decoder.decode(line) for path in files for line in path.read_bytes().splitlines()]
        groups = {t.group_id for t in trajs}
        assert row["rollout/groups"] == len(groups) == 2 + 2 * (len(files) - 1)
        assert row["rollout/mixed_groups"] == len(mixed_groups(trajs)) / len(groups)
        assert row["samples"] == len(usable_samples(trajs, 10**6, 10**6, mixed_only=True))
        if not mixed_groups(trajs):
            assert [p.name for p in files] == [f"ppo_{row['step']:06d}.jsonl", f"ppo_{row['step']:06d}_more1.jsonl"]
