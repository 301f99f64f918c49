"""Seed operators: torch.nn modules and torch ops that build and run, as KernelBench-format tasks.

What it is: a table of operator families (conv, pooling, norm, activation, linear, elementwise,
reductions, shape) saying how to construct each op from its input shape, which input ranks it
takes, and what else its input must satisfy; `seed_ops()` keeps the entries the installed torch
has and that build and run on a meta tensor, plus the transformers-module seeds of `hf_seeds.py`
(their code inlined through `SeedOp.preamble`); `seed_task` renders one as a runnable `Model`
source; `render_model` renders any chain of them (used by `compose.py`).
What it is not: the runtime filters (eager and torch.compile run, 1-100 ms measured on a GPU,
non-constant outputs); those need the GPU and come later in the pipeline. Stochastic ops
(Dropout, RReLU) are left out on purpose (the CUDA Agent paper's data filters reject them).

Shapes: the start inputs hold about 2**27 fp32 elements (512 MiB); they fix every dim but the
batch (dim 0), which no op mixes. At `scale=1` the batch is then chosen by `sizing.py` so that a
roofline estimate of the eager time is ~3 ms on an H100 (fixed 2**27-element inputs left 240 of
500 compositions under the filters' 1 ms floor). Any other `scale` multiplies every start
dimension (with floors) and skips the sizing, so CPU tests run the same code at toy sizes.

Example:
    ops = seed_ops()
    task = seed_task(ops[0], scale=0.02)   # a Task whose source runs on CPU in milliseconds
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional name, used in rendered sources
from torch import nn

from agentcore.types import Task

Shape = tuple[int, ...]

BASE_SHAPES: dict[int, Shape] = {
    2: (32768, 4096),  # [B, F]      2**27 elements
    3: (64, 128, 16384),  # [B, C, L]
    4: (32, 64, 256, 256),  # [B, C, H, W]
    5: (16, 32, 64, 64, 64),  # [B, C, D, H, W]
}
"""Input shape per rank at scale 1: ~2**27 fp32 elements each (see the size heuristic above)."""

MIN_DIMS: dict[int, Shape] = {2: (2, 8), 3: (2, 4, 8), 4: (2, 4, 8, 8), 5: (2, 4, 4, 4, 4)}
"""Floors under `scale`: enough batch for BatchNorm statistics, channels for groups, space for pools."""

MAX_LINEAR_FEATURES = 16384
"""Linear/LayerNorm only on a last dim this small: a [F, F] weight past it does not fit a GPU."""


def base_shape(rank: int, scale: float = 1.0, base: Shape | None = None) -> Shape:
    """The seed input shape of `rank` (or `base`) at `scale`, each dimension floored at MIN_DIMS.

    The last dimension is kept a multiple of 8 (vector-friendly, and GLU halves it).
    """
    dims = [max(lo, round(d * scale)) for d, lo in zip(base or BASE_SHAPES[rank], MIN_DIMS[rank])]
    dims[-1] = max(8, dims[-1] // 8 * 8)
    return tuple(dims)


@dataclass(frozen=True)
class SeedOp:
    """One operator: a template formatted with the input's shape variables (see `shape_vars`).

    Module ops render as `self.<attr> = <template>` and `x = self.<attr>(x)`; function ops render
    as `x = <template>` with `{x}` standing for the input. An op whose template names a class or
    function of its own (the transformers seeds, `hf_seeds.py`) carries that code in `preamble`,
    rendered once at the top of the source; `origin` says where it came from.
    """

    name: str
    family: str
    template: str
    ranks: tuple[int, ...]
    module: bool = True
    fits: Callable[[Shape], bool] = field(default=lambda shape: True, compare=False)
    preamble: tuple[str, ...] = ()
    """Code blocks (classes, functions) the template uses, rendered once each above `Model`."""
    origin: str = ""
    """The class the op was taken from (transformers seeds); empty for torch's own ops."""
    start: dict[int, Shape] = field(default_factory=dict, compare=False)
    """Input shape per rank of a chain that starts with this op (default BASE_SHAPES)."""

    def accepts(self, shape: Shape) -> bool:
        return len(shape) in self.ranks and self.fits(shape)

    def expression(self, shape: Shape, x: str = "x") -> str:
        return self.template.format(x=x, **shape_vars(shape))

    def start_shape(self, rank: int, scale: float = 1.0) -> Shape:
        """The input of a chain starting with this op at `rank` (its own start, else the base)."""
        return base_shape(rank, scale, self.start.get(rank, BASE_SHAPES[rank]))


def shape_vars(shape: Shape) -> dict[str, int]:
    """Template variables: C channels (dim 1), L last dim, G groups dividing C, H half of L."""
    c = shape[1] if len(shape) > 1 else shape[0]
    return {"C": c, "L": shape[-1], "G": math.gcd(c, 8), "H": max(1, shape[-1] // 2), "C2": max(1, c // 2)}


def _spatial_at_least(n: int) -> Callable[[Shape], bool]:
    return lambda shape: all(d >= n for d in shape[2:])


def _last_at_most(n: int) -> Callable[[Shape], bool]:
    return lambda shape: shape[-1] <= n


def _even_last(shape: Shape) -> bool:
    return shape[-1] % 2 == 0


def _table() -> list[SeedOp]:
    ops: list[SeedOp] = []
    for d in (1, 2, 3):
        r = d + 2
        ops += [
            SeedOp(name=f"nn.Conv{d}d", family="conv", template=f"nn.Conv{d}d({{C}}, {{C}}, kernel_size=3, padding=1)", ranks=(r,), fits=_spatial_at_least(3)),
            SeedOp(name=f"nn.ConvTranspose{d}d", family="conv", template=f"nn.ConvTranspose{d}d({{C}}, {{C}}, kernel_size=3, padding=1)", ranks=(r,), fits=_spatial_at_least(3)),
            SeedOp(name=f"nn.MaxPool{d}d", family="pooling", template=f"nn.MaxPool{d}d(kernel_size=2, stride=2)", ranks=(r,), fits=_spatial_at_least(2)),
            SeedOp(name=f"nn.AvgPool{d}d", family="pooling", template=f"nn.AvgPool{d}d(kernel_size=2, stride=2)", ranks=(r,), fits=_spatial_at_least(2)),
            SeedOp(name=f"nn.BatchNorm{d}d", family="norm", template=f"nn.BatchNorm{d}d({{C}})", ranks=(r,) if d > 1 else (2, 3)),
            SeedOp(name=f"nn.InstanceNorm{d}d", family="norm", template=f"nn.InstanceNorm{d}d({{C}})", ranks=(r,), fits=_spatial_at_least(2)),
        ]
    ops += [
        SeedOp(name="nn.AdaptiveAvgPool2d", family="pooling", template="nn.AdaptiveAvgPool2d(4)", ranks=(4,), fits=_spatial_at_least(4)),
        SeedOp(name="nn.GroupNorm", family="norm", template="nn.GroupNorm({G}, {C})", ranks=(3, 4, 5)),
        SeedOp(name="nn.LayerNorm", family="norm", template="nn.LayerNorm({L})", ranks=(2, 3, 4), fits=_last_at_most(MAX_LINEAR_FEATURES)),
        SeedOp(name="nn.RMSNorm", family="norm", template="nn.RMSNorm({L})", ranks=(2, 3, 4), fits=_last_at_most(MAX_LINEAR_FEATURES)),
        SeedOp(name="nn.Linear", family="linear", template="nn.Linear({L}, {L})", ranks=(2, 3), fits=_last_at_most(MAX_LINEAR_FEATURES)),
        SeedOp(name="nn.Flatten", family="shape", template="nn.Flatten()", ranks=(3, 4, 5)),
        SeedOp(name="nn.GLU", family="activation", template="nn.GLU(dim=-1)", ranks=(2, 3, 4, 5), fits=_even_last),
        SeedOp(name="nn.PReLU", family="activation", template="nn.PReLU()", ranks=(2, 3, 4, 5)),
        SeedOp(name="nn.Softmax", family="activation", template="nn.Softmax(dim=1)", ranks=(2, 3, 4, 5)),
        SeedOp(name="nn.LogSoftmax", family="activation", template="nn.LogSoftmax(dim=1)", ranks=(2, 3, 4, 5)),
        SeedOp(name="nn.LeakyReLU", family="activation", template="nn.LeakyReLU(negative_slope=0.1)", ranks=(2, 3, 4, 5)),
        SeedOp(name="nn.Hardtanh", family="activation", template="nn.Hardtanh(min_val=-1.0, max_val=1.0)", ranks=(2, 3, 4, 5)),
    ]
    for act in ("ReLU", "ReLU6", "GELU", "SiLU", "Mish", "Sigmoid", "Tanh", "ELU", "SELU", "CELU", "Softplus",
                "Softsign", "Hardswish", "Hardsigmoid", "LogSigmoid", "Tanhshrink", "Softshrink", "Hardshrink"):
        ops.append(SeedOp(name=f"nn.{act}", family="activation", template=f"nn.{act}()", ranks=(2, 3, 4, 5)))
    for fn in ("torch.abs", "torch.sin", "torch.cos", "torch.erf", "torch.exp", "torch.square", "torch.sigmoid", "torch.tanh"):
        ops.append(SeedOp(name=fn, family="elementwise", template=f"{fn}({{x}})", ranks=(2, 3, 4, 5), module=False))
    ops += [
        SeedOp(name="torch.clamp", family="elementwise", template="torch.clamp({x}, min=-0.5, max=0.5)", ranks=(2, 3, 4, 5), module=False),
        SeedOp(name="torch.mul", family="elementwise", template="torch.mul({x}, 2.0)", ranks=(2, 3, 4, 5), module=False),
        SeedOp(name="torch.add", family="elementwise", template="torch.add({x}, {x})", ranks=(2, 3, 4, 5), module=False),
        SeedOp(name="F.normalize", family="norm", template="F.normalize({x}, dim=1)", ranks=(2, 3, 4, 5), module=False),
        SeedOp(name="torch.sum", family="reduction", template="torch.sum({x}, dim=1, keepdim=True)", ranks=(2, 3, 4, 5), module=False),
        SeedOp(name="torch.mean", family="reduction", template="torch.mean({x}, dim=-1)", ranks=(3, 4, 5), module=False),
        SeedOp(name="torch.amax", family="reduction", template="torch.amax({x}, dim=1)", ranks=(3, 4, 5), module=False),
        SeedOp(name="torch.amin", family="reduction", template="torch.amin({x}, dim=1, keepdim=True)", ranks=(2, 3, 4, 5), module=False),
        SeedOp(name="torch.logsumexp", family="reduction", template="torch.logsumexp({x}, dim=1, keepdim=True)", ranks=(2, 3, 4, 5), module=False),
        SeedOp(name="torch.var", family="reduction", template="torch.var({x}, dim=-1, keepdim=True)", ranks=(2, 3, 4, 5), module=False),
        SeedOp(name="torch.cumsum", family="reduction", template="torch.cumsum({x}, dim=1)", ranks=(2, 3, 4, 5), module=False),
    ]
    return ops


NAMESPACE = {"torch": torch, "nn": nn, "F": F}
"""What a template may refer to; rendered sources import exactly these names."""


@functools.cache
def _namespace(preamble: tuple[str, ...]) -> dict:
    namespace = dict(NAMESPACE, math=math)
    for block in preamble:
        exec(compile(block, "<seed preamble>", "exec"), namespace)  # noqa: S102 - our own table's code
    return namespace


def build(op: SeedOp, shape: Shape) -> Callable[[torch.Tensor], torch.Tensor]:
    """The op as a callable for an input of `shape` (a module is built on the current device)."""
    expr = op.expression(shape)
    namespace = dict(_namespace(op.preamble))
    if op.module:
        return eval(expr, namespace)  # noqa: S307 - our own table's templates
    return eval(f"lambda x: {expr}", namespace)  # noqa: S307


def output_shape(op: SeedOp, shape: Shape) -> Shape | None:
    """`op`'s output shape on a meta tensor of `shape`, or None if it does not build or run."""
    if not op.accepts(shape):
        return None
    try:
        with torch.device("meta"):
            fn = build(op, shape)
            out = fn(torch.empty(shape, device="meta"))
    except Exception:  # noqa: BLE001 - any failure means "this op does not take this input"
        return None
    if not isinstance(out, torch.Tensor) or out.dim() == 0 or out.numel() == 0 or not out.is_floating_point():
        return None
    return tuple(out.shape)


def _available(op: SeedOp) -> bool:
    if op.preamble:  # the code is inlined: nothing to import
        return True
    root, _, attr = op.name.partition(".")
    return hasattr(NAMESPACE[root], attr)


@functools.cache
def seed_ops(*, transformers: bool = True) -> tuple[SeedOp, ...]:
    """Table entries the installed torch provides and that run on their own start shape; with
    `transformers`, the transformers-module seeds (`hf_seeds`, inlined as plain torch) too."""
    from rl.data.hf_seeds import hf_table  # hf_seeds builds on SeedOp: imported late

    table = _table() + (hf_table() if transformers else [])
    return tuple(op for op in table if _available(op)
                 and any(output_shape(op, op.start_shape(r)) is not None for r in op.ranks))


def propagate(ops: list[SeedOp], start: Shape) -> list[tuple[SeedOp, Shape, Shape]] | None:
    """`ops` chained from an input of `start` as (op, in, out) stages, or None if one does not run."""
    stages, shape = [], start
    for op in ops:
        out = output_shape(op, shape)
        if out is None:
            return None
        stages.append((op, shape, out))
        shape = out
    return stages


# ---------------------------------------------------------------------------------------------
# Rendering


def _attr_name(op: SeedOp, index: int) -> str:
    return f"{op.name.split('.')[-1].lower()}_{index}"


def render_model(stages: list[tuple[SeedOp, Shape, Shape]], input_shape: Shape, doc: str) -> str:
    """KernelBench-format source applying `stages` ((op, input shape, output shape), in order)."""
    init, forward, preambles = [], [], []
    for i, (op, shape, out) in enumerate(stages):
        preambles += [block for block in op.preamble if block not in preambles]
        if op.module:
            attr = _attr_name(op, i)
            init.append(f"        self.{attr} = {op.expression(shape)}")
            forward.append(f"        x = self.{attr}(x)  # {list(shape)} -> {list(out)}")
        else:
            forward.append(f"        x = {op.expression(shape)}  # {list(shape)} -> {list(out)}")
    init = init or ["        pass"]
    dims = ", ".join(str(d) for d in input_shape)
    helpers = [line for block in preambles for line in (*block.strip("\n").splitlines(), "", "")]
    lines = [
        *(["import math"] if preambles else []),
        "import torch",
        "import torch.nn as nn",
        "import torch.nn.functional as F",
        "",
        "",
        *helpers,
        "class Model(nn.Module):",
        f'    """{doc}"""',
        "",
        "    def __init__(self):",
        "        super().__init__()",
        *init,
        "",
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:",
        *forward,
        "        return x",
        "",
        "",
        "def get_inputs():",
        f"    return [torch.randn({dims})]",
        "",
        "",
        "def get_init_inputs():",
        "    return []",
        "",
    ]
    return "\n".join(lines)


def seed_task(op: SeedOp, *, scale: float = 1.0, rank: int | None = None, sizing=None) -> Task:
    """One seed operator as a Task, on its first accepted rank's start input (or `rank`).

    At scale 1 its batch is sized to `sizing.target_ms` (an `rl.data.sizing.Config`; default one);
    any other scale keeps the scaled start shape (toy sizes for CPU tests).
    """
    from rl.data import sizing as sz  # sizing builds on this module: imported late

    config = sizing or sz.Config()
    for r in [rank] if rank is not None else list(op.ranks):
        shape = op.start_shape(r, scale)
        out = output_shape(op, shape)
        if out is None:
            continue
        stages = [(op, shape, out)]
        meta = {"source": "seed", "ops": op.name, "family": op.family, "depth": 1, "scale": scale}
        if op.origin:
            meta["transformers"] = op.origin
        if scale == 1.0 and config.target_ms > 0:
            stages, prof, batch = sz.resize(stages, config)
            meta |= sz.provenance(prof, batch)
        _, shape, _ = stages[0]
        source = render_model(stages, shape, f"Seed operator {op.name} ({op.family}).")
        return Task(task_id=f"seed/{op.name}/r{r}", source=source, name=op.name, metadata=meta)
    raise ValueError(f"{op.name} accepts none of ranks {op.ranks if rank is None else [rank]} at scale {scale}")
