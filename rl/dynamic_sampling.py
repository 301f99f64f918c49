"""PPO's dynamic sampling: a step tops its groups up with more tasks until enough of them teach.

What it is: under the group baseline (`ppo.baseline=group`) a group whose samples all scored alike
has every advantage 0: it teaches nothing and only dilutes the update's token mean. With
`data.dynamic_tasks = K`, a PPO step rolls out its `tasks_per_step` tasks, counts the groups whose
rewards differ (`mixed_groups`), and while fewer than `tasks_per_step` are mixed it draws more tasks
of PPO's pool that this step has not drawn (twice the shortfall a round, at most K in all) and
rolls them out too (`rollouts/ppo_<step>_more<round>.jsonl`). The update then learns from the mixed
groups alone (`learning_trajectories`); the step's rollout figures count every trajectory. This is
DAPO's dynamic sampling, bounded by K so a step's time stays bounded.

What it is not: the task order (`rl.stages.tasks_for_step`) or the advantages (`rl.learner.update`).

Example:
    trajs = await topped_up(run, pool, step, items, await run.rollouts(items, tag="ppo_000063"))
    samples = usable_samples(learning_trajectories(trajs), version, max_staleness)
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import TYPE_CHECKING

from agentcore.orchestrator import WorkItem
from agentcore.types import Task, Trajectory

if TYPE_CHECKING:
    from rl.config import TrainConfig
    from rl.run import Run


def mixed_groups(trajs: list[Trajectory]) -> set[str]:
    """The groups (`group_id`) whose scored trajectories' rewards differ."""
    rewards: dict[str, set[float]] = defaultdict(set)
    for traj in trajs:
        if traj.reward is not None:
            rewards[traj.group_id].add(traj.reward)
    return {group for group, seen in rewards.items() if len(seen) > 1}


def learning_trajectories(trajs: list[Trajectory]) -> list[Trajectory]:
    """The trajectories of mixed groups: what a step under dynamic sampling learns from."""
    keep = mixed_groups(trajs)
    return [t for t in trajs if t.group_id in keep]


def more_items(pool: list[Task], cfg: TrainConfig, step: int, drawn: set[str], count: int,
               round_: int) -> list[WorkItem]:
    """Up to `count` tasks of `pool` not in `drawn`, in an order seeded by the data seed, the step
    and the round (a resumed run draws the same), as groups of this step."""
    rest = [t for t in pool if t.task_id not in drawn]
    random.Random(cfg.data.seed * 100003 + step * 7919 + round_).shuffle(rest)
    return [WorkItem(task=t, group_id=f"{t.task_id}@{step}", samples=cfg.data.samples_per_task)
            for t in rest[:count]]


async def topped_up(run: Run, pool: list[Task], step: int, items: list[WorkItem],
                    trajs: list[Trajectory]) -> list[Trajectory]:
    """`trajs` (the step's rollouts of `items`) and, while fewer than `tasks_per_step` groups are
    mixed and `data.dynamic_tasks` allows, the rollouts of more tasks of `pool`."""
    cfg = run.cfg
    drawn = {item.task.task_id for item in items}
    left, round_ = cfg.data.dynamic_tasks, 0
    while left > 0 and (short := cfg.data.tasks_per_step - len(mixed_groups(trajs))) > 0:
        round_ += 1
        more = more_items(pool, cfg, step, drawn, min(left, 2 * short), round_)
        if not more:
            break
        left -= len(more)
        drawn |= {item.task.task_id for item in more}
        trajs = trajs + await run.rollouts(more, tag=f"ppo_{step:06d}_more{round_}")
    return trajs
