"""`cuda-agent rollout`: run the agent over a task file against SGLang and store trajectories.

    cuda-agent rollout --tasks problems.jsonl --engine sglang --url http://127.0.0.1:30000 \
        --tokenizer /models/qwen --out runs/r1

Writes `OUT/trajectories.jsonl` (appended as trajectories finish; a rerun with the same OUT
resumes and skips what is stored) and `OUT/config.json` (the resolved configuration). Several
`--url`s are served through the sticky router. `--launch MODEL` starts a managed SGLang server
instead. `--env fake` uses the fake kernel environment (no GPU); `--env real` the rewards
package's compile pool and GPU queue. Ctrl-C stops cleanly: running sandboxes and servers are
killed, finished trajectories are kept, unfinished ones are redone on the next run.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import msgspec
import orjson
from msgspec import Struct

from agentcore import runtime
from agentcore.chat import ChatRenderer
from agentcore.kernel_env import FakeKernelEnv, KernelEnv
from agentcore.orchestrator import Orchestrator, OrchestratorConfig, Resources, WorkItem
from agentcore.progress import show_progress
from agentcore.rollout import RolloutConfig, RolloutRunner
from agentcore.sandbox import Sandbox, SandboxConfig
from agentcore.session import WorkspaceTools
from agentcore.sglang import Router, SGLangClient, SGLangClientConfig, SGLangServer, SGLangServerConfig
from agentcore.store import TrajectoryStore
from agentcore.tasks import load_tasks
from agentcore.tiny_tokenizer import load_tokenizer
from agentcore.toolparse import tool_schemas
from agentcore.types import Status, TrajectoryGroup

log = logging.getLogger("cuda-agent.rollout")

# Where `--env real` comes from: the rewards package implements agentcore's KernelEnv.
REAL_ENV = "rewards.env:open_kernel_env"


class RolloutJob(Struct, frozen=True, kw_only=True):
    """Everything `cuda-agent rollout` runs with; saved as OUT/config.json."""

    tasks: str
    out: str
    urls: tuple[str, ...] = ()
    launch_model: str | None = None
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


def parse_args(argv: list[str]) -> RolloutJob:
    p = argparse.ArgumentParser(prog="cuda-agent rollout", description=__doc__.split("\n")[0])
    p.add_argument("--tasks", required=True, help="JSON lines, a problem .py, or a directory")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--engine", choices=["sglang"], default="sglang")
    p.add_argument("--url", action="append", default=[], help="SGLang server URL (repeatable)")
    p.add_argument("--launch", metavar="MODEL", help="start a managed SGLang server for MODEL")
    p.add_argument("--tokenizer", help="tokenizer directory (default: the launched model)")
    p.add_argument("--family", default="hermes", help="tool-call format: hermes, qwen3_coder")
    p.add_argument("--env", choices=["fake", "real"], default="fake")
    p.add_argument("--samples", type=int, default=1, help="trajectories per task")
    p.add_argument("--levels", default="", help="keep only these KernelBench levels, e.g. 1,2")
    p.add_argument("--workers", type=int, default=256, help="concurrent trajectories")
    p.add_argument("--max-turns", type=int, default=150)
    p.add_argument("--max-context-tokens", type=int, default=131072)
    p.add_argument("--max-new-tokens", type=int, default=8192)
    p.add_argument("--retry-budget-s", type=float, default=300.0, help="give up on a dead server after this")
    p.add_argument("--keep-workspaces", action="store_true")
    p.add_argument("--allow-unsandboxed", action="store_true", help="run bash without bwrap")
    a = p.parse_args(argv)
    if not a.url and not a.launch:
        p.error("give --url (a running SGLang server) or --launch MODEL")
    tokenizer = a.tokenizer or a.launch
    if not tokenizer:
        p.error("--tokenizer is required with --url (servers run with --skip-tokenizer-init)")
    return RolloutJob(
        tasks=a.tasks,
        out=a.out,
        urls=tuple(a.url),
        launch_model=a.launch,
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
        client=SGLangClientConfig(retry_budget_s=a.retry_budget_s),
        keep_workspaces=a.keep_workspaces,
    )


async def _engine(job: RolloutJob, stack: AsyncExitStack, tg):
    urls = list(job.urls)
    if job.launch_model:
        server = await stack.enter_async_context(
            SGLangServer(SGLangServerConfig(model_path=job.launch_model, port=30000))
        )
        urls.append(server.base_url)
    clients = [
        await stack.enter_async_context(SGLangClient(msgspec.structs.replace(job.client, base_url=u))) for u in urls
    ]
    if len(clients) == 1:
        return clients[0]
    router = Router(clients)
    tg.start_soon(router.run_prober)
    return router


async def _kernel_env(job: RolloutJob, stack: AsyncExitStack) -> KernelEnv:
    if job.env == "fake":
        return FakeKernelEnv()
    module, func = REAL_ENV.split(":")
    try:
        factory = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"--env real needs {REAL_ENV}, which is not available: {exc}") from None
    return await stack.enter_async_context(factory())


async def run_job(job: RolloutJob) -> dict[str, int]:
    out = Path(job.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_bytes(orjson.dumps(msgspec.to_builtins(job), option=orjson.OPT_INDENT_2))
    tasks, problems = load_tasks(job.tasks, levels=set(job.levels) or None)
    for problem in problems:
        log.error("skipping task: %s", problem)
    if not tasks:
        raise SystemExit(f"no usable tasks in {job.tasks}")
    tokenizer = load_tokenizer(job.tokenizer)
    renderer = ChatRenderer(tokenizer, tool_schemas(), job.family)
    totals: dict[str, int] = {}
    resources = Resources(job.orchestrator)
    async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
        tg.start_soon(_stop_on_signal, tg.cancel_scope)
        engine = await _engine(job, stack, tg)
        env = resources.kernel_env(await _kernel_env(job, stack))
        store = await stack.enter_async_context(TrajectoryStore(out / "trajectories.jsonl"))
        tools = WorkspaceTools(
            root=out / "workspaces",
            sandbox=Sandbox(job.sandbox),
            kernel_env=env,
            keep_workspaces=job.keep_workspaces,
        )
        runner = RolloutRunner(engine=engine, renderer=renderer, parser=renderer.parser, config=job.rollout)
        orch = Orchestrator(runner=runner, tools=tools, config=job.orchestrator, resources=resources, store=store)
        items = [WorkItem(task=t, group_id=t.task_id, samples=job.samples) for t in tasks]
        total = len(items) * job.samples - len(store.keys())
        send, recv = anyio.create_memory_object_stream[TrajectoryGroup](16)
        tg.start_soon(show_progress, orch.statistics, total)
        tg.start_soon(orch.run, items, send)
        async with recv:
            async for group in recv:
                for t in group.trajectories:
                    totals[t.status.value] = totals.get(t.status.value, 0) + 1
        tg.cancel_scope.cancel()  # the run is over: stop the progress line and signal watcher
    return totals


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            print(f"\ncuda-agent rollout: {signal.Signals(signum).name}, stopping", file=sys.stderr)
            scope.cancel()
            return


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    job = parse_args(argv)
    try:
        totals = runtime.run(run_job, job)
    except (FileNotFoundError, NotADirectoryError) as exc:
        print(f"cuda-agent rollout: {exc}", file=sys.stderr)
        return 2
    print(orjson.dumps({"statuses": totals, "out": job.out}).decode())
    failed = totals.get(Status.FAILED.value, 0)
    return 1 if failed and failed == sum(totals.values()) else 0
