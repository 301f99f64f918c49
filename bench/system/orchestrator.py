"""How much the agent runtime itself costs: `python -m bench.system.orchestrator`.

Drives N concurrent trajectories x T turns through the real orchestrator, rollout loop, chat
renderer (tiny tokenizer) and tool-call parser, with a scripted engine of fixed latency and
tools of fixed latency (`--tools fake`), or the real workspace tools with the fake kernel
environment (`--tools real`). Prints JSON:

- cpu_ms_per_turn: process CPU time (all threads) / turns         target <= 2 ms
- loop_lag_p99_ms: how late a 5 ms sleep wakes, 99th percentile    target <= 20 ms
- rss_kib_per_trajectory: peak resident memory growth / N
- wall_over_ideal: wall time / (T x engine latency + (T-1) x tool latency)   target <= 1.05
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import orjson

from agentcore import runtime
from agentcore.chat import ChatRenderer
from agentcore.kernel_env import FakeKernelEnv, FakeKernelEnvConfig
from agentcore.orchestrator import Orchestrator, OrchestratorConfig, WorkItem
from agentcore.rollout import RolloutConfig, RolloutRunner
from agentcore.sandbox import Sandbox, SandboxConfig
from agentcore.scripted import ScriptedEngine
from agentcore.session import WorkspaceTools
from agentcore.tiny_tokenizer import build_tiny_tokenizer, load_tokenizer
from agentcore.toolparse import tool_schemas
from agentcore.tools import render_result
from agentcore.types import (
    Compile,
    Finish,
    Profile,
    ReadFile,
    Task,
    ToolOutput,
    TrajectoryGroup,
    Verify,
    WriteFile,
)

SOURCE = (
    "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
    "    def forward(self, x):\n        return torch.relu(x)\n\n"
    "def get_inputs():\n    return [torch.rand(4096, 4096)]\n\n"
    "def get_init_inputs():\n    return []\n"
)
KERNEL = (
    "#include <cuda_runtime.h>\n__global__ void relu_kernel(const float* x, float* y, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;\n}\n"
    'extern "C" void relu_launch(const float* x, float* y, int n, cudaStream_t s) {\n'
    "  relu_kernel<<<(n + 255) / 256, 256, 0, s>>>(x, y, n);\n}\n"
)
THOUGHT = (
    "The reference applies an elementwise ReLU over a 4096x4096 float tensor. A grid-stride "
    "kernel with vectorized float4 loads should saturate memory bandwidth; next I check it. "
)
CYCLE = (
    ReadFile(path="model.py"),
    WriteFile(path="kernels/relu.cu", content=KERNEL),
    Compile(),
    Verify(),
    Profile(),
)
TOOL_TEXT = "ok\n" + "line of tool output with some numbers 0.123 ms\n" * 12


class FakeTools:
    """Tools with a fixed latency and canned output (the orchestrator's overhead alone)."""

    def __init__(self, latency_s: float):
        self.latency_s = latency_s

    @asynccontextmanager
    async def open(self, task: Task, trajectory_id: str):
        yield self

    async def run(self, call):
        await anyio.sleep(self.latency_s)
        return ToolOutput(text=TOOL_TEXT)

    def render(self, result) -> str:
        return render_result(result)


class LagMonitor:
    """Samples event-loop lag (late wake-ups of a short sleep) and peak RSS."""

    def __init__(self, interval_s: float = 0.005):
        self.interval_s, self.lags_ms, self.peak_rss = interval_s, [], _rss()

    async def run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await anyio.sleep(self.interval_s)
            self.lags_ms.append((time.perf_counter() - t0 - self.interval_s) * 1e3)
            if len(self.lags_ms) % 20 == 0:
                self.peak_rss = max(self.peak_rss, _rss())


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def make_script(parser, turns: int):
    def script(session: str, turn: int) -> str:
        if turn >= turns - 1:
            return parser.render_turn("All checks pass.", (Finish(summary="done"),))
        return parser.render_turn(THOUGHT, (CYCLE[turn % len(CYCLE)],))

    return script


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def run(args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-orch-"))
    tmp.chmod(0o711)
    renderer = ChatRenderer(load_tokenizer(build_tiny_tokenizer(tmp / "tok")), tool_schemas(), "hermes")
    engine = ScriptedEngine(
        script=make_script(renderer.parser, args.turns),
        encode=lambda text: renderer.tokenizer.encode(text, add_special_tokens=False),
        end_ids=renderer.stop_token_ids[:1],
        latency_s=args.latency_s,
        logprob=-0.5,
    )
    if args.tools == "fake":
        tools = FakeTools(args.tool_latency_s)
    else:
        env = FakeKernelEnv(FakeKernelEnvConfig(latency_s=args.tool_latency_s))
        tools = WorkspaceTools(root=tmp / "ws", sandbox=Sandbox(SandboxConfig()), kernel_env=env)
    n = args.trajectories
    orch = Orchestrator(
        runner=RolloutRunner(engine=engine, renderer=renderer, parser=renderer.parser, config=RolloutConfig(max_turns=args.turns + 1)),
        tools=tools,
        config=OrchestratorConfig(workers=n, model_slots=n, compile_slots=n, gpu_slots=n),
    )
    task = Task(task_id="relu", source=SOURCE)
    items = [WorkItem(task=task, group_id=f"g{i}", samples=1) for i in range(n)]
    monitor = LagMonitor()
    rss0, cpu0, t0 = _rss(), _cpu_s(), time.perf_counter()
    statuses: dict[str, int] = {}
    send, recv = anyio.create_memory_object_stream[TrajectoryGroup](n)
    async with anyio.create_task_group() as tg:
        tg.start_soon(monitor.run)
        tg.start_soon(orch.run, items, send)
        async with recv:
            async for group in recv:
                for t in group.trajectories:
                    statuses[t.status.value] = statuses.get(t.status.value, 0) + 1
        tg.cancel_scope.cancel()
    wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    turns = orch.statistics().turns
    ideal = args.turns * args.latency_s + (args.turns - 1) * args.tool_latency_s
    return {
        "trajectories": n,
        "turns_per_trajectory": args.turns,
        "turns": turns,
        "statuses": statuses,
        "tools": args.tools,
        "engine_latency_s": args.latency_s,
        "tool_latency_s": args.tool_latency_s,
        "wall_s": round(wall, 3),
        "ideal_wall_s": round(ideal, 3),
        "wall_over_ideal": round(wall / ideal, 4),
        "cpu_ms_per_turn": round(cpu * 1e3 / max(turns, 1), 4),
        "loop_lag_p50_ms": round(statistics.median(monitor.lags_ms), 3),
        "loop_lag_p99_ms": round(_percentile(monitor.lags_ms, 0.99), 3),
        "loop_lag_max_ms": round(max(monitor.lags_ms), 3),
        "rss_kib_per_trajectory": round((monitor.peak_rss - rss0) / 1024 / n, 1),
        "generated_tokens": orch.statistics().generated_tokens,
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
        "event_loop": "uvloop",
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.system.orchestrator", description=__doc__.split("\n")[0])
    p.add_argument("--trajectories", type=int, default=512)
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--latency-s", type=float, default=1.0, help="engine latency per turn")
    p.add_argument("--tool-latency-s", type=float, default=0.1, help="latency of each tool call")
    p.add_argument("--tools", choices=["fake", "real"], default="fake")
    args = p.parse_args(argv)
    result = runtime.run(run, args)
    sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")


if __name__ == "__main__":
    main()
