"""Builds a workspace's kernels into one loadable module, one translation unit per process.

What: `CompilePool.build(workspace)` checks the workspace (`rewards.build.plan`), snapshots its
sources, compiles each translation unit in its own subprocess (`kernels/<name>.cu` with nvcc;
`kernels/<name>_binding.cpp` and `binding.cpp` with g++ against a precompiled header of the
torch headers bindings use), at most `max_parallel` at a time, and links the objects into
`cuda_extension<EXT_SUFFIX>`. Objects are cached by content (source, local headers, flags,
toolchain fingerprint), the module by its objects' keys: editing one kernel recompiles one
unit and relinks.
What not: it does not load or run the module (`rewards.build.loader` does, on the GPU worker). A
kernel that fails to build is a `CompileResult(ok=False)` with the trimmed compiler log, never an
exception; exceptions mean broken infrastructure (no compiler, unwritable cache), and a unit that
fails on a header the machine lacks raises `MachineError` (`rewards.build.toolchain.machine_fault`).
How used: one pool per compile machine, shared by every agent's compile calls; `statistics()`
reports its counts and times (`rewards.build.compile_stats`).

Why (measured on an H200 host): a full `torch.utils.cpp_extension.load` rebuild of the paper's
layout takes ~13 s on 16 cores while nvcc of a cuda_runtime-only .cu takes ~1 s: the torch glue
dominates, so it is compiled once and cached, and its headers are precompiled once per machine.

Example:
    pool = CompilePool(CompileConfig(cache_dir="/var/cache/cuda-agent"))
    build = await pool.build(Path("ws"))
    build.result     # CompileResult: ok, log, seconds, cached_units, built_units
    build.artifact   # BuildArtifact: so_path is the trusted cache copy the GPU worker loads
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import anyio
import msgspec
from msgspec import Struct

from agentcore.types import CompileResult
from rewards.build import compiler_log, linker
from rewards.build.compile_stats import CompileCounters, CompilePoolStatistics
from rewards.build.plan import TEMPLATE_DIR, BuildPlan, Unit, plan_build
from rewards.build.subprocesses import ProcessRun, file_lock, run_process
from rewards.build.toolchain import (
    MachineError,
    Toolchain,
    ToolchainError,
    discover_toolchain,
    machine_fault,
)

MODULE_NAME = "cuda_extension"

# The headers bindings use (the paper's axpby_binding.cpp and ours), parsed once per machine.
PCH_INCLUDES = (
    "cuda_runtime.h",
    "pybind11/pybind11.h",
    "pybind11/stl.h",
    "torch/types.h",
    "torch/csrc/utils/pybind.h",
    "ATen/DeviceAccelerator.h",
)
PCH_CUDA_INCLUDES = ("c10/cuda/CUDAStream.h",)  # only a CUDA wheel of torch ships these
# torch.utils.cpp_extension's COMMON_NVCC_FLAGS: load_inline sources are written against them.
TORCH_NVCC_FLAGS = (
    "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr",
)


class CompileConfig(Struct, frozen=True, kw_only=True):
    unit_timeout_s: float = 300.0
    """Wall-clock limit for one translation unit; past it the compiler's process group is killed."""
    link_timeout_s: float = 120.0
    """Wall-clock limit for the link."""
    pch_timeout_s: float = 900.0
    """Wall-clock limit for building the precompiled header (once per machine and toolchain)."""
    max_parallel: int = 0
    """Compiler processes at once; 0 means one per CPU core this process may use."""
    cache_dir: str = ""
    """Objects, headers, modules; '' means $CUDA_AGENT_CACHE_DIR or ~/.cache/cuda-agent/compile."""
    nvcc_flags: tuple[str, ...] = ("-O3", "-std=c++17")
    """Flags for kernels/*.cu; -c, -Xcompiler -fPIC and -gencode for the arch are always added."""
    cxx_flags: tuple[str, ...] = ("-O1", "-std=c++20")
    """Flags for bindings; -c, -fPIC, torch's defines and include dirs are always added. -O1: a
    binding is glue around calls into libtorch, and its compile is mostly the header's templates
    (a family binding with the precompiled header, one core: 11.4 s of CPU at -O2, 6.7 s at -O1,
    6.3 s at -O0)."""
    arch: str = ""
    """SASS target such as sm_90a; '' means the toolchain's ($CUDA_AGENT_ARCH, GPU, or sm_90)."""
    nvcc: str = ""
    """nvcc to use; '' means the one on PATH."""
    cxx: str = ""
    """Host C++ compiler (also nvcc's -ccbin); '' means g++ on PATH."""
    use_pch: bool = True
    """Compile bindings against the precompiled torch header (about half their compile time)."""
    install_in_workspace: bool = True
    """Also copy the module into the workspace root, for the agent's own use."""
    max_log_chars: int = 4000
    """Budget of the trimmed log of each failing unit."""


class BuildArtifact(Struct, frozen=True, kw_only=True):
    """A linked module. Load `so_path`, the content-addressed cache copy, not the workspace
    copy, which the agent can overwrite."""

    so_path: str
    key: str
    module_name: str = MODULE_NAME
    toolchain_fingerprint: str = ""
    installed_path: str = ""


class Build(Struct, frozen=True, kw_only=True):
    result: CompileResult
    artifact: BuildArtifact | None = None
    unit_seconds: dict[str, float] = {}
    """Compiler wall seconds of each unit compiled in this build (cached units are absent)."""
    link_s: float = 0.0
    """Linker wall seconds; 0 when the module came from the cache."""


class _Outcome(Struct, frozen=True, kw_only=True):
    unit: Unit
    key: str
    ok: bool
    cached: bool = False
    log: str = ""
    seconds: float = 0.0
    machine_fault: str = ""
    """Why the unit failed through no fault of its source (a MachineError's message), else ''."""


class _Linked(Struct, frozen=True, kw_only=True):
    ok: bool
    key: str
    so_path: str = ""
    log: str = ""
    seconds: float = 0.0


def _default_cache_dir() -> Path:
    env = os.environ.get("CUDA_AGENT_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "cuda-agent" / "compile"


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class CompilePool:
    """Compiles workspaces; see the module docstring for the cache and the example."""

    def __init__(self, config: CompileConfig = CompileConfig(), toolchain: Toolchain | None = None) -> None:
        self.config = config
        self.toolchain = toolchain or discover_toolchain(
            nvcc=config.nvcc or None, cxx=config.cxx or None, arch=config.arch or None
        )
        self.arch = config.arch or self.toolchain.arch
        self.cache_dir = Path(config.cache_dir) if config.cache_dir else _default_cache_dir()
        for sub in ("obj", "so", "pch", "tmp"):
            (self.cache_dir / sub).mkdir(parents=True, exist_ok=True)
        cores = config.max_parallel or len(os.sched_getaffinity(0))
        self._compiler_slots = anyio.CapacityLimiter(cores)
        self._pch_lock = anyio.Lock()
        self._compiling: dict[str, anyio.Event] = {}
        self._counts = CompileCounters()
        pch_key = _digest(self._pch_text(), self.toolchain.cxx, self.toolchain.fingerprint, *self._pch_flags())
        self.pch_header = self.cache_dir / "pch" / pch_key[:24] / "torch_pch.h"

    async def build(self, workspace: Path, units: tuple[Unit, ...] | None = None) -> Build:
        """Check, compile what the cache lacks, link; a model failure is `ok=False`, a header the
        machine lacks raises MachineError. `units`
        skips the layout check and builds exactly those (`rewards.inline.prepare`'s load_inline units)."""
        start = time.perf_counter()
        root = workspace.resolve()
        plan = BuildPlan(units=units) if units is not None else await anyio.to_thread.run_sync(plan_build, root)
        if plan.problems:
            return self._finish(start, ok=False, log="\n".join(plan.problems))
        snapshot = Path(tempfile.mkdtemp(prefix="src-", dir=self.cache_dir / "tmp"))
        try:
            keys = await anyio.to_thread.run_sync(self._snapshot, root, plan.units, snapshot)
            self._counts.add(plan_seconds_total=time.perf_counter() - start)
            return await self._build_units(start, root, snapshot, plan.units, keys)
        finally:
            shutil.rmtree(snapshot, ignore_errors=True)

    def statistics(self) -> CompilePoolStatistics:
        slots = self._compiler_slots.statistics()
        return self._counts.snapshot(in_flight=int(slots.borrowed_tokens), queue_length=slots.tasks_waiting)

    async def warm(self) -> None:
        """Build what every first build needs before it is asked for: the precompiled header and
        the fixed binding.cpp's object (on a fresh machine ~35 s and ~15 s of one core, which the
        first builds would otherwise wait for). Cancelling it kills the compiler."""
        unit = Unit(kind="cxx", path="binding.cpp")  # as plan_build lists it
        snapshot = Path(tempfile.mkdtemp(prefix="warm-", dir=self.cache_dir / "tmp"))
        try:
            keys = await anyio.to_thread.run_sync(self._snapshot, TEMPLATE_DIR, (unit,), snapshot)
            if self.config.use_pch:
                await self.ensure_pch()
            await self._object(snapshot, unit, keys[unit.path])
        finally:
            shutil.rmtree(snapshot, ignore_errors=True)

    async def ensure_pch(self) -> Path:
        """Build the precompiled header once per machine and toolchain; returns the header.

        An in-process lock, then a file lock, so concurrent builders (tasks or processes) wait
        for one build instead of racing; the .gch appears atomically (temp file, then rename).
        """
        gch = Path(f"{self.pch_header}.gch")
        if gch.exists():
            return self.pch_header
        async with self._pch_lock, file_lock(self.pch_header.parent / ".lock"):
            if not gch.exists():
                await self._build_pch(gch)
        return self.pch_header

    def compile_command(self, unit: Unit, out: Path) -> list[str]:
        """The compiler's argv for `unit`, run from the workspace (or its snapshot) root."""
        compiler = self.toolchain.nvcc if unit.kind.startswith("cuda") else self.toolchain.cxx
        return [compiler, "-c", *self._flags(unit.kind), unit.path, "-o", str(out)]

    # -- the steps of a build --------------------------------------------------------------------

    def _snapshot(self, root: Path, units: tuple[Unit, ...], snapshot: Path) -> dict[str, str]:
        """Copy each unit's files into `snapshot` and key them by those same bytes, so the
        cache can never pair a key with an object compiled from a later edit."""
        keys = {}
        for unit in units:
            files = {rel: (root / rel).read_bytes() for rel in (unit.path, *unit.headers)}
            for rel, data in files.items():
                (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
                (snapshot / rel).write_bytes(data)
            compiler = self.toolchain.nvcc if unit.kind.startswith("cuda") else self.toolchain.cxx
            parts = [unit.kind, compiler, self.toolchain.fingerprint, *self._flags(unit.kind)]
            keys[unit.path] = _digest(*parts, *(x for item in sorted(files.items()) for x in item))
        return keys

    async def _build_units(
        self, start: float, root: Path, snapshot: Path, units: tuple[Unit, ...], keys: dict[str, str]
    ) -> Build:
        if self.config.use_pch and any(u.kind == "cxx" and not self._obj(keys[u.path]).exists() for u in units):
            asked = time.perf_counter()
            await self.ensure_pch()
            self._counts.add(pch_wait_seconds_total=time.perf_counter() - asked)
        outcomes: list[_Outcome] = []
        async with anyio.create_task_group() as tg:
            for unit in units:
                tg.start_soon(self._object_into, outcomes, snapshot, unit, keys[unit.path])
        outcomes.sort(key=lambda o: o.unit.path)
        counts = {"cached": sum(o.cached for o in outcomes), "built": sum(o.ok and not o.cached for o in outcomes)}
        timings = {o.unit.path: round(o.seconds, 3) for o in outcomes if not o.cached}
        if fault := next((o.machine_fault for o in outcomes if o.machine_fault), ""):
            raise MachineError(fault)
        if not all(o.ok for o in outcomes):
            log = "\n".join(o.log for o in outcomes if not o.ok)
            return self._finish(start, ok=False, log=log, unit_seconds=timings, **counts)
        link = await self._link(snapshot, outcomes)
        artifact = None
        if link.ok:
            artifact = BuildArtifact(so_path=link.so_path, key=link.key, toolchain_fingerprint=self.toolchain.fingerprint)
            if self.config.install_in_workspace:
                artifact = self._install(root, artifact)
        log = "\n".join(filter(None, [*(o.log for o in outcomes), link.log]))
        return self._finish(
            start, ok=link.ok, log=log, artifact=artifact, unit_seconds=timings, link_s=link.seconds, **counts
        )

    async def _object_into(self, out: list[_Outcome], snapshot: Path, unit: Unit, key: str) -> None:
        out.append(await self._object(snapshot, unit, key))

    async def _object(self, snapshot: Path, unit: Unit, key: str) -> _Outcome:
        """The unit's object from the cache, or compiled: once per key in this process."""
        while key in self._compiling:
            await self._compiling[key].wait()
        if self._obj(key).exists():
            self._counts.add(cache_hits=1)
            warnings = self._obj(key).with_suffix(".log")
            log = warnings.read_text() if warnings.exists() else ""
            return _Outcome(unit=unit, key=key, ok=True, cached=True, log=log)
        done = self._compiling[key] = anyio.Event()
        try:
            return await self._compile(snapshot, unit, key)
        finally:
            del self._compiling[key]
            done.set()

    async def _compile(self, snapshot: Path, unit: Unit, key: str) -> _Outcome:
        obj = self._obj(key)
        obj.parent.mkdir(exist_ok=True)
        tmp = obj.with_name(f".{obj.name}.{uuid.uuid4().hex}.tmp")
        run = await self._run(self.compile_command(unit, tmp), snapshot, self.config.unit_timeout_s)
        ok = run.returncode == 0 and tmp.exists()
        log = self._unit_log(snapshot, unit, run)
        if ok:
            if log:  # warnings: shown again whenever the object is reused
                _atomic_write(obj.with_suffix(".log"), log.encode())
            os.replace(tmp, obj)  # atomic: readers see no object or a whole one
        tmp.unlink(missing_ok=True)
        self._counts.add(units_built=int(ok), units_failed=int(not ok), timeouts=int(run.timed_out))
        fault = None if ok else machine_fault(run.output, self.toolchain)
        return _Outcome(unit=unit, key=key, ok=ok, log=log, seconds=run.seconds,
                        machine_fault=str(fault) if fault else "")

    async def _link(self, snapshot: Path, outcomes: list[_Outcome]) -> _Linked:
        """The module linked from the outcomes' objects, or reused from the cache."""
        sources = [(snapshot / o.unit.path).read_text(errors="replace") for o in outcomes if o.unit.kind.startswith("cuda")]
        flags = linker.link_flags(self.toolchain, linker.vendor_libraries(sources))
        key = _digest("link", self.toolchain.fingerprint, *flags, *(o.key for o in outcomes))
        so_path = self.cache_dir / "so" / key[:32] / f"{MODULE_NAME}{self.toolchain.ext_suffix}"
        if so_path.exists():
            self._counts.add(link_cache_hits=1)
            return _Linked(ok=True, key=key, so_path=str(so_path))
        so_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = so_path.with_name(f".{so_path.name}.{uuid.uuid4().hex}.tmp")
        argv = [self.toolchain.cxx, *(str(self._obj(o.key)) for o in outcomes), "-o", str(tmp), *flags]
        run = await self._run(argv, snapshot, self.config.link_timeout_s)
        self._counts.add(links=1, link_seconds_total=run.seconds)
        names = {str(self._obj(o.key)): f"{o.unit.path}.o" for o in outcomes}
        output = compiler_log.shorten_paths(run.output, {**self._replacements(snapshot), **names})
        missing = linker.unresolved_symbols(output, self.toolchain)
        ok = run.returncode == 0 and tmp.exists() and not missing
        if ok:
            os.replace(tmp, so_path)
        tmp.unlink(missing_ok=True)
        log = ""
        if run.timed_out:
            log = f"link timed out after {self.config.link_timeout_s:g} s and was killed"
        elif missing:
            log = linker.unresolved_message(missing)
        elif not ok:
            log = compiler_log.trim_log(output, max_chars=self.config.max_log_chars)
        return _Linked(ok=ok, key=key, so_path=str(so_path) if ok else "", log=log, seconds=run.seconds)

    async def _build_pch(self, gch: Path) -> None:
        self.pch_header.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.pch_header, self._pch_text().encode())
        tmp = gch.with_name(f".{gch.name}.{uuid.uuid4().hex}.tmp")
        argv = [self.toolchain.cxx, *self._pch_flags(), str(self.pch_header), "-o", str(tmp)]
        run = await self._run(argv, self.pch_header.parent, self.config.pch_timeout_s)
        self._counts.add(pch_builds=1)
        if run.returncode != 0 or not tmp.exists():
            tmp.unlink(missing_ok=True)
            raise ToolchainError(f"precompiled header failed: {compiler_log.trim_log(run.output)}")
        os.replace(tmp, gch)

    async def _run(self, argv: list[str], cwd: Path, timeout_s: float) -> ProcessRun:
        asked = time.perf_counter()
        async with self._compiler_slots:
            waited_s = time.perf_counter() - asked
            run = await run_process(argv, cwd=cwd, timeout_s=timeout_s, tmp_root=self.cache_dir / "tmp")
        self._counts.add(processes=1, slot_wait_seconds_total=waited_s, compile_seconds_total=run.seconds)
        return run

    def _install(self, root: Path, artifact: BuildArtifact) -> BuildArtifact:
        """Copy (never hard-link: the agent could write through it) into the workspace."""
        target = root / Path(artifact.so_path).name
        _atomic_write(target, Path(artifact.so_path).read_bytes())
        return msgspec.structs.replace(artifact, installed_path=str(target))

    # -- flags, paths, logs ----------------------------------------------------------------------

    def _flags(self, kind: str) -> list[str]:
        tc = self.toolchain
        if kind == "cuda":
            code = f"-gencode=arch=compute_{self.arch.removeprefix('sm_')},code={self.arch}"
            vendor = [f"-I{d}" for d in linker.vendor_dirs("include")]  # cudnn.h ships in a wheel
            return ["-ccbin", tc.cxx, "-Xcompiler", "-fPIC", *self.config.nvcc_flags, code, "-I.", *vendor]
        if kind == "cuda_torch":  # a load_inline .cu: torch headers and cpp_extension's nvcc flags
            flags = self._flags("cuda") + [*tc.defines, *TORCH_NVCC_FLAGS]
            return flags + [arg for d in tc.cxx_include_dirs for arg in ("-isystem", d)]
        flags = ["-fPIC", *self.config.cxx_flags, *tc.defines, "-I."]
        flags += [arg for d in tc.cxx_include_dirs for arg in ("-isystem", d)]
        flags += ["-fdiagnostics-color=never", "-fmax-errors=10"]
        if self.config.use_pch:
            flags += ["-Winvalid-pch", "-include", str(self.pch_header)]
        return flags

    def _pch_text(self) -> str:
        includes = PCH_INCLUDES + (PCH_CUDA_INCLUDES if self.toolchain.torch_has_cuda else ())
        return "".join(f"#include <{h}>\n" for h in includes)

    def _pch_flags(self) -> list[str]:
        """The binding flags that decide whether GCC accepts the .gch (-fPIC, -O, -std, -D)."""
        tc = self.toolchain
        flags = ["-x", "c++-header", "-fPIC", *self.config.cxx_flags, *tc.defines]
        return flags + [arg for d in tc.cxx_include_dirs for arg in ("-isystem", d)]

    def _obj(self, key: str) -> Path:
        return self.cache_dir / "obj" / key[:2] / f"{key}.o"

    def _replacements(self, snapshot: Path) -> dict[str, str]:
        tc = self.toolchain
        return {
            f"{snapshot}/": "",
            f"{tc.torch_include_dirs[0]}/": "<torch>/",
            f"{tc.cuda_include_dir}/": "<cuda>/",
            f"{tc.python_include_dir}/": "<python>/",
            f"{self.pch_header.parent}/": "<pch>/",
        }

    def _unit_log(self, snapshot: Path, unit: Unit, run: ProcessRun) -> str:
        if run.timed_out:
            return f"{unit.path}: compiler timed out after {self.config.unit_timeout_s:g} s and was killed"
        log = compiler_log.trim_log(run.output, self._replacements(snapshot), max_chars=self.config.max_log_chars)
        if run.returncode != 0 and not log.strip():
            log = f"{unit.path}: compiler exited with status {run.returncode}"
        return log

    def _finish(self, start: float, *, ok: bool, log: str, cached: int = 0, built: int = 0, **extra) -> Build:
        seconds = time.perf_counter() - start
        self._counts.add(builds=1, builds_failed=int(not ok), build_seconds_total=seconds)
        cap = 2 * self.config.max_log_chars  # several failing units: the first ones, whole
        log = log if len(log) <= cap else log[:cap] + "\n[log truncated]"
        result = CompileResult(ok=ok, log=log, seconds=seconds, cached_units=cached, built_units=built)
        return Build(result=result, **extra)
