"""The final score of a trajectory's workspace when the kernel environment is not the real one.

What it is: `EnvScorer`, the orchestrator's Scorer over any agentcore KernelEnv: compile,
verify, profile the final workspace and give the paper's milestone reward (-1 failed, 1
correct, 2 more than 5% faster than eager, 3 faster than eager and torch.compile). Used with the
fake environment in the CPU smoke variant and in tests.
What it is not: the trusted final evaluation of real kernels - that is
`rewards.evaluate.FinalEvaluator` (pristine snapshot, static checks, hack audit, careful timing),
which the training run uses whenever the environment is real.

Example:
    scorer = EnvScorer(FakeKernelEnv())
    orch = Orchestrator(runner=..., tools=..., scorer=scorer)
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from agentcore.kernel_env import KernelEnv
from agentcore.types import Task, Trajectory

MARGIN = 0.05  # "more than 5% faster": (t0 - t) / t0 > 0.05 (rewards/README.md, the reward)


def milestone_reward(candidate_ms: float, eager_ms: float, compile_ms: float) -> int:
    faster_eager = (eager_ms - candidate_ms) / eager_ms > MARGIN
    faster_compile = (compile_ms - candidate_ms) / compile_ms > MARGIN
    return 3 if faster_eager and faster_compile else 2 if faster_eager else 1


class EnvScorer:
    """Scores the final workspace through `env` (see module docstring)."""

    def __init__(self, env: KernelEnv) -> None:
        self.env = env

    async def warm(self, task: Task) -> None:
        """Nothing to begin early: every call goes through the env's tools."""

    async def score(self, trajectory: Trajectory, tools, task: Task) -> Trajectory:
        reward, info = await self.evaluate(Path(tools.workspace.path), task)
        return msgspec.structs.replace(trajectory, reward=float(reward), reward_info=info)

    async def evaluate(self, workspace: Path, task: Task) -> tuple[int, dict]:
        built = await self.env.compile(workspace, task)
        if not built.ok:
            return -1, {"status": "compile_error", "message": built.log[:500]}
        checked = await self.env.verify(workspace, task)
        if not checked.ok:
            return -1, {"status": "incorrect", "message": checked.message[:500], "hack": checked.hack}
        timed = await self.env.profile(workspace, task)
        if not timed.ok or None in (timed.candidate_ms, timed.eager_ms, timed.compile_ms):
            return -1, {"status": "runtime_error", "message": timed.message[:500]}
        reward = milestone_reward(timed.candidate_ms, timed.eager_ms, timed.compile_ms)
        return reward, {
            "status": "ok",
            "milestone": reward,
            "speedup_vs_eager": timed.eager_ms / timed.candidate_ms,
            "speedup_vs_compile": timed.compile_ms / timed.candidate_ms,
        }
