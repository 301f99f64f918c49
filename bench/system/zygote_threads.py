"""Which of the zygote's start-up steps loads the CUDA driver's library or starts a thread:
`python -m bench.system.zygote_threads`.

What it is: the zygote's preparation (`rewards.queue.zygote_server.preload`) replayed one step at a
time in this process, NVML_CHECK set as the zygote sets it: torch's import, the device count taken
in a forked child, each other PRELOAD import and each step of the compile warm-up
(`rewards.queue.compile_warmup.warm_up`) with torch.cuda answering from that count, then NVML's
release. After each step
it prints one JSON line: the step, the threads that appeared (kernel names), whether libcuda.so.1
is mapped now and whether NVML is initialised. Every `ctypes` load of a library named libcuda prints the Python stack
that asked for it (an audit hook), so a load from Python code names its caller; a load by a C
extension shows only as the step after which the library is mapped. Within a step, every import
is a checkpoint too: a thread, libcuda or NVML that appears between two imports prints a line
naming both (`after_import_began`, `before_import`). Once torch is imported, each
call of the `torch.cuda` functions that ask NVML or the driver about devices (WATCHED) prints its
caller's stack too.

What it is not: the zygote. It forks nothing and serves nothing; the zygote's own check
(`zygote_server._warm_up`) is what the GPU test `test_the_zygote_starts_without_cuda_threads_or_files`
asserts on.

    python -m bench.system.zygote_threads
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os
import sys
import traceback

import orjson

from rewards.queue import compile_warmup, process_state, zygote_server

WATCHED = ("is_available", "device_count", "_device_count_nvml", "_raw_device_count_nvml", "current_device",
           "get_device_capability", "get_device_properties", "_lazy_init")


def _watch(module) -> None:
    """Wrap module's WATCHED functions: each call prints who called it."""
    for name in WATCHED:
        inner = getattr(module, name, None)
        if inner is None:
            continue

        def watched(*args, _inner=inner, _name=name, **kwargs):
            stack = "".join(traceback.format_stack(limit=16)[:-1])
            print(f"torch.cuda.{_name} called from:\n{stack}", file=sys.stderr, flush=True)
            return _inner(*args, **kwargs)

        setattr(module, name, watched)


def _nvml_initialised() -> bool | None:
    """Whether NVML is initialised now (asking for the device count initialises nothing: before
    nvmlInit it answers NVML_ERROR_UNINITIALIZED, 1); None without NVML's library."""
    nvml = process_state.library("libnvidia-ml.so.1")
    if nvml is None:
        return None
    count = ctypes.c_uint()
    return nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 1


class _ImportWatch:
    """An audit hook. At each module import it looks for threads that appeared, libcuda.so.1
    mapped and NVML initialised since the previous import began, and prints one JSON line for
    each change, naming the two imports. Each ctypes load of libcuda prints its Python stack."""

    def __init__(self) -> None:
        self.threads = process_state.thread_ids()
        self.libcuda = process_state.mapped("libcuda.so")
        self.nvml = _nvml_initialised()
        self.last = "(none)"
        self.on = False  # off until main() has its first report out

    def __call__(self, event: str, args: tuple) -> None:
        if event == "ctypes.dlopen" and "libcuda" in str(args[0]):
            stack = "".join(traceback.format_stack(limit=14)[:-1])
            print(f"ctypes loads {args[0]} from:\n{stack}", file=sys.stderr, flush=True)
        if event != "import" or not self.on:
            return
        self.on = False  # what this check calls imports nothing, but never re-enter it
        try:
            self.check(str(args[0]))
        finally:
            self.on = True

    def check(self, name: str) -> None:
        changes = {}
        threads = process_state.thread_ids()
        if new := threads - self.threads:
            changes["new_threads"] = [thread for _, thread in process_state.thread_names(new)]
        self.threads = threads
        if not self.libcuda and (libcuda := process_state.mapped("libcuda.so")):
            changes["libcuda_mapped"] = self.libcuda = libcuda
        if (nvml := _nvml_initialised()) != self.nvml:
            changes["nvml_initialised"] = self.nvml = nvml
        if changes:
            print(orjson.dumps({"after_import_began": self.last, "before_import": name, **changes}).decode(),
                  flush=True)
        self.last = name


def main() -> int:
    os.environ.update(zygote_server.NVML_CHECK)
    watch = _ImportWatch()
    sys.addaudithook(watch)
    known = process_state.thread_ids()

    def report(step: str) -> None:
        nonlocal known
        now = process_state.thread_ids()
        new = [name for _, name in process_state.thread_names(now - known)]
        known = now
        line = {"step": step, "new_threads": new, "libcuda_mapped": process_state.mapped("libcuda.so"),
                "nvml_initialised": _nvml_initialised()}
        print(orjson.dumps(line).decode(), flush=True)

    report("start")
    watch.on = True
    torch = importlib.import_module("torch")
    report("preload torch")
    _watch(torch.cuda)
    count = process_state.count_devices_in_a_child()
    report(f"{count} device(s) counted in a child")
    with zygote_server.devices_answered(torch.cuda, count):
        for name in (name for name in zygote_server.PRELOAD if name != "torch"):
            importlib.import_module(name)
            report(f"preload {name}")
        compile_warmup.warm_up(lambda step: report(f"warm_up {step}"))
    release = functools.partial(process_state.release_nvml, process_state.library("libnvidia-ml.so.1"))
    released = release()
    watch.on = False
    report(f"NVML released ({released} shutdowns)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
