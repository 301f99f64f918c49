"""Demonstration trajectories: hand-written correct CUDA solutions driven through the real tools.

What it is: the bundled KernelBench-style tasks in `rl/demos/` (each a `model.py` plus an
honest solution), and a scripted policy (`agentcore.scripted.ScriptedEngine`) that, per task,
reads model.py, writes the solution files, compiles, verifies, profiles and finishes - rendered
in the model's own tool-call format, so that rejection fine-tuning on them teaches a model the
tool format and the workflow of SKILL.md.
What it is not: a source of reward: the trajectories are scored by the run's scorer like any
other, and only those it rewards are kept.

Example:
    tasks = demo_tasks(limit=4)
    engine = demo_engine(renderer, tasks)
"""

from __future__ import annotations

from pathlib import Path

from agentcore.chat import ChatRenderer
from agentcore.scripted import ScriptedEngine
from agentcore.types import Compile, Finish, Profile, ReadFile, Task, Verify, WriteFile

DEMOS = Path(__file__).resolve().parent / "demos"


class DemoTask:
    """A task and the files of its honest solution."""

    def __init__(self, task: Task, files: dict[str, str]) -> None:
        self.task, self.files = task, files


def demo_tasks(limit: int | None = None, names: tuple[str, ...] = ()) -> list[DemoTask]:
    dirs = sorted(p for p in DEMOS.iterdir() if p.is_dir() and (p / "model.py").exists())
    if names:
        unknown = set(names) - {d.name for d in dirs}
        if unknown:
            raise ValueError(f"unknown demonstrations {sorted(unknown)}; have {[d.name for d in dirs]}")
        dirs = [d for d in dirs if d.name in names]
    out = []
    for d in dirs[:limit]:
        files = {
            str(f.relative_to(d)): f.read_text()
            for f in sorted(d.rglob("*"))
            if f.is_file() and f.name != "model.py" and "__pycache__" not in f.parts
        }
        out.append(DemoTask(Task(task_id=d.name, source=(d / "model.py").read_text(), name=d.name), files))
    return out


def demo_script(files: dict[str, str], *, profile: bool = True) -> list[tuple]:
    """The turns of a demonstration: read, write the solution, compile, verify, profile (unless
    `profile` is off), finish."""
    writes = tuple(WriteFile(path=path, content=text) for path, text in files.items())
    timed = [(Profile(),)] if profile else []
    return [(ReadFile(path="model.py"),), writes, (Compile(),), (Verify(),), *timed, (Finish(summary="done"),)]


def demo_engine(renderer: ChatRenderer, demos: list[DemoTask], *, profile: bool = True) -> ScriptedEngine:
    """A policy that plays each demo task's script; sessions are `task_id/...` (the orchestrator's).
    `profile` off: no profile turn. A profile job has its GPU alone and its first call per task
    times both baselines, torch.compile's build included, so 66 untimed teachers would spend most
    of their collection waiting on profiles nothing learns from."""
    scripts = {d.task.task_id: demo_script(d.files, profile=profile) for d in demos}
    notes = ["Reading the reference.", "Writing kernels, bindings and model_new.py.", "Compiling.",
             "Verifying.", *(["Profiling."] if profile else []), "Done."]

    def script(session: str, turn: int) -> str:
        turns = scripts[session.split("/", 1)[0]]
        i = min(turn, len(turns) - 1)
        return renderer.parser.render_turn(notes[i], turns[i])

    return ScriptedEngine(
        script=script,
        encode=lambda text: renderer.tokenizer.encode(text, add_special_tokens=False),
        end_ids=renderer.stop_token_ids[:1],
    )
