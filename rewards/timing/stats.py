"""The statistics of GPU timing: robust noise of a median, outliers, speedups with their noise.

What it is: pure functions over lists of per-call times (milliseconds), no clocks, no GPU, no
torch, so every rule the profiler applies is testable on a CPU. `rewards.timing.sampling` samples the GPU
and asks these functions when to stop and how noisy the result is.

What it is not: no sampling loop (that is `rewards.timing.sampling`), no reward (`rewards.reward`).

The result of a measurement is the MEDIAN of its samples: one slow sample (a clock dip, a page
fault, a GC pause that left the GPU idle) moves a mean but not a median. Its noise is the
distribution-free standard error of the median: the order statistics at ranks n/2 -+ z*sqrt(n)/2
bound a z-sigma confidence interval for the median whatever the distribution (binomial argument),
so SE ~ (x_hi - x_lo) / (2 z). Unlike a MAD-times-constant estimate it assumes no shape (timings
are skewed and often bimodal); unlike a bootstrap it is deterministic and O(n log n). On normal
samples it matches the textbook sqrt(pi/2) * sigma / sqrt(n) (tests check this).

Outliers are counted, never dropped: the median is already robust, and the count (with mean, std,
min and max, computed over all samples) keeps a spiky run visible in the report.

Example:
    rel = rel_stderr_median([1.00, 1.01, 0.99, 1.02, 1.00])
    s = speedup(baseline_ms=2.0, baseline_rel_err=0.002, candidate_ms=1.0, candidate_rel_err=0.003)
    s.value, s.rel_err    # 2.0, 0.0036...
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from msgspec import Struct

Z_CI = 1.96  # the order-statistic interval is a 95% interval; SE = half-width / Z_CI
MAD_TO_SIGMA = 1.4826  # MAD * this estimates sigma for normal data


def median(samples: Sequence[float]) -> float:
    if not samples:
        raise ValueError("no samples")
    return statistics.median(samples)


def stderr_median(samples: Sequence[float], z: float = Z_CI) -> float:
    """Distribution-free standard error of the median (module docstring); inf below 3 samples."""
    n = len(samples)
    if n < 3:
        return math.inf
    xs = sorted(samples)
    half = z * math.sqrt(n) / 2.0
    lo = max(0, math.floor(n / 2.0 - half))
    hi = min(n - 1, math.ceil(n / 2.0 + half) - 1)
    return (xs[hi] - xs[lo]) / (2.0 * z)


def rel_stderr_median(samples: Sequence[float]) -> float:
    """Standard error of the median over the median; inf when undefined."""
    m = median(samples)
    return stderr_median(samples) / m if m > 0 else math.inf


def rel_stderr_mean(samples: Sequence[float]) -> float:
    """Standard error of the mean over the mean (what `Timing.rel_stderr` holds)."""
    n = len(samples)
    if n < 2:
        return math.inf
    mean = statistics.fmean(samples)
    return statistics.stdev(samples) / math.sqrt(n) / mean if mean > 0 else math.inf


def mad(samples: Sequence[float]) -> float:
    """Median absolute deviation from the median."""
    m = median(samples)
    return statistics.median(abs(x - m) for x in samples)


def outlier_threshold(samples: Sequence[float], mads: float) -> float:
    """Samples above this are outliers: median + `mads` robust sigmas (at least 0.1% of the median)."""
    m = median(samples)
    sigma = max(MAD_TO_SIGMA * mad(samples), 1e-3 * m)
    return m + mads * sigma


def count_outliers(samples: Sequence[float], mads: float) -> int:
    """How many samples lie above `outlier_threshold` (slow ones only: nothing runs too fast)."""
    if not samples:
        return 0
    limit = outlier_threshold(samples, mads)
    return sum(x > limit for x in samples)


def relative_spread(values: Sequence[float]) -> float:
    """(max - min) / median: the spread of medians across processes (bench.system.timing)."""
    return (max(values) - min(values)) / median(values)


class Speedup(Struct, frozen=True, kw_only=True):
    """baseline / candidate time, with the relative standard error propagated to first order."""

    value: float
    rel_err: float

    def sigmas_above(self, threshold: float) -> float:
        """How many standard errors `value` lies above `threshold` (negative when below)."""
        err = self.value * self.rel_err
        if err == 0:
            return math.copysign(math.inf, self.value - threshold) if self.value != threshold else 0.0
        return (self.value - threshold) / err


def speedup(
    *, baseline_ms: float, baseline_rel_err: float, candidate_ms: float, candidate_rel_err: float
) -> Speedup:
    """S = t_baseline / t_candidate; for a ratio of independent estimates the relative errors add
    in quadrature: rel_err(S) = sqrt(r_b^2 + r_c^2)."""
    if baseline_ms <= 0 or candidate_ms <= 0:
        raise ValueError(f"times must be positive: {baseline_ms}, {candidate_ms}")
    return Speedup(value=baseline_ms / candidate_ms, rel_err=math.hypot(baseline_rel_err, candidate_rel_err))


def side_work_suspect(
    device_ms: float, host_ms: float, *, lead_ms: float, slack_ms: float, slack_rel: float
) -> bool:
    """True when the host waited much longer than the events say the call took.

    For a synchronous sample the host interval (call start to device-wide synchronize) covers
    the device interval plus the rest of the lead kernel (`lead_ms`, the L2 flush still running
    when the call began) and the synchronize latency. Work that the events do not see, e.g. a
    kernel on a side stream (rewards/README.md, hack 7: on an H200 a 2.85 ms side-stream matmul
    read as 0.17 ms), shows up only in the host interval.
    """
    return host_ms - device_ms > lead_ms + slack_ms + slack_rel * host_ms
