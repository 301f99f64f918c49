"""The parent's comparisons of large CUDA outputs as single-pass CuPy reductions.

What it is: one kernel per statistic family that reads its tensors once, in their own dtype, and
accumulates in float64 (counts, sums and peaks) or in wrapping 64-bit integers (the words' sums
of a fingerprint) through warp reductions and one atomic per warp. Each returns its accumulator
on the device, unread (`rewards.verify.readout` reads a comparison's values at once); parameters
that depend on other device values (a scaled atol, the rms scale) are read by the kernel itself:

    check_stats(out, ref, tol)           -> non-finite, mismatches, max abs err, max rel err
    rms_stats(t)                         -> sum of squares, finite count
    precision_stats(out, ref, scale)     -> sum of |out - ref| / (|ref| + scale), finite pairs
    word_sums(words)                     -> the two wrapping sums of `probes.fingerprint`
    differing_words(words)               -> how many words differ from the first

Each returns None where it does not apply (a CPU tensor, a small or non-contiguous one, a dtype it
has no kernel for, no CuPy), and `rewards.verify.compare` then runs its torch version, which
gives the same numbers: the counts and the fingerprint exactly, the sums to rounding (their order
differs). The torch versions convert each chunk of 2**24 values to float64 and launch ~45 kernels
over it; these launch one kernel per statistic and read the tensors once.

The kernels are compiled by NVRTC on first use in a process (CuPy caches them on disk). A compile
or launch error is logged once and the process goes back to the torch versions: the comparison
is the evaluator's and must not fail with its accelerator. `CUDA_AGENT_FUSED_COMPARE=0` in the
environment keeps every process on the torch versions.

What it is not: the child's side. The candidate's process fingerprints with torch only
(`rewards.verify.probes`): a sandboxed child has no business compiling kernels of the judge.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import numpy
import torch

logger = logging.getLogger(__name__)

MIN_ELEMENTS = 1 << 20  # below this the torch versions' few kernels cost no more than a launch here
BLOCK = 256
MAX_BLOCKS = 4096  # grid-stride loops: enough blocks to fill any GPU, few atomics per accumulator

SOURCE = r"""
typedef unsigned long long u64;

__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_max(double v) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ bool lane0() { return (threadIdx.x & 31) == 0; }
__device__ __forceinline__ void add(double* p, double v) {
    v = warp_sum(v);
    if (lane0()) atomicAdd(p, v);
}
// Peaks are non-negative: as integers, non-negative doubles order as the values do. NaN and -0.0
// become +0.0, so the integer order holds.
__device__ __forceinline__ void peak(double* p, double v) {
    v = warp_max(v > 0.0 ? v : 0.0);
    if (lane0()) atomicMax((u64*)p, (u64)__double_as_longlong(v));
}
__device__ __forceinline__ void add_u64(u64* p, u64 v) {
    v = warp_sum_u64(v);
    if (lane0()) atomicAdd(p, v);
}

#define FOR_EACH(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (long long)gridDim.x * blockDim.x)

// tol: atol, rtol (on the device: the atol may scale with a magnitude not yet read)
// acc: non-finite, mismatches, max |out - ref|, max |out - ref| / max(|ref|, atol)
template <typename O, typename R>
__global__ void check_stats(const O* out, const R* ref, long long n, const double* tol, double* acc) {
    const double atol = tol[0], rtol = tol[1];
    double nonfinite = 0.0, mismatches = 0.0, max_abs = 0.0, max_rel = 0.0;
    FOR_EACH(i, n) {
        double o = (double)out[i], r = (double)ref[i];
        if (isfinite(r)) {
            if (!isfinite(o)) {
                nonfinite += 1.0;
            } else {
                double d = fabs(o - r);
                if (d > atol + rtol * fabs(r)) mismatches += 1.0;
                max_abs = fmax(max_abs, d);
                max_rel = fmax(max_rel, d / fmax(fabs(r), atol));
            }
        } else if (!(o == r || (isnan(o) && isnan(r)))) {
            nonfinite += 1.0;
        }
    }
    add(acc, nonfinite);
    add(acc + 1, mismatches);
    peak(acc + 2, max_abs);
    peak(acc + 3, max_rel);
}

// acc: sum of squares of the finite values, their count
template <typename T>
__global__ void rms_stats(const T* x, long long n, double* acc) {
    double squares = 0.0, count = 0.0;
    FOR_EACH(i, n) {
        double v = (double)x[i];
        if (isfinite(v)) {
            squares += v * v;
            count += 1.0;
        }
    }
    add(acc, squares);
    add(acc + 1, count);
}

// acc: sum of |out - ref| / (|ref| + scale) where both are finite, their count; scale on the device
template <typename O, typename R>
__global__ void precision_stats(const O* out, const R* ref, long long n, const double* scale_at, double* acc) {
    const double scale = *scale_at;
    double total = 0.0, count = 0.0;
    FOR_EACH(i, n) {
        double o = (double)out[i], r = (double)ref[i];
        if (isfinite(o) && isfinite(r)) {
            total += fabs(o - r) / (fabs(r) + scale);
            count += 1.0;
        }
    }
    add(acc, total);
    add(acc + 1, count);
}

// acc: the words' sum and sum of squares, each widened to 64 bits as torch widens them (signed
// words sign-extended, bytes zero-extended) and wrapping modulo 2**64
template <typename W>
__global__ void word_sums(const W* words, long long n, u64* acc) {
    u64 s1 = 0, s2 = 0;
    FOR_EACH(i, n) {
        u64 w = (u64)(long long)words[i];
        s1 += w;
        s2 += w * w;
    }
    add_u64(acc, s1);
    add_u64(acc + 1, s2);
}

// acc: how many words differ from the first
template <typename W>
__global__ void differing_words(const W* words, long long n, double* acc) {
    double differ = 0.0;
    W first = words[0];
    FOR_EACH(i, n) {
        if (words[i] != first) differ += 1.0;
    }
    add(acc, differ);
}
"""

_FLOATS = {torch.float32: "float", torch.float64: "double"}
_WORDS = {torch.uint8: "unsigned char", torch.int16: "short", torch.int32: "int", torch.int64: "long long"}
_PAIRS = [(o, r) for o in _FLOATS.values() for r in _FLOATS.values()]
NAMES = (
    [f"check_stats<{o}, {r}>" for o, r in _PAIRS]
    + [f"precision_stats<{o}, {r}>" for o, r in _PAIRS]
    + [f"rms_stats<{t}>" for t in _FLOATS.values()]
    + [f"word_sums<{w}>" for w in _WORDS.values()]
    + [f"differing_words<{w}>" for w in _WORDS.values()]
)


class _Kernels:
    """The compiled module, per process; `off` once a compile or launch failed here, or the
    process chose the torch versions (`keep_off`)."""

    def __init__(self) -> None:
        self.module: Any = None
        self.off = False

    def function(self, name: str) -> Any:
        import cupy

        if self.module is None:
            self.module = cupy.RawModule(code=SOURCE, options=("--std=c++14",), name_expressions=NAMES)
        return self.module.get_function(name)

    def disable(self, error: BaseException) -> None:
        self.off = True
        logger.warning("fused comparisons off in this process, comparing with torch: %s: %s",
                       type(error).__name__, str(error).splitlines()[0] if str(error) else "")


_KERNELS = _Kernels()


def keep_off() -> None:
    """Compare with the torch versions for the rest of this process, and compile nothing. For a
    short-lived process with few comparisons, such as the profile job's child: a fresh process
    compiles the kernels through NVRTC (~1 s; CuPy's disk cache lives in the job's scratch, emptied
    after each job), where the torch versions of its two checks take milliseconds."""
    _KERNELS.off = True


@functools.cache
def _cupy() -> Any:
    """CuPy, or None; asked once per process (a failed import is not cached by Python, and
    `applies` runs on every comparison)."""
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def applies(*tensors: torch.Tensor, kinds: dict = _FLOATS) -> bool:
    """Whether the kernels take these tensors: CUDA, one device, contiguous, at least
    `MIN_ELEMENTS` values each (the same count), dtypes with a kernel, CuPy importable, and not
    turned off (`keep_off`, a failure, `CUDA_AGENT_FUSED_COMPARE=0`)."""
    if _KERNELS.off or not tensors or os.environ.get("CUDA_AGENT_FUSED_COMPARE", "1") == "0":
        return False
    first = tensors[0]
    if first.device.type != "cuda" or first.numel() < MIN_ELEMENTS:
        return False
    for t in tensors:
        if t.device != first.device or not t.is_contiguous() or t.numel() != first.numel() or t.dtype not in kinds:
            return False
    return _cupy() is not None


def _launch(name: str, data: tuple[torch.Tensor, ...], params: tuple[torch.Tensor, ...], slots: int,
            dtype: torch.dtype = torch.float64) -> torch.Tensor | None:
    """Queue kernel `name` over `data` (n values each) with its device-side `params` (float64) on
    torch's current stream into a fresh accumulator of `slots` values, and return the accumulator
    unread; None when the kernels failed (then never tried again in this process)."""
    cupy = _cupy()
    device = data[0].device
    n = data[0].numel()
    acc = torch.zeros(slots, dtype=dtype, device=device)
    blocks = max(1, min(MAX_BLOCKS, -(-n // BLOCK)))
    from rewards.timing.gpu_timer import external_stream

    try:
        with cupy.cuda.Device(device.index):
            kernel = _KERNELS.function(name)
            with external_stream(torch.cuda.current_stream(device), device.index):
                kernel((blocks,), (BLOCK,), (*(_pointer(cupy, t) for t in data), numpy.int64(n),
                                              *(_pointer(cupy, p) for p in params), _pointer(cupy, acc)))
    except Exception as error:  # NVRTC, driver or CuPy errors: the torch versions still judge
        _KERNELS.disable(error)
        return None
    return acc


def _pointer(cupy: Any, t: torch.Tensor) -> Any:
    """A CuPy view of `t`'s memory (no copy, no synchronisation); `t` keeps it alive."""
    memory = cupy.cuda.UnownedMemory(t.data_ptr(), t.numel() * t.element_size(), t, t.device.index)
    return cupy.ndarray((t.numel(),), dtype=_CUPY_DTYPES[t.dtype], memptr=cupy.cuda.MemoryPointer(memory, 0))


_CUPY_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.uint8: "uint8", torch.int16: "int16",
                torch.int32: "int32", torch.int64: "int64"}


def check_stats(out: torch.Tensor, ref: torch.Tensor, tol: torch.Tensor) -> torch.Tensor | None:
    """[non-finite, mismatches, max abs err, max rel err] of `out` against `ref` under `tol`
    ([atol, rtol], float64 on the device), as `rewards.verify.compare` counts them, unread; None
    where the kernels do not apply."""
    if not applies(out, ref):
        return None
    name = f"check_stats<{_FLOATS[out.dtype]}, {_FLOATS[ref.dtype]}>"
    return _launch(name, (out.reshape(-1), ref.reshape(-1)), (_param(tol, ref),), 4)


def rms_stats(t: torch.Tensor) -> torch.Tensor | None:
    """[sum of squares, count] of `t`'s finite values, unread; None where the kernels do not apply."""
    if not applies(t):
        return None
    return _launch(f"rms_stats<{_FLOATS[t.dtype]}>", (t.reshape(-1),), (), 2)


def precision_stats(out: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor) -> torch.Tensor | None:
    """[summed |out - ref| / (|ref| + scale), count] over pairs both finite, unread; `scale` a
    float64 value on the device; None where the kernels do not apply."""
    if not applies(out, ref):
        return None
    name = f"precision_stats<{_FLOATS[out.dtype]}, {_FLOATS[ref.dtype]}>"
    return _launch(name, (out.reshape(-1), ref.reshape(-1)), (_param(scale, ref),), 2)


def word_sums(words: torch.Tensor) -> torch.Tensor | None:
    """The two wrapping 64-bit sums of `probes.fingerprint` over `words` (a 1-D view of a
    tensor's bytes as uint8, int16, int32 or int64), an int64 pair, unread; None where the
    kernels do not apply."""
    if not applies(words, kinds=_WORDS):
        return None
    return _launch(f"word_sums<{_WORDS[words.dtype]}>", (words,), (), 2, dtype=torch.int64)


def differing_words(words: torch.Tensor) -> torch.Tensor | None:
    """How many of `words` differ from the first, unread; None where the kernels do not apply."""
    if not applies(words, kinds=_WORDS):
        return None
    return _launch(f"differing_words<{_WORDS[words.dtype]}>", (words,), (), 1)


def _param(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A kernel's parameters as contiguous float64 on `like`'s device (no host copy)."""
    return t.to(device=like.device, dtype=torch.float64).reshape(-1).contiguous()
