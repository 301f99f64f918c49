"""`cuda-agent rollout`: run the agent over a task file and store its trajectories.

    cuda-agent rollout --tasks problems.jsonl --url http://127.0.0.1:30000 --tokenizer /models/qwen --out runs/r1
    cuda-agent rollout --tasks problems.jsonl --engine local --model /models/qwen --out runs/r1

`--engine sglang` talks to SGLang servers (`--url`, repeatable, through the sticky router; or
`--launch MODEL` starts one); `--engine local` generates in this process with the project's
embedded engine (`rl.engine`: small models, no server). `--env fake` uses the fake kernel tools
(no GPU); `--env real` the rewards package's compile pool and GPU queue. Writes
`OUT/trajectories.jsonl` (appended as trajectories finish) and `OUT/config.json`. A rerun with the
same OUT resumes: it keeps trajectories the model ended and reruns those that ended in an
infrastructure failure (`INFRA_FAILURES`; the old records go to `trajectories.redone.jsonl`).
Exit status 1, with the cause on stderr, when no server answers within `--retry-budget-s` or
every trajectory ended in an infrastructure failure. Ctrl-C stops cleanly: sandboxes and servers
are killed, finished trajectories kept, unfinished ones redone on the next run.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import msgspec
import orjson
from msgspec import Struct

from agentcore import runtime
from agentcore.chat import ChatRenderer
from agentcore.cli import HelpFormatter, UsageError, checked_dir, checked_url
from agentcore.engine import Engine, EngineError, SamplingParams
from agentcore.kernel_env import FakeKernelEnv, KernelEnv
from agentcore.orchestrator import Orchestrator, OrchestratorConfig, Resources, WorkItem
from agentcore.progress import show_progress
from agentcore.rollout import RolloutConfig, RolloutRunner
from agentcore.sandbox import Sandbox, SandboxConfig
from agentcore.session import WorkspaceTools
from agentcore.sglang import (
    RequestRejected,
    Router,
    SGLangClient,
    SGLangClientConfig,
    SGLangServer,
    SGLangServerConfig,
)
from agentcore.signals import stop_on_signal
from agentcore.store import TrajectoryStore
from agentcore.tasks import load_tasks
from agentcore.tiny_tokenizer import load_tokenizer
from agentcore.toolparse import tool_schemas
from agentcore.types import INFRA_FAILURES, Status, Trajectory, TrajectoryGroup

log = logging.getLogger("cuda-agent.rollout")

# Implementations from higher layers, loaded by name only when asked for (agentcore imports
# neither rewards nor rl): `--env real` is the rewards package's KernelEnv, `--engine local` the
# rl package's embedded engine (it imports torch).
REAL_ENV = "rewards.env:open_kernel_env"
LOCAL_ENGINE = "rl.engine.embedded"  # EmbeddedEngine, EmbeddedEngineConfig

WAIT_NOTICE_S = 2.0
"""Say that the command waits for a model server once it has waited this long."""


class RolloutJob(Struct, frozen=True, kw_only=True):
    """Everything `cuda-agent rollout` runs with; saved as OUT/config.json."""

    tasks: str
    out: str
    engine: str = "sglang"
    urls: tuple[str, ...] = ()
    launch_model: str | None = None
    model: str | None = None
    engine_device: str = "auto"
    tokenizer: str = ""
    family: str = "hermes"
    env: str = "fake"
    samples: int = 1
    levels: tuple[int, ...] = ()
    rollout: RolloutConfig = RolloutConfig()
    orchestrator: OrchestratorConfig = OrchestratorConfig()
    sandbox: SandboxConfig = SandboxConfig()
    client: SGLangClientConfig = SGLangClientConfig()
    keep_workspaces: bool = False


class RolloutOutcome(Struct, frozen=True, kw_only=True):
    """What a run did: statuses of the groups it finished (earlier runs' members included), of
    the trajectories it ran itself, and the first infrastructure failure among those, one line."""

    statuses: dict[str, int]
    this_run: dict[str, int]
    cause: str = ""


class EngineUnreachable(RuntimeError):
    """No model server answered within the retry budget."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cuda-agent rollout", description=__doc__.split("\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--tasks", required=True, metavar="FILE", help="JSON lines, a problem .py, or a directory")
    p.add_argument("--out", required=True, metavar="DIR", help="run directory (a rerun with the same OUT resumes)")
    p.add_argument("--engine", choices=["sglang", "local"], default="sglang",
                   help="sglang: SGLang servers (--url or --launch); local: the embedded engine on --model, "
                        "in this process")
    p.add_argument("--url", action="append", default=[], help="SGLang server URL (repeatable)")
    p.add_argument("--launch", metavar="MODEL", help="start a managed SGLang server for MODEL")
    p.add_argument("--model", metavar="DIR", help="Hugging Face model directory for --engine local")
    p.add_argument("--engine-device", default="auto", metavar="DEVICE",
                   help="where --engine local runs: auto, cpu, cuda, cuda:1")
    p.add_argument("--tokenizer", metavar="DIR", help="tokenizer directory (default: --model or --launch)")
    p.add_argument("--family", default="hermes", metavar="NAME", help="tool-call format: hermes, qwen3_coder")
    p.add_argument("--env", choices=["fake", "real"], default="fake",
                   help="kernel tools: fake (no GPU, a plumbing check) or real (compile pool and GPU queue)")
    p.add_argument("--samples", type=int, default=1, metavar="N", help="trajectories per task")
    p.add_argument("--levels", default="", metavar="LIST",
                   help="keep only these KernelBench levels, e.g. 1,2 (default: all)")
    p.add_argument("--workers", type=int, default=256, metavar="N", help="concurrent trajectories")
    p.add_argument("--max-turns", type=int, default=150, metavar="N", help="model turns per trajectory")
    p.add_argument("--max-context-tokens", type=int, default=131072, metavar="N",
                   help="tokens per trajectory, prompt included")
    p.add_argument("--max-new-tokens", type=int, default=8192, metavar="N", help="tokens per model turn")
    p.add_argument("--retry-budget-s", type=float, default=300.0, metavar="S",
                   help="seconds to keep retrying a model server that does not answer before giving up on it")
    p.add_argument("--keep-workspaces", action="store_true", help="keep each trajectory's workspace in OUT/workspaces")
    p.add_argument("--allow-unsandboxed", action="store_true", help="run bash without bwrap")
    return p


def parse_args(argv: list[str]) -> RolloutJob:
    """The job for `argv`; argparse exits on a missing option, UsageError on a bad path or URL."""
    p = build_parser()
    a = p.parse_args(argv)
    if a.engine == "local":
        if not a.model:
            p.error("--engine local needs --model DIR (a Hugging Face model directory)")
        if a.url or a.launch:
            p.error("--url and --launch are for --engine sglang")
        checked_dir(a.model, "--model")
    else:
        if not a.url and not a.launch:
            p.error("give --url (a running SGLang server) or --launch MODEL, or use --engine local --model DIR")
        if a.model:
            p.error("--model is for --engine local (with SGLang: --launch MODEL or --tokenizer DIR)")
        for url in a.url:
            checked_url(url)
    tokenizer = a.tokenizer or a.model or a.launch
    if not tokenizer:
        p.error("--tokenizer is required with --url (servers run with --skip-tokenizer-init)")
    checked_dir(tokenizer, "--tokenizer" if a.tokenizer else "--launch")
    return RolloutJob(
        tasks=a.tasks,
        out=a.out,
        engine=a.engine,
        urls=tuple(a.url),
        launch_model=a.launch,
        model=a.model,
        engine_device=a.engine_device,
        tokenizer=tokenizer,
        family=a.family,
        env=a.env,
        samples=a.samples,
        levels=tuple(int(x) for x in a.levels.split(",") if x),
        rollout=RolloutConfig(
            max_turns=a.max_turns,
            max_context_tokens=a.max_context_tokens,
            max_new_tokens=a.max_new_tokens,
        ),
        orchestrator=OrchestratorConfig(workers=a.workers, model_slots=a.workers),
        sandbox=SandboxConfig(allow_unsandboxed=a.allow_unsandboxed),
        # The budget alone decides when a failing server is given up on, as --help says.
        client=SGLangClientConfig(retry_budget_s=a.retry_budget_s, max_retries=None),
        keep_workspaces=a.keep_workspaces,
    )


def _load(name: str, flag: str):
    """The module or `module:attr` that `name` names, or a one-line SystemExit saying what
    `flag` needs."""
    module, _, attr = name.partition(":")
    try:
        loaded = importlib.import_module(module)
        return getattr(loaded, attr) if attr else loaded
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"cuda-agent rollout: {flag} needs {name}, which is not available: {exc}") from None


async def _engine(job: RolloutJob, stack: AsyncExitStack, tg) -> Engine:
    if job.engine == "local":
        return await _local_engine(job, tg)
    urls = list(job.urls)
    if job.launch_model:
        server = await stack.enter_async_context(
            SGLangServer(SGLangServerConfig(model_path=job.launch_model, port=30000))
        )
        urls.append(server.base_url)
    clients = [
        await stack.enter_async_context(SGLangClient(msgspec.structs.replace(job.client, base_url=u))) for u in urls
    ]
    clients = await _reachable(clients, job.client.retry_budget_s)
    if len(clients) == 1:
        return clients[0]
    router = Router(clients)
    tg.start_soon(router.run_prober)
    return router


async def _local_engine(job: RolloutJob, tg) -> Engine:
    """The embedded engine on `job.model`, its scheduler serving in `tg` (cancelled at the end)."""
    embedded = _load(LOCAL_ENGINE, "--engine local")
    config = embedded.EmbeddedEngineConfig(device=job.engine_device,
                                           max_context_tokens=job.rollout.max_context_tokens)
    try:
        engine = await anyio.to_thread.run_sync(embedded.EmbeddedEngine.from_pretrained, job.model, config)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--model {job.model}: cannot load a model: {_first_line(str(exc))}") from None
    await tg.start(engine.serve)
    return engine


async def _reachable(clients: list[SGLangClient], budget_s: float) -> list[SGLangClient]:
    """The clients whose server generates a token (or refuses the request: it is up) within
    `budget_s`; EngineUnreachable if none does. Says on stderr that it waits when it does."""
    errors: dict[int, str] = {}

    async def probe(i: int, client: SGLangClient) -> None:
        try:
            await client.generate([0], SamplingParams(max_new_tokens=1), session_id="cuda-agent-rollout-probe")
        except RequestRejected:
            pass
        except EngineError as exc:
            errors[i] = str(exc)

    async def notice() -> None:
        await anyio.sleep(WAIT_NOTICE_S)
        print(f"cuda-agent rollout: waiting for the model server (giving up after {budget_s:g}s: --retry-budget-s)",
              file=sys.stderr)

    async with anyio.create_task_group() as tg:
        tg.start_soon(notice)
        async with anyio.create_task_group() as probes:
            for i, client in enumerate(clients):
                probes.start_soon(probe, i, client)
        tg.cancel_scope.cancel()
    if len(errors) == len(clients):
        raise EngineUnreachable(f"cannot reach the model server: {_first_line(errors[0])}")
    for i, error in errors.items():
        log.warning("leaving out %s, which does not answer: %s", clients[i].base_url, error)
    return [client for i, client in enumerate(clients) if i not in errors]


async def _kernel_env(job: RolloutJob, stack: AsyncExitStack) -> KernelEnv:
    if job.env == "fake":
        return FakeKernelEnv()
    return await stack.enter_async_context(_load(REAL_ENV, "--env real")())


def _tokenizer(path: str):
    try:
        return load_tokenizer(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--tokenizer {path}: not a tokenizer directory (transformers cannot load it: "
                         f"{type(exc).__name__})") from None


async def run_job(job: RolloutJob) -> RolloutOutcome:
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_bytes(orjson.dumps(msgspec.to_builtins(job), option=orjson.OPT_INDENT_2))
    tasks, problems = load_tasks(job.tasks, levels=set(job.levels) or None)
    for problem in problems:
        log.error("skipping task: %s", problem)
    if not tasks:
        raise SystemExit(f"no usable tasks in {job.tasks}")
    renderer = ChatRenderer(_tokenizer(job.tokenizer), tool_schemas(), job.family)
    statuses: dict[str, int] = {}
    this_run: dict[str, int] = {}
    cause = ""
    resources = Resources(job.orchestrator)
    async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
        tg.start_soon(stop_on_signal, tg.cancel_scope, "cuda-agent rollout")
        engine = await _engine(job, stack, tg)
        env = resources.kernel_env(await _kernel_env(job, stack))
        store = await stack.enter_async_context(
            TrajectoryStore(out / "trajectories.jsonl", redo=INFRA_FAILURES)
        )
        earlier = store.keys()
        tools = WorkspaceTools(
            root=out / "workspaces",
            sandbox=Sandbox(job.sandbox),
            kernel_env=env,
            keep_workspaces=job.keep_workspaces,
        )
        runner = RolloutRunner(engine=engine, renderer=renderer, parser=renderer.parser, config=job.rollout)
        orch = Orchestrator(runner=runner, tools=tools, config=job.orchestrator, resources=resources, store=store)
        items = [WorkItem(task=t, group_id=t.task_id, samples=job.samples) for t in tasks]
        total = len(items) * job.samples - len(earlier)
        send, recv = anyio.create_memory_object_stream[TrajectoryGroup](16)
        tg.start_soon(show_progress, orch.statistics, total)
        tg.start_soon(orch.run, items, send)
        async with recv:
            async for group in recv:
                for t in group.trajectories:
                    statuses[t.status.value] = statuses.get(t.status.value, 0) + 1
                    if (t.group_id, t.sample_index) not in earlier:
                        this_run[t.status.value] = this_run.get(t.status.value, 0) + 1
                        cause = cause or _cause(t)
        tg.cancel_scope.cancel()  # the run is over: stop the progress line and signal watcher
    return RolloutOutcome(statuses=statuses, this_run=this_run, cause=cause)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _cause(t: Trajectory) -> str:
    """An infrastructure failure in one line: an engine error's message, or the exception that
    ends a failure's traceback; "" for other endings."""
    lines = [line.strip() for line in (t.error or "").splitlines() if line.strip()]
    if t.status not in INFRA_FAILURES or not lines:
        return ""
    return lines[-1] if t.status is Status.FAILED else lines[0]


def _verdict(outcome: RolloutOutcome) -> tuple[int, str]:
    """Exit status and a line for stderr ("" when there is nothing to say): 1 when every
    trajectory this run finished ended in an infrastructure failure."""
    ran = {s: n for s, n in outcome.this_run.items() if s != Status.ABORTED.value}
    infra = {s: n for s, n in ran.items() if Status(s) in INFRA_FAILURES}
    failed, total = sum(infra.values()), sum(ran.values())
    if not failed:
        return 0, ""
    counts = ", ".join(f"{s} {n}" for s, n in sorted(infra.items()))
    share = f"all {total}" if failed == total else f"{failed} of {total}"
    line = (f"{share} trajectories ended in an infrastructure failure ({counts}): {outcome.cause}; "
            "the same command reruns them")
    return (1 if failed == total else 0), line


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        job = parse_args(argv)
        outcome = runtime.run(run_job, job)
    except (UsageError, FileNotFoundError, NotADirectoryError) as exc:
        print(f"cuda-agent rollout: {exc}", file=sys.stderr)
        return 2
    except EngineUnreachable as exc:
        print(f"cuda-agent rollout: {exc}", file=sys.stderr)
        return 1
    print(orjson.dumps({"statuses": outcome.statuses, "out": job.out}).decode())
    code, line = _verdict(outcome)
    if line:
        print(f"cuda-agent rollout: {line}", file=sys.stderr)
    return code
