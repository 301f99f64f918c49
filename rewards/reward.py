"""The paper's milestone reward as a pure function of a Verdict and three Timings.

`score(verdict, candidate, eager, compiled, config) -> Score`. No I/O, no clocks, no torch: the
verifier decides the Verdict, the profiler measures the Timings, this module only maps them to
a number (REFERENCE.md section 1):

    -1  compile, correctness or an anti-hacking check failed (any non-OK verdict)
     3  more than 5% faster than BOTH eager and torch.compile
     2  more than 5% faster than eager only
     1  otherwise (correct; includes "faster than compile but not eager")

"More than 5% faster" than a baseline t0 means (t0 - t) / t0 > margin on medians, i.e. a
speedup t0 / t above 1 / 0.95 = 1.0526x. A relative improvement within 1e-9 of the margin counts
as NOT more (so t = 0.95 * t0 earns nothing for that baseline, whatever the float rounding).

`mode="speedup"` is the raw-speedup ablation (the paper found it worse: REFERENCE.md section 1):
the reward is log(s) or s, with s = baseline / candidate clipped to [clip_low, clip_high]; a
failure still gets `fail_reward`, and the config refuses clips that would let a correct kernel
score below a failure.

Precision and fairness (REFERENCE.md sections 2-3, items 11, 12, 20). The reward is only as fair
as its inputs, and this function checks what it can see:
- all three timings must come from the same harness (`Timing.method`), else ValueError: a
  CUDA-graph replay against event timing is not a speedup;
- the 1e-2 tolerance admits TF32/fp16 work, so the verifier (not this function) must compare
  against a reference computed with pinned precision flags and a dtype-tied tolerance, and the
  eager/compile baselines must be timed in the task's own dtype under the same flags as the
  candidate: TF32 alone would otherwise buy >= 2x on a third of KernelBench L1;
- the three subjects must be timed alike: same machine and process, fresh inputs each call,
  the same L2-flush policy and device-wide synchronisation (REFERENCE.md section 4);
- a 5% margin is meaningful only when timing noise is well below it (medians stable to
  0.1-0.3% on millisecond kernels). `stderr_sigmas > 0` additionally requires the improvement to
  clear the margin by that many combined relative standard errors; 0 is the paper's rule.
"""

from __future__ import annotations

import math
from typing import Literal

from msgspec import Struct

from rewards.verdict import Score, Timing, Verdict

_TIE_REL_TOL = 1e-9


class RewardConfig(Struct, frozen=True, kw_only=True):
    """How a Verdict and three Timings become a number; the defaults are the paper's."""

    mode: Literal["milestone", "speedup"] = "milestone"
    """milestone: the paper's -1/1/2/3; speedup: the raw-speedup ablation."""
    margin: float = 0.05
    """A baseline is beaten when (t0 - t) / t0 > margin."""
    fail_reward: float = -1.0
    """Reward for any non-OK verdict (compile, correctness, timeout, hack)."""
    correct_reward: float = 1.0
    """Milestone 1: correct, not more than `margin` faster than eager."""
    beats_eager_reward: float = 2.0
    """Milestone 2: more than `margin` faster than eager, not than torch.compile."""
    beats_both_reward: float = 3.0
    """Milestone 3: more than `margin` faster than both eager and torch.compile."""
    stderr_sigmas: float = 0.0
    """Extra improvement required, in combined relative standard errors (0: the paper's rule)."""
    speedup_baseline: Literal["compile", "eager", "best"] = "compile"
    """speedup mode: which time the candidate is divided into; best = the faster baseline."""
    speedup_transform: Literal["log", "clipped"] = "log"
    """speedup mode: reward = log(s) or s, after clipping s."""
    clip_low: float = 0.5
    """speedup mode: lower clip of the speedup s (must keep correct above fail_reward)."""
    clip_high: float = 10.0
    """speedup mode: upper clip of the speedup s (caps rewards from timing outliers)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"margin must lie in [0, 1), got {self.margin}")
        if not 0.0 < self.clip_low <= self.clip_high:
            raise ValueError(
                f"need 0 < clip_low <= clip_high, got {self.clip_low}, {self.clip_high}"
            )
        if self.mode == "speedup" and _transform(self.clip_low, self) <= self.fail_reward:
            raise ValueError("clip_low lets a correct kernel score at or below a failure")
        if self.mode == "milestone" and self.correct_reward <= self.fail_reward:
            raise ValueError("correct_reward must exceed fail_reward")


def improvement(baseline_ms: float, candidate_ms: float) -> float:
    """Relative time saved against a baseline: (t0 - t) / t0 (negative when slower)."""
    return (baseline_ms - candidate_ms) / baseline_ms


def beats(baseline: Timing, candidate: Timing, config: RewardConfig) -> bool:
    """True when the candidate is more than `margin` faster than the baseline (medians)."""
    need = config.margin + config.stderr_sigmas * math.hypot(
        baseline.rel_stderr, candidate.rel_stderr
    )
    gain = improvement(baseline.median_ms, candidate.median_ms)
    return gain > need and not math.isclose(gain, need, rel_tol=_TIE_REL_TOL, abs_tol=1e-12)


def milestone(candidate: Timing, eager: Timing, compiled: Timing, config: RewardConfig) -> int:
    """1, 2 or 3 for a correct candidate (module docstring)."""
    faster_eager = beats(eager, candidate, config)
    if faster_eager and beats(compiled, candidate, config):
        return 3
    return 2 if faster_eager else 1


def _transform(speedup: float, config: RewardConfig) -> float:
    s = min(max(speedup, config.clip_low), config.clip_high)
    return math.log(s) if config.speedup_transform == "log" else s


def _speedup_reward(
    candidate: Timing, eager: Timing, compiled: Timing, config: RewardConfig
) -> float:
    baseline_ms = {
        "compile": compiled.median_ms,
        "eager": eager.median_ms,
        "best": min(eager.median_ms, compiled.median_ms),
    }[config.speedup_baseline]
    return _transform(baseline_ms / candidate.median_ms, config)


def _milestone_reward(level: int, config: RewardConfig) -> float:
    return {1: config.correct_reward, 2: config.beats_eager_reward, 3: config.beats_both_reward}[
        level
    ]


def _check_timings(candidate: Timing | None, eager: Timing | None, compiled: Timing | None) -> None:
    """An OK verdict without three comparable timings is a harness bug, not a model failure."""
    if candidate is None or eager is None or compiled is None:
        raise ValueError("an OK verdict needs candidate, eager and compiled timings")
    methods = {candidate.method, eager.method, compiled.method}
    if len(methods) != 1:
        raise ValueError(f"timings from different harnesses cannot be compared: {sorted(methods)}")


def score(
    verdict: Verdict,
    candidate: Timing | None,
    eager: Timing | None,
    compiled: Timing | None,
    config: RewardConfig = RewardConfig(),
) -> Score:
    """The reward of one candidate; see the module docstring for the rule and its caveats."""
    if not verdict.ok:
        return Score(
            reward=config.fail_reward,
            milestone=None,
            verdict=verdict,
            candidate=candidate,
            eager=eager,
            compiled=compiled,
            breakdown={"mode": config.mode, "failed": True},
        )
    _check_timings(candidate, eager, compiled)
    level = milestone(candidate, eager, compiled, config)
    if config.mode == "milestone":
        reward = _milestone_reward(level, config)
    else:
        reward = _speedup_reward(candidate, eager, compiled, config)
    return Score(
        reward=reward,
        milestone=level,
        verdict=verdict,
        candidate=candidate,
        eager=eager,
        compiled=compiled,
        speedup_vs_eager=eager.median_ms / candidate.median_ms,
        speedup_vs_compile=compiled.median_ms / candidate.median_ms,
        breakdown={
            "mode": config.mode,
            "failed": False,
            "improvement_vs_eager": improvement(eager.median_ms, candidate.median_ms),
            "improvement_vs_compile": improvement(compiled.median_ms, candidate.median_ms),
            "beats_eager": beats(eager, candidate, config),
            "beats_compile": beats(compiled, candidate, config),
        },
    )
