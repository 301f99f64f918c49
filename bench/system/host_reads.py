"""Counting the host reads torch code makes: each one waits for the GPU to finish what was queued.

What it is: `HostReads`, a torch function mode that counts the calls which copy a value from a
tensor to the host (`item`, `tolist`, `bool()`, `int()`, `float()`, `.cpu()`, `.numpy()`,
`nonzero` and indexing with a boolean mask, which needs the mask's count first). On a CUDA tensor
each is a synchronisation; counted on the CPU, the same code makes the same calls, so the count
stands for the GPU's without one. With `device_only` it counts only reads of tensors off the CPU,
the synchronisations themselves (a CUDA run's count, without the host-side work on samples already
read). `bench.system.judge_reads` and the comparison tests use it.

What it is not: a profiler. It counts calls, not time, and it sees only torch's Python API.

Example:
    with HostReads() as reads:
        compare.check_output(out, ref)
    reads.total, reads.by_name          # 1, {'tolist': ...}
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

READS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero"})


class HostReads(TorchFunctionMode):
    """Counts host reads by name while active."""

    def __init__(self, device_only: bool = False) -> None:
        super().__init__()
        self.by_name: Counter[str] = Counter()
        self.device_only = device_only

    @property
    def total(self) -> int:
        return sum(self.by_name.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        counted = not self.device_only or (bool(args) and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu")
        if counted and name in READS:
            self.by_name[name] += 1
        elif counted and name == "__getitem__" and len(args) > 1 and _bool_mask(args[1]):
            self.by_name["mask index"] += 1
        return func(*args, **(kwargs or {}))


def _bool_mask(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)
