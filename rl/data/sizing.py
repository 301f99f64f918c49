"""Problem sizing: a roofline estimate of a seed chain's eager time and peak memory on an
H100-class GPU, and the batch that puts the chain at a target eager time.

What it is: `profile(stages)` runs each stage once on meta tensors under a dispatch recorder
that lists every ATen kernel eager mode would launch (views cost nothing), with the bytes it
touches and its FLOPs, at two batch sizes; every count is linear in the batch (dim 0 of every
seed input is a pure batch dim), so one run gives a `Profile` of per-kernel lines.
`Profile.eager_ms(b)` sums over kernels max(bytes / HBM bandwidth, FLOPs / compute rate) plus a
launch cost; `Profile.peak_bytes(b)` models the peak the synthesis filter's memory check sees.
`sized_batch` is the largest "round" batch whose estimate is at most `Config.target_ms` and
whose peak fits `Config.memory_gib`. The rates and their check against measurements: `Config`.

What it is not: a measurement (the filters time every candidate), or a model of torch.compile.

Example:
    prof = profile(stages)                  # stages: [(SeedOp, in shape, out shape), ...]
    b = sized_batch(prof, Config())          # dim 0 that makes the estimate ~3 ms
    prof.eager_ms(b), prof.peak_bytes(b) / 2**30
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from msgspec import Struct
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from rl.data.seeds import SeedOp, Shape, build, propagate

CONV_OPS = frozenset({"convolution", "_convolution", "cudnn_convolution", "convolution_overrideable"})
"""Kernels timed at `Config.conv_flops_per_s` (the filters leave cuDNN's TF32 default on)."""

FUSED_ON_CUDA = frozenset({"nn.RMSNorm"})
"""Seed ops whose meta decomposition lists several kernels but CUDA eager runs one (torch >= 2.9)."""

OUTPUT_COPIES = 2
"""Output-sized tensors alive when the filter reads the peak (the output and its flattened copy)."""


class Config(Struct, frozen=True, kw_only=True):
    """The target and the machine the estimate is for (H100 SXM; an H200 streams ~1.4x faster).

    The rates are deliberately optimistic (full HBM streaming, no cache misses, cuDNN at
    TF32-class speed): the real eager time is then at or above the estimate, and aiming at 3 ms
    leaves a 3x margin over the filters' 1 ms floor and 30x under their 100 ms ceiling (the CUDA
    Agent paper's data filter). Checked against an H100 run (500 compositions at fixed
    2**27-element inputs): the estimate puts 66% of them under 1 ms where 51% measured so, and
    p10/p50/p90 of the rest at 1.09/1.75/4.49 ms against 1.07/1.79/5.42 measured. GEMMs,
    convolutions and attention count FLOPs with `torch.utils.flop_counter`'s formulas; ops that
    CUDA runs fused (`FUSED_ON_CUDA`) are charged one pass over their input and output, not their
    meta decomposition. The peak (`Profile.peak_bytes`) counts params, the task's input, the
    largest kernel's operands during the forward, the output and the copy its std takes
    (`rl.data.filters`). No seed op mixes or reduces over dim 0 except BatchNorm's statistics.
    """

    target_ms: float = 3.0
    """Estimated eager time to aim at; 0 turns sizing off (toy shapes for CPU tests)."""
    min_ms: float = 1.0
    """The filters' runtime floor: an estimate under it counts as out of the window."""
    max_ms: float = 100.0
    """The filters' runtime ceiling."""
    memory_gib: float = 12.0
    """Estimated peak at most (the filter's budget is 16 GiB; room for allocator slack)."""
    hbm_bytes_per_s: float = 3.0e12
    """Streaming bandwidth (H100 SXM: 3.35 TB/s peak)."""
    gemm_flops_per_s: float = 55e12
    """fp32 GEMM rate (torch leaves TF32 matmul off; H100 SXM fp32 peak 67 TFLOP/s)."""
    conv_flops_per_s: float = 150e12
    """Convolution rate: between cuDNN's TF32 (on by default in the filter, ~250 TFLOP/s at best,
    so >= ~1.7 ms at the target) and pinned fp32 (~35 TFLOP/s, the reward's FP32 policy: ~13 ms)."""
    launch_ms: float = 0.004
    """Per-kernel launch and dispatch cost of eager mode."""
    max_batch: int = 1 << 20
    """Dim 0 at most."""


class Kernel(Struct, frozen=True, kw_only=True):
    """One eager kernel's traffic and work as lines in the batch b: value(b) = fixed + per_row * b."""

    name: str
    bytes_fixed: float
    bytes_per_row: float
    flops_fixed: float
    flops_per_row: float


class Profile(Struct, frozen=True, kw_only=True):
    """A chain's kernels and its input/output/parameter sizes, each linear in the batch."""

    kernels: tuple[Kernel, ...]
    in_bytes_per_row: float
    out_bytes_per_row: float
    param_bytes: float
    config: Config = Config()

    def eager_ms(self, batch: int) -> float:
        c = self.config
        total = 0.0
        for k in self.kernels:
            nbytes = k.bytes_fixed + k.bytes_per_row * batch
            flops = k.flops_fixed + k.flops_per_row * batch
            rate = c.conv_flops_per_s if k.name in CONV_OPS else c.gemm_flops_per_s
            total += max(nbytes / c.hbm_bytes_per_s, flops / rate) * 1e3 + c.launch_ms
        return total

    def peak_bytes(self, batch: int) -> float:
        operands = max((k.bytes_fixed + k.bytes_per_row * batch for k in self.kernels), default=0.0)
        return (self.param_bytes + self.in_bytes_per_row * batch + OUTPUT_COPIES * self.out_bytes_per_row * batch
                + operands)


# ---------------------------------------------------------------------------------------------
# Recording kernels on meta tensors.


def footprint(t: torch.Tensor) -> int:
    """Distinct bytes a tensor addresses: broadcast (stride-0) dims read the same memory."""
    n = t.element_size()
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n


class _Recorder(TorchDispatchMode):
    """Every non-view ATen call: (name, distinct bytes read + written, FLOPs)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, float, float]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        returns = func._schema.returns
        if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            return out  # a view: no kernel
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        nbytes = sum(map(footprint, ins)) + sum(map(footprint, outs))
        formula = flop_registry.get(func._overloadpacket)
        flops = float(formula(*args, out_val=out, **kwargs)) if formula else 0.0
        if nbytes or flops:
            self.calls.append((func._overloadpacket.__name__, float(nbytes), flops))
        return out


def _with_batch(shape: Shape, batch: int) -> Shape:
    return (batch, *shape[1:])


def _record(op: SeedOp, shape: Shape) -> tuple[list[tuple[str, float, float]], float]:
    """(kernel calls, parameter bytes) of one stage on a meta input of `shape`."""
    with torch.device("meta"):
        fn = build(op, shape)
        x = torch.empty(shape)
        recorder = _Recorder()
        with torch.no_grad(), recorder:
            out = fn(x)
    params = sum(p.numel() * p.element_size() for p in fn.parameters()) if isinstance(fn, torch.nn.Module) else 0
    if op.name in FUSED_ON_CUDA:
        one = float(footprint(x) + footprint(out))
        return [("fused_" + op.name, one, 0.0)], float(params)
    return recorder.calls, float(params)


def profile(stages: Sequence[tuple[SeedOp, Shape, Shape]], config: Config = Config()) -> Profile:
    """The chain's kernels as lines in the batch (recorded at batch 2 and 4; BatchNorm needs > 1)."""
    kernels: list[Kernel] = []
    params = 0.0
    for op, shape, _ in stages:
        (two, params_two), (four, _) = _record(op, _with_batch(shape, 2)), _record(op, _with_batch(shape, 4))
        if [c[0] for c in two] != [c[0] for c in four]:
            raise ValueError(f"{op.name}: kernels depend on the batch size")
        for (name, b2, f2), (_, b4, f4) in zip(two, four):
            kernels.append(Kernel(name=name, bytes_fixed=2 * b2 - b4, bytes_per_row=(b4 - b2) / 2,
                                  flops_fixed=2 * f2 - f4, flops_per_row=(f4 - f2) / 2))
        params += params_two
    first, last = stages[0][1], stages[-1][2]
    return Profile(kernels=tuple(kernels), in_bytes_per_row=4.0 * math.prod(first[1:]),
                   out_bytes_per_row=4.0 * math.prod(last[1:]), param_bytes=params, config=config)


# ---------------------------------------------------------------------------------------------
# Choosing the batch.


def round_down(n: int) -> int:
    """`n` rounded down to 3 significant bits (..., 12, 14, 16, 20, 24, 28, 32, ...): tidy sizes."""
    if n < 8:
        return max(1, n)
    step = 1 << (n.bit_length() - 3)
    return n // step * step


def sized_batch(prof: Profile, config: Config, min_batch: int = 2) -> int:
    """The largest round batch >= min_batch whose estimate is <= target_ms and peak <= memory_gib."""
    budget = config.memory_gib * 2**30

    def fits(b: int) -> bool:
        return prof.eager_ms(b) <= config.target_ms and prof.peak_bytes(b) <= budget

    lo, hi = min_batch, config.max_batch
    if not fits(lo):
        return lo
    while lo < hi:  # both estimates grow with b: the last b that fits
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return max(min_batch, round_down(lo))


def in_window(prof: Profile, batch: int, config: Config) -> bool:
    """The estimate lies in the filters' runtime window and under the memory budget."""
    ms = prof.eager_ms(batch)
    return config.min_ms <= ms <= config.max_ms and prof.peak_bytes(batch) <= config.memory_gib * 2**30


def resize(stages: list[tuple[SeedOp, Shape, Shape]], config: Config = Config()
           ) -> tuple[list[tuple[SeedOp, Shape, Shape]], Profile, int]:
    """The chain with dim 0 set by `sized_batch` (shapes re-propagated), its profile and batch."""
    prof = profile(stages, config)
    batch = sized_batch(prof, config, min_batch=min(2, stages[0][1][0]))
    resized = propagate([op for op, _, _ in stages], _with_batch(stages[0][1], batch))
    if resized is None:
        raise ValueError(f"{[op.name for op, _, _ in stages]}: does not run at batch {batch}")
    return resized, prof, batch


def provenance(prof: Profile, batch: int) -> dict[str, float | int]:
    """Task metadata: the estimate behind the chosen size (compare with the filters' eager_ms)."""
    return {"batch": batch, "est_eager_ms": round(prof.eager_ms(batch), 3),
            "est_peak_gib": round(prof.peak_bytes(batch) / 2**30, 3)}
