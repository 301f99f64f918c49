"""The machine a system benchmark ran on, as recorded next to its figures (`OUT/machine.json`).

What it is: `machine() -> Machine`: GPUs and driver (nvidia-smi), CPU model and counts, memory,
torch and its CUDA (read from torch's version.py, without importing torch), nvcc, Python,
platform, git commit and date. A tool that is missing leaves its field empty.
What it is not: a benchmark, nor the runner or report (`bench.system.suite`, which re-exports both names).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from msgspec import Struct

ROOT = Path(__file__).resolve().parents[2]


class Machine(Struct, frozen=True, kw_only=True):
    """Where the figures were taken."""

    gpus: tuple[str, ...] = ()
    """One entry per GPU: name and memory, as nvidia-smi reports them."""
    driver: str = ""
    cpu_model: str = ""
    cpus: int = 0
    cpus_usable: int = 0
    mem_gib: float = 0.0
    torch: str = ""
    torch_cuda: str = ""
    nvcc: str = ""
    python: str = ""
    platform: str = ""
    commit: str = ""
    date: str = ""


def _cmd(argv: list[str]) -> str:
    if not shutil.which(argv[0]):
        return ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=ROOT, check=False)
        if done.returncode == 0:
            return done.stdout.strip()
    return ""


def _torch_cuda() -> str:
    """torch's CUDA version read from its version.py: importing torch would cost seconds."""
    with contextlib.suppress(Exception):
        for path in importlib.metadata.files("torch") or ():
            if str(path).replace("\\", "/") == "torch/version.py":
                match = re.search(r"^cuda\s*(?::.*)?=\s*['\"]([^'\"]+)", path.read_text(), re.MULTILINE)
                return match.group(1) if match else "none (CPU build)"
    return ""


def machine() -> Machine:
    smi = _cmd(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
    rows = [[c.strip() for c in line.split(",")] for line in smi.splitlines() if line.strip()]
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    mem = re.search(r"^MemTotal:\s*(\d+) kB", meminfo, re.MULTILINE)
    nvcc = re.search(r"release ([\d.]+)", _cmd(["nvcc", "--version"]))
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = ""
    return Machine(
        gpus=tuple(f"{r[0]} ({r[1]})" for r in rows if len(r) >= 2),
        driver=rows[0][2] if rows and len(rows[0]) > 2 else "",
        cpu_model=model.group(1).strip() if model else platform.processor(),
        cpus=os.cpu_count() or 0,
        cpus_usable=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0,
        mem_gib=round(int(mem.group(1)) / 2**20, 1) if mem else 0.0,
        torch=torch_version,
        torch_cuda=_torch_cuda(),
        nvcc=nvcc.group(1) if nvcc else "",
        python=platform.python_version(),
        platform=platform.platform(),
        commit=_cmd(["git", "rev-parse", "--short", "HEAD"]),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )
