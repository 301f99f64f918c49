"""The command line and environment of a GPU-queue worker process (`rewards.queue.worker`).

What it is: `worker_argv(config, gpu, scratch)` (the interpreter, `-m rewards.queue.worker` and its
flags, wrapped in bubblewrap by `sandbox_argv` when `config.sandbox`), `worker_env` (the lane's
CUDA_VISIBLE_DEVICES, a filtered environment inside the sandbox, Inductor settings, the project
on PYTHONPATH) and `count_gpus` (asked of torch in a subprocess). `rewards.queue.gpu_queue` starts the
processes; `config` is its `GpuQueueConfig`.

What it is not: it starts nothing and never touches CUDA.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from pathlib import Path

import anyio

from agentcore.interpreter import bind_back, interpreter_dirs
from rewards.queue.config import GpuQueueConfig

_SANDBOX_ENV = ("PATH", "LANG", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX")
_SANDBOX_ENV_PREFIXES = ("CUDA_", "NVIDIA_", "LC_", "TORCH_", "OMP_", "MKL_")


async def count_gpus(python: str = sys.executable) -> int:
    """How many GPUs torch sees, asked in a subprocess: the orchestrator never initialises CUDA."""
    code = "import torch; print(torch.cuda.device_count())"
    result = await anyio.run_process([python, "-c", code])
    return int(result.stdout.decode().split()[-1])


_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


def _worker_python_dirs(python: str) -> list[str]:
    """What the worker's interpreter needs to start and import the project: its prefixes, site
    directories and sys.path (this process's, when the worker runs this interpreter), the
    directory of `python` itself, and the project root."""
    dirs = interpreter_dirs(with_sys_path=True) + [_PROJECT_ROOT]
    venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))  # <prefix>/bin/python
    return dirs + [venv, os.path.dirname(os.path.realpath(python))]


def sandbox_argv(config: GpuQueueConfig, scratch: Path) -> list[str]:
    """bwrap around a worker. Later mounts cover earlier ones: the scratch bind comes after the
    tmpfs that may hold it, and /tmp turns read-only last, once the bind point exists in it.
    All /dev/nvidia* nodes are bound; CUDA_VISIBLE_DEVICES picks the lane's GPU."""
    s = str(scratch)
    argv = [config.bwrap_path, "--unshare-all", "--unshare-user", "--disable-userns"]
    argv += ["--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev"]
    for node in sorted(glob.glob("/dev/nvidia*")):
        argv += ["--dev-bind", node, node]
    argv += ["--proc", "/proc", "--tmpfs", "/tmp"]
    for path in config.hidden_paths:
        if os.path.isdir(path):
            argv += ["--tmpfs", path]
        elif os.path.exists(path):
            argv += ["--ro-bind", "/dev/null", path]
    hidden = [p for p in config.hidden_paths if os.path.isdir(p)]
    for path in bind_back(_worker_python_dirs(config.python), ["/tmp", *hidden], keep_hidden=hidden):
        argv += ["--ro-bind", path, path]  # e.g. a virtualenv under /tmp
    for path in config.writable_paths:
        os.makedirs(path, exist_ok=True)
        argv += ["--bind", path, path]
    return argv + ["--bind", s, s, "--remount-ro", "/tmp", "--chdir", s, "--"]


def worker_argv(config: GpuQueueConfig, gpu: int, scratch: Path) -> list[str]:
    # -P: the cwd (the writable scratch) is not on sys.path; -s: nor is ~/.local's site dir.
    argv = [config.python, "-P", "-s", "-m", "rewards.queue.worker", "--gpu", str(gpu)]
    argv += ["--scratch", str(scratch), "--handlers", json.dumps(config.handlers)]
    argv += ["--fork-per-job"] if config.fork_per_job else []
    for module in config.preload:
        argv += ["--preload", module]
    if config.sandbox:
        argv = sandbox_argv(config, scratch) + argv
        argv += ["--reap-strays", "--max-file-mib", str(config.file_size_mib)]
    return argv


def device_name(gpu: int) -> str:
    """The GPU that lane index `gpu` means on this machine, as CUDA_VISIBLE_DEVICES names it: lane
    indices count the GPUs the orchestrator sees, through its own CUDA_VISIBLE_DEVICES when set
    (e.g. by Slurm)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[gpu].strip() if visible else str(gpu)


def worker_env(config: GpuQueueConfig, gpu: int, scratch: Path) -> dict[str, str]:
    """The lane's worker sees its one GPU (`device_name`), with PCI bus order so that indices
    match nvidia-smi."""
    host = os.environ
    device = device_name(gpu)
    if config.sandbox:  # nothing else of the host: no tokens, no keys
        env = {k: v for k, v in host.items() if k in _SANDBOX_ENV or k.startswith(_SANDBOX_ENV_PREFIXES)}
        env["HOME"] = str(scratch)
    else:
        env = dict(host)
    env |= {"CUDA_VISIBLE_DEVICES": device, "TMPDIR": str(scratch), "PYTHONDONTWRITEBYTECODE": "1"}
    # Inductor compiles the torch.compile baselines in this process, not in its subprocess pool:
    # the sandboxed worker kills every other process after each job (--reap-strays), and torch
    # keeps the pool's write pipe open in the parent, so the next compile would wait forever on
    # a reaped pool (seen on an H100: a profile job hung with the GPU idle).
    # A child forked per job starts its own pool and takes it with it (`compile_threads`).
    env["TORCHINDUCTOR_COMPILE_THREADS"] = str(config.compile_threads if config.fork_per_job else 1)
    # Inductor's caches live under TMPDIR, the scratch dir emptied after every job (a candidate
    # must not leave anything for a later job's baselines); its precompiled C++ header path is
    # remembered per process, so a later CPU compile would include a deleted file.
    env["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] = "0"
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, str(config.cpu_threads))
    env |= config.env
    # The worker runs `-m rewards.queue.worker`: make this very project importable whether or not it
    # is pip-installed (a checkout run with PYTHONPATH, as on the GPU machines).
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([_PROJECT_ROOT, *paths]))
    return env


__all__ = ["count_gpus", "sandbox_argv", "worker_argv", "worker_env"]
