"""The paper's training stages as steps of one plan, resumable at any step.

What it is: `stage_plan(cfg)` (which stages, how many steps each) and `train(run)`, which walks
the global step counter through the plan:
  single_turn - PPO where one response holds the whole solution (warm-up, stage 1);
  rft         - rejection fine-tuning: collect agent trajectories once, keep reward > 0 and drop
                looping / tool-schema-violating ones, SFT on their action tokens;
  value       - value pretraining: collect trajectories of the current policy once, fit the critic
                to GAE targets;
  ppo         - agentic PPO: roll out, score, update actor and critic, push weights, repeat.
`smoke` chains rft -> value -> ppo on the bundled demonstration tasks.

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

import logging
import random
import time
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import msgspec


from agentcore.orchestrator import WorkItem
from agentcore.rollout import RolloutConfig
from agentcore.tasks import load_tasks
from agentcore.types import Status, Task, Trajectory
from rl.config import TrainConfig
from rl.demonstrations import demo_engine, demo_tasks
from rl.learner_client import LearnerError
from rl.metrics import ProgressBar, step_metrics
from rl.run import Run
from rl.samples import Sample, sample_from_trajectory
from rl.selection import select_for_rft
from rl.single_turn import SingleTurnParser, single_turn_messages

log = logging.getLogger("cuda-agent.train")

UNUSABLE = {Status.FAILED, Status.ENGINE_ERROR, Status.ABORTED}


def stage_plan(cfg: TrainConfig) -> list[tuple[str, int]]:
    s = cfg.steps
    if cfg.stage == "smoke":
        return [("rft", s.rft), ("value", s.value), ("ppo", s.ppo)]
    return [(cfg.stage, getattr(s, cfg.stage))]


def training_tasks(cfg: TrainConfig) -> list[Task]:
    if cfg.data.tasks == "demos":
        return [d.task for d in demo_tasks(cfg.data.demos, cfg.data.demo_names)]
    tasks, problems = load_tasks(cfg.data.tasks)
    for problem in problems:
        log.error("skipping task: %s", problem)
    if not tasks:
        raise SystemExit(f"no usable tasks in {cfg.data.tasks}")
    if cfg.data.with_demo_tasks:
        tasks = [d.task for d in demo_tasks(cfg.data.demos, cfg.data.demo_names)] + tasks
    return tasks


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


async def train(run: Run) -> list[dict]:
    """Run the plan from wherever the run's checkpoints say; returns the metric rows written."""
    cfg = run.cfg
    found = await run.learner.load()
    step = found[0] if found else 0
    if found is None and cfg.init_from:
        if await run.learner.load(Path(cfg.init_from)) is None:
            raise SystemExit(f"init_from {cfg.init_from}: no checkpoint there")
    run.version = int((await run.sync_weights()).get("version", 0))  # engines start from the actor
    metrics = run.open_metrics(step)
    progress = ProgressBar(sum(n for _, n in stage_plan(cfg)), start_step=step)
    rows, lo = [], 0
    tasks = training_tasks(cfg)
    for name, n in stage_plan(cfg):
        hi = lo + n
        run.stage_end = hi
        for g in range(max(step, lo), hi):
            row = await STEPS[name](run, tasks, g, g - lo)
            row |= {"stage": name, "step": g, "stage_index": STAGE_INDEX[name]} | _perf(row)
            metrics.write(g, row)
            progress.update(g, row)
            rows.append(row)
            log.info("step %d (%s %d/%d): %s", g, name, g - lo + 1, n, _brief(row))
            if (g + 1) % cfg.checkpoint.every_steps == 0 or g + 1 == hi:
                saved = await run.learner.save(g + 1, {"stage": name, "step": g + 1}, export=cfg.checkpoint.export_hf)
                log.info("checkpoint step %d: %s", g + 1, {k: round(v, 2) for k, v in saved.items()})
        lo = hi
    await run.learner.wait_saved()  # the last checkpoint is committed (and exported) when train returns
    progress.close()
    return rows


# -- one step of each stage ----------------------------------------------------------------------


async def ppo_step(run: Run, tasks: list[Task], g: int, k: int, *, single_turn: bool = False) -> dict:
    """Roll out, update, push weights. Under `max_staleness > 0` the next step's rollouts run
    while this step trains (their trajectories are one weight version behind)."""
    t0 = time.perf_counter()
    trajs = run.prefetched.pop(g, None)
    if trajs is None:
        trajs = await _step_rollouts(run, tasks, g, single_turn)
    t1 = time.perf_counter()
    samples = usable_samples(trajs, run, g)
    times: dict[str, float] = {}

    async def update() -> None:
        nonlocal train, sync
        if samples:
            train, sync = await _update(run, "ppo", samples, g, times)
        else:
            times["time/train_s"] = times["time/weight_sync_s"] = 0.0

    async def prefetch() -> None:
        run.prefetched[g + 1] = await _step_rollouts(run, tasks, g + 1, single_turn)
        times["time/overlapped_rollout_s"] = time.perf_counter() - t1

    train: dict = {}
    sync: dict = {}
    async with anyio.create_task_group() as tg:
        if run.cfg.max_staleness > 0 and g + 1 < run.stage_end:
            tg.start_soon(prefetch)
        await update()
    run.version = int(sync.get("version", run.version))
    times["time/rollout_s"] = t1 - t0
    return _row(trajs, train, sync, times, run) | {"samples": len(samples)}


async def _step_rollouts(run: Run, tasks: list[Task], g: int, single_turn: bool) -> list[Trajectory]:
    items = tasks_for_step(tasks, run.cfg, g)
    if single_turn:
        return await run.rollouts(items, tag=f"single_turn_{g:06d}", parser=SingleTurnParser(),
                                  opening=single_turn_messages, max_turns=1)
    return await run.rollouts(items, tag=f"ppo_{g:06d}")


async def single_turn_step(run: Run, tasks: list[Task], g: int, k: int) -> dict:
    return await ppo_step(run, tasks, g, k, single_turn=True)


async def rft_step(run: Run, tasks: list[Task], g: int, k: int) -> dict:
    first = "rft" not in run.pools
    kept = await _collected(run, tasks, "rft", select=True)
    if not kept:
        raise SystemExit("rejection fine-tuning: no trajectory with reward > 0 to learn from")
    batch = _cyclic(kept, k, run.cfg.data.tasks_per_step * run.cfg.data.samples_per_task)
    times: dict[str, float] = {}
    # Nothing generates between two rft steps: the engines get the weights after the stage's last
    # step (a resumed run pushes them at its start), not after every step.
    last = g + 1 == run.stage_end
    scale = sft_lr_scale(run.cfg.optim.sft_lr_schedule, k, k + run.stage_end - g)
    train, sync = await _update(run, "sft", batch, g, times, sync=last, lr_scale=scale)
    run.version = int(sync.get("version", run.version))
    return {f"train/{k_}": v for k_, v in train.items()} | _sync(sync) | times | {
        "rft/kept": len(kept)} | (run.collect_metrics if first else {})


async def value_step(run: Run, tasks: list[Task], g: int, k: int) -> dict:
    first = "value" not in run.pools
    pool = await _collected(run, tasks, "value", select=False)
    batch = _cyclic(pool, k, run.cfg.data.tasks_per_step * run.cfg.data.samples_per_task)
    times: dict[str, float] = {}
    train, _ = await _update(run, "value", batch, g, times, sync=False)
    # the collection's rollout figures (pass rate, statuses): the policy PPO starts from
    return {f"train/{k_}": v for k_, v in train.items()} | times | (run.collect_metrics if first else {})


STAGE_INDEX = {"single_turn": 0, "rft": 1, "value": 2, "ppo": 3}
STEPS = {"ppo": ppo_step, "single_turn": single_turn_step, "rft": rft_step, "value": value_step}


# -- one learner update, with the colocated engines' memory released around it ---------------------


def releases_memory(cfg: TrainConfig) -> bool:
    """Whether updates free the engines' memory: switched on, engines on the learner's GPUs, and
    strictly on-policy (under `max_staleness > 0` the next rollouts generate during training)."""
    colocated = cfg.engine.kind == "embedded" or cfg.weight_sync.mode == "sglang_tensor"
    return cfg.engine.release_during_training and colocated and cfg.max_staleness == 0


def sft_lr_scale(schedule: str, k: int, n: int) -> float:
    """Multiplier of sft_lr at step k (0-based) of an n-step rft stage: 1 (constant), or falling
    linearly from 1 to 1/n (linear)."""
    return 1.0 if schedule == "constant" else (n - k) / n


async def _update(run: Run, kind: str, samples: list[Sample], g: int, times: dict[str, float], *,
                  sync: bool = True, lr_scale: float = 1.0) -> tuple[dict, dict]:
    """learner.step, then (with `sync`) the weight push; fills `times` (train, sync, release,
    resume seconds) and returns (train metrics, sync metrics)."""
    pushed: dict = {}
    async with _released(run, times, weights=sync):
        t0 = time.perf_counter()
        train = await run.learner.step(kind, samples, step=g, lr_scale=lr_scale)
        times["time/train_s"] = time.perf_counter() - t0
        if sync:
            pushed = await run.sync_weights()
            times["time/weight_sync_s"] = time.perf_counter() - t0 - times["time/train_s"]
    return train, pushed


@asynccontextmanager
async def _released(run: Run, times: dict[str, float], *, weights: bool):
    """Release the colocated engines' memory for the block, resume it after. A failure inside
    (or of the release itself) still resumes, shielded and best-effort, so the servers are whole
    for `--resume`; the original error is the one raised."""
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


async def _checked(what: str, command) -> None:
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


# -- helpers ----------------------------------------------------------------------------------------


async def _collected(run: Run, tasks: list[Task], stage: str, *, select: bool) -> list[Sample]:
    """The trajectories a stage learns from, collected once per run (`rollouts/<stage>_collect`)."""
    if stage not in run.pools:
        trajs = await _collect(run, tasks, stage)
        run.collect_metrics = {f"collect/{k.split('/')[-1]}": v for k, v in step_metrics(trajs, max_response_tokens=None).items()}
        if select:
            kept, dropped = select_for_rft(trajs)
            log.info("%s: kept %d of %d trajectories; dropped %s", stage, len(kept), len(trajs), dict(dropped))
            trajs = kept
        run.pools[stage] = [sample_from_trajectory(t) for t in trajs if t.reward is not None and t.status not in UNUSABLE]
    return run.pools[stage]


async def _collect(run: Run, tasks: list[Task], stage: str) -> list[Trajectory]:
    cfg = run.cfg
    tasks = collection_tasks(tasks, cfg)
    items = [WorkItem(task=t, group_id=f"{t.task_id}@{stage}", samples=cfg.data.samples_per_task) for t in tasks]
    trajs: list[Trajectory] = []
    demos_given = stage == "rft" and cfg.data.demos > 0
    if demos_given:
        demos = demo_tasks(cfg.data.demos, cfg.data.demo_names)
        demo_items = [WorkItem(task=d.task, group_id=d.task.task_id, samples=1) for d in demos]
        script = RolloutConfig(max_turns=12, max_new_tokens=16384, max_context_tokens=cfg.rollout.max_context_tokens)
        trajs += await run.rollouts(demo_items, tag="rft_demos", engine=demo_engine(run.renderer, demos), rollout=script)
    if stage == "value" or (cfg.data.tasks != "demos" and (cfg.data.rft_policy_rollouts or not demos_given)):
        trajs += await run.rollouts(items, tag=f"{stage}_collect")
    return trajs


def usable_samples(trajs: list[Trajectory], run: Run, g: int) -> list[Sample]:
    """Scored trajectories within the staleness bound, as learner samples."""
    out = []
    for t in trajs:
        if t.reward is None or t.status in UNUSABLE or not t.response_ids:
            continue
        if run.version - t.weight_version_min > run.cfg.max_staleness:
            continue  # sampled by weights too old for the staleness bound (0: strictly on-policy)
        out.append(sample_from_trajectory(t))
    return out


def _cyclic(pool: list[Sample], k: int, n: int) -> list[Sample]:
    n = max(1, min(n, len(pool)))
    return [pool[(k * n + i) % len(pool)] for i in range(n)]


def _row(trajs, train: dict, sync: dict, times: dict, run: Run) -> dict:
    metrics = step_metrics(trajs, max_response_tokens=run.cfg.rollout.max_context_tokens, current_version=run.version)
    row = {f"rollout/{k}": v for k, v in metrics.items()}
    row |= {f"train/{k}": v for k, v in train.items()} | _sync(sync) | times
    return row | run.env_statistics()


def _perf(row: dict) -> dict:
    """`perf/` figures of the step's update: tokens/s and (on a known GPU) MFU, from the learner."""
    return {f"perf/{k}": row[f"train/{k}"] for k in ("tokens_per_s", "mfu") if f"train/{k}" in row}


def _sync(sync: dict) -> dict:
    return {f"sync/{k}": v for k, v in sync.items()}


def _brief(row: dict) -> str:
    keys = ["rollout/reward_mean", "rollout/pass_rate", "train/policy_loss", "train/sft_loss", "train/value_loss"]
    return " ".join(f"{k.split('/')[-1]}={row[k]:.3g}" for k in keys if isinstance(row.get(k), (int, float)))


__all__ = ["collection_tasks", "releases_memory", "stage_plan", "train", "tasks_for_step"]
