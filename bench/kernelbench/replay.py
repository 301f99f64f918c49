"""The replay policy: given solutions submitted through the agent's own tools, without an LLM.

What it is: `find_solutions(paths)` reads a solution set - our workspaces (a directory holding
model_new.py + kernels/<name>.cu + kernels/<name>_binding.cpp, named `l<level>_<id>_<name>` as
in rl/demos, or `level<N>/<id>_<name>/`), or KernelBench single-file solutions named by level and
problem (`level1/19_ReLU.py`, or KernelBench's `level_1_problem_19_sample_0_kernel.py`), which
are written as model_new.py alone and evaluated in load_inline mode. `replay_engine` is an
`agentcore.scripted.ScriptedEngine` that, per trajectory, reads model.py, writes the files,
compiles, verifies, profiles and finishes - rendered in the tool-call format of the run's
renderer, so the real parser, tools and evaluator see exactly what a model's turns would give.
What it is not: a judge. Whatever the set claims, the run's final evaluation decides.

Example:
    found = find_solutions([Path("rl/demos")])
    engine = replay_engine(renderer, {"L1/19_ReLU@replay": found.solutions[(1, 19)]})
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from msgspec import Struct

from agentcore.chat import ChatRenderer
from agentcore.scripted import ScriptedEngine
from agentcore.types import Compile, Finish, Profile, ReadFile, ToolCall, Verify, WriteFile
from rewards.evaluate import solution_files

Key = tuple[int, int]  # (level, problem_id)

_OUR_DIR = re.compile(r"^l(\d+)_(\d+)(?:_|$)")
_LEVEL_DIR = re.compile(r"^level_?(\d+)$")
_ID_STEM = re.compile(r"^(\d+)(?:_|$)")
_KB_FILE = re.compile(r"^level_(\d+)_problem_(\d+)(?:_|\.)")
NOT_SOLUTIONS = {"model.py", "model_new.py", "__init__.py"}


class Solution(Struct, frozen=True, kw_only=True):
    """The files one replayed trajectory writes for one problem."""

    level: int
    problem_id: int
    kind: Literal["workspace", "single_file"]
    path: str
    """Where it came from."""
    files: dict[str, str]
    """Relative path in the workspace -> text."""


class Found(Struct, frozen=True, kw_only=True):
    solutions: dict[Key, Solution]
    ignored: tuple[str, ...] = ()
    """Paths that looked like solutions but were not used (duplicates, unreadable), with why."""


def _key_of(path: Path) -> Key | None:
    """(level, problem_id) from a solution's path name, or None."""
    if m := _OUR_DIR.match(path.name):
        return int(m[1]), int(m[2])
    if m := _KB_FILE.match(path.name):
        return int(m[1]), int(m[2])
    stem = path.stem if path.is_file() else path.name
    if (m := _ID_STEM.match(stem)) and (lv := _LEVEL_DIR.match(path.parent.name)):
        return int(lv[1]), int(m[1])
    return None


def _workspace(path: Path, key: Key) -> Solution:
    files = {rel: data.decode("utf-8", "replace") for rel, data in solution_files(path).items()}
    return Solution(level=key[0], problem_id=key[1], kind="workspace", path=str(path), files=files)


def _single_file(path: Path, key: Key) -> Solution:
    return Solution(level=key[0], problem_id=key[1], kind="single_file", path=str(path),
                    files={"model_new.py": path.read_text(errors="replace")})


def _candidates(root: Path):
    """(path, kind) of every workspace directory and single-file solution under root, sorted."""
    if (root / "model_new.py").is_file():
        yield root, "workspace"
        return
    for path in sorted(root.rglob("*")):
        if path.is_dir() and (path / "model_new.py").is_file():
            yield path, "workspace"
        elif path.is_file() and path.suffix == ".py" and path.name not in NOT_SOLUTIONS:
            if not (path.parent / "model_new.py").exists():  # a workspace's own helper files
                yield path, "single_file"


def find_solutions(paths: list[Path] | tuple[Path, ...]) -> Found:
    """Every solution under `paths`; for a problem found twice the first (in `paths` order, then
    sorted path order) wins and the rest are listed in `ignored`."""
    solutions: dict[Key, Solution] = {}
    ignored: list[str] = []
    for root in map(Path, paths):
        if not root.exists():
            raise FileNotFoundError(f"replay path not found: {root}")
        for path, kind in _candidates(root):
            key = _key_of(path)
            if key is None:
                if kind == "workspace":
                    ignored.append(f"{path}: name does not say level and problem (l<level>_<id>_...)")
                continue
            if key in solutions:
                ignored.append(f"{path}: level {key[0]} problem {key[1]} already from {solutions[key].path}")
                continue
            solutions[key] = (_workspace if kind == "workspace" else _single_file)(path, key)
    return Found(solutions=solutions, ignored=tuple(ignored))


def replay_turns(solution: Solution, *, checks: bool = True) -> list[tuple[ToolCall, ...]]:
    """Read the reference, write the files, compile, (verify, profile,) finish."""
    writes = tuple(WriteFile(path=p, content=t) for p, t in solution.files.items())
    middle = [(Compile(),), (Verify(),), (Profile(),)] if checks else [(Compile(),)]
    return [(ReadFile(path="model.py"),), writes, *middle, (Finish(summary=f"replayed {solution.path}"),)]


def group_of(session_id: str) -> str:
    """The group id of an orchestrator trajectory id `group/index/hex`."""
    return session_id.rsplit("/", 2)[0]


def replay_engine(renderer: ChatRenderer, by_group: dict[str, Solution], *, checks: bool = True) -> ScriptedEngine:
    """A policy that plays each group's solution script (sessions are the orchestrator's ids)."""
    scripts = {g: replay_turns(s, checks=checks) for g, s in by_group.items()}

    def script(session: str, turn: int) -> str:
        turns = scripts[group_of(session)]
        return renderer.parser.render_turn("", turns[min(turn, len(turns) - 1)])

    return ScriptedEngine(
        script=script,
        encode=lambda text: renderer.tokenizer.encode(text, add_special_tokens=False),
        end_ids=renderer.stop_token_ids[:1],
    )


__all__ = ["Found", "Solution", "find_solutions", "group_of", "replay_engine", "replay_turns"]
