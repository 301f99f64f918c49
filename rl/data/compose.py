"""Programmatic composition: 1-5 seed operators chained into one KernelBench-format Model.

What it is: a seeded sampler. It picks a depth, a first operator and an input rank, then for each
further stage draws among the seed operators that accept the current shape (rank and the op's
own constraints) and really run on it: each stage is executed on a meta tensor to find its output
shape, and an op that fails there is not chained. Nothing is inserted between stages (no
reshapes or adapters): only compatible ops follow each other. The CUDA Agent paper had an LLM
compose up to 5 torch operator classes (its data synthesis: 83.8% two-op); `DEPTH_WEIGHTS` leans
the same way.
Sizing (`sizing.py`): the chain is drawn on the seeds' start shapes, then its batch (dim 0) is
set so that a roofline estimate of its eager time is about `Config.sizing.target_ms` (3 ms on an
H100) within the memory budget; among `max_tries` chains the first of the drawn depth whose
estimate lies in the filters' window is kept. The estimate and batch go into the metadata
(`est_eager_ms`, `est_peak_gib`, `batch`). A `scale` other than 1 (CPU tests) skips the sizing
and keeps toy shapes.
What it is not: the runtime filters (eager/compile run, timing, non-constant outputs) or
decontamination (`similarity.py`).

Same `rng_seed`, config and op table -> byte-identical source.

Example:
    task = compose(7, scale=0.02)
    task.metadata["ops"], task.metadata["depth"]   # "nn.Conv2d,nn.GELU", 2
"""

from __future__ import annotations

import random

from msgspec import Struct

from agentcore.types import Task
from rl.data import sizing as sz
from rl.data.seeds import SeedOp, Shape, output_shape, render_model, seed_ops

Stages = list[tuple[SeedOp, Shape, Shape]]

DEPTH_WEIGHTS: dict[int, float] = {1: 0.05, 2: 0.6, 3: 0.2, 4: 0.1, 5: 0.05}
"""How often each depth is drawn; two-op compositions dominate, as in the paper's data."""

MAX_GROWTH = 4.0
"""A stage may not make its output more than this many times the composition's input elements."""


class Config(Struct, frozen=True, kw_only=True):
    """How compositions are sampled."""

    max_depth: int = 5
    """Most operators in one Model."""
    scale: float = 1.0
    """Size multiplier of the start shapes; 1.0 is sized to `sizing.target_ms`, others are not."""
    max_tries: int = 20
    """Fresh first operators to try before giving up on a requested depth (or the window)."""
    sizing: sz.Config = sz.Config()
    """The eager-time target and the machine the estimate is for."""


def _chain(rng: random.Random, ops: tuple[SeedOp, ...], depth: int, scale: float) -> tuple[Stages, Shape]:
    """Up to `depth` stages starting from a random op and rank; may stop early if nothing fits."""
    first = rng.choice(ops)
    rank = rng.choice(first.ranks)
    start = first.start_shape(rank, scale)
    limit = MAX_GROWTH * _numel(start)
    stages: list[tuple[SeedOp, Shape, Shape]] = []
    shape, candidates = start, [first]
    while len(stages) < depth and candidates:
        for op in candidates:
            out = output_shape(op, shape)
            if out is not None and _numel(out) <= limit:
                stages.append((op, shape, out))
                shape = out
                break
        else:
            break  # no candidate runs on this shape
        candidates = [op for op in ops if op.accepts(shape)]
        rng.shuffle(candidates)
    return stages, start


def _numel(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _sized(stages: Stages, config: Config) -> tuple[Stages, dict, bool]:
    """(stages at their sized batch, estimate metadata, whether the estimate is in the window)."""
    if config.scale != 1.0 or config.sizing.target_ms <= 0:
        return stages, {}, True
    resized, prof, batch = sz.resize(stages, config.sizing)
    return resized, sz.provenance(prof, batch), sz.in_window(prof, batch, config.sizing)


def _draw(rng: random.Random, ops: tuple[SeedOp, ...], depth: int, config: Config) -> tuple[Stages, dict]:
    """The first chain of `depth` stages in the window, else the longest (in-window first) seen."""
    best: tuple[tuple[int, bool], Stages, dict] = ((0, False), [], {})
    for _ in range(config.max_tries):
        stages, _ = _chain(rng, ops, depth, config.scale)
        if not stages:
            continue
        stages, estimate, ok = _sized(stages, config)
        rank = (len(stages), ok)
        if rank > best[0]:
            best = (rank, stages, estimate)
        if rank == (depth, True):
            break
    return best[1], best[2]


def compose(rng_seed: int, *, config: Config = Config(), ops: tuple[SeedOp, ...] | None = None) -> Task:
    """One composed task, reproducible from `rng_seed` (provenance in its metadata)."""
    ops = ops if ops is not None else seed_ops()
    rng = random.Random(rng_seed)
    depths = [d for d in DEPTH_WEIGHTS if d <= config.max_depth]
    depth = rng.choices(depths, weights=[DEPTH_WEIGHTS[d] for d in depths])[0]
    stages, estimate = _draw(rng, ops, depth, config)
    if not stages:
        raise RuntimeError(f"compose({rng_seed}): no operator runs at scale {config.scale}")
    names = [op.name for op, _, _ in stages]
    origins = [op.origin for op, _, _ in stages if op.origin]
    doc = f"Composition of {len(stages)} seed operator(s): {' -> '.join(names)}."
    meta = {
        "source": "compose",
        "ops": ",".join(names),
        "families": ",".join(op.family for op, _, _ in stages),
        "depth": len(stages),
        "rng_seed": rng_seed,
        "scale": config.scale,
        **({"transformers": ",".join(origins)} if origins else {}),
        **estimate,
    }
    start = stages[0][1]
    return Task(task_id=f"compose/{rng_seed}", source=render_model(stages, start, doc), name="_".join(n.split(".")[-1] for n in names), metadata=meta)


def compose_many(n: int, *, first_seed: int = 0, config: Config = Config()) -> list[Task]:
    """`n` compositions with seeds first_seed .. first_seed + n - 1."""
    ops = seed_ops()
    return [compose(seed, config=config, ops=ops) for seed in range(first_seed, first_seed + n)]
