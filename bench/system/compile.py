"""Benchmark of the build path: cold build, one-kernel edits, and a full
`torch.utils.cpp_extension.load` rebuild of the same sources, printed as one JSON object.

What it is: `python -m bench.system.compile` writes a KernelBench-style workspace (three kernels:
tiled GEMM, bias + ReLU, row softmax; the paper's layout with our fixed template files), then
with a fresh cache: builds the precompiled header (timed once), builds cold, rebuilds with
nothing changed, edits the GEMM kernel `--edits` times (a different tile each time, so each is
a cache miss) and rebuilds, and times one binding compiled with and without the precompiled
header. Then it rebuilds everything `--full-rebuilds` times through cpp_extension.load into a
fresh build dir (what the paper's compile tool does). Wall seconds and the CPU seconds of the
compiler processes are both reported: the second is robust to a machine shared with others.
What it is not: a load benchmark. Building needs no GPU; `load_s` is measured only where a GPU
is visible (importing the module and one call).

How it is used:
    python -m bench.system.compile                      # --edits 5 --full-rebuilds 1
    python -m bench.system.compile --arch sm_90a --keep /tmp/bench-ws
With a CPU wheel of torch, cpp_extension links against torch's CUDA libraries, which that
wheel lacks: empty stand-ins are linked instead (the build is complete; its import fails).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import msgspec

from rewards.build.compile_pool import CompileConfig, CompilePool
from rewards.build.plan import Unit
from rewards.build.subprocesses import run_process
from rewards.build.toolchain import Toolchain

TEMPLATE = Path(__file__).resolve().parents[2] / "agentcore" / "assets" / "template"
STREAM = "static_cast<cudaStream_t>(at::accelerator::getCurrentStream({t}.get_device()).native_handle())"
BINDING_HEAD = """#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>
#include <ATen/DeviceAccelerator.h>
#include <cuda_runtime.h>

#include "../binding_registry.h"
"""

GEMM_CU = """#include <cuda_runtime.h>
#define TILE 16  // edit

__global__ void gemm_kernel(const float* __restrict__ a, const float* __restrict__ b,
                            float* __restrict__ c, int m, int n, int k) {
    __shared__ float as[TILE][TILE];
    __shared__ float bs[TILE][TILE + 1];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < k; t += TILE) {
        as[threadIdx.y][threadIdx.x] = (row < m && t + threadIdx.x < k) ? a[(long)row * k + t + threadIdx.x] : 0.0f;
        bs[threadIdx.y][threadIdx.x] = (col < n && t + threadIdx.y < k) ? b[(long)col * k + t + threadIdx.y] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < TILE; ++i) acc += as[threadIdx.y][i] * bs[i][threadIdx.x];
        __syncthreads();
    }
    if (row < m && col < n) c[(long)row * n + col] = acc;
}

// c[m, n] = a[m, k] @ b[n, k]^T (nn.Linear without bias)
extern "C" void gemm_launcher(const float* a, const float* b, float* c, int m, int n, int k, cudaStream_t s) {
    dim3 block(TILE, TILE), grid((n + TILE - 1) / TILE, (m + TILE - 1) / TILE);
    gemm_kernel<<<grid, block, 0, s>>>(a, b, c, m, n, k);
}
"""

GEMM_BINDING = BINDING_HEAD + f"""
extern "C" void gemm_launcher(const float* a, const float* b, float* c, int m, int n, int k, cudaStream_t s);

static torch::Tensor gemm_forward(torch::Tensor a, torch::Tensor b) {{
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "gemm_forward: CUDA tensors expected");
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "gemm_forward: contiguous tensors expected");
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1), "gemm_forward: a[m, k], b[n, k]");
    auto c = torch::empty({{a.size(0), b.size(0)}}, a.options());
    gemm_launcher(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(),
                  a.size(0), b.size(0), a.size(1), {STREAM.format(t="a")});
    return c;
}}

static void register_gemm(pybind11::module& m) {{ m.def("gemm_forward", &gemm_forward); }}
REGISTER_BINDING(gemm, register_gemm);
"""

BIAS_RELU_CU = """#include <cuda_runtime.h>

__global__ void bias_relu_kernel(const float* x, const float* bias, float* y, long long total, int n) {
    long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        float v = x[i] + bias[i % n];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

extern "C" void bias_relu_launcher(const float* x, const float* bias, float* y, long long total, int n,
                                   cudaStream_t s) {
    int blocks = (int)((total + 255) / 256 < 65535 ? (total + 255) / 256 : 65535);
    if (total > 0) bias_relu_kernel<<<blocks, 256, 0, s>>>(x, bias, y, total, n);
}
"""

BIAS_RELU_BINDING = BINDING_HEAD + f"""
extern "C" void bias_relu_launcher(const float* x, const float* bias, float* y, long long total, int n,
                                   cudaStream_t s);

static torch::Tensor bias_relu_forward(torch::Tensor x, torch::Tensor bias) {{
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && bias.numel() == x.size(-1), "bias_relu_forward: bad input");
    auto y = torch::empty_like(x);
    bias_relu_launcher(x.data_ptr<float>(), bias.data_ptr<float>(), y.data_ptr<float>(), x.numel(),
                       x.size(-1), {STREAM.format(t="x")});
    return y;
}}

static void register_bias_relu(pybind11::module& m) {{ m.def("bias_relu_forward", &bias_relu_forward); }}
REGISTER_BINDING(bias_relu, register_bias_relu);
"""

SOFTMAX_CU = """#include <cuda_runtime.h>
#include <float.h>

__device__ float warp_max(float v) {
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

// One warp per row of x[rows, n].
__global__ void row_softmax_kernel(const float* x, float* y, int rows, int n) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* in = x + (long)row * n;
    float* out = y + (long)row * n;
    float m = -FLT_MAX;
    for (int i = lane; i < n; i += 32) m = fmaxf(m, in[i]);
    m = warp_max(m);
    float s = 0.0f;
    for (int i = lane; i < n; i += 32) s += __expf(in[i] - m);
    s = warp_sum(s);
    for (int i = lane; i < n; i += 32) out[i] = __expf(in[i] - m) / s;
}

extern "C" void row_softmax_launcher(const float* x, float* y, int rows, int n, cudaStream_t s) {
    if (rows > 0) row_softmax_kernel<<<(rows + 7) / 8, 256, 0, s>>>(x, y, rows, n);
}
"""

SOFTMAX_BINDING = BINDING_HEAD + f"""
extern "C" void row_softmax_launcher(const float* x, float* y, int rows, int n, cudaStream_t s);

static torch::Tensor row_softmax_forward(torch::Tensor x) {{
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.dim() == 2, "row_softmax_forward: x[rows, n] on CUDA");
    auto y = torch::empty_like(x);
    row_softmax_launcher(x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), x.size(1), {STREAM.format(t="x")});
    return y;
}}

static void register_row_softmax(pybind11::module& m) {{ m.def("row_softmax_forward", &row_softmax_forward); }}
REGISTER_BINDING(row_softmax, register_row_softmax);
"""

KERNELS = {
    "gemm": (GEMM_CU, GEMM_BINDING),
    "bias_relu": (BIAS_RELU_CU, BIAS_RELU_BINDING),
    "row_softmax": (SOFTMAX_CU, SOFTMAX_BINDING),
}
TILES = (8, 32, 16, 8, 32, 16, 8, 32, 16, 8)


def write_workspace(root: Path) -> Path:
    (root / "kernels").mkdir(parents=True, exist_ok=True)
    for item in TEMPLATE.iterdir():
        shutil.copy(item, root / item.name)
    for name, (cu, binding) in KERNELS.items():
        (root / "kernels" / f"{name}.cu").write_text(cu)
        (root / "kernels" / f"{name}_binding.cpp").write_text(binding)
    return root


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Stopwatch:
    """Wall seconds and CPU seconds of finished child processes, between start and stop."""

    def __enter__(self) -> Stopwatch:
        self.wall, self.cpu = time.perf_counter(), children_cpu_s()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = round(time.perf_counter() - self.wall, 3)
        self.cpu = round(children_cpu_s() - self.cpu, 3)


async def measure_pool(root: Path, cache_dir: Path, edits: int, arch: str) -> dict:
    pool = CompilePool(CompileConfig(cache_dir=str(cache_dir), arch=arch))
    out: dict = {"toolchain": pool.toolchain.fingerprint}
    with Stopwatch() as pch:
        await pool.ensure_pch()
    out |= {"pch_build_s": pch.wall, "pch_build_cpu_s": pch.cpu}
    with Stopwatch() as cold:
        build = await pool.build(root)
    assert build.result.ok, build.result.log
    out |= {"cold_s": cold.wall, "cold_cpu_s": cold.cpu, "cold_unit_s": build.unit_seconds, "cold_link_s": build.link_s}
    with Stopwatch() as noop:
        await pool.build(root)
    out["noop_rebuild_s"] = noop.wall
    out |= await measure_edits(pool, root, edits)
    out |= await measure_pch_effect(pool, root, cache_dir, arch)
    out["so_path"] = build.artifact.so_path
    out["statistics"] = msgspec.to_builtins(pool.statistics())
    return out


async def measure_edits(pool: CompilePool, root: Path, edits: int) -> dict:
    cu = root / "kernels" / "gemm.cu"
    original = cu.read_text()
    walls, cpus, units, links = [], [], [], []
    for i in range(edits):
        cu.write_text(original.replace("#define TILE 16  // edit", f"#define TILE {TILES[i % len(TILES)]}  // edit {i}"))
        with Stopwatch() as watch:
            build = await pool.build(root)
        assert build.result.ok and build.result.built_units == 1, build.result
        walls.append(watch.wall)
        cpus.append(watch.cpu)
        units.append(build.unit_seconds["kernels/gemm.cu"])
        links.append(round(build.link_s, 3))
    cu.write_text(original)
    return {
        "edit_rebuild_s": walls,
        "edit_rebuild_median_s": statistics.median(walls),
        "edit_rebuild_cpu_median_s": statistics.median(cpus),
        "edit_nvcc_s": units,
        "edit_link_s": links,
    }


async def measure_pch_effect(pool: CompilePool, root: Path, cache_dir: Path, arch: str) -> dict:
    """One binding compiled with and without the precompiled header (same flags otherwise)."""
    unit = Unit(kind="cxx", path="kernels/gemm_binding.cpp")
    no_pch = CompilePool(CompileConfig(cache_dir=str(cache_dir), arch=arch, use_pch=False), pool.toolchain)
    out = {}
    for label, which in (("binding_unit_pch", pool), ("binding_unit_nopch", no_pch)):
        with tempfile.TemporaryDirectory() as tmp, Stopwatch() as watch:
            argv = which.compile_command(unit, Path(tmp) / "unit.o")
            run = await run_process(argv, cwd=root, timeout_s=900, tmp_root=Path(tmp))
        assert run.returncode == 0, run.output[-2000:]
        out |= {f"{label}_s": watch.wall, f"{label}_cpu_s": watch.cpu}
    return out


def stub_torch_cuda_libs(toolchain: Toolchain, where: Path) -> list[str]:
    """Empty libc10_cuda/libtorch_cuda for a CPU wheel of torch, so cpp_extension can link."""
    if toolchain.torch_has_cuda:
        return []
    for name in ("c10_cuda", "torch_cuda"):
        subprocess.run([toolchain.cxx, "-shared", "-x", "c++", os.devnull, "-o", str(where / f"lib{name}.so")], check=True)
    return [f"-L{where}"]


def torch_arch_list(arch: str) -> str:
    """sm_90 -> 9.0, sm_90a -> 9.0a: cpp_extension's spelling of the same single target."""
    digits = arch.removeprefix("sm_").rstrip("af")
    return f"{digits[:-1]}.{digits[-1]}{arch[len('sm_') + len(digits):]}"


def measure_full_rebuild(root: Path, toolchain: Toolchain, reps: int, arch: str) -> dict:
    os.environ.setdefault("CUDA_HOME", str(Path(toolchain.cuda_include_dir).parent))
    os.environ["TORCH_CUDA_ARCH_LIST"] = torch_arch_list(arch)
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:  # a CPU wheel of torch never looks for CUDA
        cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]
    sources = [str(root / "binding.cpp")] + sorted(str(p) for p in (root / "kernels").glob("*.c*"))
    walls, cpus, errors = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        ldflags = stub_torch_cuda_libs(toolchain, Path(tmp))
        for rep in range(reps):
            build_dir = Path(tmp) / f"build{rep}"
            build_dir.mkdir()
            with Stopwatch() as watch:
                try:
                    cpp_extension.load(
                        name="cuda_extension", sources=sources, build_directory=str(build_dir),
                        extra_cflags=["-O2"], extra_cuda_cflags=["-O3"], extra_ldflags=ldflags,
                        with_cuda=True, verbose=False,
                    )
                except Exception as exc:  # the import fails without a GPU wheel; the build is what we time
                    errors.append(str(exc).strip().splitlines()[-1][:200])
            if not any(build_dir.glob("cuda_extension*.so")):
                raise RuntimeError(f"cpp_extension.load built nothing: {errors[-1:]}")
            walls.append(watch.wall)
            cpus.append(watch.cpu)
    return {
        "full_rebuild_s": statistics.median(walls),
        "full_rebuild_cpu_s": statistics.median(cpus),
        "full_rebuild_runs_s": walls,
        "full_rebuild_import_errors": errors,
    }


def measure_load(so_path: str) -> dict:
    """Import in a fresh process and call one kernel; only where a GPU is visible."""
    import torch

    if not torch.cuda.is_available():
        return {"load_s": None}
    code = (
        "import time, torch; torch.zeros(1, device='cuda'); t = time.perf_counter()\n"
        f"from rewards.build.loader import load_extension; m = load_extension({so_path!r})\n"
        "m.row_softmax_forward(torch.rand(8, 64, device='cuda')); torch.cuda.synchronize()\n"
        "print(time.perf_counter() - t)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {"load_s": round(float(done.stdout.split()[-1]), 3)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edits", type=int, default=5, help="one-kernel edits to rebuild")
    parser.add_argument("--full-rebuilds", type=int, default=1, help="cpp_extension.load rebuilds")
    parser.add_argument("--arch", default="", help="SASS target; default: the toolchain's")
    parser.add_argument("--keep", type=Path, default=None, help="write the workspace here and keep it")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = write_workspace(args.keep or Path(tmp) / "ws")
        report: dict = {"cpus": len(os.sched_getaffinity(0)), "loadavg_start": os.getloadavg()}
        report |= anyio.run(measure_pool, root, Path(tmp) / "cache", args.edits, args.arch)
        pool_toolchain = CompilePool(CompileConfig(cache_dir=str(Path(tmp) / "cache"))).toolchain
        arch = args.arch or pool_toolchain.arch
        report |= measure_full_rebuild(root, pool_toolchain, args.full_rebuilds, arch)
        report |= measure_load(report["so_path"])
        report["ratio"] = round(report["full_rebuild_s"] / report["edit_rebuild_median_s"], 2)
        report["ratio_cpu"] = round(report["full_rebuild_cpu_s"] / report["edit_rebuild_cpu_median_s"], 2)
        report["loadavg_end"] = os.getloadavg()
        report |= {"nvcc": pool_toolchain.nvcc_version, "cxx": pool_toolchain.cxx_version,
                   "torch": pool_toolchain.torch_version, "arch": arch}
        report.pop("so_path")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
