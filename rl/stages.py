"""The parts of a training step, which the loop in `rl/train.py` puts in order.

What it is: the plan (`stage_plan`: each stage and its global steps), the tasks of a step, the
rollouts of a step or of a stage's one collection, the samples a step learns from, the learner
update with the colocated engines' memory released around it, the weight sync, checkpoints, and
the step's metric row. The stages:
  single_turn - PPO where one response holds the whole solution (warm-up, stage 1);
  rft         - rejection fine-tuning: collect agent trajectories once, keep reward > 0 and drop
                looping / tool-schema-violating ones, SFT on their action tokens;
  value       - value pretraining: collect trajectories of the current policy once, fit the critic
                to GAE targets;
  ppo         - agentic PPO: roll out, score, update actor and critic, push weights, repeat.
`smoke` chains rft -> value -> ppo (on a GPU: the `rl.data.families` tasks, their teachers as the
rft demonstrations; on the CPU: the bundled demonstration tasks).
What it is not: the loop (`rl/train.py`) or the open parts it runs on (`rl/run.py`).

Resume: the data position is the global step (tasks for a step are a deterministic function of
the seed and the step), rollouts of a step live in `rollouts/<stage>_<step>.jsonl` (a restarted
step keeps its finished trajectories), and checkpoints record the next step to run.

Memory: with `engine.release_during_training` and strictly on-policy, an update of engines
colocated with the learner runs as release -> train -> weight sync (a colocated SGLang server
gets its weights back before the buckets, its KV cache after) -> resume (the embedded engine's
KV cache; whatever a value step, which syncs nothing, released). `time/release_s` and
`time/resume_s` go into the step's metrics (a colocated SGLang server's restore after a weight
sync is inside `time/weight_sync_s`). A failed release, update or sync still resumes, so the
engines are whole for `--resume`.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Generic, NamedTuple, TypeVar

import anyio
import msgspec

from agentcore.orchestrator import WorkItem
from agentcore.rollout import RolloutConfig
from agentcore.tasks import load_tasks
from agentcore.types import Status, Task, Trajectory
from rl import dynamic_sampling
from rl.config import TrainConfig
from rl.data import families
from rl.demonstrations import DemoTask, demo_engine, demo_tasks
from rl.learner.protocol import Metrics, SyncReply
from rl.learner_client import LearnerError
from rl.metrics import step_metrics
from rl.run import Run, lag_metrics
from rl.samples import Sample, sample_from_trajectory
from rl.selection import select_for_rft
from rl.single_turn import SingleTurnParser, single_turn_messages
from rl.weight_sync import WeightSyncError, sync_disk

log = logging.getLogger("cuda-agent.train")

T = TypeVar("T")

UNUSABLE = {Status.FAILED, Status.ENGINE_ERROR, Status.ABORTED}
ROLLOUT_STAGES = ("single_turn", "ppo")  # a step rolls out the policy; rft and value learn from one collection
STAGE_INDEX = {"single_turn": 0, "rft": 1, "value": 2, "ppo": 3}
UPDATE_KIND = {"single_turn": "ppo", "rft": "sft", "value": "value", "ppo": "ppo"}


class Stage(NamedTuple):
    """A stage of the plan and its global steps: `first` .. `end - 1`."""

    name: str
    first: int
    end: int


def stage_plan(cfg: TrainConfig) -> list[Stage]:
    names = ["rft", "value", "ppo"] if cfg.stage == "smoke" else [cfg.stage]
    plan, first = [], 0
    for name in names:
        plan.append(Stage(name, first, first + getattr(cfg.steps, name)))
        first = plan[-1].end
    return plan


# -- tasks and rollouts -----------------------------------------------------------------------------


def training_tasks(cfg: TrainConfig) -> list[Task]:
    if cfg.data.ppo_shapes and cfg.data.tasks != "families":
        raise SystemExit(f"data.ppo_shapes {list(cfg.data.ppo_shapes)} needs data.tasks=families, not {cfg.data.tasks!r}")
    if cfg.data.tasks == "demos":
        return [d.task for d in demo_tasks(cfg.data.demos, cfg.data.demo_names)]
    if cfg.data.tasks == "families":
        return list(families.split_for(cfg.data).train)
    tasks, problems = load_tasks(cfg.data.tasks)
    for problem in problems:
        log.error("skipping task: %s", problem)
    if not tasks:
        raise SystemExit(f"no usable tasks in {cfg.data.tasks}")
    if cfg.data.with_demo_tasks:
        tasks = [d.task for d in demo_tasks(cfg.data.demos, cfg.data.demo_names)] + tasks
    return tasks


def demonstrations(cfg: TrainConfig) -> list[DemoTask]:
    """The rft demonstrations: the bundled ones (`data.demos`, `data.demo_names`), or with
    `data.tasks=families` the teachers of `data.demos` training tasks (all when it is larger),
    drawn in a seeded order."""
    if cfg.data.tasks != "families":
        return demo_tasks(cfg.data.demos, cfg.data.demo_names)
    demos = families.family_demos(taught_tasks(training_tasks(cfg), cfg))
    if cfg.data.demos >= len(demos):
        return demos
    keep = sorted(random.Random(cfg.data.seed).sample(range(len(demos)), cfg.data.demos))
    return [demos[i] for i in keep]


def ppo_tasks(tasks: list[Task], cfg: TrainConfig) -> list[Task]:
    """The tasks PPO (and the value stage's collection) draws from: all, or with `data.ppo_shapes`
    the families tasks at those shapes."""
    if not cfg.data.ppo_shapes:
        return tasks
    picked = [t for t in tasks if t.metadata.get("shape") in cfg.data.ppo_shapes]
    if not picked:
        raise SystemExit(f"data.ppo_shapes {list(cfg.data.ppo_shapes)}: no training task has those shapes")
    return picked


def taught_tasks(tasks: list[Task], cfg: TrainConfig) -> list[Task]:
    """The tasks rft may teach: all but PPO's own under `data.ppo_shapes`."""
    return [t for t in tasks if t.metadata.get("shape") not in cfg.data.ppo_shapes]


def tasks_for_step(tasks: list[Task], cfg: TrainConfig, step: int) -> list[WorkItem]:
    """Tasks of global step `step`: consecutive slices of a seeded permutation, one per epoch."""
    n = min(cfg.data.tasks_per_step, len(tasks))
    start = step * n
    epoch, offset = divmod(start, len(tasks))
    order = list(range(len(tasks)))
    random.Random(cfg.data.seed * 100003 + epoch).shuffle(order)
    picked = [tasks[order[(offset + i) % len(tasks)]] for i in range(n)]
    return [WorkItem(task=t, group_id=f"{t.task_id}@{step}", samples=cfg.data.samples_per_task) for t in picked]


def collection_tasks(tasks: list[Task], cfg: TrainConfig) -> list[Task]:
    """Tasks of one rft/value collection: all of them, or `data.collect_tasks` drawn like step 0."""
    if not 0 < cfg.data.collect_tasks < len(tasks):
        return tasks
    capped = msgspec.structs.replace(cfg, data=msgspec.structs.replace(cfg.data, tasks_per_step=cfg.data.collect_tasks))
    return [item.task for item in tasks_for_step(tasks, capped, 0)]


async def restore(run: Run) -> int:
    """Load the run's latest checkpoint and return the step it records (the next to run); a fresh
    run starts at 0, from the checkpoint of `init_from` when set."""
    found = await run.learner.load()
    if found.found:
        return found.step
    if run.cfg.init_from and not (await run.learner.load(Path(run.cfg.init_from))).found:
        raise SystemExit(f"init_from {run.cfg.init_from}: no checkpoint there")
    return 0


async def step_rollouts(run: Run, tasks: list[Task], step: int, stage: str) -> list[Trajectory]:
    """The trajectories of `step`, scored by the orchestrator as each one finishes
    (`rollouts/<stage>_<step>.jsonl`); single_turn asks for one reply that holds the solution. Under
    `data.dynamic_tasks` a PPO step also rolls out more tasks until enough groups are mixed
    (`rl.dynamic_sampling`)."""
    pool = ppo_tasks(tasks, run.cfg)
    items = tasks_for_step(pool, run.cfg, step)
    if stage == "single_turn":
        return await run.rollouts(items, tag=f"single_turn_{step:06d}", parser=SingleTurnParser(),
                                  opening=single_turn_messages, max_turns=1)
    trajs = await run.rollouts(items, tag=f"ppo_{step:06d}")
    return await dynamic_sampling.topped_up(run, pool, step, items, trajs) if run.cfg.data.dynamic_tasks else trajs


class Background(Generic[T]):
    """`fn(*args)` running in the task group `tg`: its `result` and `seconds` once the group has
    exited. The loop prefetches the next step's rollouts this way while a step trains.

    Example:
        async with anyio.create_task_group() as tg:
            prefetch = Background(tg, step_rollouts, run, tasks, step + 1, "ppo")
            ...  # this step's update
        trajs = prefetch.result
    """

    def __init__(self, tg: anyio.abc.TaskGroup, fn: Callable[..., Awaitable[T]], *args: Any) -> None:
        self.result: T | None = None
        self.seconds = 0.0
        tg.start_soon(self._run, fn, *args)

    async def _run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> None:
        t0 = time.perf_counter()
        self.result = await fn(*args)
        self.seconds = time.perf_counter() - t0


def usable_samples(trajs: list[Trajectory], version: int, max_staleness: int, *,
                   mixed_only: bool = False) -> list[Sample]:
    """Scored trajectories sampled by weights at most `max_staleness` versions behind `version`
    (0: strictly on-policy), as learner samples; with `mixed_only` (dynamic sampling) those of
    groups whose rewards differ."""
    if mixed_only:
        trajs = dynamic_sampling.learning_trajectories(trajs)
    return [
        sample_from_trajectory(t) for t in trajs
        if t.reward is not None and t.status not in UNUSABLE and t.response_ids
        and version - t.weight_version_min <= max_staleness
    ]  # fmt: skip


@dataclass(frozen=True)
class Collection:
    """What an rft or value stage learns from: one collection's samples, served in batches."""

    samples: list[Sample]
    figures: dict[str, float]
    """The collection's rollout figures (`collect/`): for rft the demonstrations and policy
    rollouts before the filter, for value the policy PPO starts from."""
    batch_size: int
    seconds: float = 0.0
    """Wall time of the collection's rollouts (`time/collect_s` in the stage's first step row)."""
    seed: int = 0
    """Seeds each epoch's order (`data.seed`)."""

    def batch(self, k: int) -> list[Sample]:
        """Batch `k` of the stage: `batch_size` samples at a time, each pass over the collection
        (epoch) in its own seeded order. Collected in task order, consecutive samples would make
        batches of one task family. A pure function of `k`: a resumed stage sees the same batches."""
        n, total = max(1, min(self.batch_size, len(self.samples))), len(self.samples)
        picked = []
        for j in range(k * n, k * n + n):
            epoch, position = divmod(j, total)
            picked.append(self.samples[_epoch_order(self.seed, epoch, total)[position]])
        return picked

    def demonstrations(self, k: int) -> list[Sample]:
        """Batch `k` marked as demonstrations, which a PPO update imitates (`ppo.sft_coef`)."""
        return [msgspec.structs.replace(s, demonstration=True) for s in self.batch(k)]


@functools.lru_cache(maxsize=8)
def _epoch_order(seed: int, epoch: int, total: int) -> tuple[int, ...]:
    order = list(range(total))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return tuple(order)


async def collect(run: Run, tasks: list[Task], stage: str) -> Collection:
    """Roll out the stage's collection (`rollouts/<stage>_collect`, resumable) and keep what it
    learns from: rft the trajectories `select_for_rft` keeps, value every scored one."""
    t0 = time.perf_counter()
    trajs = await collect_trajectories(run, tasks, stage)
    seconds = time.perf_counter() - t0
    figures = {f"collect/{k.split('/')[-1]}": v for k, v in step_metrics(trajs, max_response_tokens=None).items()}
    if stage == "rft":
        kept, dropped = select_for_rft(trajs)
        log.info("%s: kept %d of %d trajectories; dropped %s", stage, len(kept), len(trajs), dict(dropped))
        trajs = kept
    samples = [sample_from_trajectory(t) for t in trajs if t.reward is not None and t.status not in UNUSABLE]
    if not samples:
        what = "no trajectory with reward > 0" if stage == "rft" else "no scored trajectory"
        raise SystemExit(f"{stage}: {what} to learn from")
    return Collection(samples, figures, run.cfg.data.tasks_per_step * run.cfg.data.samples_per_task, seconds,
                      seed=run.cfg.data.seed)


async def collect_trajectories(run: Run, tasks: list[Task], stage: str) -> list[Trajectory]:
    """rft: the demonstrations driven through the real tools (`data.demos`) and, unless they
    suffice, the policy's rollouts; value: the policy's rollouts."""
    cfg = run.cfg
    pool = ppo_tasks(tasks, cfg) if stage == "value" else tasks  # the critic learns the tasks PPO draws
    items = [WorkItem(task=t, group_id=f"{t.task_id}@{stage}", samples=cfg.data.samples_per_task)
             for t in collection_tasks(pool, cfg)]
    trajs: list[Trajectory] = []
    demos_given = stage == "rft" and cfg.data.demos > 0
    if demos_given:
        demos = demonstrations(cfg)
        demo_items = [WorkItem(task=d.task, group_id=d.task.task_id, samples=1) for d in demos]
        script = RolloutConfig(max_turns=12, max_new_tokens=16384, max_context_tokens=cfg.rollout.max_context_tokens)
        scorer = run.scorer if cfg.data.time_demos else run.untimed_scorer()
        engine = demo_engine(run.renderer, demos, profile=cfg.data.time_demos)
        trajs += await run.rollouts(demo_items, tag="rft_demos", engine=engine, rollout=script, scorer=scorer)
    if stage == "value" or (cfg.data.tasks != "demos" and (cfg.data.rft_policy_rollouts or not demos_given)):
        trajs += await run.rollouts(items, tag=f"{stage}_collect")
    return trajs


# -- update, weight sync, checkpoint ------------------------------------------------------------------


async def update(run: Run, stage: Stage, step: int, samples: list[Sample], times: dict[str, float]) -> Metrics:
    """One learner update on `samples` (ppo, sft for rft, value); rft's learning rate follows
    `optim.sft_lr_schedule` over the stage. Records `time/train_s`."""
    k, n = step - stage.first, stage.end - stage.first
    scale = sft_lr_scale(run.cfg.optim.sft_lr_schedule, k, n) if stage.name == "rft" else 1.0
    t0 = time.perf_counter()
    reply = await run.learner.step(UPDATE_KIND[stage.name], samples, step=step, lr_scale=scale)
    times["time/train_s"] = time.perf_counter() - t0
    return reply.metrics


def sft_lr_scale(schedule: str, k: int, n: int) -> float:
    """Multiplier of sft_lr at step k (0-based) of an n-step rft stage: 1 (constant), or falling
    linearly from 1 to 1/n (linear)."""
    return 1.0 if schedule == "constant" else (n - k) / n


async def sync_weights(run: Run, times: dict[str, float] | None = None) -> SyncReply:
    """Learner -> engines: in-process for the embedded engines; with `sglang_tensor` each rank
    sends its colocated server the tensors itself (`rl/learner/rank.py`); otherwise SGLang servers
    load the exported HF directory (`update_weights_from_disk`). A failed sync raises before the
    step's metrics and checkpoint are written: `--resume` redoes the step from its stored
    trajectories and publishes the checkpoint's weights first. Records `time/weight_sync_s`."""
    t0 = time.perf_counter()
    try:
        reply = await run.learner.sync_weights()
        if reply.path is not None:
            report = await sync_disk(run.clients, reply.path, reply.version, run.cfg.weight_sync)
            seconds = reply.metrics.get("export_s", 0.0) + report.seconds
            reply = msgspec.structs.replace(reply, metrics=reply.metrics | {"weight_sync_s": seconds})
    except (LearnerError, WeightSyncError) as exc:
        raise type(exc)(f"weight sync failed; checkpoints and stored trajectories are intact, so "
                        f"`cuda-agent train --resume` redoes this step once the engines work: {exc}") from exc
    if times is not None:
        times["time/weight_sync_s"] = time.perf_counter() - t0
    return reply


def releases_memory(cfg: TrainConfig) -> bool:
    """Whether updates free the engines' memory: switched on, engines on the learner's GPUs, and
    strictly on-policy (under `max_staleness > 0` the next rollouts generate during training)."""
    colocated = cfg.engine.kind == "embedded" or cfg.weight_sync.mode == "sglang_tensor"
    return cfg.engine.release_during_training and colocated and cfg.max_staleness == 0


@asynccontextmanager
async def engines_released(run: Run, times: dict[str, float], *, weights: bool):
    """Release the colocated engines' memory for the block (with `weights`, a colocated SGLang
    server's weights too: a sync inside restores them), resume it after. A failure inside (or of
    the release itself) still resumes, shielded and best-effort, so the servers are whole for
    `--resume`; the original error is the one raised. Records `time/release_s`, `time/resume_s`."""
    if not releases_memory(run.cfg):
        yield
        return
    t0 = time.perf_counter()
    try:
        await _checked("releasing the engines' memory before training", run.learner.release(weights=weights))
        times["time/release_s"] = time.perf_counter() - t0
        yield
    except BaseException:
        await _resume_quietly(run)
        raise
    t0 = time.perf_counter()
    await _checked("restoring the engines' memory after training", run.learner.resume())
    times["time/resume_s"] = time.perf_counter() - t0


async def _checked(what: str, command: Awaitable[None]) -> None:
    try:
        await command
    except LearnerError as exc:
        raise LearnerError(f"{what} failed; checkpoints and stored trajectories are intact, so "
                           f"`cuda-agent train --resume` redoes this step: {exc}") from exc


async def _resume_quietly(run: Run) -> None:
    with anyio.CancelScope(shield=True), anyio.move_on_after(run.cfg.weight_sync.cleanup_timeout_s):
        try:
            await run.learner.resume()
        except LearnerError as exc:
            log.error("could not restore the engines' memory after a failed update: %s", exc)


async def save_checkpoint(run: Run, step: int, stage: str) -> None:
    """Checkpoint the learner as of `step`, the next step to run (and export the actor to RUN/hf)."""
    saved = await run.learner.save(step, {"stage": stage, "step": step}, export=run.cfg.checkpoint.export_hf)
    log.info("checkpoint step %d: %s", step, {k: round(v, 2) for k, v in saved.metrics.items()})


# -- the step's metric row --------------------------------------------------------------------------


def step_row(run: Run, stage: Stage, step: int, *, trajs: list[Trajectory] | None, collection: Collection | None,
             samples: list[Sample], trained: Metrics, synced: SyncReply | None, times: dict[str, float],
             version: int) -> dict[str, Any]:
    """The metrics line of a step: its rollouts' figures (rollout stages; staleness against the
    weights after the step), the update's (`train/`, `perf/`), the sync's (`sync/`) and seconds."""
    row: dict[str, Any] = {"stage": stage.name, "step": step, "stage_index": STAGE_INDEX[stage.name]}
    if trajs is not None:
        figures = step_metrics(trajs, max_response_tokens=run.cfg.rollout.max_context_tokens, current_version=version)
        demos = sum(s.demonstration for s in samples)  # rft's samples beside the rollouts (ppo.sft_coef)
        row |= {f"rollout/{k}": v for k, v in figures.items()} | {"samples": len(samples) - demos}
        row |= {"demonstrations": demos} if demos else {}
        groups = {t.group_id for t in trajs}  # dynamic sampling draws more of them
        row |= {"rollout/groups": len(groups),
                "rollout/mixed_groups": len(dynamic_sampling.mixed_groups(trajs)) / max(len(groups), 1)}
        row |= {"time/train_s": 0.0, "time/weight_sync_s": 0.0}  # stay 0 when no sample was usable
        row |= run.env_statistics() | lag_metrics(run.loop_lag.take("step"))
    if stage.name == "rft" and collection is not None:
        row["rft/kept"] = len(collection.samples)
    row |= {f"train/{k}": v for k, v in trained.items()}
    row |= {f"perf/{k}": trained[k] for k in ("tokens_per_s", "mfu") if k in trained}  # throughput, MFU on a known GPU
    if synced is not None:
        row |= {"sync/version": synced.version} | {f"sync/{k}": v for k, v in synced.metrics.items()}
    return row | times


def brief(row: dict[str, Any]) -> str:
    keys = ["rollout/reward_mean", "rollout/pass_rate", "train/policy_loss", "train/sft_loss", "train/value_loss"]
    return " ".join(f"{k.split('/')[-1]}={row[k]:.3g}" for k in keys if isinstance(row.get(k), (int, float)))


__all__ = [
    "Background", "Collection", "Stage", "brief", "collect", "collection_tasks", "demonstrations",
    "engines_released", "releases_memory", "restore", "save_checkpoint", "stage_plan", "step_row", "step_rollouts",
    "sync_weights", "tasks_for_step", "training_tasks", "update", "usable_samples",
]
