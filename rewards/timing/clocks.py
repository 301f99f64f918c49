"""Reads a GPU's SM and memory clocks and temperature through NVML, for the timing log.

What it is: `ClockReader(pci_bus_id, name)`, a callable returning a `ClockInfo` snapshot, and
`max_sm_clock_mhz()`. It talks to `libnvidia-ml.so.1` through ctypes: the library ships with the
driver, so no pynvml is needed (torch.cuda.clock_rate needs it, and cupy exposes no clocks).
The device is found by PCI bus id, which is stable under CUDA_VISIBLE_DEVICES renumbering.

What it is not: never required. Every failure (no library, no permission, a sandbox without the
NVML device nodes, gVisor) gives a `ClockInfo` with None fields: timing never fails for want of a
clock. It never changes clocks (METHOD.md: measure the card as you find it).

Example:
    read = ClockReader("0000:1B:00.0", "NVIDIA H200")
    read().sm_clock_mhz    # 1980.0 under load, 345.0 idle (an H200)
"""

from __future__ import annotations

import ctypes
import functools

from rewards.verdict import ClockInfo

_NVML_SUCCESS = 0
_NVML_CLOCK_SM = 1
_NVML_CLOCK_MEM = 2
_NVML_TEMPERATURE_GPU = 0


@functools.cache
def _nvml() -> ctypes.CDLL | None:
    """The initialised NVML library, or None (loaded once per process)."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        if lib.nvmlInit_v2() != _NVML_SUCCESS:
            return None
        return lib
    except (OSError, AttributeError):
        return None


def _handle(lib: ctypes.CDLL, pci_bus_id: str) -> ctypes.c_void_p | None:
    handle = ctypes.c_void_p()
    if pci_bus_id:
        rc = lib.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(handle))
        if rc == _NVML_SUCCESS:
            return handle
    count = ctypes.c_uint()
    if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == _NVML_SUCCESS and count.value == 1:
        if lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == _NVML_SUCCESS:
            return handle  # one GPU: no ambiguity even when the bus id format differs
    return None


def _uint(fn, handle: ctypes.c_void_p, kind: int) -> float | None:
    value = ctypes.c_uint()
    try:
        ok = fn(handle, kind, ctypes.byref(value)) == _NVML_SUCCESS
    except (OSError, AttributeError):
        return None
    return float(value.value) if ok else None


class ClockReader:
    """Callable snapshot of one GPU's clocks; returns None fields where NVML cannot answer."""

    def __init__(self, pci_bus_id: str, name: str = "") -> None:
        self.name = name
        self._lib = _nvml()
        self._handle = _handle(self._lib, pci_bus_id) if self._lib is not None else None

    @property
    def available(self) -> bool:
        return self._handle is not None

    def __call__(self) -> ClockInfo:
        if self._handle is None:
            return ClockInfo(gpu_name=self.name)
        lib, h = self._lib, self._handle
        return ClockInfo(
            gpu_name=self.name,
            sm_clock_mhz=_uint(lib.nvmlDeviceGetClockInfo, h, _NVML_CLOCK_SM),
            mem_clock_mhz=_uint(lib.nvmlDeviceGetClockInfo, h, _NVML_CLOCK_MEM),
            temperature_c=_uint(lib.nvmlDeviceGetTemperature, h, _NVML_TEMPERATURE_GPU),
        )

    def max_sm_clock_mhz(self) -> float | None:
        if self._handle is None:
            return None
        return _uint(self._lib.nvmlDeviceGetMaxClockInfo, self._handle, _NVML_CLOCK_SM)
