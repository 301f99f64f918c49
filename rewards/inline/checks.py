"""Static checks of a single-file solution: Python rules on the rewritten model_new.py, C++ rules
on the load_inline source strings.

What it is: step 4 of `rewards.inline.prepare`. `static_findings(spec, model_new, reference)` runs
`rewards.static.python.check_model_new` on the rewritten file (told which imports only made
build settings, `InlineSpec.build_only_imports`) and `rewards.static.cpp`'s host and
device rules on each module's strings (file names say which module and argument; lines are lines
of that string);
`split_device_code` separates a .cu text's kernel bodies from its host code so that each set of
rules reads only its own side.
What it is not: the verdict (`rewards.inline.prepare.convert` turns findings into one with
`rewards.verdict.hack_verdict`). `rewards.inline.prepare` re-exports both functions.
"""

from __future__ import annotations

import re

from rewards.inline.extract import InlineSpec
from rewards.static.cpp import check_kernels
from rewards.static.python import check_model_new
from rewards.verdict import Finding

_DEVICE_FN = re.compile(r"\b__(?:global|device)__\b")


def split_device_code(source: str) -> tuple[str, str]:
    """(host view, device view) of a .cu text, same length and lines: the bodies of __global__ and
    __device__ functions go to the device view, the rest stays host. In one load_inline string a
    kernel's `out[i] = ...` shares names with the wrapper's `torch::Tensor out`; the host rules
    must not read the kernel as tensor code, and the device rules forbid torch in kernels."""
    from rewards.static.cpp import strip_cpp

    code = strip_cpp(source)
    device = [False] * len(source)
    pos = 0
    while (m := _DEVICE_FN.search(code, pos)) is not None:
        brace, semi = code.find("{", m.end()), code.find(";", m.end())
        if brace < 0 or (0 <= semi < brace):
            pos = m.end()
            continue
        depth, end = 0, brace
        for end in range(brace, len(code)):
            depth += {"{": 1, "}": -1}.get(code[end], 0)
            if depth == 0:
                break
        for i in range(m.start(), end + 1):
            device[i] = True
        pos = end + 1

    def view(keep: bool) -> str:
        return "".join(c if c == "\n" or device[i] == keep else " " for i, c in enumerate(source))

    return view(False), view(True)


def static_findings(spec: InlineSpec, model_new: str, reference: str) -> list[Finding]:
    """Python checks on the rewritten model_new.py, C++ checks on each module's source strings
    (file names say which module and argument; lines are lines of that string)."""
    files = {}
    for module in spec.modules:
        prefix = f"load_inline/{module.attr}/" if module.attr else "load_inline/"
        files[f"{prefix}cpp_sources.cpp"] = module.cpp_sources
        if module.cuda_sources:
            host, device = split_device_code(module.cuda_sources)
            files |= {f"{prefix}cuda_sources.cpp": host, f"{prefix}cuda_sources.cuh": device}
    build_only = frozenset(spec.build_only_imports)
    findings = check_model_new(model_new, reference=reference, build_only_imports=build_only) + check_kernels(files)
    return sorted(findings, key=lambda f: (f.file, f.line))
