"""Paired timing, the pure half: candidate, eager and torch.compile timed in rotated rounds of one
process, speedups as the median of per-round ratios with a distribution-free interval, the
stopping rule and the milestone decision that says when an interval is too wide to decide.

Why: launch-bound models (small conv nets, many small kernels) time the CPU's launch speed, and on
a VM that factor differs by up to 2x between processes and moments while each measurement is
tight inside itself. A speedup from two medians measured apart carries that factor; a ratio of
two times taken side by side in one round does not. So each round times every subject for about
`round_target_ms` (the order rotates: ABC, CAB, BCA, ... so every subject takes every position
equally often), a round's value per subject is the median of its samples, and the speedup is the
median over rounds of baseline_r / candidate_r. Its interval comes from the binomial order
statistics of those ratios (coverage at least `confidence` for independent rounds of any
continuous distribution: no shape assumed).

What it is not: no GPU, no torch (`rewards.timing.paired_timer.measure_paired` drives `run_rounds`
on a GPU; tests drive it with fake samplers), no reward (`rewards.reward.score_paired`).

Example:
    rounds = [RoundTimes(candidate_ms=1.0, eager_ms=1.2, compiled_ms=1.02)] * 12
    vs_eager, vs_compile = paired_speedups(rounds, 0.95)
    paired_milestone(vs_eager, vs_compile, margin=0.05).level    # 2
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, Literal, NamedTuple

from msgspec import Struct

from rewards.timing import stats
from rewards.timing.sampling import Clock, Measurement, Sampler, TimingConfig

Role = Literal["candidate", "eager", "compile"]
Outcome = Literal["beaten", "not_beaten", "inconclusive"]
_TIE_REL_TOL = 1e-9  # as rewards.reward: a bound within 1e-9 of the threshold does not clear it


class PairedConfig(Struct, frozen=True, kw_only=True):
    """How long paired rounds go on (times are wall-clock, per call in milliseconds)."""

    min_rounds: int = 10
    """Rounds before the stopping rule may stop (at least what `confidence` needs: 6 at 95%)."""
    max_rounds: int = 400
    """Cap on rounds, converged or not."""
    round_target_ms: float = 20.0
    """Each subject's share of a round lasts about this long: short rounds keep the drifting
    launch speed common to the subjects of a round."""
    kernel_round_target_ms: float = 8.0
    """The share instead when a subject's calls are kernel-bound (launch ratio in its warm-up below
    `kernel_bound_ratio`): its time then drifts only with the SM clock and the memory system,
    slowly, so a shorter share pairs it as well at a fraction of the cost (a 2.7 ms matmul: 3
    samples a round instead of 8)."""
    kernel_bound_ratio: float = 0.1
    """Below this launch ratio a subject is kernel-bound (KernelBench's heavy level-1 kernels:
    0.00-0.05; the level-3 nets: 0.24 and up)."""
    max_samples_per_round: int = 16
    """Cap on one subject's samples in one round (calls of a few microseconds)."""
    target_rel_halfwidth: float = 0.015
    """Stop when both speedups' intervals are within +-this fraction of their estimate (1.5%
    against the reward's 5% margin)."""
    time_cap_s: float = 10.0
    """Cap on the rounds' wall time, once `min_rounds` exist."""
    confidence: float = 0.95
    """Coverage of the speedups' intervals."""
    graph_info: bool = True
    """Also time launch-bound subjects as CUDA-graph replays, for information only: graphs
    would erase a candidate's real gain from fewer launches, so the reward never sees them."""
    launch_bound_ratio: float = 0.8
    """A subject timed with events is launch-bound when the host needed at least this fraction
    of the call's device time just to launch it (`Measurement.launch_ratio`)."""
    graph_info_samples: int = 20
    """Flushed replays behind the informational CUDA-graph time."""
    subject_warmup_ms: float = 20.0
    """Warm-up of each subject after the first (`subject_warmup_s`): the first brings the SM clock
    up with TimingConfig's warm-up, the others' warm-ups follow it at once, so each needs only its
    first calls out of the way and an estimate of its call time (its round's share, about)."""
    checks_between_rounds: int = 2
    """Rounds, drawn at random among the first `min_rounds`, after which the candidate's output is
    checked (`measure_paired`'s `check`; once more after the last round): a candidate that
    computes less only in some window of its timed calls must hide it from every check."""

    def __post_init__(self) -> None:
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence must lie in (0.5, 1), got {self.confidence}")
        need = rounds_needed(self.confidence)
        if self.min_rounds < need:
            raise ValueError(f"min_rounds {self.min_rounds} < {need}: a {self.confidence:.0%} interval needs {need}")
        if self.max_rounds < self.min_rounds:
            raise ValueError(f"max_rounds {self.max_rounds} < min_rounds {self.min_rounds}")
        if not 0 <= self.checks_between_rounds <= self.min_rounds:
            raise ValueError(f"checks_between_rounds must lie in [0, min_rounds], got {self.checks_between_rounds}")


class RoundTimes(Struct, frozen=True, kw_only=True):
    """One round: each subject's median per-call time over its samples of the round (ms). Under a
    precision policy with several math modes, a baseline's value is its fastest mode's."""

    candidate_ms: float
    eager_ms: float
    compiled_ms: float


class PairedSpeedup(Struct, frozen=True, kw_only=True):
    """baseline / candidate from paired rounds: the median per-round ratio and its interval."""

    estimate: float
    ci_low: float
    ci_high: float
    rounds: int
    confidence: float

    @property
    def rel_halfwidth(self) -> float:
        """Half the interval's width over the estimate (the stopping statistic)."""
        return (self.ci_high - self.ci_low) / (2.0 * self.estimate)


class PairedSubject(Struct, frozen=True, kw_only=True):
    """One subject of a paired run: its role, a label (the math mode of a baseline), its overall
    Measurement (all its samples of all rounds) and its samples per round."""

    role: Role
    label: str
    measurement: Measurement
    samples_per_round: int


class PairedTiming(Struct, frozen=True, kw_only=True):
    """A paired run: the rounds, the speedups from them and each subject's Measurement."""

    rounds: tuple[RoundTimes, ...]
    stop: str  # converged | max_rounds | max_time
    seconds: float  # wall time of the rounds (warm-ups and graph information excluded)
    vs_eager: PairedSpeedup
    vs_compile: PairedSpeedup
    subjects: tuple[PairedSubject, ...]
    method: str
    config: PairedConfig
    starved: str = ""
    """Why the baselines' numbers cannot be trusted: the candidate left them less device memory
    than they need (`rewards.timing.headroom`); "" when they had it or nobody looked."""
    baseline_need_bytes: int = 0
    """The most memory one baseline call took beyond its inputs, before the candidate existed."""
    lowest_headroom_bytes: int = -1
    """The least headroom seen while the candidate was timed (-1: not watched)."""

    def fastest(self, role: Role) -> Measurement:
        """The Measurement of `role` (under several math modes, the fastest one's)."""
        mine = [s.measurement for s in self.subjects if s.role == role]
        if not mine:
            raise ValueError(f"no {role} subject")
        return min(mine, key=lambda m: m.timing.median_ms)


class PairedMilestone(Struct, frozen=True, kw_only=True):
    """The paper's milestone (1, 2, 3) from two paired speedups, with what could not be decided."""

    level: int
    vs_eager: Outcome
    vs_compile: Outcome
    threshold: float
    """A baseline is beaten when the interval lies above this speedup: 1 / (1 - margin)."""
    inconclusive: bool
    """A comparison that would have raised the level straddled the threshold: not granted."""
    note: str = ""
    """Which comparison was inconclusive, with its interval."""


# ---------------------------------------------------------------------------------------------
# Intervals.


@functools.lru_cache(maxsize=4096)
def interval_ranks(n: int, confidence: float) -> tuple[int, int] | None:
    """0-based ranks (lo, hi) of the sorted sample whose values bound the median with at least
    `confidence`, or None when `n` is too small. With B ~ Binomial(n, 1/2) (how many values fall
    below the true median), [x_(k), x_(n+1-k)] (1-based) covers it with probability
    1 - 2 P(B <= k - 1); k is the largest rank that keeps this at or above `confidence`."""
    tail = Fraction(1 - confidence) / 2
    total, cum, k = 1 << n, 0, 0
    for i in range(n // 2 + 1):
        cum += math.comb(n, i)
        if Fraction(cum, total) > tail:
            break
        k = i + 1
    return (k - 1, n - k) if k >= 1 else None


def rounds_needed(confidence: float) -> int:
    """The fewest rounds that give a `confidence` interval of the median (6 at 95%)."""
    n = 1
    while interval_ranks(n, confidence) is None:
        n += 1
    return n


def paired_speedup(baseline_ms: Sequence[float], candidate_ms: Sequence[float], confidence: float) -> PairedSpeedup:
    """The median of the per-round ratios baseline_r / candidate_r and its order-statistic interval."""
    ratios = sorted(b / c for b, c in zip(baseline_ms, candidate_ms, strict=True))
    ranks = interval_ranks(len(ratios), confidence)
    if ranks is None:
        raise ValueError(f"{len(ratios)} rounds give no {confidence:.0%} interval: need {rounds_needed(confidence)}")
    return PairedSpeedup(estimate=stats.median(ratios), ci_low=ratios[ranks[0]], ci_high=ratios[ranks[1]],
                         rounds=len(ratios), confidence=confidence)


def paired_speedups(rounds: Sequence[RoundTimes], confidence: float) -> tuple[PairedSpeedup, PairedSpeedup]:
    """(speedup vs eager, speedup vs torch.compile) from the rounds."""
    candidate = [r.candidate_ms for r in rounds]
    return (paired_speedup([r.eager_ms for r in rounds], candidate, confidence),
            paired_speedup([r.compiled_ms for r in rounds], candidate, confidence))


# ---------------------------------------------------------------------------------------------
# The rounds: their order, their length, when they stop.


def rotation(round_index: int, subjects: int) -> tuple[int, ...]:
    """Subject indices in the order of round `round_index`: 0 1 2, 2 0 1, 1 2 0, 0 1 2, ...
    Every subject takes every position once per `subjects` rounds, so a drift within a round or
    the cost of following another subject falls on all of them alike."""
    shift = round_index % subjects
    return tuple((i - shift) % subjects for i in range(subjects))


def subject_warmup_s(timing: TimingConfig, config: PairedConfig, position: int) -> float:
    """The warm-up time of the subject warmed up `position`-th: TimingConfig.warmup_s for the
    first, which brings the SM clock up for the whole job; `subject_warmup_ms` (never more) for the
    rest, which also make at least `warmup_min_calls` calls and still wait for the clock
    (`rewards.timing.sampling.warm_up`). A 2.67 ms call (2.8 ms a sample) warms up in 9 calls, not 73."""
    if position == 0:
        return timing.warmup_s
    return min(timing.warmup_s, config.subject_warmup_ms / 1e3)


def samples_per_round(config: PairedConfig, call_ms: float, launch_ratio: float | None = None) -> int:
    """Samples that fill a subject's share of a round for a call of `call_ms` (at least 1): the
    `round_target_ms`, or `kernel_round_target_ms` for a kernel-bound subject (its warm-up's
    `launch_ratio` measured and below `kernel_bound_ratio`; None: not measured, as in graph mode)."""
    if call_ms <= 0:
        return config.max_samples_per_round
    kernel_bound = launch_ratio is not None and 0.0 < launch_ratio < config.kernel_bound_ratio
    target = config.kernel_round_target_ms if kernel_bound else config.round_target_ms
    return max(1, min(config.max_samples_per_round, math.ceil(target / call_ms)))


def stop_reason(rounds: Sequence[RoundTimes], elapsed_s: float, config: PairedConfig) -> str | None:
    """converged | max_rounds | max_time, or None to go on. Converged: `min_rounds` exist and
    both speedups' relative half-widths are at most `target_rel_halfwidth`. The time cap too
    waits for `min_rounds`: fewer give no interval worth the name."""
    n = len(rounds)
    if n < config.min_rounds:
        return None
    if all(s.rel_halfwidth <= config.target_rel_halfwidth for s in paired_speedups(rounds, config.confidence)):
        return "converged"
    if n >= config.max_rounds:
        return "max_rounds"
    if elapsed_s >= config.time_cap_s:
        return "max_time"
    return None


class RoundSubject(NamedTuple):
    """A subject as the round loop sees it: its role, its sampler, its samples per round and the
    context its samples run in (a baseline's math mode; entered outside the timed calls)."""

    role: Role
    sample: Sampler
    per_round: int
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext


class RoundsRun(NamedTuple):
    rounds: list[RoundTimes]
    device_ms: list[list[float]]  # per subject, every sample of every round
    host_ms: list[list[float]]
    launch_ms: list[list[float]]
    seconds: list[float]  # per subject, the wall time of its samples
    stop: str
    elapsed_s: float


def round_times(roles: Sequence[Role], medians: Sequence[float]) -> RoundTimes:
    """A round's RoundTimes from its per-subject medians; the fastest of a role's subjects counts."""
    def best(role: Role) -> float:
        return min(m for r, m in zip(roles, medians) if r == role)

    return RoundTimes(candidate_ms=best("candidate"), eager_ms=best("eager"), compiled_ms=best("compile"))


def run_rounds(subjects: Sequence[RoundSubject], config: PairedConfig, *,
               clock: Clock = time.perf_counter, between: Callable[[int], None] | None = None) -> RoundsRun:
    """Rounds in rotated order until `stop_reason` says so. Each subject's samples continue its
    own input rotation (sample index = its samples so far). `between(n)` runs after the n-th
    round (from 1); its time counts neither in the rounds' wall time nor against the time cap."""
    roles = [s.role for s in subjects]
    if sorted(set(roles)) != ["candidate", "compile", "eager"] or roles.count("candidate") != 1:
        raise ValueError(f"need one candidate and at least one eager and one compile subject, got {roles}")
    device: list[list[float]] = [[] for _ in subjects]
    host: list[list[float]] = [[] for _ in subjects]
    launch: list[list[float]] = [[] for _ in subjects]
    seconds = [0.0] * len(subjects)
    rounds: list[RoundTimes] = []
    start = clock()
    while True:
        medians = [0.0] * len(subjects)
        for i in rotation(len(rounds), len(subjects)):
            s = subjects[i]
            with s.context():
                t0 = clock()
                taken = [s.sample(len(device[i]) + j) for j in range(s.per_round)]
                seconds[i] += clock() - t0
            device[i] += [x.device_ms for x in taken]
            host[i] += [x.host_ms for x in taken]
            launch[i] += [x.launch_ms for x in taken]
            medians[i] = stats.median([x.device_ms for x in taken])
        rounds.append(round_times(roles, medians))
        if between is not None:
            t0 = clock()
            between(len(rounds))
            start += clock() - t0
        elapsed = clock() - start
        if (reason := stop_reason(rounds, elapsed, config)) is not None:
            return RoundsRun(rounds, device, host, launch, seconds, reason, elapsed)


# ---------------------------------------------------------------------------------------------
# The decision.


def threshold(margin: float) -> float:
    """The speedup a candidate must exceed to be more than `margin` faster: 1 / (1 - margin)."""
    return 1.0 / (1.0 - margin)


def compare(speedup: PairedSpeedup, margin: float) -> Outcome:
    """beaten: the whole interval lies above the threshold; not_beaten: none of it does;
    inconclusive: it straddles the threshold."""
    t = threshold(margin)
    tie = functools.partial(math.isclose, t, rel_tol=_TIE_REL_TOL)
    if speedup.ci_low > t and not tie(speedup.ci_low):
        return "beaten"
    if speedup.ci_high <= t or tie(speedup.ci_high):
        return "not_beaten"
    return "inconclusive"


def paired_milestone(vs_eager: PairedSpeedup, vs_compile: PairedSpeedup, margin: float,
                     starved: str = "") -> PairedMilestone:
    """3: eager and compile beaten; 2: eager beaten; 1: otherwise. An inconclusive comparison is
    not granted (the lower milestone); `inconclusive` says it cost a level (an inconclusive
    compile comparison costs nothing when eager was not beaten). `starved` (PairedTiming.starved):
    the baselines ran short of memory beside the candidate, so no comparison is decided."""
    eager, compiled = compare(vs_eager, margin), compare(vs_compile, margin)
    if starved:
        lost = "beaten" in (eager, compiled)
        eager = "inconclusive" if eager == "beaten" else eager
        compiled = "inconclusive" if compiled == "beaten" else compiled
        return PairedMilestone(level=1, vs_eager=eager, vs_compile=compiled, threshold=threshold(margin),
                               inconclusive=lost, note=starved)
    if eager == "beaten":
        level = 3 if compiled == "beaten" else 2
        undecided = ("torch.compile", vs_compile) if compiled == "inconclusive" else None
    else:
        level = 1
        undecided = ("eager", vs_eager) if eager == "inconclusive" else None
    t = threshold(margin)
    note = ""
    if undecided is not None:
        name, s = undecided
        note = (f"inconclusive against {name}: speedup {s.estimate:.4f}, {s.confidence:.0%} interval "
                f"[{s.ci_low:.4f}, {s.ci_high:.4f}] straddles {t:.4f} after {s.rounds} rounds")
    return PairedMilestone(level=level, vs_eager=eager, vs_compile=compiled, threshold=t,
                           inconclusive=undecided is not None, note=note)


__all__ = [
    "Outcome", "PairedConfig", "PairedMilestone", "PairedSpeedup", "PairedSubject", "PairedTiming", "Role",
    "RoundSubject", "RoundTimes", "RoundsRun", "compare", "interval_ranks", "paired_milestone", "paired_speedup",
    "paired_speedups", "rotation", "round_times", "rounds_needed", "run_rounds", "samples_per_round",
    "stop_reason", "threshold",
]
