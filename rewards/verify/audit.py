"""What the candidate's forward executed: every aten op (dispatch audit) and, on the GPU, every
kernel with its time and stream (profiler attribution).

What it is:
- `OpAudit`, a `TorchDispatchMode` the child (`rewards.verify.candidate`) runs forward under. It
  sees every op that reaches the dispatcher, from model_new.py and from the extension's C++ alike
  (`at::relu` in a binding is as visible as `torch.relu`); it records names only.
- `op_violations(ops)`, run by the trusted parent on those names: an explicit allow-list
  (allocation, views, metadata; rewards/README.md, hack 1; SKILL.md rule "no torch compute").
- `kernel_names(sources)`, `attribute(events, ...)`: which GPU time belongs to the candidate;
  `gpu_events(trace)`, `profiler_gpu_events(prof.events())`: a profiled run's kernels and streams;
  `library_kernels(events, marker)`: which kernels the reference's libraries run off its stream.

What it is not: the verdict. `rewards.verify.judge` turns violations and an `Attribution` into evidence.

How it is used:
    with OpAudit() as audit:            # in the child
        out = model(*inputs)
    bad = op_violations(audit.ops)      # in the parent
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

from msgspec import Struct
from torch.utils._python_dispatch import TorchDispatchMode

from rewards.static.cpp import strip_cpp
from rewards.verify.wire import KernelEvent

FRESH = "@fresh"  # suffix of an init op applied to a tensor allocated during this forward

# The op allow-list:
# - allocation: empty*, new_empty*, zeros/zeros_like/new_zeros (a memset for atomic accumulators,
#   as in `rewards.static.policy`; a zero output is the degenerate-output check's business),
#   scalar_tensor and lift_fresh (constants);
# - `zero_`/`fill_` only on a tensor allocated during this forward (allocation-time
#   initialisation); on anything else they compute (or mutate an input);
# - views and metadata. `reshape`/`contiguous`/`to` never reach the dispatcher when they are
#   no-ops; when they copy, the audit sees `clone`/`_to_copy`/`copy_`, which are torch doing work
#   (device copies included) and fail the candidate;
# - ops of other namespaces (a TORCH_LIBRARY op of the candidate's own extension). Their inner
#   ops are not visible; `rewards.static.policy` forbids registering such operators, and the
#   profiler attribution still sees the kernels they launch;
# - aten GEMM/convolution ops (mm, addmm, bmm, convolution, ...) fail like any other compute op:
#   cuBLAS and cuDNN are allowed only when called from the candidate's own C++, which pybind
#   calls never route through the dispatcher. `allow_gemm_conv=True` relaxes this (not used by
#   default).

ALLOCATION_OPS = frozenset(
    "empty empty_like empty_strided empty_permuted new_empty new_empty_strided zeros zeros_like "
    "new_zeros scalar_tensor lift_fresh lift_fresh_copy".split()
)
INIT_OPS = frozenset({"zero_", "fill_"})
VIEW_OPS = frozenset(
    "view _unsafe_view _reshape_alias reshape view_as permute transpose t expand expand_as "
    "as_strided slice select squeeze unsqueeze unbind split split_with_sizes unsafe_split "
    "unsafe_split_with_sizes chunk tensor_split narrow alias detach diagonal unfold movedim "
    "swapaxes swapdims unflatten flatten view_as_real view_as_complex contiguous".split()
)
METADATA_OPS = frozenset(
    "sym_size sym_stride sym_numel sym_storage_offset size stride numel dim is_contiguous "
    "is_same_size is_nonzero _local_scalar_dense is_pinned record_stream "
    "_has_compatible_shallow_copy_type".split()
)
GEMM_CONV_OPS = frozenset(
    "mm addmm bmm baddbmm addbmm mv addmv dot vdot matmul linear convolution _convolution "
    "cudnn_convolution cudnn_convolution_transpose conv1d conv2d conv3d conv_transpose1d "
    "conv_transpose2d conv_transpose3d _scaled_mm _int_mm".split()
)
TORCH_NAMESPACES = frozenset(
    "aten prims prim quantized _quantized mkldnn onednn _c10d_functional c10d c10d_functional "
    "_dtensor torchvision inductor higher_order rngprims debugprims profiler fbgemm".split()
)


def _storage_key(tensor) -> int | None:
    try:
        return tensor.untyped_storage().data_ptr() or None
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


class OpAudit(TorchDispatchMode):
    """Counts every op forward dispatches, by overload name ("aten.relu.default"). Init ops on
    tensors allocated inside the audited region get the FRESH suffix."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self._fresh: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        packet = func.overloadpacket.__name__
        if packet in INIT_OPS and args and _storage_key(args[0]) in self._fresh:
            name += FRESH
        out = func(*args, **(kwargs or {}))
        if packet in ALLOCATION_OPS and hasattr(out, "untyped_storage"):
            key = _storage_key(out)
            if key is not None:
                self._fresh.add(key)
        self.ops[name] += 1
        return out


def op_violations(ops: Mapping[str, int], *, allow_gemm_conv: bool = False) -> list[str]:
    """The recorded op names that are torch doing work (the allow-list above), sorted."""
    return sorted(name for name in ops if not _allowed(name, allow_gemm_conv))


def op_calls(ops: Mapping[str, int], *, allow_gemm_conv: bool = False) -> Counter[str]:
    """Calls per op of the violations, overloads merged: {"aten.addmm": 3, ...}."""
    calls: Counter[str] = Counter()
    for name in op_violations(ops, allow_gemm_conv=allow_gemm_conv):
        calls[".".join(name.removesuffix(FRESH).split(".")[:2])] += ops[name]
    return calls


def _allowed(name: str, allow_gemm_conv: bool) -> bool:
    fresh = name.endswith(FRESH)
    namespace, _, rest = name.removesuffix(FRESH).partition(".")
    if namespace not in TORCH_NAMESPACES:
        return True
    packet = rest.partition(".")[0]
    if packet in ALLOCATION_OPS or packet in VIEW_OPS or packet in METADATA_OPS:
        return True
    if packet in INIT_OPS:
        return fresh
    return allow_gemm_conv and packet in GEMM_CONV_OPS


# ---------------------------------------------------------------------------------------------
# Profiler attribution (trusted side; hacks 1, 2 and 7). Kernels whose name is a `__global__`
# function of the candidate's kernels/*.cu are its own. cuBLAS/cuDNN kernels count as its own
# only when the task has a GEMM or convolution (`task_allows_vendor`: nn.Linear/Conv*/RNNs,
# matmul/mm/bmm/einsum/linear/conv*d, the @ operator) and the candidate's sources call
# cuBLAS/cuDNN; then every kernel that is neither torch's nor a copy counts as vendor (library
# kernel names change per release). Memsets and torch's fill kernel are initialisation and count
# for nobody; device copies count against the candidate. A kernel on another stream than the
# harness's marker is side-stream work, unless the reference's own run shows the same kernel off
# its stream too (`library_kernels`): cuDNN's RNNs and FFT convolutions fork to streams of their
# own and join back to the caller's. A kernel of the candidate's own is never excused that way.

_GLOBAL = re.compile(r"__global__\b")
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\([^)]*\)")
_NAME_BEFORE_PAREN = re.compile(r"([A-Za-z_]\w*)\s*(?:<[^;{()]*>)?\s*\($")
_VENDOR_ANYWHERE = re.compile(r"cutlass|cublas|cudnn|xmma|nvjet|cask_")
_VENDOR_PREFIX = re.compile(
    r"(void )?(sm\d+_|ampere_|turing_|volta_|maxwell_|hopper_|gemm|gemv|splitkreduce|dot_kernel"
    r"|reduce_1block|implicit_convolve|explicit_convolve|precomputed_convolve|fft|winograd"
    r"|conv2d_|nchwtonhwc|nhwctonchw|op_generic_tensor|scalepackedtensor|flip_filter)"
)
_TORCH_KERNEL = re.compile(r"\bat::|\bc10::|\btriton_|\bcunn_|softmax_warp_(forward|backward)")
_INIT_KERNEL = re.compile(r"FillFunctor")
_TASK_VENDOR = re.compile(
    r"nn\.(Linear|Bilinear|Conv\w*|LazyConv\w*|LSTM|GRU|RNN|MultiheadAttention|Transformer\w*)\b"
    r"|\b(matmul|mm|bmm|baddbmm|addmm|addbmm|addmv|mv|einsum|linear|conv[123]d|conv_transpose[123]d"
    r"|tensordot|scaled_dot_product_attention|bilinear)\s*\("
    r"|[\w)\]]\s*@\s*[\w(]"
)
_SOURCE_VENDOR = re.compile(r"\b(cublas|cudnn)\w*\s*\(")


def kernel_names(sources: Mapping[str, str]) -> set[str]:
    """Names of the `__global__` functions defined in the .cu/.cuh texts of `sources`."""
    names = set()
    for path, text in sources.items():
        if not path.endswith((".cu", ".cuh")):
            continue
        code = _LAUNCH_BOUNDS.sub(" ", strip_cpp(text))
        for m in _GLOBAL.finditer(code):
            head = code[m.end() : m.end() + 400]
            paren = head.find("(")
            found = _NAME_BEFORE_PAREN.search(head[: paren + 1]) if paren >= 0 else None
            if found:
                names.add(found.group(1))
    return names


def task_allows_vendor(task_source: str) -> bool:
    """True when the task has a GEMM or a convolution, where cuBLAS/cuDNN may do that part."""
    return _TASK_VENDOR.search(task_source) is not None


def sources_call_vendor(sources: Mapping[str, str]) -> bool:
    return any(_SOURCE_VENDOR.search(strip_cpp(t)) for p, t in sources.items() if p.startswith("kernels/"))


def kernel_head(name: str) -> str:
    """A demangled kernel name without its parameter list: `void ns::k<4, at::Half>`."""
    name = name.replace("(anonymous namespace)", "anonymous")
    depth = 0
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            return name[:i]
    return name


def kernel_base(name: str) -> str:
    """`void ns::relu_kernel<256>(float const*, ...)` -> `relu_kernel`; mangled names too."""
    mangled = re.match(r"_ZN?(\d+)", name)
    if mangled:
        start = mangled.end()
        return name[start : start + int(mangled.group(1))]
    head = re.sub(r"<.*>", "", kernel_head(name)).strip()
    head = head.removeprefix("void ").strip()
    return head.split("::")[-1].strip()


def kernel_kind(event: KernelEvent, own: set[str], vendor_is_own: bool) -> str:
    """own | vendor | torch | init | copy | other."""
    if event.cat == "gpu_memset":
        return "init"
    if event.cat == "gpu_memcpy":
        return "copy"
    head = kernel_head(event.name)  # parameter types (c10::Half*) say nothing of the owner
    if kernel_base(event.name) in own and not _TORCH_KERNEL.search(head):
        return "own"
    if _INIT_KERNEL.search(event.name):
        return "init"
    if _TORCH_KERNEL.search(head):
        return "torch"
    lower = event.name.lower()
    if vendor_is_own or _VENDOR_ANYWHERE.search(lower) or _VENDOR_PREFIX.match(lower):
        return "vendor"
    return "other"


class Attribution(Struct, frozen=True, kw_only=True):
    """GPU microseconds of one profiled forward, by whom they were spent."""

    us: dict[str, float]  # kind -> time
    own_launches: int
    vendor_counts: bool  # vendor time counted as the candidate's
    share: float | None  # (own + counted vendor) / everything but init; None: no GPU work
    torch_kernels: tuple[str, ...] = ()
    vendor_kernels: tuple[str, ...] = ()
    foreign_streams: tuple[str, ...] = ()  # kernels not on the harness stream


def gpu_events(trace: Path) -> tuple[list[KernelEvent], int | None]:
    """Kernels, copies and memsets of a chrome trace, in time order; the first one is the
    harness's marker, whose stream is the harness stream."""
    events = json.loads(trace.read_text()).get("traceEvents", [])
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    gpu.sort(key=lambda e: e.get("ts", 0))
    if not gpu:
        return [], None
    marker = next((e for e in gpu if "spin_kernel" in e.get("name", "")), gpu[0])
    kernels = [
        KernelEvent(
            name=e.get("name", ""),
            cat=e["cat"],
            stream=int(e.get("args", {}).get("stream", -1)),
            dur_us=float(e.get("dur", 0.0)),
        )
        for e in gpu
        if e is not marker
    ]
    return kernels, int(marker.get("args", {}).get("stream", -1))


def profiler_gpu_events(events: Iterable) -> tuple[list[KernelEvent], int | None]:
    """`gpu_events` of a profiler's own event list (`prof.events()`) instead of its trace file: a
    process that must not trust the files around it (the verifier's parent) reads these."""
    from torch.autograd import DeviceType

    gpu = [e for e in events if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
    gpu.sort(key=lambda e: e.time_range.start)
    marker = next((e for e in gpu if "spin_kernel" in e.name), None)
    if marker is None:
        return [], None
    kernels = [
        KernelEvent(name=e.name, cat=_category(e.name), stream=int(e.device_resource_id),
                    dur_us=float(e.time_range.elapsed_us()))
        for e in gpu
        if e is not marker
    ]
    return kernels, int(marker.device_resource_id)


def _category(name: str) -> str:
    """A profiler event's trace category from its name: "Memcpy DtoD (Device -> Device)", "Memset (Device)"."""
    return "gpu_memcpy" if name.startswith("Memcpy") else "gpu_memset" if name.startswith("Memset") else "kernel"


def library_kernels(events: Iterable[KernelEvent], marker_stream: int | None) -> frozenset[str]:
    """The kernels (base names) a profiled run of the reference launched off its own stream: in
    the reference's run only the libraries torch calls do that."""
    if marker_stream is None:
        return frozenset()
    return frozenset(kernel_base(e.name) or e.name for e in events if e.stream != marker_stream)


def attribute(
    events: Iterable[KernelEvent], *, marker_stream: int | None, own: set[str], vendor_counts: bool,
    library: frozenset[str] = frozenset(),
) -> Attribution:
    """Sum the profiled forward's GPU time by kind (the rules above `kernel_names`); `library`:
    the kernels the reference, too, runs off its stream (`library_kernels`)."""
    us: Counter[str] = Counter()
    launches, torch_names, vendor_names, foreign = 0, set(), set(), set()
    for event in events:
        kind = kernel_kind(event, own, vendor_counts)
        us[kind] += event.dur_us
        launches += kind == "own"
        if kind == "torch":
            torch_names.add(kernel_base(event.name))
        elif kind == "vendor":
            vendor_names.add(kernel_base(event.name))
        base = kernel_base(event.name) or event.name
        if marker_stream is not None and event.stream != marker_stream and (kind == "own" or base not in library):
            foreign.add(f"{base} (stream {event.stream})")
    counted = us["own"] + (us["vendor"] if vendor_counts else 0.0)
    total = sum(t for kind, t in us.items() if kind != "init")
    return Attribution(
        us=dict(us),
        own_launches=launches,
        vendor_counts=vendor_counts,
        share=counted / total if total > 0 else None,
        torch_kernels=tuple(sorted(torch_names)),
        vendor_kernels=tuple(sorted(vendor_names)),
        foreign_streams=tuple(sorted(foreign)),
    )
