"""The zygote's compile warm-up: what each forked child's first torch.compile would import and
hash, done once before the fork.

What it is: `warm_up()`, run by rewards.queue.zygote_server after its PRELOAD imports and before
it forks. It imports the Inductor, AOTAutograd and Dynamo-backend modules that
`torch.compile(model)`, `torch.compiler.load_cache_artifacts` and a first compile (a cache hit
included) load lazily (`torch.compile(model)` alone, which traces nothing, spent 0.5-1.8 s on
them in a fresh process on a CPU), registers Inductor's device backends, and computes the two
source hashes in Inductor's cache keys (`torch_key`: torch's Python files; `triton_key`: Triton's,
its libtriton among them). The process caches both, and every child inherits them.

What it is not: it compiles nothing. A Dynamo trace on a CUDA build calls
`torch.cuda.is_available()` (cudaGetDeviceCount, which initialises the CUDA driver without
`torch.cuda.is_initialized()` noticing, and a child forked after that cannot use CUDA) and
reads the CUDA RNG state (which initialises CUDA); `torch._dynamo.reset()` calls
`is_available()` too. So nothing here traces, resets or touches a device: imports and file
hashes only; should an import touch the driver all the same, the zygote restarts without the
warm-up (rewards.queue.zygote_server). It starts no thread or process and writes no file: Inductor's cache directory
(under TMPDIR, which the PRELOAD imports already create) stays empty. Inductor's config,
`compile_threads` included, is read from the zygote's environment, the one its children get.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

MODULES = (
    "torch._inductor.compile_fx",  # torch.compile(model) imports it to read Inductor's config
    "torch._inductor.compiler_bisector",  # ... and this to apply the bisector's config
    "torch._dynamo.repro.after_dynamo",  # Dynamo wraps the backend it looks up with it
    "torch._functorch.aot_autograd",
    "torch._functorch._aot_autograd.autograd_cache",  # the cache a recorded compile hits
    "torch.compiler._cache",  # torch.compiler.load_cache_artifacts
)
FIRST_CALL_MODULES = (  # what a first compiled call served from the cache still imported (30-40 ms)
    "torch._dynamo.dce_extra_outputs",
    "torch._functorch._aot_autograd.subclass_codegen",
    "torch._higher_order_ops.passes.inline_invoke_subgraph",
    "torch._inductor.codegen.memory_planning",
    "torch._inductor.hooks",
    "torch._subclasses.schema_check_mode",
    "torch.distributed.tensor.experimental",
    "torch.export._trace",
    "torch.fx.experimental.validator",
)


def warm_up(done: Callable[[str], object] = lambda step: None) -> None:
    """Import MODULES and Dynamo's backends, register Inductor's device backends, hash the
    sources in Inductor's cache keys, import FIRST_CALL_MODULES (those this torch has). Calls
    `done(step)` after each of those steps, each of MODULES a step of its own (the zygote's thread
    check says which step left a thread or loaded the driver). Raises what an import raises."""
    import torch

    for name in MODULES:
        importlib.import_module(name)
        done(name)
    torch.compiler.list_backends()  # imports every registered backend's module
    done("backends")
    from torch._inductor import codecache
    from torch._inductor.codegen.common import init_backend_registration

    init_backend_registration()  # what the first compile registers, for every device type
    done("device_backends")
    codecache.torch_key()
    done("torch_key")
    for owner in (codecache, _module("torch.utils._triton")):  # torch 2.13 keeps it in codecache, 2.11 does not
        if hasattr(owner, "triton_key"):
            owner.triton_key()  # None without Triton
            break
    compat = _module("torch._inductor.runtime.triton_compat")
    if getattr(compat, "HAS_TRITON", False):
        compat.triton_key()  # Triton's own (lru-cached), which Inductor's system key hashes where torch has no wrapper
    done("triton_key")
    for name in FIRST_CALL_MODULES:  # private modules: another torch may have moved them
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            pass
    done("first_call_modules")


def _module(name: str):
    """The module `name`, or None where this torch has no such module."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        return None
