"""Task families a small model can learn, each task with a teacher solution, and a fixed held-out split.

What it is: a deterministic generator of KernelBench-format tasks (`agentcore.types.Task`) in five
families - unary activations, binary elementwise with a broadcast row or column vector, fused
chains of 2-4 unary ops, row reductions over the last dim, and softmax/normalisation rows - at a
few shapes, each with an honest teacher solution in the workspace layout (model_new.py, one
kernels/<name>.cu, its binding) generated from one CUDA template per family. `family_demos` wraps
them as `rl.demonstrations.DemoTask`s, so `demo_engine` drives them through the real tools like
the bundled demonstrations. `split()` is the training tasks and a held-out set never trained on:
trained ops at a shape no training task has, chains of trained ops in orders training lacks, and
ops that appear in no training task; it depends only on `VERSION`, and `manifest` records it.
What it is not: proof that the teachers are right: the tests check them statically, evaluate their
elementwise expressions on the host and compile their kernels with nvcc; `verify` needs a GPU.

Shapes: at `scale=1` a task's rows are set so that an H100 roofline estimate of its eager time
(`rl.data.sizing.Config`: HBM streaming plus launches) is about `target_ms` within the memory
budget; the estimate is in the metadata (`est_eager_ms`). Other scales give toy shapes (CPU tests).

Example:
    s = split(scale=0.01)
    len(s.train), len(s.heldout)            # 66, 23
    demos = family_demos(s.train)           # rl.demonstrations.DemoTask with the teacher files
    write_manifest(run_dir, s)              # families_split.json: version, ids, why each is held out
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import orjson
from msgspec import Struct

from agentcore.types import Task
from rl.data import sizing as sz
from rl.demonstrations import DemoTask

if TYPE_CHECKING:
    from rl.config import DataConfig

SIZING = sz.Config()
"""The eager-time target, memory budget and H100 rates the real shapes are sized with."""

VERSION = 3
"""Bump when a source, a teacher or the split changes: task ids and the split are fixed per version."""


class Op(Struct, frozen=True, kw_only=True):
    """One operator: its torch expression of `x` (and `b`), and its CUDA expression of `v` (and `w`)."""

    name: str
    torch: str
    cuda: str


def _unary(name: str, torch: str, cuda: str) -> Op:
    return Op(name=name, torch=torch, cuda=cuda)


SOFTPLUS_CU = "(v > 20.0f ? v : log1pf(expf(v)))"
UNARY = {op.name: op for op in (
    _unary("relu", "torch.relu(x)", "fmaxf(v, 0.0f)"),
    _unary("gelu_tanh", "torch.nn.functional.gelu(x, approximate='tanh')",
           "0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)))"),
    _unary("sigmoid", "torch.sigmoid(x)", "1.0f / (1.0f + expf(-v))"),
    _unary("tanh", "torch.tanh(x)", "tanhf(v)"),
    _unary("silu", "torch.nn.functional.silu(x)", "v / (1.0f + expf(-v))"),
    _unary("softplus", "torch.nn.functional.softplus(x)", SOFTPLUS_CU),
    _unary("elu", "torch.nn.functional.elu(x)", "(v > 0.0f ? v : expm1f(v))"),
    _unary("leaky_relu", "torch.nn.functional.leaky_relu(x, 0.01)", "(v > 0.0f ? v : 0.01f * v)"),
    _unary("abs", "torch.abs(x)", "fabsf(v)"),
    _unary("hardsigmoid", "torch.nn.functional.hardsigmoid(x)", "fminf(fmaxf(v / 6.0f + 0.5f, 0.0f), 1.0f)"),
    # Held out: never in a training task.
    _unary("mish", "torch.nn.functional.mish(x)", f"v * tanhf{SOFTPLUS_CU}"),
    _unary("selu", "torch.selu(x)", "1.0507009873554805f * (v > 0.0f ? v : 1.6732632423543772f * expm1f(v))"),
    _unary("hardswish", "torch.nn.functional.hardswish(x)", "v * fminf(fmaxf(v + 3.0f, 0.0f), 6.0f) / 6.0f"),
    _unary("softsign", "torch.nn.functional.softsign(x)", "v / (1.0f + fabsf(v))"),
    _unary("gelu_erf", "torch.nn.functional.gelu(x)", "0.5f * v * (1.0f + erff(v * 0.7071067811865476f))"),
)}

BINARY = {op.name: op for op in (
    Op(name="add", torch="x + b", cuda="v + w"),
    Op(name="mul", torch="x * b", cuda="v * w"),
    Op(name="sub", torch="x - b", cuda="v - w"),
    Op(name="max", torch="torch.maximum(x, b)", cuda="fmaxf(v, w)"),
    Op(name="min", torch="torch.minimum(x, b)", cuda="fminf(v, w)"),  # held out
)}

REDUCE = {op.name: op for op in (  # cuda: the row's value from `acc`, the combined row, and `n` columns
    Op(name="sum", torch="torch.sum(x, dim=-1)", cuda="acc"),
    Op(name="mean", torch="torch.mean(x, dim=-1)", cuda="acc / n"),
    Op(name="max", torch="torch.amax(x, dim=-1)", cuda="acc"),
    Op(name="min", torch="torch.amin(x, dim=-1)", cuda="acc"),  # held out
)}

NORM = ("softmax", "log_softmax", "rmsnorm", "layernorm")  # layernorm is held out
NORM_TORCH = {
    "softmax": "torch.softmax(x, dim=-1)",
    "log_softmax": "torch.log_softmax(x, dim=-1)",
    "rmsnorm": "x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-6)",
    "layernorm": "torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-5)",
}
NORM_PASSES = {"softmax": 8, "log_softmax": 8, "rmsnorm": 20, "layernorm": 8}
"""Bytes per element eager moves (rmsnorm runs pow, mean and mul as separate kernels)."""

COLS = (4096, 16384, 65536, 12288)
"""Columns of shapes s0..s3; s3 is only ever held out (a trained op at an unseen shape)."""

TRAIN_CHAINS = (
    ("relu", "sigmoid"), ("tanh", "abs"), ("silu", "leaky_relu"), ("gelu_tanh", "hardsigmoid"),
    ("softplus", "tanh", "relu"), ("elu", "sigmoid", "abs"), ("abs", "silu", "tanh", "relu"),
    ("leaky_relu", "gelu_tanh", "sigmoid", "hardsigmoid"),
)
HELDOUT_CHAINS = (("tanh", "relu", "sigmoid"), ("softplus", "abs"), ("leaky_relu", "silu", "tanh", "hardsigmoid"))
HELDOUT_OPS = frozenset({"mish", "selu", "hardswish", "softsign", "gelu_erf", "min", "layernorm"})


class Spec(Struct, frozen=True, kw_only=True):
    """One task before rendering: its family, ops (applied in order), broadcast axis and shape."""

    family: str
    ops: tuple[str, ...]
    shape: int
    """Index into COLS."""
    axis: str = ""
    """binary only: "row" (b has shape [cols]) or "col" (b has shape [rows, 1])."""

    @property
    def task_id(self) -> str:
        axis = f"_{self.axis}" if self.axis else ""
        return f"fam_{self.family}_{'_'.join(self.ops)}{axis}_s{self.shape}"


def _train_specs() -> list[Spec]:
    trained_unary = [n for n in UNARY if n not in HELDOUT_OPS]
    specs = [Spec(family="unary", ops=(n,), shape=s) for n in trained_unary for s in range(3)]
    specs += [Spec(family="binary", ops=(n,), axis=a, shape=s)
              for n in BINARY if n not in HELDOUT_OPS for a in ("row", "col") for s in range(2)]
    specs += [Spec(family="chain", ops=c, shape=i % 3) for i, c in enumerate(TRAIN_CHAINS)]
    specs += [Spec(family="reduce", ops=(n,), shape=s) for n in REDUCE if n not in HELDOUT_OPS for s in range(2)]
    specs += [Spec(family="norm", ops=(n,), shape=s) for n in NORM if n not in HELDOUT_OPS for s in range(2)]
    return specs


def _heldout_specs() -> list[Spec]:
    # New shapes weigh towards the families whose indexing a small policy gets wrong at a shape it
    # has not seen (broadcast axes, row reductions, normalised rows): there PPO has room to gain.
    # An elementwise op at a new shape is right or wrong with the op, which rft already decides
    # (SmolLM2-135M after rft: every unary and chain of trained ops right, broadcasts and row sums not).
    new_shape = [Spec(family="unary", ops=("relu",), shape=3), Spec(family="unary", ops=("silu",), shape=3),
                 Spec(family="binary", ops=("add",), axis="row", shape=3),
                 Spec(family="binary", ops=("max",), axis="col", shape=3),
                 Spec(family="binary", ops=("mul",), axis="col", shape=3),
                 Spec(family="binary", ops=("sub",), axis="row", shape=3),
                 Spec(family="reduce", ops=("sum",), shape=3), Spec(family="reduce", ops=("mean",), shape=3),
                 Spec(family="reduce", ops=("max",), shape=3),
                 Spec(family="norm", ops=("softmax",), shape=3), Spec(family="norm", ops=("log_softmax",), shape=3),
                 Spec(family="norm", ops=("rmsnorm",), shape=3)]
    new_chain = [Spec(family="chain", ops=c, shape=i % 3) for i, c in enumerate(HELDOUT_CHAINS)]
    new_op = [Spec(family="unary", ops=(n,), shape=1) for n in ("mish", "selu", "hardswish", "softsign")]
    new_op += [Spec(family="chain", ops=("gelu_erf", "tanh"), shape=0),
               Spec(family="binary", ops=("min",), axis="row", shape=1),
               Spec(family="reduce", ops=("min",), shape=0), Spec(family="norm", ops=("layernorm",), shape=1)]
    return new_shape + new_chain + new_op


# ---------------------------------------------------------------------------------------------
# Shapes and the reference Model.


def _bytes_per_elem(spec: Spec) -> tuple[float, float]:
    """(bytes eager moves, bytes of peak memory) per input element; the output is x's shape but for reduce."""
    if spec.family == "reduce":
        return 4.0, 8.0
    if spec.family == "norm":
        return float(NORM_PASSES[spec.ops[0]]), 20.0
    return 8.0 * len(spec.ops), 20.0  # input, output and its copy, and the largest kernel's input and output


def _shape(spec: Spec, scale: float, config: sz.Config) -> tuple[int, int, dict]:
    """(rows, cols, estimate metadata): rows sized to the eager-time target at scale 1."""
    cols = COLS[spec.shape]
    if scale != 1.0:
        return max(2, round(512 * scale)), max(8, round(cols * scale)), {}
    moved, peak = _bytes_per_elem(spec)
    kernels = len(spec.ops) if spec.family == "chain" else (5 if spec.ops == ("rmsnorm",) else 1)
    by_time = (config.target_ms - kernels * config.launch_ms) * 1e-3 * config.hbm_bytes_per_s / moved
    by_memory = config.memory_gib * 2**30 / peak
    rows = sz.round_down(int(min(by_time, by_memory) / cols))
    est_ms = rows * cols * moved / config.hbm_bytes_per_s * 1e3 + kernels * config.launch_ms
    return rows, cols, {"est_eager_ms": round(est_ms, 3), "est_peak_gib": round(rows * cols * peak / 2**30, 2)}


def _forward(spec: Spec) -> tuple[str, str]:
    """(forward's parameter list, its body lines)."""
    if spec.family == "binary":
        return "x: torch.Tensor, b: torch.Tensor", f"        return {BINARY[spec.ops[0]].torch}\n"
    if spec.family == "reduce":
        return "x: torch.Tensor", f"        return {REDUCE[spec.ops[0]].torch}\n"
    if spec.family == "norm":
        return "x: torch.Tensor", f"        return {NORM_TORCH[spec.ops[0]]}\n"
    lines = "".join(f"        x = {UNARY[n].torch}\n" for n in spec.ops[:-1])
    return "x: torch.Tensor", lines + f"        return {UNARY[spec.ops[-1]].torch}\n"


def _describe(spec: Spec) -> str:
    if spec.family == "binary":
        vec = "a row vector b of shape (cols,)" if spec.axis == "row" else "a column vector b of shape (rows, 1)"
        return f"Elementwise {spec.ops[0]} of x with {vec}, broadcast over x."
    if spec.family == "reduce":
        return f"Row {spec.ops[0]}: reduces x over its last dimension."
    if spec.family == "norm":
        return f"Row {spec.ops[0]} over the last dimension of x."
    return f"Elementwise {' then '.join(spec.ops)}."


def render_model(spec: Spec, rows: int, cols: int) -> str:
    params, body = _forward(spec)
    inputs = "x = torch.randn(rows, cols)"
    names = "x"
    if spec.family == "binary":
        inputs += f"\n    b = torch.randn({'cols' if spec.axis == 'row' else 'rows, 1'})"
        names = "x, b"
    return (
        "import torch\nimport torch.nn as nn\n\n\n"
        f'class Model(nn.Module):\n    """{_describe(spec)}"""\n\n'
        "    def __init__(self):\n        super().__init__()\n\n"
        f"    def forward(self, {params}) -> torch.Tensor:\n{body}\n\n"
        f"rows = {rows}\ncols = {cols}\n\n\n"
        f"def get_inputs():\n    {inputs}\n    return [{names}]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )


def task(spec: Spec, *, scale: float = 1.0, config: sz.Config = SIZING) -> Task:
    rows, cols, estimate = _shape(spec, scale, config)
    meta = {"source": "families", "version": VERSION, "family": spec.family, "ops": ",".join(spec.ops),
            "axis": spec.axis, "shape": spec.shape, "rows": rows, "cols": cols, "scale": scale, **estimate}
    return Task(task_id=spec.task_id, source=render_model(spec, rows, cols), name=spec.task_id[4:], metadata=meta)


# ---------------------------------------------------------------------------------------------
# Teacher solutions: one kernel per task from its family's template.

HEADER = "#include <cuda_runtime.h>\n#include <math.h>\n\n"
LAUNCH = """static unsigned grid_for(long long items, int threads) {
    const long long blocks = (items + threads - 1) / threads;
    return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}
"""
BLOCK_REDUCE = """// Combines one value per thread of the block; every thread gets the result.
__device__ float block_{kind}(float acc, float* shared) {{
    shared[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {{
        if (threadIdx.x < s) {{
            const float v = shared[threadIdx.x + s];
            acc = shared[threadIdx.x];
            shared[threadIdx.x] = {combine};
        }}
        __syncthreads();
    }}
    const float result = shared[0];
    __syncthreads();
    return result;
}}
"""
COMBINE = {"sum": "acc + v", "max": "fmaxf(acc, v)", "min": "fminf(acc, v)"}


def _elementwise_cu(spec: Spec) -> str:
    """A grid-stride loop over the flat buffer; binary ops read b at the element's column or row."""
    if spec.family == "binary":
        index = "i % cols" if spec.axis == "row" else "i / cols"
        return (f"// y = {spec.ops[0]}(x, b) with b broadcast along the {spec.axis}s of a [rows, cols] float32 matrix.\n"
                f"{HEADER}// {spec.ops[0]}\n__device__ __forceinline__ float apply(float v, float w) {{ return {BINARY[spec.ops[0]].cuda}; }}\n\n"
                "__global__ void binary_kernel(const float* __restrict__ x, const float* __restrict__ b,\n"
                "                              float* __restrict__ y, long long n, long long cols) {\n"
                "    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;\n"
                "    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)\n"
                f"        y[i] = apply(x[i], b[{index}]);\n}}\n\n{LAUNCH}\n"
                "extern \"C\" void binary_launcher(const float* x, const float* b, float* y, long long n, long long cols,\n"
                "                                cudaStream_t stream) {\n    if (n <= 0) return;\n"
                "    binary_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, b, y, n, cols);\n}\n")
    # The op's name comes before its expression: a model writing this file recalls the expression
    # right after the name it copied from the task, not before it.
    steps = "".join(f"    // {n}\n    v = {UNARY[n].cuda};\n" for n in spec.ops)
    return (f"// y = {' then '.join(spec.ops)} of x, elementwise over a flat float32 buffer.\n"
            f"{HEADER}__device__ __forceinline__ float apply(float v) {{\n{steps}    return v;\n}}\n\n"
            "__global__ void unary_kernel(const float* __restrict__ x, float* __restrict__ y, long long n) {\n"
            "    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;\n"
            "    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)\n"
            f"        y[i] = apply(x[i]);\n}}\n\n{LAUNCH}\n"
            f"extern \"C\" void {spec.family}_launcher(const float* x, float* y, long long n, cudaStream_t stream) {{\n"
            "    if (n <= 0) return;\n    unary_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, y, n);\n}\n")


def _stat(name: str, kind: str, term: str) -> str:
    """One row statistic: each thread combines its strided columns, then the block combines."""
    init = {"sum": "0.0f", "max": "-INFINITY", "min": "INFINITY"}[kind]
    combine = COMBINE[kind].replace("v", f"({term})").replace("acc", f"a_{name}")
    return (f"    float a_{name} = {init};\n"
            f"    for (int c = threadIdx.x; c < cols; c += blockDim.x) {{ const float v = row[c]; a_{name} = {combine}; }}\n"
            f"    const float {name} = block_{kind}(a_{name}, shared);\n")


NORM_CU = {  # (statistics, output of v)
    "softmax": (_stat("m", "max", "v") + _stat("s", "sum", "expf(v - m)"), "expf(v - m) / s"),
    "log_softmax": (_stat("m", "max", "v") + _stat("s", "sum", "expf(v - m)"), "v - m - logf(s)"),
    "rmsnorm": (_stat("ss", "sum", "v * v") + "    const float r = rsqrtf(ss / n + 1e-6f);\n", "v * r"),
    "layernorm": (_stat("s", "sum", "v") + "    const float mean = s / n;\n" + _stat("q", "sum", "(v - mean) * (v - mean)")
                  + "    const float r = rsqrtf(q / n + 1e-5f);\n", "(v - mean) * r"),
}


def _row_cu(spec: Spec) -> str:
    """One block per row: block-wide reductions, then (norm) a pass writing the row."""
    op = spec.ops[0]
    if spec.family == "reduce":
        kinds = [op if op in COMBINE else "sum"]
        stats, write = _stat("acc", kinds[0], "v"), f"    if (threadIdx.x == 0) y[blockIdx.x] = {REDUCE[op].cuda};\n"
    else:
        stats, expr = NORM_CU[op]
        kinds = sorted({k for k in ("sum", "max") if f"block_{k}(" in stats})
        write = (f"    float* out = y + static_cast<long long>(blockIdx.x) * cols;\n"
                 f"    for (int c = threadIdx.x; c < cols; c += blockDim.x) {{ const float v = row[c]; out[c] = {expr}; }}\n")
    count = "    const float n = static_cast<float>(cols);\n" if "/ n" in stats + write else ""
    helpers = "\n".join(BLOCK_REDUCE.format(kind=k, combine=COMBINE[k]) for k in kinds)
    what = f"{op} over the last dim" if spec.family == "reduce" else f"row {op}"
    return (f"// {what} of a contiguous [rows, cols] float32 matrix: one block of THREADS per row.\n"
            f"{HEADER}constexpr int THREADS = 256;\n\n{helpers}\n"
            f"__global__ void {spec.family}_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {{\n"
            "    __shared__ float shared[THREADS];\n"
            "    const float* row = x + static_cast<long long>(blockIdx.x) * cols;\n"
            f"{count}{stats}{write}}}\n\n"
            f"extern \"C\" void {spec.family}_launcher(const float* x, float* y, int rows, int cols, cudaStream_t stream) {{\n"
            "    if (rows <= 0) return;\n"
            f"    {spec.family}_kernel<<<rows, THREADS, 0, stream>>>(x, y, cols);\n}}\n")


BINDING = """#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>
#include "../binding_registry.h"

extern "C" void {name}_launcher({launcher_args});

static torch::Tensor {name}_forward({params}) {{
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.dim() == 2, "{name}_forward: x must be a contiguous 2-D CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "{name}_forward: x must be float32");
{checks}    auto y = {alloc};
    {name}_launcher({call}, c10::cuda::getCurrentCUDAStream().stream());
    return y;
}}

static void register_{name}(pybind11::module& m) {{
    m.def("{name}_forward", &{name}_forward, "{doc}", {pyargs});
}}

REGISTER_BINDING({name}, register_{name});
"""


BINDING_DOC = {
    "unary": "Elementwise y = f(x) of a contiguous float32 matrix.",
    "chain": "Elementwise y = f(x) of a contiguous float32 matrix, ops applied in turn.",
    "binary": "Elementwise y = f(x, b) with b broadcast along the {axis}s of x.",
    "reduce": "Reduces each row of a contiguous float32 matrix to one value.",
    "norm": "Normalises each row of a contiguous float32 matrix.",
}
"""The binding's docstring names the family, never the op: one family's bindings (and, for binary,
one axis's) are the same file, so the compile pool's object cache builds each once (a binding is
a g++ pass over torch's headers, most of a teacher's build; its .cu is a short nvcc pass)."""


def _binding(spec: Spec) -> str:
    name, x, y = spec.family, "x.data_ptr<float>()", "y.data_ptr<float>()"
    fields = {"name": name, "params": "torch::Tensor x", "checks": "", "alloc": "torch::empty_like(x)",
              "pyargs": 'py::arg("x")', "doc": BINDING_DOC[spec.family].format(axis=spec.axis)}
    rows, cols = "static_cast<int>(x.size(0))", "static_cast<int>(x.size(1))"
    if spec.family == "binary":
        size = "x.size(1)" if spec.axis == "row" else "x.size(0)"
        fields.update(params="torch::Tensor x, torch::Tensor b", pyargs='py::arg("x"), py::arg("b")',
                      checks=(f'    TORCH_CHECK(b.is_cuda() && b.is_contiguous() && b.scalar_type() == torch::kFloat32 && b.numel() == {size},\n'
                              f'                "{name}_forward: b must be a contiguous float32 CUDA vector of {size} elements");\n'),
                      launcher_args="const float* x, const float* b, float* y, long long n, long long cols, cudaStream_t stream",
                      call=f"{x}, b.data_ptr<float>(), {y}, x.numel(), x.size(1)")
    elif spec.family in ("reduce", "norm"):
        fields.update(launcher_args="const float* x, float* y, int rows, int cols, cudaStream_t stream",
                      call=f"{x}, {y}, {rows}, {cols}")
        if spec.family == "reduce":
            fields["alloc"] = "torch::empty({x.size(0)}, x.options())"
    else:
        fields.update(launcher_args="const float* x, float* y, long long n, cudaStream_t stream", call=f"{x}, {y}, x.numel()")
    return BINDING.format(**fields)


def _model_new(spec: Spec) -> str:
    args = "x.contiguous(), b.contiguous()" if spec.family == "binary" else "x.contiguous()"
    params = "x: torch.Tensor, b: torch.Tensor" if spec.family == "binary" else "x: torch.Tensor"
    return ("import torch\nimport torch.nn as nn\n\nimport cuda_extension\n\n\n"
            f'class ModelNew(nn.Module):\n    """{_describe(spec)} One CUDA kernel."""\n\n'
            "    def __init__(self):\n        super().__init__()\n\n"
            f"    def forward(self, {params}) -> torch.Tensor:\n"
            f"        return cuda_extension.{spec.family}_forward({args})\n")


def teacher_files(spec: Spec) -> dict[str, str]:
    """The teacher's workspace files: model_new.py, kernels/<family>.cu and its binding."""
    cu = _row_cu(spec) if spec.family in ("reduce", "norm") else _elementwise_cu(spec)
    return {"model_new.py": _model_new(spec), f"kernels/{spec.family}.cu": cu,
            f"kernels/{spec.family}_binding.cpp": _binding(spec)}


# ---------------------------------------------------------------------------------------------
# The split and its record.


class Split(Struct, frozen=True, kw_only=True):
    """Training and held-out tasks of one generator version; no held-out source is in `train`."""

    version: int
    train: tuple[Task, ...]
    heldout: tuple[Task, ...]


def specs() -> tuple[list[Spec], list[Spec]]:
    """(training specs, held-out specs) of this `VERSION`."""
    return _train_specs(), _heldout_specs()


def split(*, scale: float = 1.0, config: sz.Config = SIZING, target_ms: float | None = None) -> Split:
    """The tasks of both splits; `target_ms` replaces the sizing's eager-time target (scale 1)."""
    if target_ms is not None:
        config = msgspec.structs.replace(config, target_ms=target_ms)
    train, heldout = specs()
    return Split(version=VERSION, train=tuple(task(s, scale=scale, config=config) for s in train),
                 heldout=tuple(task(s, scale=scale, config=config) for s in heldout))


def split_for(data: DataConfig) -> Split:
    """The split a run's data section names (`data.family_scale`, `data.family_target_ms`)."""
    return split(scale=data.family_scale, target_ms=data.family_target_ms)


def family_demos(tasks: tuple[Task, ...] | list[Task]) -> list[DemoTask]:
    """The tasks with their teacher files, for `rl.demonstrations.demo_engine`."""
    by_id = {s.task_id: s for group in specs() for s in group}
    return [DemoTask(t, teacher_files(by_id[t.task_id])) for t in tasks]


def heldout_kind(t: Task) -> str:
    """Why a held-out task is new: "op" (an op no training task has), "chain" or "shape"."""
    if set(str(t.metadata["ops"]).split(",")) & HELDOUT_OPS:
        return "op"
    return "chain" if t.metadata["family"] == "chain" else "shape"


def manifest(s: Split) -> dict:
    """The split as JSON-able data for the run directory: version, ids and what each held-out task tests."""
    def row(t: Task) -> dict:
        return {"task_id": t.task_id, "family": t.metadata["family"], "ops": t.metadata["ops"],
                "rows": t.metadata["rows"], "cols": t.metadata["cols"]}
    return {"generator": "rl.data.families", "version": s.version,
            "train": [row(t) for t in s.train],
            "heldout": [{**row(t), "new": heldout_kind(t)} for t in s.heldout],
            "heldout_ops": sorted(HELDOUT_OPS)}


def write_manifest(run_dir: str | Path, s: Split) -> Path:
    """`manifest(s)` as `families_split.json` in the run directory; returns its path."""
    path = Path(run_dir) / "families_split.json"
    path.write_bytes(orjson.dumps(manifest(s), option=orjson.OPT_INDENT_2))
    return path
