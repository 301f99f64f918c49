"""The precision policy: the math modes baselines are timed in and candidates are judged in.

What it is: `PrecisionPolicy` (its `name` goes into baseline cache keys), the two policies
`FP32` (the default: reference, eager and torch.compile all in true fp32) and `TF32_BEST`,
`precision_flags(mode)`, a context manager that pins torch's float32 math mode and restores every
flag on exit, and `snapshot_flags()`, which the verifier compares before and after a candidate
runs (rewards/README.md, hack 11).

What it is not: it computes no errors and times nothing: `rewards.verify.compare` holds the
tolerances, `rewards.timing.baselines` times under `baseline_modes`.

Example:
    for mode in FP32.baseline_modes:
        with precision_flags(mode):
            eager_ms = time_gpu(model, make_inputs)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

from msgspec import Struct

from agentcore.types import JsonScalar

MathMode = Literal["ieee", "tf32"]

# New-API precision knobs (torch >= 2.9), parents before children, for an exact restore.
_NEW_API = (
    ("backends", "fp32_precision"),
    ("backends.cuda.matmul", "fp32_precision"),
    ("backends.cudnn", "fp32_precision"),
    ("backends.cudnn.conv", "fp32_precision"),
    ("backends.cudnn.rnn", "fp32_precision"),
    ("backends.mkldnn", "fp32_precision"),
    ("backends.mkldnn.matmul", "fp32_precision"),
    ("backends.mkldnn.conv", "fp32_precision"),
    ("backends.mkldnn.rnn", "fp32_precision"),
)
# Boolean flags that change numerics or algorithm choice.
_BOOL_FLAGS = (
    ("backends.cuda.matmul", "allow_fp16_reduced_precision_reduction"),
    ("backends.cuda.matmul", "allow_bf16_reduced_precision_reduction"),
    ("backends.cudnn", "benchmark"),
    ("backends.cudnn", "deterministic"),
)


class PrecisionPolicy(Struct, frozen=True, kw_only=True):
    """How baselines and candidates are made comparable (why: the comment at `FP32`)."""

    name: str
    """Goes into baseline cache keys: a policy change never reuses old baseline times."""
    baseline_modes: tuple[MathMode, ...]
    """Each baseline is timed under each mode; the fastest counts."""
    tolerance_mode: MathMode
    """The mode the correctness reference and the candidate run under: the precision check of
    `rewards.verify.compare` measures the candidate against torch's error in this mode."""


# The decision. The CUDA Agent paper timed baselines in fp32 while its 1e-2 tolerance admitted
# TF32 and bf16 (TF32 alone buys >= 2x on about a third of KernelBench L1), so part of its
# speedups came from a math mode the baseline was denied. The mismatch is removed by tying the
# tolerance to the baseline's precision, not by racing two baselines: under FP32 the reference,
# eager and torch.compile all run in true fp32 (TF32 off for cuBLAS and cuDNN, matmul precision
# "highest", cudnn.benchmark off; `rewards.verify.probes.pin_precision` sets the same), and the
# candidate's outputs must pass the dtype-tied precision check of `rewards.verify.compare`
# (error against a float64 reference at most a small factor times torch's own fp32 error, with a
# floor), which an honest fp32 kernel with another summation order passes and TF32 (~3e-4 on
# signed inputs) or bf16 (1e-3..1e-2) do not. Why FP32 is the default: one baseline per subject,
# so no minimum over two noisy numbers (biased low) and half the baseline cost; the reward pays
# for kernel engineering (tiling, fusion, split-precision tricks such as 3xTF32 that really are
# fp32-accurate), not for flipping a math mode; and both sides meet the same accuracy bar.
# TF32_BEST is for parity with TF32-tolerant published numbers: the candidate and its reference
# run with TF32 allowed (so the precision check admits TF32 error), and each baseline is timed
# in fp32 AND TF32 with the faster counting. The verifier uses FP32 only.
FP32 = PrecisionPolicy(name="fp32-ieee", baseline_modes=("ieee",), tolerance_mode="ieee")
TF32_BEST = PrecisionPolicy(name="tf32-best", baseline_modes=("ieee", "tf32"), tolerance_mode="tf32")
POLICIES = {p.name: p for p in (FP32, TF32_BEST)}
DEFAULT_POLICY = FP32


def policy(name: str) -> PrecisionPolicy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown precision policy {name!r}; known: {sorted(POLICIES)}") from None


def _resolve(torch, path: str):
    """torch.<path>, e.g. _resolve(torch, "backends.cudnn.conv")."""
    obj = torch
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def snapshot_flags() -> dict[str, JsonScalar]:
    """Every precision-relevant torch flag readable now; never raises (unreadable ones are left
    out: torch refuses to read a legacy flag after the two TF32 APIs were mixed)."""
    import torch

    flags: dict[str, JsonScalar] = {}
    readers = [(f"{mod}.{attr}", mod, attr) for mod, attr in _NEW_API + _BOOL_FLAGS]
    readers += [("backends.cuda.matmul.allow_tf32", "backends.cuda.matmul", "allow_tf32")]
    readers += [("backends.cudnn.allow_tf32", "backends.cudnn", "allow_tf32")]
    for key, mod, attr in readers:
        try:
            flags[key] = getattr(_resolve(torch, mod), attr)
        except (AttributeError, RuntimeError):
            pass
    try:
        flags["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    except RuntimeError:
        pass
    return flags


def restore_flags(flags: dict[str, JsonScalar]) -> None:
    """Put back a `snapshot_flags()` result: legacy setters first (they keep both APIs
    consistent), then the new-API values exactly, parents before children. A mixed-API state
    (legacy getters raising) comes back with its new-API values and consistent legacy ones."""
    import torch

    if "backends.cuda.matmul.allow_tf32" in flags:
        torch.backends.cuda.matmul.allow_tf32 = flags["backends.cuda.matmul.allow_tf32"]
    if "float32_matmul_precision" in flags:  # after allow_tf32, which overwrites it ("medium")
        torch.set_float32_matmul_precision(flags["float32_matmul_precision"])
    if "backends.cudnn.allow_tf32" in flags:
        torch.backends.cudnn.allow_tf32 = flags["backends.cudnn.allow_tf32"]
    for mod, attr in _NEW_API + _BOOL_FLAGS:
        key = f"{mod}.{attr}"
        if key in flags:
            setattr(_resolve(torch, mod), attr, flags[key])


def _apply(mode: MathMode) -> None:
    """Pin the float32 math mode through the legacy setters, which torch keeps consistent with
    the new API (setting only the new API makes the legacy getters raise, and inductor reads them)."""
    import torch

    tf32 = mode == "tf32"
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = False  # torch's default; autotuning is not part of a baseline


@contextlib.contextmanager
def precision_flags(mode: MathMode) -> Iterator[dict[str, JsonScalar]]:
    """Run the block in `mode` ("ieee": true fp32; "tf32": TF32 for matmul and cuDNN); every flag
    is restored on exit, also on an exception. Yields the flags as set."""
    if mode not in ("ieee", "tf32"):
        raise ValueError(f"unknown math mode {mode!r}")
    saved = snapshot_flags()
    try:
        _apply(mode)
        yield snapshot_flags()
    finally:
        restore_flags(saved)


def changed_flags(before: dict[str, JsonScalar], after: dict[str, JsonScalar]) -> dict[str, tuple]:
    """Flags whose value differs between two snapshots: key -> (before, after)."""
    keys = before.keys() | after.keys()
    return {k: (before.get(k), after.get(k)) for k in sorted(keys) if before.get(k) != after.get(k)}
