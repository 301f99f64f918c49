"""Comparing a candidate's outputs with the reference, on the trusted side.

What it is: `check_output(out, ref)` (shape, dtype, non-finite values, elementwise tolerance),
`within_tolerance(out, ref)` (the same pass or fail, cheaply, without the numbers),
`precision_error(out, ref)` (how far below the reference's precision the output is),
`mantissa_change(...)` (how an output follows the inputs' low mantissa bits, against the reference),
the output's typical magnitude (its scale, for the atol of the input variants), and the
primitives `rewards.verify.judge` uses to spot degenerate and replayed outputs (`is_constant`,
`samples`, `mean_abs`, `spread`). Large tensors are processed in chunks, in float64, on their device.

Tolerances are tied to the output dtype (rewards/README.md, hack 12):

    dtype     atol = rtol   precision floor
    float32   1e-2          2e-5       (the paper's assert_close tolerance)
    float64   1e-2          1e-9
    float16   1e-2          2e-3
    bfloat16  2e-2          1.6e-2
    integers and bool: exact

The loose 1e-2 tolerance admits fp16, bf16 and TF32 arithmetic behind fp32 outputs, so passing
outputs are also held to their dtype's precision: the normalised mean error
mean(|out - ref| / (|ref| + rms(ref))) must stay below max(floor, factor x the same error of the
exact-fp32 reference against a float64 one) when a float64 reference was affordable, else
below the floor. fp16 rounding alone gives ~1e-4 on this scale, bf16 ~1e-3, TF32 GEMMs ~1e-4;
honest fp32 kernels with another summation order stay near 1e-7..1e-6. But honest fp32
approximations land in fp16's range too (a tanh GELU 2e-5..1e-4, an in-order sum of 0.5-1M
terms 2e-5..8e-5), so for float32 outputs the magnitude alone decides nothing between the floor
and `APPROXIMATION_FLOOR`: there the mantissa probe does (`mantissa_change`, on inputs from
`rewards.verify.inputs.probe_inputs`). A candidate that computes on inputs converted to fp16,
bf16 or TF32 gives the same output for two inputs that differ only in the bits the conversion
drops, and an output rounded to fp16 or bf16 mostly so, where an fp32 computation's output
changes as the reference's does.

The atol is KernelBench's for its own inputs. The "signed" and "scaled" input variants
(`rewards.verify.inputs`) make long sums cancel: an output element near 0 is then the difference
of terms far larger than itself, and fp32 rounding of an honest sum is an absolute error on the
scale of the whole output, which the "scaled" variant grows too (a K = 524,288 dot product with
inputs scaled by 5, summed in order in fp32: error std 0.09, output median 4,200). On those
variants the judge asks for `scaled_atol`: atol times max(1, the typical magnitude of ref), so atol
is relative to the output's typical size; the "task" variant keeps KernelBench's tolerance.

Every statistic stays on the device until it is read: `queue_output` queues all that the judge
reads of one output (check, fingerprints, constancy, precision error, samples) on a
`rewards.verify.readout.Readout`, and one host read brings it all back; on a GPU shared with other
processes each read waits a scheduling round of theirs. The plain functions (`check_output`,
`precision_error`, `fingerprint`, ...) make one read each.

What it is not: the verdict, and no knowledge of trials (`rewards.verify.judge` keeps the history).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch
from msgspec import Struct

from rewards.verdict import VerdictStatus
from rewards.verify import fused, probes
from rewards.verify.readout import Readout

T = TypeVar("T")

CHUNK = 1 << 24  # elements per step: float64 temporaries of 128 MiB
SAMPLES = 4096


class Tolerance(Struct, frozen=True, kw_only=True):
    atol: float
    rtol: float
    precision_floor: float


TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-2, rtol=1e-2, precision_floor=2e-5),
    torch.float64: Tolerance(atol=1e-2, rtol=1e-2, precision_floor=1e-9),
    torch.float16: Tolerance(atol=1e-2, rtol=1e-2, precision_floor=2e-3),
    torch.bfloat16: Tolerance(atol=2e-2, rtol=2e-2, precision_floor=1.6e-2),
}


# Past the dtype floor, a float32 output the mantissa probe finds following its inputs' low bits
# is an fp32 approximation, held only to this: a tenth of KernelBench's rtol, ten times the
# largest honest approximation seen (a tanh GELU, 1.1e-4).
APPROXIMATION_FLOOR = 1e-3
# The probe's eligible elements are the outputs whose reference change is PROBE_SIGNAL x the
# reference's own fp32 error (its mean error against float64, at least PROBE_MIN_NOISE) or more;
# one of them is frozen where the candidate's change is under PROBE_FROZEN x the reference's. With
# at least PROBE_MIN_ELIGIBLE of them, more than PROBE_FROZEN_SHARE frozen is a downgrade: inputs
# converted freeze all, an output rounded to fp16 about half or more (its change is a whole fp16
# unit or nothing), an fp32 computation a few percent at most (where its own rounding noise
# happens to cancel the change).
PROBE_SIGNAL = 4.0
PROBE_MIN_NOISE = 2.0**-20
PROBE_FROZEN = 0.1
PROBE_MIN_ELIGIBLE = 16
PROBE_FROZEN_SHARE = 1 / 3


def tolerance_for(dtype: torch.dtype, atol: float | None = None, rtol: float | None = None) -> Tolerance | None:
    """The dtype's tolerance (overrides applied); None means exact comparison."""
    base = TOLERANCES.get(dtype)
    if base is None:
        if dtype.is_floating_point or dtype.is_complex:
            base = TOLERANCES[torch.float32]
        else:
            return None
    return Tolerance(
        atol=base.atol if atol is None else atol,
        rtol=base.rtol if rtol is None else rtol,
        precision_floor=base.precision_floor,
    )


class Check(Struct, frozen=True, kw_only=True):
    """One output against its reference."""

    status: VerdictStatus
    message: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    mismatches: int = 0


class OutputFacts(Struct, frozen=True, kw_only=True):
    """What the judge reads of one output against its reference (`queue_output`)."""

    check: Check
    digest: str
    """`fingerprint` of the output."""
    constant: bool
    ref_digest: str
    ref_constant: bool
    precision: float | None
    """`precision_error` against the exact reference; None where shape or dtype differ, or the
    output's dtype has no tolerance."""
    samples: torch.Tensor | None = None
    """`samples` of the output and of the reference (not the float64 one), when asked."""
    ref_samples: torch.Tensor | None = None


def queue_output(out: torch.Tensor, ref: torch.Tensor, readout: Readout, *, exact: torch.Tensor | None = None,
                 atol: float | None = None, rtol: float | None = None, scaled_atol: bool = False,
                 with_samples: bool = False) -> Callable[[], OutputFacts]:
    """Queue on `readout` all that the judge reads of `out` against `ref` (values against `exact`
    when given): the check, fingerprints and constancy of both, the precision error and, with
    `with_samples`, both tensors' samples. `scaled_atol` scales atol by the output's typical
    magnitude (at least 1), taken on the device. Call the result after `readout.read()`."""
    check = queue_check(out, ref, readout, atol, rtol, exact=exact, scaled_atol=scaled_atol)
    target = ref if exact is None else exact
    comparable = tuple(out.shape) == tuple(ref.shape) and out.dtype == ref.dtype
    precision = (queue_precision(out, target, readout)
                 if comparable and tolerance_for(out.dtype) is not None else lambda: None)
    digest, constant = queue_fingerprint(out, readout), queue_constant(out, readout)
    ref_digest, ref_constant = queue_fingerprint(ref, readout), queue_constant(ref, readout)
    taken = (queue_samples(out, readout), queue_samples(ref, readout)) if with_samples else None

    def facts() -> OutputFacts:
        return OutputFacts(check=check(), digest=digest(), constant=constant(), ref_digest=ref_digest(),
                           ref_constant=ref_constant(), precision=precision(),
                           samples=taken[0]() if taken else None, ref_samples=taken[1]() if taken else None)

    return facts


def _pairs(a: torch.Tensor, b: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for x, y in zip(a.reshape(-1).split(CHUNK), b.reshape(-1).split(CHUNK)):
        yield x.to(torch.float64), y.to(torch.float64)


def _read(queued: Callable[[Readout], Callable[[], T]]) -> T:
    readout = Readout()
    result = queued(readout)
    readout.read()
    return result()


def check_output(
    out: torch.Tensor,
    ref: torch.Tensor,
    atol: float | None = None,
    rtol: float | None = None,
    *,
    exact: torch.Tensor | None = None,
    scaled_atol: bool = False,
) -> Check:
    """Shape and dtype against `ref` (the task's own precision), then values against `exact`
    (a float64 reference, when there is one) or `ref`: non-finite where the reference is finite
    fails; elsewhere |out - ref| <= atol * scale + rtol * |ref| (exact for integer dtypes), the
    scale 1, or with `scaled_atol` the output's typical magnitude (at least 1). One host read."""
    return _read(lambda readout: queue_check(out, ref, readout, atol, rtol, exact=exact, scaled_atol=scaled_atol))


_ISCLOSE_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
                             torch.complex128})


def within_tolerance(out: torch.Tensor, ref: torch.Tensor, atol: float | None = None,
                     rtol: float | None = None) -> bool:
    """Whether `out` is within `check_output(out, ref, atol, rtol)`'s tolerance, decided cheaply:
    `torch.isclose` (NaN equal to NaN, an infinity close only to itself) chunk by chunk in the
    tensors' own dtype, one host read; exact equality for integer dtypes. False when it is not, and
    whenever this cannot tell cheaply (shapes, dtypes or devices that differ, a dtype without an
    isclose kernel): the caller then asks `check_output`. For a process that compares a few times:
    the float64 path's first launches take ~0.4 s in a fresh process on an H200, this one's ~0.1 s.
    The bound is rounded in the tensors' dtype, not in float64, so a value within that rounding of
    it may pass here and fail `check_output`: callers that need the exact verdict ask that."""
    if tuple(out.shape) != tuple(ref.shape) or out.dtype != ref.dtype or out.device != ref.device:
        return False
    tol = tolerance_for(ref.dtype, atol, rtol)
    if tol is None:
        return torch.equal(out, ref)
    if ref.dtype not in _ISCLOSE_DTYPES:  # float8 and the like: torch.isclose has no kernel for them
        return False
    far = torch.zeros((), dtype=torch.int64, device=ref.device)
    for x, y in zip(out.reshape(-1).split(CHUNK), ref.reshape(-1).split(CHUNK)):
        far += (~torch.isclose(x, y, rtol=tol.rtol, atol=tol.atol, equal_nan=True)).sum()
    return int(far) == 0


def queue_check(out: torch.Tensor, ref: torch.Tensor, readout: Readout, atol: float | None = None,
                rtol: float | None = None, *, exact: torch.Tensor | None = None,
                scaled_atol: bool = False) -> Callable[[], Check]:
    """`check_output`, queued on `readout`."""
    if tuple(out.shape) != tuple(ref.shape):
        shape = Check(status=VerdictStatus.SHAPE_MISMATCH, message=f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
        return lambda: shape
    if out.dtype != ref.dtype:
        dtype = Check(status=VerdictStatus.DTYPE_MISMATCH, message=f"dtype {out.dtype}, expected {ref.dtype}")
        return lambda: dtype
    if out.device != ref.device:
        out = out.to(ref.device)
    tol = tolerance_for(ref.dtype, atol, rtol)
    if tol is None:
        wrong = readout.add((out != ref).sum())
        return lambda: _exact_check(readout.ints(wrong)[0], ref.numel())
    target = ref if exact is None else exact
    scale = _atol_scale(target) if scaled_atol else torch.ones((), dtype=torch.float64, device=target.device)
    limits = torch.stack([scale * tol.atol, torch.full_like(scale, tol.rtol)])  # [atol, rtol] on the device
    stats = fused.check_stats(out, target, limits)
    stats_at = readout.add(stats if stats is not None else _float_stats(out, target, limits))
    limits_at = readout.add(limits)  # the message names the atol that was applied

    def check() -> Check:
        nonfinite, mismatches, max_abs, max_rel = readout.floats(stats_at)
        applied = Tolerance(atol=readout.floats(limits_at)[0], rtol=tol.rtol, precision_floor=tol.precision_floor)
        return _float_check(int(nonfinite), int(mismatches), max_abs, max_rel, target.numel(), applied)

    return check


def _exact_check(wrong: int, n: int) -> Check:
    if wrong:
        return Check(status=VerdictStatus.WRONG_OUTPUT, message=f"{wrong} of {n} values differ", mismatches=wrong)
    return Check(status=VerdictStatus.OK, max_abs_err=0.0, max_rel_err=0.0)


def _float_check(nonfinite: int, mismatches: int, max_abs: float, max_rel: float, n: int, tol: Tolerance) -> Check:
    numbers = dict(max_abs_err=max_abs, max_rel_err=max_rel, mismatches=mismatches)
    if nonfinite:
        return Check(status=VerdictStatus.NAN_INF, message=f"{nonfinite} NaN/Inf values where the reference has none", **numbers)
    if mismatches:
        message = (
            f"{mismatches} of {n} values outside atol={tol.atol:g}, rtol={tol.rtol:g} "
            f"(max abs err {max_abs:.3g}, max rel err {max_rel:.3g})"
        )
        return Check(status=VerdictStatus.WRONG_OUTPUT, message=message, **numbers)
    return Check(status=VerdictStatus.OK, **numbers)


def _float_stats(out: torch.Tensor, ref: torch.Tensor, limits: torch.Tensor) -> torch.Tensor:
    """[non-finite, mismatches, max abs err, max rel err] under `limits` ([atol, rtol] on the
    device), with torch, chunk by chunk in float64, unread (`rewards.verify.fused.check_stats` is
    the same in one pass). float64 holds the counts exactly (below 2**53), so counts and peaks
    share one tensor."""
    atol, rtol = limits[0], limits[1]
    acc = torch.zeros(4, dtype=torch.float64, device=ref.device)  # non-finite, mismatches, max abs, max rel
    for o, r in _pairs(out, ref):
        finite = torch.isfinite(r)
        same_special = ~finite & ((o == r) | (torch.isnan(o) & torch.isnan(r)))
        acc[0] += (~torch.isfinite(o) & finite).sum() + (~finite & ~same_special).sum()
        both = finite & torch.isfinite(o)
        diff = torch.where(both, (o - r).abs(), 0.0)
        acc[1] += (diff > atol + rtol * r.abs()).sum()
        if diff.numel():
            acc[2] = torch.maximum(acc[2], diff.max())
            # only where both are finite: a NaN in the reference is no relative error
            acc[3] = torch.maximum(acc[3], torch.where(both, diff / torch.maximum(r.abs(), atol), 0.0).max())
    return acc


def _rms_sums(t: torch.Tensor) -> torch.Tensor:
    """[sum of squares, count] of the finite elements, on the device, unread."""
    sums = fused.rms_stats(t)
    if sums is not None:
        return sums
    sums = torch.zeros(2, dtype=torch.float64, device=t.device)
    for x in t.reshape(-1).split(CHUNK):
        x = x.to(torch.float64)
        finite = torch.isfinite(x)
        sums += torch.stack([torch.where(finite, x * x, 0.0).sum(), finite.sum()])
    return sums


def rms(t: torch.Tensor) -> float:
    """Root mean square of the finite elements; 0 if none is finite. One host read."""
    total, count = _rms_sums(t).tolist()
    return math.sqrt(total / count) if count else 0.0


def _scale(t: torch.Tensor) -> torch.Tensor:
    """rms(t), or 1 where that is 0 (or nothing is finite), as a float64 scalar on the device."""
    total, count = _rms_sums(t).unbind()
    value = (total / count).sqrt()  # 0 / 0 is NaN: nothing finite
    return torch.where(value > 0, value, 1.0)


def _atol_scale(t: torch.Tensor) -> torch.Tensor:
    """max(1, the typical magnitude of `t`) as a float64 scalar on `t`'s device, unread. The typical
    magnitude is the median |value| of `samples(t)`'s finite elements (the lower middle one of an
    even count; 0 if none is finite): the scale of an output, which a few outliers (a cumprod's
    first terms, a softmax's peak) cannot inflate. Non-finite samples are left out as NaN."""
    if t.numel() == 0:
        return torch.ones((), dtype=torch.float64, device=t.device)
    values = _sampled(t).abs()
    median = torch.nanmedian(torch.where(torch.isfinite(values), values, math.nan))
    return torch.nan_to_num(median, nan=0.0).clamp_min(1.0)


def precision_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """mean(|out - ref| / (|ref| + rms(ref))) over finite elements; 0 for integer dtypes. One host read."""
    return _read(lambda readout: queue_precision(out, ref, readout))


def queue_precision(out: torch.Tensor, ref: torch.Tensor, readout: Readout) -> Callable[[], float]:
    """`precision_error`, queued on `readout`."""
    if not ref.dtype.is_floating_point or ref.numel() == 0:
        return lambda: 0.0
    scale = _scale(ref)
    out = out.to(ref.device)
    sums = fused.precision_stats(out, ref, scale)
    if sums is None:
        sums = torch.zeros(2, dtype=torch.float64, device=ref.device)  # summed error, finite pairs
        for o, r in _pairs(out, ref):
            both = torch.isfinite(o) & torch.isfinite(r)
            err = (o - r).abs() / (r.abs() + scale)
            sums += torch.stack([torch.where(both, err, 0.0).sum(), both.sum()])
    handle = readout.add(sums)

    def error() -> float:
        total, count = readout.floats(handle)
        return total / count if count else 0.0

    return error


class ProbeChange(Struct, frozen=True, kw_only=True):
    """How outputs changed between the mantissa probe's two inputs (sums over outputs add up)."""

    elements: int = 0  # finite in all four tensors
    eligible: int = 0  # whose reference change stands out of the reference's fp32 noise
    frozen: int = 0  # eligible ones whose candidate change is under PROBE_FROZEN x the reference's
    cand_change: float = 0.0  # summed normalised changes over the eligible elements
    ref_change: float = 0.0

    def __add__(self, other: ProbeChange) -> ProbeChange:
        return ProbeChange(elements=self.elements + other.elements, eligible=self.eligible + other.eligible,
                           frozen=self.frozen + other.frozen, cand_change=self.cand_change + other.cand_change,
                           ref_change=self.ref_change + other.ref_change)


def mantissa_change(cand_near: torch.Tensor, cand_rounded: torch.Tensor, ref_near: torch.Tensor,
                    ref_rounded: torch.Tensor, noise: float = 0.0) -> ProbeChange:
    """Element by element, the candidate's change |cand_near - cand_rounded| against the
    reference's |ref_near - ref_rounded|, both normalised as `precision_error` normalises
    (by |ref_near| + rms(ref_near)). `noise` is the reference's own normalised fp32 error."""
    threshold = PROBE_SIGNAL * max(noise, PROBE_MIN_NOISE)
    scale = _scale(ref_near)
    sums = torch.zeros(5, dtype=torch.float64, device=ref_near.device)  # elements, eligible, frozen, changes
    chunks = (t.to(ref_near.device).reshape(-1).split(CHUNK) for t in (cand_near, cand_rounded, ref_near, ref_rounded))
    for cn, cr, rn, rr in zip(*chunks):
        cn, cr, rn, rr = (t.to(torch.float64) for t in (cn, cr, rn, rr))
        finite = torch.isfinite(cn) & torch.isfinite(cr) & torch.isfinite(rn) & torch.isfinite(rr)
        denom = rn.abs() + scale
        ref_change = torch.where(finite, (rn - rr).abs() / denom, 0.0)
        cand_change = torch.where(finite, (cn - cr).abs() / denom, 0.0)
        eligible = ref_change > threshold
        frozen = eligible & (cand_change < PROBE_FROZEN * ref_change)
        sums += torch.stack([finite.sum(), eligible.sum(), frozen.sum(),
                             torch.where(eligible, cand_change, 0.0).sum(), torch.where(eligible, ref_change, 0.0).sum()])
    elements, eligible_n, frozen_n, cand_total, ref_total = sums.tolist()
    return ProbeChange(elements=int(elements), eligible=int(eligible_n), frozen=int(frozen_n),
                       cand_change=cand_total, ref_change=ref_total)


def is_constant(t: torch.Tensor) -> bool:
    """All elements bitwise equal (an all-zero or all-NaN output included). One host read."""
    return _read(lambda readout: queue_constant(t, readout))


def queue_constant(t: torch.Tensor, readout: Readout) -> Callable[[], bool]:
    """`is_constant`, queued on `readout`."""
    if t.numel() <= 1:
        return lambda: False
    words = probes.fingerprint_words(t)
    differing = fused.differing_words(words)
    if differing is None:
        first = words[:1]
        differing = torch.zeros((), dtype=torch.float64, device=t.device)
        for chunk in words.split(CHUNK):
            differing += (chunk != first).sum()
    handle = readout.add(differing)
    return lambda: readout.floats(handle)[0] == 0


def fingerprint(t: torch.Tensor) -> str:
    """`rewards.verify.probes.fingerprint` on the trusted side: the same digest, its sums taken
    in one pass (`rewards.verify.fused.word_sums`) where the kernels apply. One host read."""
    return _read(lambda readout: queue_fingerprint(t, readout))


def fingerprints(tensors: list[torch.Tensor]) -> tuple[str, ...]:
    """`fingerprint` of each of `tensors`, with one host read for all."""
    readout = Readout()
    queued = [queue_fingerprint(t, readout) for t in tensors]
    readout.read()
    return tuple(digest() for digest in queued)


def queue_fingerprint(t: torch.Tensor, readout: Readout) -> Callable[[], str]:
    """`fingerprint`, queued on `readout`."""
    t = t.detach()
    if t.numel() == 0:
        return lambda: probes.digest(t, 0, 0)
    words = probes.fingerprint_words(t)
    sums = fused.word_sums(words)
    handle = readout.add(sums if sums is not None else probes.word_sums(words))
    return lambda: probes.digest(t, *readout.ints(handle))


def samples(t: torch.Tensor, count: int = SAMPLES) -> torch.Tensor:
    """`count` evenly spaced elements as float64 on the CPU: the same positions for every
    tensor of one shape, so samples of different trials can be compared. One host read."""
    return _read(lambda readout: queue_samples(t, readout, count))


def queue_samples(t: torch.Tensor, readout: Readout, count: int = SAMPLES) -> Callable[[], torch.Tensor]:
    """`samples`, queued on `readout`."""
    if t.numel() == 0:
        return lambda: torch.zeros(0, dtype=torch.float64)
    handle = readout.add(_sampled(t, count))
    return lambda: readout.tensor(handle)


def _sampled(t: torch.Tensor, count: int = SAMPLES) -> torch.Tensor:
    """The elements of `samples`, as float64 on `t`'s device (`t` not empty)."""
    flat = t.reshape(-1)
    # float64 positions: float32 cannot count past 2**24, and a 1.6e9-element output rounds
    # its last position past the end.
    last = flat.numel() - 1
    index = torch.linspace(0, last, min(count, flat.numel()), dtype=torch.float64, device=flat.device)
    return flat[index.round().long().clamp_(0, last)].to(torch.float64)


def spread(t: torch.Tensor) -> float:
    """Mean |value - median| over the finite elements of a sample: no constant comes closer to
    it than this on average; inf for fewer than two finite elements (nothing to spread)."""
    finite = t[torch.isfinite(t)]
    if finite.numel() < 2:
        return math.inf
    return float((finite - finite.median()).abs().mean())


def mean_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean |a - b| over positions where both are finite (samples of equal length)."""
    if a.shape != b.shape or a.numel() == 0:
        return math.inf
    both = torch.isfinite(a) & torch.isfinite(b)
    if not bool(both.any()):
        return math.inf
    return float((a - b).abs()[both].mean())
