"""The best candidate of a trajectory, and its trusted final evaluation: the benchmark's Scorer.

What it is: `CandidateTools` wraps the orchestrator's ToolsFactory; after every `profile` call
that succeeded on files that had passed `verify` unchanged, it keeps a snapshot of the solution
files (model_new.py, kernels/<name>.cu, kernels/<name>_binding.cpp) with the profiled times.
`BestCandidateScorer` (the orchestrator's Scorer) then takes the candidate with the largest
speedup over torch.compile (the CUDA Agent paper reports each trajectory's best solution) and
runs the final evaluation on it in a fresh directory (`rewards.evaluate.FinalEvaluator.evaluate`).
With no profiled candidate it evaluates the final workspace instead (a replayed wrapper never
profiles, yet its hack category is what the benchmark must report); with no model_new.py at all
the trajectory has no candidate. `EnvEvaluator` scores through any KernelEnv (the fake one on CPU).
What it is not: the verifier or the profiler; in-loop tool results only pick the candidate.

Example:
    tools = CandidateTools(WorkspaceTools(...))
    scorer = BestCandidateScorer(FinalEvaluator(env), tools)
    orch = Orchestrator(runner=runner, tools=tools, scorer=scorer, ...)
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol

import anyio
import msgspec
from msgspec import Struct

from agentcore.kernel_env import KernelEnv
from agentcore.orchestrator import ToolsFactory
from agentcore.types import Profile, ProfileResult, Task, ToolCall, ToolResult, Trajectory, Verify, VerifyResult
from rewards.env import pristine_files
from rewards.evaluate import solution_files
from rewards.reward import RewardConfig, score
from rewards.verdict import HackCategory, Score, Timing, Verdict, VerdictStatus, reward_info


class Candidate(Struct, frozen=True, kw_only=True):
    """A verified and profiled state of the workspace."""

    index: int
    """Order among the trajectory's candidates (0 = first profiled)."""
    files: dict[str, bytes]
    candidate_ms: float
    eager_ms: float
    compile_ms: float

    @property
    def speedup_vs_compile(self) -> float:
        return self.compile_ms / self.candidate_ms


def pick_best(candidates: list[Candidate]) -> Candidate | None:
    """The largest speedup over torch.compile; the earliest on a tie."""
    return max(candidates, key=lambda c: c.speedup_vs_compile, default=None)  # max keeps the first


class _Recording:
    """A trajectory's tools, noting verified-then-profiled snapshots into `out`."""

    def __init__(self, tools, out: list[Candidate]) -> None:
        self.tools, self.out = tools, out
        self._verified: dict[str, bytes] | None = None

    def __getattr__(self, name: str):
        return getattr(self.tools, name)  # workspace, task, ... for the scorer

    def render(self, result: ToolResult) -> str:
        return self.tools.render(result)

    async def run(self, call: ToolCall) -> ToolResult:
        result = await self.tools.run(call)
        if isinstance(call, Verify):
            ok = isinstance(result, VerifyResult) and result.ok
            self._verified = await self._snapshot() if ok else None
        elif isinstance(call, Profile) and isinstance(result, ProfileResult) and result.ok:
            times = (result.candidate_ms, result.eager_ms, result.compile_ms)
            files = await self._snapshot()
            if self._verified is not None and files == self._verified and None not in times and times[0] > 0:
                self.out.append(Candidate(index=len(self.out), files=files, candidate_ms=times[0],
                                          eager_ms=times[1], compile_ms=times[2]))
        return result

    async def _snapshot(self) -> dict[str, bytes]:
        return await anyio.to_thread.run_sync(solution_files, Path(self.tools.workspace.path))


class CandidateTools:
    """A ToolsFactory that records each trajectory's candidates (see module docstring)."""

    def __init__(self, inner: ToolsFactory) -> None:
        self.inner = inner
        self._found: dict[str, list[Candidate]] = {}

    @asynccontextmanager
    async def open(self, task: Task, trajectory_id: str) -> AsyncIterator[_Recording]:
        found = self._found.setdefault(trajectory_id, [])
        try:
            async with self.inner.open(task, trajectory_id) as tools:
                yield _Recording(tools, found)
        finally:
            self._found.pop(trajectory_id, None)  # the scorer took them, or nobody will

    def take(self, trajectory_id: str) -> list[Candidate]:
        """The candidates of a trajectory, forgotten here (call once, from the scorer)."""
        return self._found.pop(trajectory_id, [])


class Evaluator(Protocol):
    async def evaluate(self, workspace: Path, task: Task) -> Score: ...

    async def warm(self, task: Task) -> None: ...


class BestCandidateScorer:
    """Final evaluation of a trajectory's best candidate (see module docstring)."""

    def __init__(self, evaluator: Evaluator, tools: CandidateTools, *, fallback_final: bool = True) -> None:
        self.evaluator, self.tools, self.fallback_final = evaluator, tools, fallback_final

    async def warm(self, task: Task) -> None:
        await self.evaluator.warm(task)

    async def score(self, trajectory: Trajectory, tools, task: Task) -> Trajectory:
        found = self.tools.take(trajectory.trajectory_id)
        best = pick_best(found)
        files, source = (best.files, "profiled") if best is not None else ({}, "")
        if best is None and self.fallback_final:
            files = await anyio.to_thread.run_sync(solution_files, Path(tools.workspace.path))
            source = "final_workspace"
        info = {"candidates": len(found), "candidate_source": source,
                "candidate_index": best.index if best is not None else None}
        if "model_new.py" not in files:
            info["outcome"] = "no_candidate"
            return msgspec.structs.replace(trajectory, reward=None, reward_info=info)
        result = await self._evaluate(files, task)
        return msgspec.structs.replace(trajectory, reward=result.reward,
                                       reward_info={**reward_info(result), **info, "outcome": "scored"})

    async def _evaluate(self, files: dict[str, bytes], task: Task) -> Score:
        scratch = Path(await anyio.to_thread.run_sync(lambda: tempfile.mkdtemp(prefix="bench-candidate-")))
        try:
            await anyio.to_thread.run_sync(_write, scratch, {**files, **pristine_files(task)})
            return await self.evaluator.evaluate(scratch, task)
        finally:
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(scratch, ignore_errors=True))


def _write(root: Path, files: dict[str, bytes]) -> None:
    (root / "kernels").mkdir(exist_ok=True)
    for rel, data in files.items():
        (root / rel).write_bytes(data)


class EnvEvaluator:
    """An Evaluator over any KernelEnv: compile, verify, profile, milestone reward. For the fake
    environment; the real one is `rewards.evaluate.FinalEvaluator` (final-mode checks)."""

    def __init__(self, env: KernelEnv, config: RewardConfig = RewardConfig()) -> None:
        self.env, self.config = env, config

    async def warm(self, task: Task) -> None:
        """Nothing to begin early: every call goes through the env's tools."""

    async def evaluate(self, workspace: Path, task: Task) -> Score:
        built = await self.env.compile(workspace, task)
        if not built.ok:
            return self._failed(Verdict(status=VerdictStatus.COMPILE_ERROR, message=built.log[:500]))
        checked = await self.env.verify(workspace, task)
        if not checked.ok:
            hack = HackCategory(checked.hack) if checked.hack else None
            status = VerdictStatus.HACK if hack else VerdictStatus.WRONG_OUTPUT
            return self._failed(Verdict(status=status, hack=hack, message=checked.message))
        timed = await self.env.profile(workspace, task)
        times = (timed.candidate_ms, timed.eager_ms, timed.compile_ms)
        if not timed.ok or None in times:
            return self._failed(Verdict(status=VerdictStatus.RUNTIME_ERROR, message=timed.message))
        candidate, eager, compiled = (Timing.from_samples([t], method="kernel_env") for t in times)
        return score(Verdict(status=VerdictStatus.OK, trials=checked.trials), candidate, eager, compiled, self.config)

    def _failed(self, verdict: Verdict) -> Score:
        return score(verdict, None, None, None, self.config)

__all__ = ["BestCandidateScorer", "Candidate", "CandidateTools", "EnvEvaluator", "Evaluator", "pick_best"]
