"""`cuda-agent smoke`: the quick end-to-end run of everything built so far.

Today it drives demonstration trajectories (the hand-written honest KernelBench solutions in
`rl/demos/`, written through the real tools by a scripted policy) through the real
orchestrator, chat template, tool-call parser, sandboxed workspace and trajectory store, and
prints what each tool returned. The kernel environment is the fake one: the wiring of the
compile pool and GPU queue into the agent's tools, and the learner (rejection fine-tuning on
these demonstrations, then PPO steps), are not built yet (issues 3 and 4); the run says so.

    cuda-agent smoke [--out DIR] [--demos N]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import anyio
import orjson

from agentcore import runtime
from agentcore.chat import ChatRenderer
from agentcore.kernel_env import FakeKernelEnv
from agentcore.orchestrator import Orchestrator, OrchestratorConfig, WorkItem, collect
from agentcore.rollout import RolloutConfig, RolloutRunner
from agentcore.sandbox import Sandbox, SandboxConfig
from agentcore.scripted import ScriptedEngine
from agentcore.session import WorkspaceTools
from agentcore.store import TrajectoryStore
from agentcore.tiny_tokenizer import build_tiny_tokenizer, load_tokenizer
from agentcore.toolparse import tool_schemas
from agentcore.types import Compile, Finish, Profile, ReadFile, Task, Verify, WriteFile

DEMOS = Path(__file__).resolve().parent / "demos"


def demo_tasks(limit: int) -> list[tuple[Task, dict[str, str]]]:
    """(task, solution files) for each demonstration workspace."""
    out = []
    for d in sorted(p for p in DEMOS.iterdir() if p.is_dir())[:limit]:
        files = {
            str(f.relative_to(d)): f.read_text()
            for f in sorted(d.rglob("*"))
            if f.is_file() and f.name != "model.py"
        }
        out.append((Task(task_id=d.name, source=(d / "model.py").read_text(), name=d.name), files))
    return out


def demo_script(files: dict[str, str]) -> list[tuple]:
    """The turns of a demonstration: read, write the solution, compile, verify, profile, finish."""
    writes = tuple(WriteFile(path=path, content=text) for path, text in files.items())
    return [(ReadFile(path="model.py"),), writes, (Compile(),), (Verify(),), (Profile(),), (Finish(summary="demo"),)]


async def run(out: Path, limit: int) -> dict:
    renderer = ChatRenderer(load_tokenizer(build_tiny_tokenizer(out / "tokenizer")), tool_schemas(), "hermes")
    demos = demo_tasks(limit)
    scripts = {task.task_id: demo_script(files) for task, files in demos}

    def script(session: str, turn: int) -> str:
        turns = scripts[session.split("/", 1)[0]]
        return renderer.parser.render_turn(f"Step {turn + 1}.", turns[min(turn, len(turns) - 1)])

    engine = ScriptedEngine(
        script=script,
        encode=lambda text: renderer.tokenizer.encode(text, add_special_tokens=False),
        end_ids=renderer.stop_token_ids[:1],
    )
    workspaces = Path(tempfile.mkdtemp(prefix="cuda-agent-smoke-"))
    workspaces.chmod(0o711)  # the sandbox's unprivileged uid must traverse it
    tools = WorkspaceTools(root=workspaces, sandbox=Sandbox(SandboxConfig()), kernel_env=FakeKernelEnv())
    runner = RolloutRunner(engine=engine, renderer=renderer, parser=renderer.parser, config=RolloutConfig(max_turns=12))
    (out / "trajectories.jsonl").unlink(missing_ok=True)
    try:
        async with TrajectoryStore(out / "trajectories.jsonl") as store:
            orch = Orchestrator(runner=runner, tools=tools, store=store, config=OrchestratorConfig(workers=4))
            groups = await collect(orch, [WorkItem(task=t, group_id=t.task_id) for t, _ in demos])
    finally:
        shutil.rmtree(workspaces, ignore_errors=True)
    return {g.task_id: _summary(g.trajectories[0]) for g in groups}


def _summary(traj) -> dict:
    results = [type(r).__name__ + ("" if getattr(r, "ok", True) else "(failed)") for t in traj.turns for r in t.results]
    return {"status": traj.status.value, "turns": len(traj.turns), "tokens": len(traj.response_ids), "results": results}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="cuda-agent smoke", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/smoke", help="run directory")
    p.add_argument("--demos", type=int, default=4, help="demonstration tasks to run")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if shutil.which("nvidia-smi") is None:
        print("cuda-agent smoke: no GPU on this machine: CPU variant with the fake kernel environment", file=sys.stderr)
    print("cuda-agent smoke: kernel tools use the fake environment and no learner runs yet (issues 3, 4)", file=sys.stderr)
    summary = runtime.run(run, out, args.demos)
    for task_id, s in summary.items():
        print(f"{task_id:40s} {s['status']:12s} turns={s['turns']:2d} tokens={s['tokens']:6d} {' '.join(s['results'])}")
    (out / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    return 0 if all(s["status"] == "completed" for s in summary.values()) else 1
