"""Single-file KernelBench solutions (`load_inline`) turned into a build the trusted side owns.

What it is: published KernelBench solutions are one model_new.py that calls
`torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., cuda_sources=...,
functions=[...])` at import and defines ModelNew over the returned module. Running that file as
is would compile (and run the compiler on candidate text) inside the candidate child, outside
the compile pool and the static checks. Instead:

1. `extract(source)` reads the call's arguments from the AST without running anything: string
   constants, module-level names bound to them earlier in the file (`src = "..."`, `src += "..."`),
   `+` concatenations, lists/tuples of those (cpp_sources as a list), `functions` as a list,
   tuple, dict (its keys) or one string. Anything else (an f-string, a call, a name bound in a
   function, two load_inline calls, `is_python_module=False`, a stray use of `load_inline`) is
   `UnsupportedInline`, which becomes a COMPILE_ERROR verdict "unsupported load_inline form: ...".
2. `rewrite(source, spec)` replaces the call by the prebuilt module: `ext = load_inline(...)` at
   module level becomes `import cuda_extension as ext` (the static checks know import aliases),
   any other call site becomes the name `cuda_extension` with `import cuda_extension;` in front
   of the first top-level statement; imports of torch.utils.cpp_extension become `pass`. Line
   numbers are kept, so tracebacks point at the author's lines.
3. `write_sources(dir, spec)` writes what load_inline would compile: kernels/inline.cu (the cuda
   sources behind load_inline's implicit includes, `#line`-mapped to "cuda_sources") and
   kernels/inline_binding.cpp (`<torch/extension.h>`, the cpp sources, and the pybind11 module
   `cuda_extension` with `torch::wrap_pybind_function` for each of `functions`, as load_inline
   generates). The compile pool builds them (`kind="cuda_torch"`: nvcc with torch's headers and
   cpp_extension's nvcc flags); extra_*flags are not passed on (arch and flags are the pool's),
   `-DNAME[=value]` flags become `#define`s.
4. `static_findings(...)` runs the Python checks on the rewritten model_new.py and the C++ host
   rules (`rewards.static.cpp`; torch may only allocate and read metadata) on both source
   strings. The verification and profiling that follow are the same as for our layout: the
   candidate child only imports the prebuilt module; the dispatch audit and the profiler's kernel
   attribution see kernels/inline.cu.

Each step is its own module: `rewards.inline.extract` (1), `rewards.inline.rewrite` (2),
`rewards.inline.sources` (3), `rewards.inline.checks` (4); this one detects the form and runs the
steps (`convert`, `prepare_inline`), and re-exports the steps' public names.

What it is not: a general Python evaluator, and no support for several load_inline calls (one
module per solution, as `rewards.build.loader` loads one).

How it is used (by `rewards.evaluate.FinalEvaluator.prepare`):
    if is_inline_solution(snapshot):
        prepared = await prepare_inline(env, snapshot, task)
"""

from __future__ import annotations

import re
from pathlib import Path

import anyio

from agentcore.types import Task
from rewards.inline.checks import split_device_code, static_findings
from rewards.inline.extract import InlineSpec, UnsupportedInline, extract
from rewards.inline.rewrite import rewrite
from rewards.inline.sources import (
    CUDA_FILE,
    UNITS,
    binding_file,
    cuda_file,
    write_sources,
)
from rewards.verdict import Verdict, VerdictStatus, hack_verdict

_LOAD_INLINE_CALL = re.compile(r"\bload_inline\s*\(")


def is_inline_solution(workspace: Path) -> bool:
    """model_new.py mentions load_inline and kernels/ holds no file: the single-file form."""
    model_new = Path(workspace) / "model_new.py"
    kernels = Path(workspace) / "kernels"
    if not model_new.is_file() or (kernels.is_dir() and any(p.is_file() for p in kernels.rglob("*"))):
        return False
    return bool(_LOAD_INLINE_CALL.search(model_new.read_text(errors="replace")))


def unsupported(message: str) -> Verdict:
    return Verdict(status=VerdictStatus.COMPILE_ERROR, message=f"unsupported load_inline form: {message}")


def convert(workspace: Path, task: Task) -> Verdict | None:
    """Rewrite the snapshot `workspace` into the built layout; a verdict when it must not build."""
    source = (workspace / "model_new.py").read_text(errors="replace")
    try:
        spec = extract(source)
        model_new = rewrite(source, spec)
    except UnsupportedInline as exc:
        return unsupported(str(exc))
    hack = hack_verdict(static_findings(spec, model_new, task.source))
    if hack is not None:
        return hack
    write_sources(workspace, spec, model_new)
    return None


async def prepare_inline(env, workspace: Path, task: Task):
    """`rewards.env.Prepared` for a single-file solution in the snapshot `workspace`."""
    from rewards.env import Prepared

    verdict = await anyio.to_thread.run_sync(convert, workspace, task)
    if verdict is not None:
        return Prepared(verdict=verdict)
    units = UNITS if (workspace / CUDA_FILE).read_text() else UNITS[1:]
    build = await env.pool.build(workspace, units=units)
    env.builds[Path(workspace).resolve()] = build
    if not build.result.ok:
        return Prepared(build=build, verdict=Verdict(status=VerdictStatus.COMPILE_ERROR, message=build.result.log))
    return Prepared(build=build, inline=True)


__all__ = ["InlineSpec", "UnsupportedInline", "binding_file", "convert", "cuda_file", "extract", "is_inline_solution",
           "prepare_inline", "rewrite", "split_device_code", "static_findings", "write_sources"]
