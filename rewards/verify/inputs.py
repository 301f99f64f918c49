"""The inputs of verification: the task's own `get_inputs`, drawn fresh from hidden seeds, in
several distributions, and the plan of which trial uses which.

What it is: `load_task(source)` runs a KernelBench-format model.py in a fresh namespace;
`draw_inputs(task, seed=, variant=, scale=, device=)` calls its `get_inputs()` with the global
RNG seeded and with `torch.rand`/`torch.randn` (and their `_like` forms) replaced for the
variant; `plan_trials(...)` lays out the trials of a verification; `derive_seed` turns the one
hidden seed into per-trial seeds; `probe_inputs(inputs, probe)` clears the mantissa bits of the
precision probe.

What it is not: no comparison and no process handling. Both sides import it: the trusted parent
draws the inputs for its reference, the candidate child draws the same ones from the same
(seed, variant, scale) after the parent sends them, and the parent checks the child's input
fingerprints against its own (bit-exact: same code, same device, same torch).

How it is used:
    task = load_task(source)
    inputs = draw_inputs(task, seed=7, variant="signed", scale=1.0, device="cuda")
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

from msgspec import Struct

# Why variants (rewards/README.md, hack 13): KernelBench draws every float input with
# `torch.rand` (uniform on [0, 1)), so at allclose 1e-2 an all-zero output passes 11 of the
# KernelBench L1-3 problems and the input returned unchanged passes 5 (ReLU-like ops on
# non-negative inputs). The variants:
# - "task": `get_inputs()` as written;
# - "signed": every `torch.rand` value u becomes 2u - 1 (uniform on [-1, 1));
# - "scaled": the signed values times `scale` (drawn per trial from SCALE_RANGE), `torch.randn`
#   times `scale` as well.
# Only the random float draws change: `torch.randint` targets, boolean masks, sizes and any
# post-processing in `get_inputs` (a softmax over `torch.rand`) stay valid. A variant whose
# reference is not finite (a log of a negative value) is replaced by "task" in
# `rewards.verify.trials`.
VARIANTS = ("task", "signed", "scaled")
SCALE_RANGE = (2.0, 6.0)
_PATCHED = ("rand", "rand_like", "randn", "randn_like")


class TaskModule(Struct, frozen=True, kw_only=True):
    """The callables of a model.py; `Model` is None where the caller dropped it (the child)."""

    get_inputs: Callable[[], list]
    get_init_inputs: Callable[[], list]
    Model: Any = None


def load_task(source: str, *, keep_model: bool = True) -> TaskModule:
    """Execute a KernelBench-format model.py in a fresh namespace (it is trusted task code)."""
    namespace: dict[str, Any] = {"__name__": "kernelbench_task"}
    exec(compile(source, "<task model.py>", "exec"), namespace)
    for name in ("get_inputs", "get_init_inputs", "Model"):
        if name not in namespace:
            raise ValueError(f"task source defines no {name}")
    model = namespace["Model"] if keep_model else None
    return TaskModule(
        get_inputs=namespace["get_inputs"], get_init_inputs=namespace["get_init_inputs"], Model=model
    )


def derive_seed(seed: int, *tags: object) -> int:
    """A 63-bit seed from the hidden `seed` and tags; unpredictable without `seed`."""
    text = ":".join([str(seed), *map(str, tags)]).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def trial_scale(seed: int) -> float:
    low, high = SCALE_RANGE
    return low + (high - low) * (derive_seed(seed, "scale") % 10_000) / 10_000


@contextlib.contextmanager
def _random_draws(variant: str, scale: float) -> Iterator[None]:
    """Replace torch's float random draws for the variant; restored on exit."""
    import torch

    if variant == "task":
        yield
        return
    if variant not in VARIANTS:
        raise ValueError(f"unknown input variant {variant!r}; known: {VARIANTS}")
    factor = 1.0 if variant == "signed" else scale
    originals = {name: getattr(torch, name) for name in _PATCHED}

    def uniform(draw):
        return lambda *args, **kwargs: draw(*args, **kwargs).mul_(2).sub_(1).mul_(factor)

    def normal(draw):
        return lambda *args, **kwargs: draw(*args, **kwargs).mul_(factor)

    wrapped = {
        "rand": uniform(originals["rand"]),
        "rand_like": uniform(originals["rand_like"]),
        "randn": normal(originals["randn"]),
        "randn_like": normal(originals["randn_like"]),
    }
    try:
        for name, fn in wrapped.items():
            setattr(torch, name, fn)
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)


def draw_inputs(task: TaskModule, *, seed: int, variant: str, scale: float, device: str) -> list:
    """`task.get_inputs()` under the variant, every tensor created on (or moved to) `device`."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad(), torch.device(device), _random_draws(variant, scale):
        inputs = list(task.get_inputs())
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]


# The mantissa probe (rewards/README.md, hack 12): two versions of a trial's float32 inputs that
# every conversion to 10 or fewer mantissa bits (fp16 and TF32 keep 10, bf16 keeps 7) maps to the
# same values, whether it rounds to nearest or truncates. Both clear bit 15 of the 23, the highest
# bit bf16 drops; "near" also clears bit 12, the highest a 10-bit conversion drops, "rounded" the
# low 13 bits (it keeps 10). What a conversion drops of "near" is then under half a unit of its
# last kept bit, so every rounding goes down: to "rounded" for 10 bits, and for 7 bits to what
# "rounded" goes to as well. A candidate that converts its inputs computes the same thing on
# both; an fp32 one changes with them as the reference does.
PROBES = {"near": ~((1 << 15) | (1 << 12)), "rounded": ~((1 << 15) | ((1 << 13) - 1))}


def probe_inputs(inputs: list, probe: str) -> list:
    """Clear the mantissa bits of `PROBES[probe]` in every float32 tensor of `inputs`, in place;
    other tensors and values are left alone. An inf keeps its (zero) mantissa, a quiet NaN its
    quiet bit. Returns `inputs`."""
    import torch

    mask = PROBES[probe]
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.dtype == torch.float32:
            x.view(torch.int32).bitwise_and_(mask)
    return inputs


def probed(inputs: list) -> bool:
    """Whether the probe changes anything of `inputs`' kind: they hold a float32 tensor."""
    import torch

    return any(isinstance(x, torch.Tensor) and x.dtype == torch.float32 for x in inputs)


# ---------------------------------------------------------------------------------------------
# The plan of a verification.


class TrialSpec(Struct, frozen=True, kw_only=True):
    """One set of inputs and the forward calls made on it (two for a poison pair)."""

    index: int
    seed: int
    variant: str
    scale: float
    poisons: tuple[int | None, ...]  # one entry per run; a pair runs the same inputs twice
    reuse_buffers: bool  # the inputs go into the previous trial's tensors (same pointers)
    profile: bool  # the last run is profiled instead of audited


POISON_BYTES = (0xFF, 0x42)  # NaN in fp32/fp16/bf16 (-1 in integers), then finite ~48.5


def plan_trials(*, trials: int, pairs: int, seed: int, poison: bool, profile: bool) -> list[TrialSpec]:
    """`trials` input sets cycling through the variants. The first `pairs` trials spread over
    the plan run twice, under the two poison patterns; odd trials reuse the previous trial's
    input tensors (a cache keyed on pointers then replays a stale answer); the last trial is
    the profiled one and uses fresh tensors."""
    pair_at = {round(k * trials / max(pairs, 1)) for k in range(pairs)} if pairs else set()
    specs = []
    for i in range(trials):
        trial_seed = derive_seed(seed, "trial", i)
        last = i == trials - 1
        runs = POISON_BYTES if i in pair_at else (POISON_BYTES[i % 2],)
        specs.append(
            TrialSpec(
                index=i,
                seed=trial_seed,
                variant=VARIANTS[i % len(VARIANTS)],
                scale=trial_scale(trial_seed),
                poisons=tuple(p if poison else None for p in runs),
                reuse_buffers=i % 2 == 1 and not (last and profile),
                profile=last and profile,
            )
        )
    return specs
