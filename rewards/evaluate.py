"""The trusted final evaluation of a finished trajectory: an agentcore `Scorer`.

What it is: `FinalEvaluator.score(trajectory, tools, task)` copies the agent's solution files out
of the workspace into a fresh directory (`snapshot_solution`), adds model.py from the task and the
fixed files from agentcore's assets, then runs the static checks, the build, final-mode
verification and paired profiling through a `RewardsKernelEnv` (candidate, eager and
torch.compile timed together in one process: `rewards.timing.paired`; the profile job starts
beside the verification and times only if it passed, `EvaluateConfig.overlap`), and scores the result with
`rewards.reward.score_paired` (`rewards.reward.score` with `paired=False`). A single-file
KernelBench solution (model_new.py calling `load_inline`) is converted by
`rewards.inline.prepare` first. Every failure of the candidate (a hack, no build, a
wrong answer, a crash while timed) is a `Score` with `config.fail_reward` and the reason in
reward_info; infrastructure errors raise.

What it is not: the agent's tools (`rewards.env`).

Example:
    async with open_kernel_env() as env:
        evaluator = FinalEvaluator(env)
        scored = await evaluator.score(trajectory, tools, task)   # scored.reward, scored.reward_info
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

import anyio
import msgspec
from msgspec import Struct

from agentcore.runtime import sole_exception
from agentcore.types import Task, Trajectory
from rewards.env import Prepared, RewardsKernelEnv, pristine_files
from rewards.inline.prepare import is_inline_solution, prepare_inline, with_notes
from rewards.reward import RewardConfig, score, score_paired, score_untimed
from rewards.timing.profile import Profile
from rewards.verdict import HackCategory, Score, Verdict, VerdictStatus, reward_info

KERNEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.cu|_binding\.cpp)$")
MAX_FILE_BYTES = 1 << 20


class EvaluateConfig(Struct, frozen=True, kw_only=True):
    reward: RewardConfig = RewardConfig()
    """How a verdict and three timings become a reward."""
    scratch_root: str = ""
    """Parent of the per-evaluation snapshot dirs; '' means the system temp dir."""
    paired: bool = True
    """Time candidate, eager and torch.compile together in the candidate's process, in rotated
    rounds (rewards.timing.paired); False: the candidate alone against cached baselines."""
    timed: bool = True
    """False: a verified solution scores milestone 1 without a profile job (scripted teachers,
    whose reward only has to be > 0; a timing job has its GPU alone and is the queue's slow part)."""
    overlap: bool = True
    """Paired: start the profile job once the verify job has a lane, when a lane is spare (no job
    waits for one), so that its reference compile and build run beside the verification; it times
    only if the verification passed (its gate, `GpuQueue.submit`), else it is withdrawn. False, or
    no spare lane: the profile job after the verdict."""


def _read_regular(path: Path) -> bytes | None:
    """The bytes of a regular file that is not a symlink (checked on the open fd), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
            return None
        return f.read(MAX_FILE_BYTES + 1)[:MAX_FILE_BYTES]


def solution_files(workspace: Path) -> dict[str, bytes]:
    """model_new.py and kernels/<name>.cu, kernels/<name>_binding.cpp of `workspace`, regular
    files only; everything else is ignored."""
    workspace = Path(workspace)
    files: dict[str, bytes] = {}
    if (data := _read_regular(workspace / "model_new.py")) is not None:
        files["model_new.py"] = data
    kernels = workspace / "kernels"
    if kernels.is_dir() and not kernels.is_symlink():
        for entry in sorted(os.scandir(kernels), key=lambda e: e.name):
            if KERNEL_NAME.match(entry.name) and (data := _read_regular(Path(entry.path))) is not None:
                files[f"kernels/{entry.name}"] = data
    return files


def snapshot_solution(workspace: Path, task: Task, dest: Path) -> Path:
    """A fresh directory `dest` holding the agent's solution files and the pristine files.

    Nothing is read from the workspace but model_new.py and kernels/<name>.cu /
    kernels/<name>_binding.cpp, regular files only: a symlink, a modified model.py or binding.cpp,
    a stray header or a planted extension module in the workspace never reaches the evaluation.
    Local headers (kernels/*.cuh) are not copied either, so a solution that includes one fails to
    build here."""
    dest.mkdir(parents=True)
    (dest / "kernels").mkdir()
    for rel, data in {**solution_files(workspace), **pristine_files(task)}.items():
        (dest / rel).write_bytes(data)
    return dest


class FinalEvaluator:
    """The trainer's Scorer: snapshot, check, build, verify (final), profile, score.

    Example:
        evaluator = FinalEvaluator(env, EvaluateConfig())
        result = await evaluator.evaluate(Path("ws"), task)   # a rewards.verdict.Score
    """

    def __init__(self, env: RewardsKernelEnv, config: EvaluateConfig = EvaluateConfig()) -> None:
        self.env, self.config = env, config

    async def warm(self, task: Task) -> None:
        """The task's reference compiled for paired timing (`RewardsKernelEnv.warm_reference`) while
        its group's rollouts run, so that no final evaluation of the group waits for it."""
        if self.config.timed and self.config.paired:
            await self.env.warm_reference(task)

    async def score(self, trajectory: Trajectory, tools, task: Task) -> Trajectory:
        result = await self.evaluate(Path(tools.workspace.path), task)
        return msgspec.structs.replace(trajectory, reward=result.reward, reward_info=reward_info(result))

    async def evaluate(self, workspace: Path, task: Task) -> Score:
        """The Score of the solution in `workspace` (only its solution files are read)."""
        root = Path(self.config.scratch_root or tempfile.gettempdir())
        scratch = Path(await anyio.to_thread.run_sync(lambda: tempfile.mkdtemp(prefix="final-", dir=root)))
        try:
            snapshot = await anyio.to_thread.run_sync(snapshot_solution, workspace, task, scratch / "ws")
            prepared = await self.prepare(snapshot, task)
            return await self.evaluate_prepared(snapshot, task, prepared)
        finally:
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(scratch, ignore_errors=True))

    async def prepare(self, snapshot: Path, task: Task) -> Prepared:
        """Static checks and build of a snapshot: our layout, or a single-file load_inline
        solution (model_new.py calling load_inline, no kernels/ files; `rewards.inline.prepare`)."""
        if await anyio.to_thread.run_sync(is_inline_solution, snapshot):
            return await prepare_inline(self.env, snapshot, task)
        return await self.env.prepare(snapshot, task)

    async def evaluate_prepared(self, snapshot: Path, task: Task, prepared: Prepared) -> Score:
        """Verify and profile a checked, built snapshot (raises NoGpuError without a GPU)."""
        if prepared.verdict is not None:
            return score(prepared.verdict, None, None, None, self.config.reward)
        c = self.config
        if c.timed and c.paired and c.overlap:
            verdict, timed = await self._overlapped(snapshot, task, prepared)
        else:
            verdict = await self.env.final_verdict(snapshot, task, prepared.build, inline=prepared.inline)
            timed = None
        verdict = with_notes(verdict, prepared.notes)
        scored = await self._verified(snapshot, task, prepared, verdict, timed)
        return msgspec.structs.replace(scored, breakdown=scored.breakdown | verify_times(verdict))

    async def _overlapped(self, snapshot: Path, task: Task, prepared: Prepared) -> tuple[Verdict, Profile | None]:
        """The verify job and, once it has a lane, the paired profile job beside it if a lane is
        spare, gated on its verdict: the profile's reference compile and build overlap the
        verification, its timing waits for a pass. A failed verification wastes that preparation,
        so it only ever takes a lane no other job wanted. The Profile is None when no profile job
        started (the verdict came first, or no lane was spare): the caller times a pass then."""
        verdicts: list[Verdict] = []
        running, judged = anyio.Event(), anyio.Event()

        async def verify() -> None:
            try:
                verdicts.append(await self.env.final_verdict(snapshot, task, prepared.build, inline=prepared.inline,
                                                             running=running))
            finally:
                judged.set()
                running.set()

        async def passed() -> bool:
            await judged.wait()
            return bool(verdicts) and verdicts[0].ok

        timed = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(verify)
                await running.wait()  # a gated job must not hold a lane its verification still waits for
                if not judged.is_set() and self.env.spare_lane():
                    timed = await self.env.time(snapshot, task, prepared.build, paired=True, gate=passed)
        except BaseExceptionGroup as group:  # callers catch what they know (NoGpuError), as without overlap
            if (sole := sole_exception(group)) is None:
                raise
            raise sole from None
        return verdicts[0], timed

    async def _verified(self, snapshot: Path, task: Task, prepared: Prepared, verdict: Verdict,
                        timed: Profile | None = None) -> Score:
        """The Score of a snapshot its verify job judged: failed, untimed, or timed by a profile
        job (`timed`, when it ran beside the verification)."""
        if not verdict.ok:
            return score(verdict, None, None, None, self.config.reward)
        if not self.config.timed:
            return score_untimed(verdict, self.config.reward)
        if timed is None:
            timed = await self.env.time(snapshot, task, prepared.build, paired=self.config.paired)
        return self._scored(verdict, timed)

    def _scored(self, verdict: Verdict, timed: Profile) -> Score:
        if timed.reference_candidate:  # the timing-only harness mode of benchmarks: never a reward
            raise ValueError("a profile of the timing-only harness mode reached the final evaluation")
        if timed.diverged:  # what was timed is not what was verified
            verdict = msgspec.structs.replace(verdict, status=VerdictStatus.HACK, hack=HackCategory.OUTPUT_CACHING,
                                              message=timed.message)
        elif not timed.ok or timed.candidate is None:
            verdict = msgspec.structs.replace(verdict, status=VerdictStatus.RUNTIME_ERROR, message=timed.message)
        if self.config.paired:
            scored = score_paired(verdict, timed.paired, self.config.reward)
        else:
            scored = score(verdict, timed.candidate, timed.eager, timed.compiled, self.config.reward)
        return msgspec.structs.replace(scored, breakdown=scored.breakdown | job_times(timed))


def job_times(timed: Profile) -> dict[str, float]:
    """Where a final evaluation's profile job spent its time, for the trajectory's record: its wait
    in the GPU queue (and for its GPU alone), how long it held its lane, of that how long it had
    the GPU alone (every other job of the machine waiting), and its phases in ms
    (`rewards.verify.phases`; "child." from the child)."""
    record = _job_record("profile", timed.job_wait_s, timed.job_wall_s, timed.phases_ms)
    return record | {"profile_alone_s": round(timed.job_alone_s, 3)}


def verify_times(verdict: Verdict) -> dict[str, float]:
    """Where a final evaluation's verify job spent its time, for the trajectory's record: its wait
    in the GPU queue, how long it held its lane, and its phases in ms (`rewards.verify.phases`)."""
    return _job_record("verify", verdict.job_wait_s, verdict.job_wall_s, verdict.phases_ms)


def _job_record(kind: str, wait_s: float, held_s: float, phases_ms: dict[str, float]) -> dict[str, float]:
    times = {f"{kind}_wait_s": round(wait_s, 3), f"{kind}_held_s": round(held_s, 3)}
    return times | {f"{kind}_ms.{name}": round(ms, 1) for name, ms in phases_ms.items()}


__all__ = ["EvaluateConfig", "FinalEvaluator", "job_times", "snapshot_solution", "solution_files", "verify_times"]
