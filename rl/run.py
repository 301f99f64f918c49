"""Everything a training run holds open, in one place: the tree under `cuda-agent train`.

What it is: `open_run(cfg)`, which opens (and on exit closes, shielded) the kernel environment
(compile pool + GPU queue, or the fake one), the learner ranks with their embedded engines, the
engine clients (one per rank, behind the sticky router) and the sandbox workspaces, and returns a
`Run` whose `rollouts()` runs a batch of tasks through the orchestrator into a resumable
trajectory file. A `Run` is frozen: what changes from step to step lives in the loop.

    cuda-agent train (this process, one anyio task-group tree)
      |- kernel env: compile pool (subprocesses) + GPU queue (worker process per GPU)
      |- learner ranks (torchrun process group): FSDP2 actor/critic + embedded engine + HTTP
      |- orchestrator per rollout batch -> engines (HTTP) / tools (sandbox) / scorer
      |    beside it: the progress line and the event-loop lag monitor (`agentcore.loop_lag`)
      `- metrics: JSON lines + TensorBoard (opened by the loop, which knows the step it starts at)
What it is not: the training loop (`rl/train.py`) or the parts of its steps (`rl/stages.py`).

Example:
    async with open_run(cfg) as run:
        trajs = await run.rollouts(items, tag="ppo_000003")   # RUN/rollouts/ppo_000003.jsonl
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import anyio
import msgspec

from agentcore.chat import ChatRenderer
from agentcore.engine import Engine
from agentcore.kernel_env import FakeKernelEnv, KernelEnv
from agentcore.loop_lag import LagStatistics, LoopLag
from agentcore.orchestrator import Orchestrator, Resources, WorkItem, collect
from agentcore.rollout import RolloutConfig, RolloutRunner, first_messages
from agentcore.sandbox import Sandbox
from agentcore.session import WorkspaceTools
from agentcore.sglang import Router, SGLangClient, SGLangClientConfig, SGLangServer
from agentcore.store import TrajectoryStore
from agentcore.tiny_tokenizer import build_tiny_tokenizer, load_tokenizer
from agentcore.toolparse import tool_schemas
from agentcore.types import INFRA_FAILURES, Message, Task, Trajectory
from rl.config import TrainConfig, save_config
from rl.data import families
from rl.learner_client import LearnerGroup
from rl.pretrained import resolve_model
from rl.scoring import EnvScorer

log = logging.getLogger("cuda-agent.train")


@dataclass(frozen=True, kw_only=True)
class Run:
    """The open parts of a training run (see module docstring); nothing in it changes per step."""

    cfg: TrainConfig
    run_dir: Path
    renderer: ChatRenderer
    learner: LearnerGroup
    engine: Engine
    """What rollouts generate with: the one engine server's client, or the router over several."""
    clients: list[SGLangClient]
    """One per engine server (weight sync from disk reaches every one)."""
    env: KernelEnv
    scorer: Any
    env_statistics: Callable[[], dict]
    """The kernel environment's GPU queue and compile pool figures, for the step's metrics and
    progress lines."""
    loop_lag: LoopLag
    """How late the event loop wakes while a batch runs: the progress line's window ("progress")
    and the step's metrics' ("step")."""
    resources: Resources
    """The orchestrator's limiters, shared by every rollout batch of the run."""
    workspaces: Path
    """Where the sandbox's task workspaces live (removed when the run closes)."""

    async def rollouts(
        self,
        items: list[WorkItem],
        *,
        tag: str,
        engine: Engine | None = None,
        parser=None,
        opening: Callable[[Task], list[Message]] = first_messages,
        max_turns: int | None = None,
        rollout: RolloutConfig | None = None,
        scorer: Any = None,
    ) -> list[Trajectory]:
        """Run `items` to scored trajectories, stored in `rollouts/{tag}.jsonl` (scored by `scorer`,
        default the run's); a rerun of the same tag after a crash keeps what finished and redoes
        only the rest."""
        config = rollout or self.cfg.rollout
        if max_turns is not None:
            config = msgspec.structs.replace(config, max_turns=max_turns)
        runner = RolloutRunner(
            engine=engine or self.engine, renderer=self.renderer,
            parser=parser or self.renderer.parser, config=config, opening=opening,
        )
        tools = WorkspaceTools(
            root=self.workspaces, sandbox=Sandbox(self.cfg.sandbox),
            kernel_env=self.resources.kernel_env(self.env),
        )
        path = self.run_dir / "rollouts" / f"{tag}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        # A trajectory the model server or the harness failed is not kept: a rerun rolls it out again.
        async with TrajectoryStore(path, redo=INFRA_FAILURES) as store:
            orch = Orchestrator(runner=runner, tools=tools, config=self.cfg.orchestrator,
                                resources=self.resources, store=store, scorer=scorer or self.scorer)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.loop_lag.run)
                tg.start_soon(self._report_progress, tag, orch, len(items))
                groups = await collect(orch, items)
                tg.cancel_scope.cancel()
            # A resumed tag does not re-emit groups finished before the stop: take those from disk.
            found = {(t.group_id, t.sample_index): t for t in store.existing()}
        found |= {(t.group_id, t.sample_index): t for g in groups for t in g.trajectories}
        return [found[k] for k in sorted(found)]

    def untimed_scorer(self) -> Any:
        """The run's scorer without profile jobs (`EvaluateConfig.timed`); the fake
        environment's scorer times nothing anyway."""
        from rewards.evaluate import FinalEvaluator

        if not isinstance(self.scorer, FinalEvaluator):
            return self.scorer
        return FinalEvaluator(self.scorer.env, msgspec.structs.replace(self.scorer.config, timed=False))

    async def _report_progress(self, tag: str, orch: Orchestrator, groups: int) -> None:
        """A log line every `progress_every_s` while a batch runs: a stalled collection shows
        where it waits (engine, compile pool, GPU queue, a late event loop) instead of nothing."""
        every = self.cfg.orchestrator.progress_every_s
        while every > 0:
            await anyio.sleep(every)
            s, env = orch.statistics(), self.env_statistics()
            limits = " ".join(f"{k}={v.borrowed}/{v.total}+{v.waiting}w" for k, v in s.limiters.items())
            log.info("%s: %d of %d groups, %d trajectories done %s, %d in flight, %d turns, %d tokens; "
                     "%s%s%s%s (%.0f s)",
                     tag, s.groups_emitted, groups, s.finished, dict(s.by_status), s.in_flight, s.turns,
                     s.generated_tokens, limits, queue_progress(env), pool_progress(env),
                     lag_progress(self.loop_lag.take("progress")), s.elapsed_s)


def queue_progress(queue: dict[str, float]) -> str:
    """The GPU queue's part of a progress line ('' without a queue): depth, jobs, how busy its lanes
    are and how much of that with the GPU alone, their wait for other queues' jobs, and per job
    kind the jobs and their mean run time, wait for a lane and wait for the machine-wide lock."""
    busy = queue.get("gpu_queue/busy_fraction")
    if busy is None:
        return ""
    kinds = [key.split("/")[1] for key in queue if key.startswith("gpu_queue/") and key.endswith("/jobs")]
    per_kind = "".join(f", {_kind_progress(queue, kind)}" for kind in kinds)
    return (f"; gpu queue depth {queue.get('gpu_queue/depth', 0):.0f}, {queue.get('gpu_queue/jobs_done', 0):.0f} "
            f"jobs, busy {busy:.0%} (alone {queue.get('gpu_queue/exclusive_busy_fraction', 0):.0%}), waiting for "
            f"other queues {queue.get('gpu_queue/lock_wait_fraction', 0):.0%}{per_kind}")


def _kind_progress(queue: dict[str, float], kind: str) -> str:
    """"verify 57 x 1.2 s (wait 0.4 s, lock 0.3 s)": jobs, mean run time, lane wait, lock wait."""
    def figure(name: str) -> float:
        return queue[f"gpu_queue/{kind}/{name}"]

    return (f"{kind} {figure('jobs'):.0f} x {figure('run_s'):.1f} s "
            f"(wait {figure('wait_s'):.1f} s, lock {figure('lock_s'):.1f} s)")


def pool_progress(env: dict[str, float]) -> str:
    """The compile pool's part of a progress line ('' without one): builds and their mean time,
    against the mean time a compiler process ran and waited for a compiler slot."""
    builds = env.get("compile_pool/builds")
    if builds is None:
        return ""
    return (f"; builds {builds:.0f} x {env['compile_pool/build_s_mean']:.1f} s (compiler "
            f"{env['compile_pool/process_s_mean']:.1f} s, slot wait {env['compile_pool/slot_wait_s_mean']:.1f} s)")


def lag_progress(lag: LagStatistics) -> str:
    """The event loop's part of a progress line: how late it woke since the last line."""
    return f"; loop lag max {lag.max_ms:.0f} ms (mean {lag.mean_ms:.1f} ms)"


def lag_metrics(lag: LagStatistics) -> dict[str, float]:
    """The event loop's lag as a step's metrics (`loop_lag/`)."""
    return {"loop_lag/max_ms": lag.max_ms, "loop_lag/mean_ms": lag.mean_ms, "loop_lag/samples": float(lag.samples)}


def resolve_tokenizer(cfg: TrainConfig, run_dir: Path) -> str:
    """The tokenizer directory: configured, the model's own, or the built-in tiny one."""
    if cfg.data.tokenizer:
        return cfg.data.tokenizer
    if cfg.model.path:
        return str(resolve_model(cfg.model.path))  # builds a named model once, before the ranks load it
    return str(build_tiny_tokenizer(run_dir / "tokenizer"))


@asynccontextmanager
async def open_run(cfg: TrainConfig) -> AsyncIterator[Run]:
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = resolve_tokenizer(cfg, run_dir)
    cfg = msgspec.structs.replace(cfg, data=msgspec.structs.replace(cfg.data, tokenizer=tokenizer_dir))
    tokenizer = load_tokenizer(tokenizer_dir)
    _check_vocab(cfg, len(tokenizer))
    renderer = ChatRenderer(tokenizer, tool_schemas(), cfg.engine.family)
    async with AsyncExitStack() as stack:
        cfg = await _launch_servers(cfg, run_dir, stack)
        _check_weight_sync(cfg)
        save_config(cfg, run_dir)  # the ranks read it (the servers' urls too); also the record of the run
        if cfg.data.tasks == "families":  # which tasks were trained on and which held out
            families.write_manifest(run_dir, families.split_for(cfg.data))
        env, scorer, stats = await _kernel_env(cfg, stack)
        learner = await stack.enter_async_context(LearnerGroup(cfg, run_dir))
        engine, clients = await _engine(cfg, learner, stack)
        yield Run(cfg=cfg, run_dir=run_dir, renderer=renderer, learner=learner, engine=engine, clients=clients,
                  env=env, scorer=scorer, env_statistics=stats, loop_lag=LoopLag(readers=("progress", "step")),
                  resources=Resources(cfg.orchestrator), workspaces=_workspaces(stack))


def _workspaces(stack: AsyncExitStack) -> Path:
    """A fresh system temp dir the sandbox's unprivileged uid can traverse (a run dir may sit
    under a 0700 directory), removed when the run closes."""
    path = Path(tempfile.mkdtemp(prefix="cuda-agent-ws-"))
    path.chmod(0o711)
    stack.callback(shutil.rmtree, path, ignore_errors=True)
    return path


async def _launch_servers(cfg: TrainConfig, run_dir: Path, stack: AsyncExitStack) -> TrainConfig:
    """engine.kind=sglang without urls: start one SGLang server per learner GPU (at once), each
    stopped when the run closes, and return the config with their urls. A server serves the
    run's model directory, or the random-init model's config with dummy weights: the learner's
    first sync sends the real ones either way."""
    if cfg.engine.kind != "sglang" or cfg.engine.urls:
        return cfg
    launch = cfg.engine.sglang
    if cfg.model.path:
        model, load = str(resolve_model(cfg.model.path)), ()
    else:
        model, load = _config_only_model(cfg, run_dir / "sglang" / "model"), ("--load-format", "dummy")
    servers = [SGLangServer(launch.server(model, gpu, str(run_dir / "sglang" / f"server_gpu{gpu}.log"), load))
               for gpu in (cfg.layout.learner_gpus or (0,))]
    (run_dir / "sglang").mkdir(parents=True, exist_ok=True)
    for server in servers:
        stack.push_async_callback(server.stop)
    log.info("starting %d SGLang server(s) of %s", len(servers), model)
    async with anyio.create_task_group() as tg:
        for server in servers:
            tg.start_soon(server.start)
    urls = tuple(server.base_url for server in servers)
    log.info("SGLang server(s) up: %s", ", ".join(urls))
    return msgspec.structs.replace(cfg, engine=msgspec.structs.replace(cfg.engine, urls=urls))


def _config_only_model(cfg: TrainConfig, out: Path) -> str:
    """A directory with the random-init model's config.json alone (for `--load-format dummy`)."""
    from rl.learner.models import pretrained_config  # torch and transformers: only for such a run

    pretrained_config(cfg.model.hf_config or {}).save_pretrained(out)
    return str(out)


def _check_weight_sync(cfg: TrainConfig) -> None:
    """sglang_tensor pairs learner rank r with server r (the one on its GPU): the counts match."""
    mode, ranks = cfg.weight_sync.mode, max(1, len(cfg.layout.learner_gpus))
    if mode.startswith("sglang") and cfg.engine.kind != "sglang":
        raise SystemExit(f"weight_sync.mode={mode} needs engine.kind=sglang and engine.urls")
    if mode == "sglang_tensor" and len(cfg.engine.urls) != ranks:
        raise SystemExit(
            f"weight_sync.mode=sglang_tensor pairs each of the {ranks} learner rank(s) with the SGLang "
            f"server on its GPU, but engine.urls has {len(cfg.engine.urls)}; use weight_sync.mode=sglang_disk "
            "for servers that are not colocated"
        )


def _check_vocab(cfg: TrainConfig, vocab: int) -> None:
    hf = None if cfg.model.path else cfg.model.hf_config   # a checkpoint's own config wins
    if hf and int(hf.get("vocab_size", 0)) < vocab:
        raise SystemExit(f"model.hf_config.vocab_size {hf.get('vocab_size')} < tokenizer size {vocab}")


async def _kernel_env(cfg: TrainConfig, stack: AsyncExitStack):
    if cfg.env == "fake":
        env = FakeKernelEnv()
        return env, EnvScorer(env), lambda: {}
    from rewards.env import open_kernel_env  # only the real environment needs nvcc and a GPU
    from rewards.evaluate import FinalEvaluator

    env_cfg = cfg.kernel_env
    if not env_cfg.gpus and cfg.layout.verify_gpus:
        env_cfg = msgspec.structs.replace(env_cfg, gpus=cfg.layout.verify_gpus)
    env = await stack.enter_async_context(open_kernel_env(env_cfg))
    return env, FinalEvaluator(env), lambda: env_metrics(env)


def env_metrics(env) -> dict[str, float]:
    """A kernel environment's figures as metrics: its GPU queue's and its compile pool's (each
    absent when the environment has none)."""
    return _queue_stats(env) | _pool_stats(env)


def _queue_stats(env) -> dict[str, float]:
    """`gpu_queue/<field>`, and per job kind `gpu_queue/<kind>/{jobs,wait_s,lock_s,run_s}`."""
    queue = getattr(env, "queue", None)
    if queue is None:
        return {}
    s = queue.statistics()
    stats = {f"gpu_queue/{k}": float(v) for k, v in msgspec.to_builtins(s).items() if isinstance(v, (int, float))}
    for kind, times in s.kinds.items():
        stats |= {f"gpu_queue/{kind}/{k}": float(v) for k, v in msgspec.to_builtins(times).items()}
    return stats


def _pool_stats(env) -> dict[str, float]:
    """`compile_pool/<field>`, and the mean build, compiler-process and slot-wait seconds."""
    pool = getattr(env, "pool", None)
    if pool is None:
        return {}
    s = pool.statistics()
    stats = {f"compile_pool/{k}": float(v) for k, v in msgspec.to_builtins(s).items()}
    means = {"build_s_mean": s.build_s_mean, "process_s_mean": s.process_s_mean, "slot_wait_s_mean": s.slot_wait_s_mean}
    return stats | {f"compile_pool/{k}": v for k, v in means.items()}


async def _engine(cfg: TrainConfig, learner: LearnerGroup, stack: AsyncExitStack) -> tuple[Engine, list[SGLangClient]]:
    urls = list(cfg.engine.urls) if cfg.engine.kind == "sglang" else learner.urls
    clients = [
        await stack.enter_async_context(SGLangClient(SGLangClientConfig(base_url=u, retry_budget_s=120.0)))
        for u in urls
    ]
    return (clients[0] if len(clients) == 1 else Router(clients)), clients


__all__ = ["Run", "env_metrics", "lag_metrics", "lag_progress", "open_run", "pool_progress", "queue_progress",
           "resolve_tokenizer"]
