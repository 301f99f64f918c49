"""`run_benchmark(config)`: the agent (or a replayed solution set) on KernelBench, one record per
problem in `OUT/records.jsonl`.

    problems.jsonl ─► selection (levels; level 4 skipped) ─► not yet in records.jsonl
        │
        ▼  orchestrator (agentcore): one WorkItem per problem, `samples` trajectories each
           engine: local (embedded HF model) | sglang (servers, sticky router) | replay (scripted)
           tools: real workspace + sandbox + kernel env (compile pool, GPU queue)
           scorer: BestCandidateScorer -> FinalEvaluator on the best profiled candidate
        │
        ▼  group of trajectories ─► ProblemRecord (append + fsync) ─► records.jsonl
                          └──────► trajectories.jsonl (agentcore.store)

What it is: the runner behind `cuda-agent bench` and the checkpoint watcher. Resumable: a rerun
with the same `out_dir` (and `checkpoint_step`) skips problems that have a record, rebuilds the
records of trajectories that were stored before a kill, and redoes only the rest, problems whose
record is an infrastructure error included (their trajectories go to trajectories.redone.jsonl).
An environment error (`rewards.build.toolchain.MachineError`: the machine, not the candidate, e.g.
a torch build without CUDA headers) stops the run and records nothing for its problem. Sampling is
fixed (BenchConfig); each trajectory's seed is derived from (seed, level, problem, sample) and
recorded. Each run (and each resume) appends how it used the machine to `OUT/run_stats.jsonl`
(`bench.kernelbench.run_stats`). What it is not: the config (`.config`, re-exported here), the
metrics or the report (`bench.kernelbench.metrics`, `.report`).

Example:
    records = await run_benchmark(BenchConfig(engine="replay", replay_paths=("rl/demos",), out_dir="runs/b"))
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections import defaultdict
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import msgspec
import orjson
from msgspec import Struct

from agentcore.chat import ChatRenderer
from agentcore.engine import Engine
from agentcore.kernel_env import FakeKernelEnv, KernelEnv
from agentcore.orchestrator import Orchestrator, OrchestratorConfig, Resources, WorkItem
from agentcore.progress import show_progress
from agentcore.rollout import TURN_STRIDE, RolloutConfig, RolloutRunner
from agentcore.sandbox import Sandbox, SandboxConfig
from agentcore.session import WorkspaceTools
from agentcore.store import TrajectoryStore, set_aside
from agentcore.tiny_tokenizer import build_tiny_tokenizer, load_tokenizer
from agentcore.toolparse import tool_schemas
from agentcore.types import (
    INFRA_FAILURES,
    CompileResult,
    ProfileResult,
    Status,
    Task,
    Trajectory,
    TrajectoryGroup,
    VerifyResult,
)
from bench.kernelbench.candidates import BestCandidateScorer, CandidateTools, EnvEvaluator, Evaluator
from bench.kernelbench.config import BenchConfig, group_id, seed_of, source_label
from bench.kernelbench.problems import Problem, default_problems_path, load_problems
from bench.kernelbench.replay import Solution, find_solutions, group_of, replay_engine
from bench.kernelbench.run_stats import RUN_STATS_FILE, DepthSampler, write_run_stats
from bench.kernelbench.wrappers import write_wrappers
from bench.system.records import ProblemRecord, append_record, read_records
from rewards.build.toolchain import MachineError
from rewards.verdict import Score
from rl.pretrained import resolve_model

log = logging.getLogger("cuda-agent.bench")

INFRA_STATUSES = (Status.FAILED, Status.ENGINE_ERROR, Status.ABORTED)


class SeededEngine:
    """Gives each trajectory its own seed: base seed of (problem, sample) + the runner's turn index."""

    def __init__(self, engine: Engine, seeds: dict[tuple[str, int], int]) -> None:
        self.engine, self.seeds = engine, seeds

    async def generate(self, input_ids, params, *, session_id: str):
        group, index = group_of(session_id), int(session_id.rsplit("/", 2)[1])
        turn = (params.seed or 0) % TURN_STRIDE  # the runner's base seed is 0: its turn index
        params = msgspec.structs.replace(params, seed=self.seeds[(group, index)] + turn)
        return await self.engine.generate(input_ids, params, session_id=session_id)


def _rank(traj: Trajectory) -> tuple[bool, bool, float]:
    info = traj.reward_info
    return (traj.status not in INFRA_STATUSES, info.get("status") == "ok", info.get("speedup_vs_compile") or 0.0)


def record_of(problem: Problem, trajs: list[Trajectory], config: BenchConfig, source: str) -> ProblemRecord:
    """The problem's record from its trajectories: the best (correct first, then speedup over compile)."""
    best = max(trajs, key=_rank)
    info = best.reward_info
    common = dict(level=problem.level, problem_id=problem.problem_id, name=problem.name, source=source,
                  trajectory_id=best.trajectory_id, seed=seed_of(config, problem, best.sample_index),
                  turns=len(best.turns), candidates=int(info.get("candidates") or 0),
                  checkpoint_step=config.checkpoint_step, wall_s=best.timings.total_s, env=config.env,
                  rules=config.rules)
    if best.status in INFRA_STATUSES:
        return ProblemRecord(**common, outcome="error", error=f"{best.status.value}: {best.error or ''}"[:2000])
    if info.get("outcome") != "scored":
        return ProblemRecord(**common, outcome="no_candidate", message="the trajectory left no model_new.py")
    num = lambda k: float(info[k]) if isinstance(info.get(k), (int, float)) else None
    return ProblemRecord(
        **common, outcome="scored", correct=info.get("status") == "ok", status=str(info.get("status") or ""),
        hack=info.get("hack"), message=str(info.get("message") or "")[:500], eager_ms=num("eager_ms"),
        compile_ms=num("compile_ms"), candidate_ms=num("candidate_ms"), speedup_vs_eager=num("speedup_vs_eager"),
        speedup_vs_compile=num("speedup_vs_compile"), reward=num("reward"),
        inconclusive=bool(info.get("inconclusive")), partial=str(info.get("partial") or ""),
    )


def _bare_record(problem: Problem, config: BenchConfig, source: str, outcome: str, message: str) -> ProblemRecord:
    return ProblemRecord(level=problem.level, problem_id=problem.problem_id, name=problem.name, source=source,
                         outcome=outcome, message=message, checkpoint_step=config.checkpoint_step, env=config.env,
                         rules=config.rules)


NOT_IN_SET = "no solution in the replay set"
"""The message of a replay run's record for a selected problem its solution sets do not hold."""


class _Plan(Struct, kw_only=True):
    """What this run still has to roll out, and the records it can write without rolling out."""

    todo: list[Problem]
    direct: list[ProblemRecord]
    selected: set[tuple[int, int]]  # (level, problem_id) of every selected problem
    solutions: dict[str, Solution] = {}  # group id -> replayed solution


def plan(config: BenchConfig, out: Path) -> _Plan:
    """Select problems, drop those already recorded (but not an infrastructure error), match replay
    solutions (see module doc)."""
    selection = load_problems(config.problems_path or default_problems_path(), config.levels, config.problem_ids)
    done = {r.key for r in read_records(out / "records.jsonl") if r.outcome != "error"}
    fresh = lambda p: (p.level, p.problem_id, config.checkpoint_step) not in done
    source = source_label(config)
    direct = [_bare_record(p, config, source, "skipped", why) for p, why in selection.skipped if fresh(p)]
    todo = [p for p in selection.problems if fresh(p)]
    selected = {(p.level, p.problem_id) for p in [*selection.problems, *(p for p, _ in selection.skipped)]}
    if config.engine != "replay":
        return _Plan(todo=todo, direct=direct, selected=selected)
    found = _replay_set(config, todo, out)
    covered = [p for p in todo if (p.level, p.problem_id) in found]
    direct += [_bare_record(p, config, source, "no_candidate", NOT_IN_SET)
               for p in todo if (p.level, p.problem_id) not in found]
    solutions = {group_id(p, config): found[(p.level, p.problem_id)] for p in covered}
    return _Plan(todo=covered, direct=direct, selected=selected, solutions=solutions)


def _replay_set(config: BenchConfig, todo: list[Problem], out: Path) -> dict[tuple[int, int], Solution]:
    """The replay paths' solutions, then wrappers (written to OUT/wrappers) for what they miss."""
    found = find_solutions([Path(p) for p in config.replay_paths])
    for why in found.ignored:
        log.warning("replay: ignored %s", why)
    solutions = dict(found.solutions)
    missing = [p for p in todo if (p.level, p.problem_id) not in solutions]
    if config.replay_wrappers and missing:
        wrappers = find_solutions(write_wrappers(missing, out / "wrappers"))
        solutions |= {key: s for key, s in wrappers.solutions.items() if key not in solutions}
    return solutions


class _RecordKey(Struct):
    level: int
    problem_id: int


class _TrajectoryTask(Struct):
    task_id: str


_record_key = msgspec.json.Decoder(_RecordKey).decode
_trajectory_task = msgspec.json.Decoder(_TrajectoryTask).decode


def forget(out: Path, problems: tuple[tuple[int, int], ...]) -> int:
    """Set aside OUT's records and trajectories of `problems` ((level, problem_id)), so that the
    next run judges them again; returns how many records moved. A torn or foreign line stays."""
    keys = set(problems)
    prefixes = tuple(f"L{level}/{problem_id}_" for level, problem_id in keys)  # `Problem.task_id`s

    def record(line: bytes) -> bool:
        try:
            key = _record_key(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False
        return (key.level, key.problem_id) in keys

    def trajectory(line: bytes) -> bool:
        try:
            return _trajectory_task(line).task_id.startswith(prefixes)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False

    moved = set_aside(out / "records.jsonl", record)
    set_aside(out / "trajectories.jsonl", trajectory)
    return moved


def _cut_torn_tail(path: Path) -> None:
    """Drop bytes after the last newline (a killed append), so the next record starts a clean line."""
    if path.exists() and (data := path.read_bytes()) and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def _check_env(config: BenchConfig, out: Path) -> None:
    """Refuse to mix kernel environments in one out_dir: fake records would pass for results."""
    for path in sorted(out.glob("config*.json")):
        try:
            env = orjson.loads(path.read_bytes()).get("env", "real")
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if env != config.env:
            raise ValueError(f"{out} holds a run with --env {env} ({path.name}); write this --env {config.env} "
                             "run to another --out")


def _save_config(config: BenchConfig, out: Path) -> None:
    name = "config.json" if config.checkpoint_step is None else f"config_step{config.checkpoint_step}.json"
    (out / name).write_bytes(orjson.dumps(msgspec.to_builtins(config), option=orjson.OPT_INDENT_2))


def _renderer(config: BenchConfig, out: Path) -> ChatRenderer:
    path = config.tokenizer or config.model_path
    if not path:
        if config.engine != "replay":
            raise ValueError(f"engine {config.engine!r} needs model_path or tokenizer")
        path = str(build_tiny_tokenizer(out / "tokenizer"))
    return ChatRenderer(load_tokenizer(resolve_model(path)), tool_schemas(), config.family)


async def _open_engine(config: BenchConfig, renderer: ChatRenderer, work: _Plan,
                       stack: AsyncExitStack) -> tuple[Engine, list]:
    """The engine, opened in `stack`, and the background tasks it needs (the router's prober)."""
    if config.engine == "replay":
        return replay_engine(renderer, work.solutions, checks=config.replay_checks), []
    if config.engine == "sglang":
        from agentcore.sglang import Router, SGLangClient, SGLangClientConfig

        urls = list(config.urls) or [await _start_server(config, stack)]
        clients = [await stack.enter_async_context(SGLangClient(SGLangClientConfig(base_url=u))) for u in urls]
        if len(clients) == 1:
            return clients[0], []
        router = Router(clients)
        return router, [router.run_prober]
    from rl.engine.embedded import EmbeddedEngine, EmbeddedEngineConfig  # torch only for the local engine

    if not config.model_path:
        raise ValueError("engine local needs model_path")
    engine_config = EmbeddedEngineConfig(device=config.engine_device, max_context_tokens=config.max_context_tokens)
    engine = await anyio.to_thread.run_sync(EmbeddedEngine.from_pretrained, config.model_path, engine_config)
    return await stack.enter_async_context(engine.running()), []


async def _start_server(config: BenchConfig, stack: AsyncExitStack) -> str:
    """An SGLang server on `model_path` for the run (`config.sglang`), stopped with it; its url."""
    from agentcore.sglang import SGLangServer

    if not config.model_path:
        raise ValueError("engine sglang needs urls or a model_path to serve")
    device = config.engine_device
    gpu = int(device.split(":")[1]) if device.startswith("cuda:") else 0
    log_path = str(Path(config.out_dir) / "sglang.log")
    server = SGLangServer(config.sglang.server(str(resolve_model(config.model_path)), gpu, log_path))
    log.info("starting SGLang on %s (GPU %d; log %s)", config.model_path, gpu, log_path)
    await stack.enter_async_context(server)
    return server.base_url


async def _open_env(config: BenchConfig, stack: AsyncExitStack) -> tuple[KernelEnv, Evaluator]:
    if config.env == "fake":
        env = FakeKernelEnv()
        return env, EnvEvaluator(env)
    from rewards.env import EnvConfig, open_kernel_env
    from rewards.evaluate import FinalEvaluator

    env_config = EnvConfig(gpus=config.gpus, lanes_per_gpu=config.lanes_per_gpu, rules=config.rules)
    env = await stack.enter_async_context(open_kernel_env(env_config))
    return env, FinalEvaluator(env)


def _orchestrator_config(config: BenchConfig) -> OrchestratorConfig:
    gpu_slots = (len(config.gpus) or 8) * config.lanes_per_gpu  # the queue's lanes; more slots just wait there
    return OrchestratorConfig(workers=config.workers, model_slots=config.workers,
                              compile_slots=config.compile_slots, gpu_slots=gpu_slots)


def _rollout_config(config: BenchConfig) -> RolloutConfig:
    if config.engine == "replay":  # a script's turn holds whole files; nothing is sampled
        return RolloutConfig(max_turns=12, max_context_tokens=config.max_context_tokens,
                             max_new_tokens=config.max_context_tokens // 2, seed=0)
    return RolloutConfig(max_turns=config.max_turns, max_context_tokens=config.max_context_tokens,
                         max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                         top_p=config.top_p, seed=0)


class _Recorder:
    """Turns finished groups into records (append + fsync), once per problem."""

    def __init__(self, config: BenchConfig, out: Path, work: _Plan, problems: dict[str, Problem]) -> None:
        self.config, self.path, self.work, self.problems = config, out / "records.jsonl", work, problems
        self.written: set[str] = set()

    def group(self, gid: str, trajs: list[Trajectory]) -> None:
        if gid in self.written or gid not in self.problems:
            return
        record = record_of(self.problems[gid], trajs, self.config, source_label(self.config))
        append_record(self.path, record)
        self.written.add(gid)

    def recover(self, stored: list[Trajectory]) -> None:
        """Records of groups stored complete before a kill, whose record was never written."""
        groups: dict[str, list[Trajectory]] = defaultdict(list)
        for traj in stored:
            groups[traj.group_id].append(traj)
        for gid, trajs in groups.items():
            if len({t.sample_index for t in trajs}) >= self.config.samples:
                self.group(gid, trajs)


async def run_benchmark(config: BenchConfig, *, kernel_env: KernelEnv | None = None,
                        evaluator: Evaluator | None = None) -> list[ProblemRecord]:
    """Run (or resume) the benchmark; returns this checkpoint's records of the selected problems.
    `kernel_env` and `evaluator` replace the configured environment (tests fake the GPU edge)."""
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_env(config, out)
    _save_config(config, out)
    _cut_torn_tail(out / "records.jsonl")
    if config.redo:
        await anyio.to_thread.run_sync(forget, out, config.redo)
    work = plan(config, out)
    for record in work.direct:
        append_record(out / "records.jsonl", record)
    skipped = [r for r in work.direct if r.outcome == "skipped"]
    if skipped:
        log.warning("%s (%d problems)", skipped[0].message, len(skipped))
    if work.todo:
        await _roll_out(config, out, work, kernel_env, evaluator)
    records = [r for r in read_records(out / "records.jsonl")
               if r.checkpoint_step == config.checkpoint_step and (r.level, r.problem_id) in work.selected]
    return sorted(records, key=lambda r: (r.level, r.problem_id))


async def _roll_out(config: BenchConfig, out: Path, work: _Plan, kernel_env: KernelEnv | None,
                    evaluator: Evaluator | None) -> None:
    renderer = await anyio.to_thread.run_sync(_renderer, config, out)
    problems = {group_id(p, config): p for p in work.todo}
    seeds = {(g, i): seed_of(config, p, i) for g, p in problems.items() for i in range(config.samples)}
    recorder = _Recorder(config, out, work, problems)
    workspaces = Path(tempfile.mkdtemp(prefix="cuda-agent-ws-")) if not config.keep_workspaces else out / "workspaces"
    workspaces.mkdir(parents=True, exist_ok=True)
    workspaces.chmod(0o711)  # the sandbox's unprivileged uid must traverse it
    watch = MachineWatch()
    try:
        async with AsyncExitStack() as stack:  # env, engine, store: opened first, closed last
            if kernel_env is None:
                kernel_env, default_evaluator = await _open_env(config, stack)
                evaluator = evaluator or default_evaluator
            queue = getattr(kernel_env, "queue", None)  # rewards.env.RewardsKernelEnv's GpuQueue (None: fake env)
            kernel_env, evaluator = watch.wrap(kernel_env), watch.wrap(evaluator or EnvEvaluator(kernel_env))
            engine, background = await _open_engine(config, renderer, work, stack)
            store = await stack.enter_async_context(TrajectoryStore(out / "trajectories.jsonl", redo=INFRA_FAILURES))
            recorder.recover(store.existing())
            items = [WorkItem(task=p.task, group_id=g, samples=config.samples)
                     for g, p in problems.items() if g not in recorder.written]
            resources = Resources(_orchestrator_config(config))
            tools = CandidateTools(WorkspaceTools(root=workspaces, sandbox=Sandbox(SandboxConfig(
                allow_unsandboxed=config.allow_unsandboxed)), kernel_env=resources.kernel_env(kernel_env),
                keep_workspaces=config.keep_workspaces))
            runner = RolloutRunner(engine=SeededEngine(engine, seeds), renderer=renderer, parser=renderer.parser,
                                   config=_rollout_config(config))
            orch = Orchestrator(runner=runner, tools=tools, config=_orchestrator_config(config),
                                resources=resources, store=store,
                                scorer=BestCandidateScorer(evaluator, tools))
            depth = DepthSampler(queue) if queue is not None else None
            started = time.monotonic()
            await _drive(orch, items, recorder, [*background, *([depth.run] if depth else [])], config, watch)
            write_run_stats(out / RUN_STATS_FILE, wall_s=time.monotonic() - started, problems=len(recorder.written),
                            checkpoint_step=config.checkpoint_step, orchestrator=orch, queue=queue, depth=depth)
    finally:
        if not config.keep_workspaces:
            shutil.rmtree(workspaces, ignore_errors=True)


async def _drive(orch: Orchestrator, items: list[WorkItem], recorder: _Recorder, background: list,
                 config: BenchConfig, watch: MachineWatch) -> None:
    """Run the orchestrator to the end, recording each finished group; the first environment
    error stops it and is raised, with no record for the problems it failed."""
    send, recv = anyio.create_memory_object_stream[TrajectoryGroup](16)
    async with anyio.create_task_group() as tg:
        for task in background:
            tg.start_soon(task)
        if config.progress:
            tg.start_soon(show_progress, orch.statistics, len(items) * config.samples)
        tg.start_soon(watch.cancel_on_error, tg.cancel_scope)
        tg.start_soon(orch.run, items, send)
        async with recv:
            async for group in recv:
                if watch.error is None or not all(t.status in INFRA_STATUSES for t in group.trajectories):
                    recorder.group(group.group_id, group.trajectories)
        tg.cancel_scope.cancel()  # the run is over: stop the progress line, the prober, the sampler
    if watch.error is not None:
        raise watch.error


class MachineWatch:
    """Notes the first MachineError that the kernel env or the evaluator raises (the orchestrator
    turns it into a FAILED trajectory) and cancels the run on it.

    Example:
        watch = MachineWatch()
        env, evaluator = watch.wrap(env), watch.wrap(evaluator)
        tg.start_soon(watch.cancel_on_error, tg.cancel_scope)
    """

    def __init__(self) -> None:
        self.error: MachineError | None = None
        self._raised = anyio.Event()

    def wrap(self, inner: KernelEnv | Evaluator) -> _Watched:
        return _Watched(inner, self)

    async def cancel_on_error(self, scope: anyio.CancelScope) -> None:
        await self._raised.wait()
        scope.cancel()

    def note(self, exc: MachineError) -> None:
        if self.error is None:
            self.error = exc
            self._raised.set()


class _Watched:
    """A KernelEnv or Evaluator whose MachineError reaches its watch on the way out."""

    def __init__(self, inner: KernelEnv | Evaluator, watch: MachineWatch) -> None:
        self.inner, self.watch = inner, watch

    async def _call(self, name: str, workspace: Path, task: Task):
        try:
            return await getattr(self.inner, name)(workspace, task)
        except MachineError as exc:
            self.watch.note(exc)
            raise

    async def compile(self, workspace: Path, task: Task) -> CompileResult:
        return await self._call("compile", workspace, task)

    async def verify(self, workspace: Path, task: Task) -> VerifyResult:
        return await self._call("verify", workspace, task)

    async def profile(self, workspace: Path, task: Task) -> ProfileResult:
        return await self._call("profile", workspace, task)

    async def evaluate(self, workspace: Path, task: Task) -> Score:
        return await self._call("evaluate", workspace, task)


__all__ = ["BenchConfig", "MachineWatch", "SeededEngine", "group_id", "plan", "record_of", "run_benchmark", "seed_of", "source_label"]
