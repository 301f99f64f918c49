"""A GPU-queue "inductor_compile" handler for CPU tests: torch.compile in the worker process itself,
as `rewards.timing.baselines` does for the torch.compile baseline, on CPU tensors.

Each job compiles a function made from source text unique to its payload (a fresh code object,
its own shape, caches off), so Inductor really compiles every time. Then it does what Inductor
does for each Triton kernel on a GPU machine (`AsyncCompile.triton`): when compile_threads > 1
the kernel compiles in Inductor's subprocess pool and the caller waits with no timeout
(`AsyncCompile._wait_futures`). CPU kernels compile in threads, never in that pool, so on a CPU
box the handler submits to the pool itself. A pool reaped by the sandboxed worker's
`--reap-strays` then hangs the next job, as it hung a profile job on an H100.

Used by tests/test_gpu_queue_inductor.py as
`GpuQueueConfig(handlers={"inductor_compile": "tests.fakes.compile_handler:inductor_compile"})`.
"""

from __future__ import annotations

import operator

from msgspec import Struct

from rewards.queue.jobs import JobContext, decode, encode


class CompileArgs(Struct, frozen=True, kw_only=True):
    size: int
    """Length of the input vector, also baked into the compiled code."""


class CompileValue(Struct, frozen=True, kw_only=True):
    total: float
    """sum(sin(x * size + 1)) for x = arange(size) / size, computed by the compiled function."""
    compile_threads: int
    """Inductor's compile_threads as torch decided it in the worker."""
    pool_used: bool
    """Whether the job went through Inductor's subprocess compile pool."""


def expected_total(size: int) -> float:
    import torch

    x = torch.arange(size, dtype=torch.float64) / size
    return float(torch.sin(x * size + 1).sum())


def inductor_compile(payload: bytes, ctx: JobContext) -> bytes:
    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor.async_compile import get_compile_threads

    size = decode(payload, CompileArgs).size
    scope: dict = {"torch": torch}
    # A new code object per job: dynamo cannot reuse an earlier job's frame cache.
    source = f"def job_{size}(x):\n    return torch.sin(x * {size} + 1).sum()\n"
    exec(source, scope)  # noqa: S102 - our own text
    x = torch.arange(size, dtype=torch.float32) / size
    # Inductor's cache dir is under TMPDIR, the scratch dir the worker empties after every job;
    # `_precompile_header` memoizes a header path in there (functools.cache), so C++ kernels
    # would fail to compile in the next job: no precompiled headers.
    off = {"fx_graph_cache": False, "autotune_local_cache": False, "cpp_cache_precompile_headers": False}
    with inductor_config.patch(off):
        compiled = torch.compile(scope[f"job_{size}"], backend="inductor", dynamic=False, fullgraph=True)
        total = float(compiled(x))
    threads = get_compile_threads()
    return encode(CompileValue(total=total, compile_threads=threads, pool_used=_compile_in_pool(threads)))


def _compile_in_pool(threads: int) -> bool:
    """One task through Inductor's subprocess pool, waited on like a Triton kernel: no timeout."""
    if threads <= 1:  # Inductor's own test (AsyncCompile.use_process_pool)
        return False
    from torch._inductor.async_compile import AsyncCompile

    assert AsyncCompile.process_pool().submit(operator.mul, 6, 7).result() == 42
    return True
