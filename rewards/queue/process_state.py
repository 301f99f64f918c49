"""What a process holds of the CUDA driver, NVML and threads, read from /proc and the driver's
own libraries without initialising either.

What it is: the checks the GPU queue's zygote (`rewards.queue.zygote_server`) makes before it
forks children that must create their own CUDA context: its threads (`thread_ids`,
`thread_names`), whether libcuda is mapped (`mapped`) or initialised (`cuda_touched`), the driver
libraries loaded without initialising them (`library`), NVML shut down as often as torch
initialised it (`release_nvml`), and torch's device count taken in a forked child
(`count_devices_in_a_child`). `python -m bench.system.zygote_threads` replays the zygote's
start-up with them. What it is not: a CUDA API; nothing here creates a context.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from pathlib import Path


def thread_ids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def thread_count() -> int:
    return len(thread_ids())


def thread_names(tids: set[str]) -> list[tuple[str, str]]:
    """(tid, name) of this process's threads `tids`: a Python thread's name, else the kernel's (`comm`)."""
    import threading

    python = {str(t.native_id): t.name for t in threading.enumerate()}
    names = []
    for tid in sorted(tids):
        try:
            names.append((tid, python.get(tid) or Path(f"/proc/self/task/{tid}/comm").read_text().strip()))
        except OSError:  # ended meanwhile
            pass
    return names


def cuda_touched() -> bool:
    """Whether this process initialised CUDA: torch's context, or the driver alone (a bare
    cudaGetDeviceCount, which `torch.cuda.is_available()` makes and `is_initialized()` does not
    see). A child forked after either cannot use CUDA. The driver is asked directly: before
    cuInit, cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED (3)."""
    if sys.modules["torch"].cuda.is_initialized():
        return True
    driver = cuda_driver()
    if driver is None:  # no driver on this machine: nothing to initialise
        return False
    count = ctypes.c_int()
    return driver.cuDeviceGetCount(ctypes.byref(count)) != 3


def cuda_driver() -> ctypes.CDLL | None:
    """libcuda.so.1, loaded (not initialised); None without a driver."""
    return library("libcuda.so.1")


@functools.cache
def library(name: str) -> ctypes.CDLL | None:
    """A driver library (libcuda.so.1, libnvidia-ml.so.1), loaded once: loading it initialises
    nothing. None on a machine without it."""
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def release_nvml(nvml, most: int = 1000) -> int:
    """Shut NVML down as often as it was initialised (torch's NVML device count initialises it at
    each call and never shuts it down): a child must not inherit an initialised NVML whose device
    fds the zygote's `_place_fds` then closes. Returns the shutdowns that released something."""
    if nvml is None:
        return 0
    for done in range(most):
        if nvml.nvmlShutdown() != 0:  # NVML_ERROR_UNINITIALIZED: the count is down to zero
            return done
    return most


def mapped(library: str) -> bool:
    """Whether a file whose name contains `library` is mapped into this process."""
    try:
        return library in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def count_devices_in_a_child() -> int:
    """`torch.cuda.device_count()` as this process would see it, asked in a forked child that then
    exits: torch counts with NVML (NVML_CHECK) or the CUDA runtime, and either leaves a driver
    thread, or a driver, behind in the process that asked. 0 where the child could not answer."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer, then leave without running any of the parent's exit code
        try:
            os.close(read)
            import torch

            os.write(write, str(int(torch.cuda.device_count())).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        text = answer.read()
    os.waitpid(pid, 0)
    return int(text) if text.isdigit() else 0


__all__ = ["count_devices_in_a_child", "cuda_driver", "cuda_touched", "library", "mapped", "release_nvml",
           "thread_count", "thread_ids", "thread_names"]
