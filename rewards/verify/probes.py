"""Measurements the candidate child takes around each forward call: process-state snapshots,
tensor fingerprints, allocator poisoning; plus the precision flags both sides pin.

What it is:
- `pin_precision()`: TF32 off for matmul and cuDNN, matmul precision "highest", cudnn.benchmark
  off, fp32 default dtype (rewards/README.md, item 20: by default cuDNN convolutions run in TF32
  while matmuls do not). The parent computes its reference under these flags; the child
  sets the same before the candidate is imported, so a candidate that flips one is seen.
- `snapshot()`: torch's global flags (`rewards.verify.precision.snapshot_flags` plus autocast, default
  dtype, deterministic algorithms, grad mode, threads), the identity of functions a cheat would patch
  (timers, synchronize, events, comparisons), Python and native thread counts, child processes.
- `fingerprint(t)`: a cheap exact digest of a tensor's bytes, computed on its device in chunks
  (two wrapping int64 sums of the words). NaNs and -0.0 are just bits here.
- `poison(...)`: fill the caching allocator's free memory with a byte pattern, so that a kernel
  that leaves part of its output unwritten returns that pattern instead of a stale answer.

What it is not: no decisions (the parent's `rewards.verify.judge` compares snapshots), no protocol.
A candidate in the same process can tamper with these; the parent's own comparisons cannot be
faked, and `rewards.static.checks` forbids the imports such tampering needs.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import threading
import time

_perf_counter = time.perf_counter  # the harness's own clock, bound before any candidate loads

from rewards.verify.wire import Snapshot

# Functions a cheat would rebind (rewards/README.md, hack 10), as dotted paths.
IDENTITY_PATHS = (
    "time.perf_counter",
    "time.perf_counter_ns",
    "time.time",
    "time.monotonic",
    "torch.cuda.synchronize",
    "torch.cuda.Event",
    "torch.cuda.Event.record",
    "torch.cuda.Event.elapsed_time",
    "torch.cuda.Event.synchronize",
    "torch.cuda.Stream.synchronize",
    "torch.cuda.current_stream",
    "torch.allclose",
    "torch.isclose",
    "torch.equal",
    "torch.testing.assert_close",
    "torch.manual_seed",
    "torch.rand",
    "torch.randn",
    "torch.randint",
    "torch.Tensor.cpu",
    "torch.Tensor.to",
    "torch.Tensor.copy_",
    "torch.Tensor.__eq__",
    "torch.nn.Module.__call__",
    "torch.nn.Module.load_state_dict",
    "torch.profiler.profile",
    "rewards.verify.probes.fingerprint",
    "rewards.verify.audit.OpAudit.__torch_dispatch__",
)
_WORDS = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
_CHUNK = 1 << 24  # elements per fingerprint step: bounds the int64 temporaries (128 MiB)


def pin_precision() -> None:
    """Exact fp32 everywhere: the numerics the reference and the baselines are held to."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.benchmark = False
    torch.set_default_dtype(torch.float32)


def _other_flags():
    """Process-wide state beyond the precision flags, each as (name, reader)."""
    import torch

    return (
        ("cudnn.enabled", lambda: torch.backends.cudnn.enabled),
        ("default_dtype", torch.get_default_dtype),
        ("deterministic_algorithms", torch.are_deterministic_algorithms_enabled),
        ("grad_enabled", torch.is_grad_enabled),
        ("autocast.cuda", lambda: torch.is_autocast_enabled("cuda")),
        ("autocast.cpu", lambda: torch.is_autocast_enabled("cpu")),
        ("autocast.cuda_dtype", lambda: torch.get_autocast_dtype("cuda")),
        ("num_threads", torch.get_num_threads),
    )


def torch_flags() -> dict[str, str]:
    """`rewards.verify.precision.snapshot_flags()` (TF32 in both APIs, matmul precision, reduced-precision
    reductions, cudnn benchmark/deterministic; an unreadable flag is left out, which shows as a
    change) plus autocast, default dtype, deterministic algorithms, grad mode and threads."""
    from rewards.verify.precision import snapshot_flags

    flags = {key: str(value) for key, value in snapshot_flags().items()}
    for name, read in _other_flags():
        try:
            flags[name] = str(read())
        except (RuntimeError, AttributeError, TypeError):
            flags[name] = "<unreadable>"
    return flags


@functools.cache
def _split(path: str) -> tuple[str, tuple[str, ...]]:
    """The longest importable module prefix of a dotted path, and the attributes after it."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return ".".join(parts[:cut]), tuple(parts[cut:])
    raise ImportError(path)


def _resolve(path: str):
    module, attrs = _split(path)
    obj = sys.modules[module]
    for attr in attrs:
        obj = getattr(obj, attr)
    return obj


def identities() -> dict[str, int]:
    found = {}
    for path in IDENTITY_PATHS:
        try:
            found[path] = id(_resolve(path))
        except (ImportError, AttributeError):
            found[path] = 0
    return found


def native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def child_pids() -> tuple[int, ...]:
    """Live processes whose parent is this one (zombies included: they were started)."""
    me, found = os.getpid(), []
    try:
        names = os.listdir("/proc")
    except OSError:
        return ()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me:
            found.append(int(name))
    return tuple(sorted(found))


def snapshot() -> Snapshot:
    return Snapshot(
        flags=torch_flags(),
        identities=identities(),
        threads=threading.active_count(),
        native_threads=native_threads(),
        children=child_pids(),
    )


def fingerprint(tensor) -> str:
    """Exact digest of the bytes of `tensor`, on its device; one host sync at the end. On a CUDA
    tensor it is ordered on the current stream only: work on other streams may not be done."""
    t = tensor.detach()
    if t.numel() == 0:
        return digest(t, 0, 0)
    a, b = word_sums(fingerprint_words(t)).tolist()
    return digest(t, a, b)


def fingerprint_words(t):
    """A non-empty tensor's bytes as one flat view of words (bool as bytes)."""
    import torch

    flat = t.detach().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    return flat.view(getattr(torch, _WORDS.get(flat.element_size(), "uint8")))


def word_sums(words):
    """[sum, sum of squares] of the words widened to int64 and wrapping, chunk by chunk, as an
    int64 pair on their device, unread."""
    import torch

    sums = torch.zeros(2, dtype=torch.int64, device=words.device)
    for chunk in words.split(_CHUNK):
        wide = chunk.to(torch.int64)
        sums += torch.stack([wide.sum(), (wide * wide).sum()])
    return sums


def digest(t, a: int, b: int) -> str:
    """The fingerprint of `t` from its words' two sums (as signed or unsigned ints)."""
    if t.numel() == 0:
        return f"empty{tuple(t.shape)}"
    return f"{a & (2**64 - 1):016x}{b & (2**64 - 1):016x}:{tuple(t.shape)}"


def poison(device: str, sizes: tuple[int, ...], byte: int) -> bool:
    """Fill what the caching allocator will hand out next with `byte`: release the cached free
    blocks, allocate one block per expected output size (best fit gives the output exactly that
    block) plus a spare for intermediates, fill, free. Call it on the stream forward will run on:
    the allocator reuses a block on the stream it was freed on. False on CPU (nothing to poison)."""
    import torch

    if torch.device(device).type != "cuda":
        return False
    torch.cuda.empty_cache()
    spare = min(max(64 << 20, sum(sizes)), 2 << 30)  # for intermediates; capped: memory is shared
    blocks = [torch.empty(n, dtype=torch.uint8, device=device) for n in (*sizes, spare) if n > 0]
    for block in blocks:
        block.fill_(byte)
    torch.cuda.current_stream().synchronize()
    del blocks
    return True


def elapsed_ms(start: float) -> float:
    return (_perf_counter() - start) * 1e3


def now() -> float:
    return _perf_counter()
