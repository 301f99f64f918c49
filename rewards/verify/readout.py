"""Values computed on a device and read to the host together: one synchronisation for many.

What it is: `Readout` collects small device tensors (counts, sums, peaks, samples) while their
kernels are still queued, and `read()` copies them all to the host at once, one copy per device.
Each host read of a CUDA value waits for everything queued before it; on a GPU that several
verification lanes, their children, the engine and the learner share, each such wait lasts a
scheduling round of the other contexts, whatever the work, so the judge queues the statistics of
a whole comparison and reads them once (`rewards.verify.compare.queue_output`).

What it is not: a cache or a stream. Values are read in the order they were added, on the
current stream.

Example:
    readout = Readout()
    total = readout.add(x.sum())            # float64 values come back as floats
    sums = readout.add(words.sum(0))        # int64 values come back to the bit
    readout.read()
    readout.floats(total), readout.ints(sums)
"""

from __future__ import annotations

import numpy
import torch


class Readout:
    """Device tensors queued for one host read; handles index them after `read()`."""

    def __init__(self) -> None:
        self._parts: list[torch.Tensor] = []
        self._spans: list[tuple[torch.device, int, int]] = []
        self._bits: dict[torch.device, numpy.ndarray] | None = None

    def add(self, t: torch.Tensor) -> int:
        """Queue `t`'s values (int64 kept to the bit, anything else as float64); its handle."""
        if self._bits is not None:
            raise RuntimeError("this readout was already read")
        flat = t.detach().reshape(-1)
        if flat.dtype != torch.int64:
            flat = flat.to(torch.float64).contiguous().view(torch.int64)  # its bits travel unchanged
        start = sum(p.numel() for p in self._parts if p.device == flat.device)
        self._parts.append(flat)
        self._spans.append((flat.device, start, start + flat.numel()))
        return len(self._parts) - 1

    def read(self) -> None:
        """Copy every queued value to the host: one read (one synchronisation) per device."""
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for part in self._parts:
            by_device.setdefault(part.device, []).append(part)
        # As Python ints, 64-bit patterns cross exactly (a float's NaN payload included).
        self._bits = {device: numpy.array(torch.cat(parts).tolist(), dtype=numpy.int64)
                      for device, parts in by_device.items()}
        self._parts = []

    def _slice(self, handle: int) -> numpy.ndarray:
        if self._bits is None:
            raise RuntimeError("read() first")
        device, start, end = self._spans[handle]
        return self._bits[device][start:end]

    def floats(self, handle: int) -> list[float]:
        return self._slice(handle).view(numpy.float64).tolist()

    def ints(self, handle: int) -> list[int]:
        """The values of an int64 tensor, bit for bit."""
        return self._slice(handle).tolist()

    def tensor(self, handle: int) -> torch.Tensor:
        """The values of `handle` as a float64 CPU tensor."""
        return torch.from_numpy(self._slice(handle).view(numpy.float64).copy())
