"""The milestone reward of the CUDA Agent paper, as a pure function of a Verdict and three Timings.

`score(verdict, candidate, eager, compiled, config) -> Score`:

    -1  compile, correctness or an anti-hacking check failed (any non-OK verdict)
     3  more than 5% faster than BOTH eager and torch.compile
     2  more than 5% faster than eager only
     1  otherwise (correct; includes "faster than compile but not eager")

"More than 5% faster" than a baseline t0 means (t0 - t) / t0 > margin, on medians.
`mode="speedup"` is the paper's raw-speedup ablation (log(s) or s, s clipped).

`score_untimed(verdict, config)`: verified, deliberately not timed (milestone 1 when correct).

`score_paired(verdict, paired, config)` is the same reward from paired timing
(`rewards.timing.paired`: the three subjects timed together in rotated rounds of one process):
a baseline is beaten when the whole confidence interval of the median per-round speedup lies
above 1 / (1 - margin); an interval that straddles it is not granted, and the Score says
`inconclusive`. Baselines the candidate starved of device memory (`rewards.timing.headroom`)
decide nothing: milestone 1, and no speedup above 1 is paid.

What it is not: no I/O, no clocks, no torch. The verifier decides the Verdict and the profiler
measures the Timings; this module only maps them to a number. rewards/README.md has the rules.
"""

from __future__ import annotations

import math
from typing import Literal

from msgspec import Struct

from rewards.timing.paired import PairedTiming, paired_milestone
from rewards.verdict import Score, Timing, Verdict

_TIE_REL_TOL = 1e-9


class RewardConfig(Struct, frozen=True, kw_only=True):
    """How a Verdict and three Timings become a number; the defaults are the paper's."""

    mode: Literal["milestone", "speedup"] = "milestone"
    """milestone: the paper's -1/1/2/3; speedup: the raw-speedup ablation (the paper found it
    worse). A failure gets `fail_reward` in both modes."""
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
    """True when the candidate is more than `margin` faster than the baseline (medians).

    At margin 0.05 that is a speedup t0 / t above 1 / 0.95 = 1.0526x. An improvement within 1e-9
    of what is needed counts as NOT more, so t = 0.95 * t0 earns nothing whatever the rounding.
    A 5% margin means something only when timing noise is well below it (millisecond medians
    are stable to 0.1-0.3%); `stderr_sigmas > 0` also asks the gain to clear the margin by that
    many combined relative standard errors (0 is the paper's rule).
    """
    need = config.margin + config.stderr_sigmas * math.hypot(
        baseline.rel_stderr, candidate.rel_stderr
    )
    gain = improvement(baseline.median_ms, candidate.median_ms)
    return gain > need and not math.isclose(gain, need, rel_tol=_TIE_REL_TOL, abs_tol=1e-12)


def milestone(candidate: Timing, eager: Timing, compiled: Timing, config: RewardConfig) -> int:
    """1, 2 or 3 for a correct candidate (the table in the module docstring)."""
    faster_eager = beats(eager, candidate, config)
    if faster_eager and beats(compiled, candidate, config):
        return 3
    return 2 if faster_eager else 1


def _transform(speedup: float, config: RewardConfig) -> float:
    s = min(max(speedup, config.clip_low), config.clip_high)
    return math.log(s) if config.speedup_transform == "log" else s


def _speedup_reward(vs_eager: float, vs_compile: float, config: RewardConfig) -> float:
    """speedup mode: the speedup over the configured baseline; `best` is the faster baseline,
    i.e. the smaller speedup."""
    speedup = {"compile": vs_compile, "eager": vs_eager, "best": min(vs_eager, vs_compile)}[config.speedup_baseline]
    return _transform(speedup, config)


def _milestone_reward(level: int, config: RewardConfig) -> float:
    return {1: config.correct_reward, 2: config.beats_eager_reward, 3: config.beats_both_reward}[
        level
    ]


def _check_timings(candidate: Timing | None, eager: Timing | None, compiled: Timing | None) -> None:
    """An OK verdict without three comparable timings is a harness bug, not a model failure."""
    # The reward is only as fair as its inputs. What it can see: the three timings come from one
    # harness (a CUDA-graph replay against event timing is not a speedup). What it cannot see
    # belongs upstream: the three subjects timed alike (same machine and process, fresh inputs
    # each call, same L2-flush policy and device-wide synchronisation: rewards.timing); the
    # baselines timed in the task's own dtype under the same precision flags as the candidate;
    # passing outputs held to their dtype's precision (rewards.verify.precision and compare),
    # since the 1e-2 tolerance admits TF32/fp16 and TF32 alone would buy >= 2x on about a third
    # of KernelBench L1.
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
    """The reward of one candidate; the rule is in the module docstring, its caveats at `beats`
    and `_check_timings`."""
    if not verdict.ok:
        return _failed(verdict, candidate, eager, compiled, config)
    _check_timings(candidate, eager, compiled)
    level = milestone(candidate, eager, compiled, config)
    vs_eager, vs_compile = eager.median_ms / candidate.median_ms, compiled.median_ms / candidate.median_ms
    return Score(
        reward=_reward(level, vs_eager, vs_compile, config),
        milestone=level,
        verdict=verdict,
        candidate=candidate,
        eager=eager,
        compiled=compiled,
        speedup_vs_eager=vs_eager,
        speedup_vs_compile=vs_compile,
        breakdown={
            "mode": config.mode,
            "failed": False,
            "improvement_vs_eager": improvement(eager.median_ms, candidate.median_ms),
            "improvement_vs_compile": improvement(compiled.median_ms, candidate.median_ms),
            "beats_eager": beats(eager, candidate, config),
            "beats_compile": beats(compiled, candidate, config),
        },
    )


def _reward(level: int, vs_eager: float, vs_compile: float, config: RewardConfig) -> float:
    """The reward of a correct candidate under `config.mode`: its milestone's, or the speedups'."""
    if config.mode == "milestone":
        return _milestone_reward(level, config)
    return _speedup_reward(vs_eager, vs_compile, config)


def _failed(verdict: Verdict, candidate: Timing | None, eager: Timing | None, compiled: Timing | None,
            config: RewardConfig) -> Score:
    return Score(reward=config.fail_reward, milestone=None, verdict=verdict, candidate=candidate, eager=eager,
                 compiled=compiled, breakdown={"mode": config.mode, "failed": True})


def score_untimed(verdict: Verdict, config: RewardConfig = RewardConfig()) -> Score:
    """The reward of a candidate that was verified and deliberately not timed (scripted
    demonstrations, whose speed nothing learns from): a correct one is milestone 1 and no
    speedup is claimed; `breakdown["untimed"]` says so."""
    if not verdict.ok:
        return _failed(verdict, None, None, None, config)
    reward = config.correct_reward if config.mode == "milestone" else _transform(1.0, config)
    return Score(reward=reward, milestone=1, verdict=verdict,
                 breakdown={"mode": config.mode, "failed": False, "untimed": True})


def score_paired(verdict: Verdict, paired: PairedTiming | None, config: RewardConfig = RewardConfig()) -> Score:
    """The reward of one candidate from paired timing (module docstring). Speedups are the
    median per-round ratios; a comparison whose interval straddles 1 / (1 - margin) is not
    granted (`Score.inconclusive`, the interval in `breakdown["inconclusive_note"]`).
    `stderr_sigmas` does not apply: the intervals already carry the noise."""
    candidate, eager, compiled = (None, None, None) if paired is None else (
        paired.fastest(role).timing for role in ("candidate", "eager", "compile"))
    if not verdict.ok:
        return _failed(verdict, candidate, eager, compiled, config)
    if paired is None:
        raise ValueError("an OK verdict needs a paired timing")
    _check_timings(candidate, eager, compiled)
    decided = paired_milestone(paired.vs_eager, paired.vs_compile, config.margin, paired.starved)
    vs_eager, vs_compile = paired.vs_eager.estimate, paired.vs_compile.estimate
    # starved baselines (PairedTiming.starved) decide nothing: no speedup above 1 is paid for either
    paid = (min(vs_eager, 1.0), min(vs_compile, 1.0)) if paired.starved else (vs_eager, vs_compile)
    return Score(
        reward=_reward(decided.level, *paid, config),
        milestone=decided.level,
        verdict=verdict,
        candidate=candidate,
        eager=eager,
        compiled=compiled,
        speedup_vs_eager=vs_eager,
        speedup_vs_compile=vs_compile,
        paired=True,
        speedup_vs_eager_ci=(paired.vs_eager.ci_low, paired.vs_eager.ci_high),
        speedup_vs_compile_ci=(paired.vs_compile.ci_low, paired.vs_compile.ci_high),
        inconclusive=decided.inconclusive,
        breakdown={
            "mode": config.mode,
            "failed": False,
            "threshold": decided.threshold,
            "vs_eager": decided.vs_eager,
            "vs_compile": decided.vs_compile,
            "beats_eager": decided.vs_eager == "beaten",
            "beats_compile": decided.vs_compile == "beaten",
            "inconclusive_vs_eager": decided.vs_eager == "inconclusive",
            "inconclusive_vs_compile": decided.vs_compile == "inconclusive",
            "inconclusive_note": decided.note,
            "baselines_starved": bool(paired.starved),
            "rounds": len(paired.rounds),
            "paired_stop": paired.stop,
            "paired_seconds": paired.seconds,
            "confidence": paired.config.confidence,
        },
    )
