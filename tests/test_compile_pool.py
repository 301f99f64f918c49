"""The compile pool with the real nvcc and g++: builds of the relu fixture workspace
(tests/fixtures/build/relu plus the fixed template files), cache behaviour, trimmed errors,
static rejections, timeouts that kill the process group, and concurrent builders.

One cache dir serves the whole session, so the precompiled header and the binding objects are
built once (about a minute on a 2-core machine); later tests mostly recompile one .cu.
Importing the module needs libcudart but no GPU; running a kernel carries the `gpu` marker.
"""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import anyio
import msgspec
import pytest

from rewards.build.compile_pool import CompileConfig, CompilePool
from rewards.build.compile_stats import CompilePoolStatistics
from rewards.build.compiler_log import trim_log
from rewards.build.toolchain import (
    MachineError,
    ToolchainError,
    discover_toolchain,
    resolve_arch,
)

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "build" / "relu"
TEMPLATE = REPO / "agentcore" / "assets" / "template"

pytestmark = pytest.mark.skipif(
    shutil.which("nvcc") is None or shutil.which("g++") is None, reason="needs nvcc and g++"
)


@pytest.fixture(scope="session")
def toolchain():
    return discover_toolchain()


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("compile-cache")


@pytest.fixture
def config(cache_dir) -> CompileConfig:
    return CompileConfig(cache_dir=str(cache_dir), max_parallel=2)


@pytest.fixture(scope="session")
def warm_cache(cache_dir, toolchain, tmp_path_factory):
    """The fixture built once: the precompiled header and the binding objects are cached."""
    ws = make_workspace(tmp_path_factory.mktemp("warm") / "ws")
    pool = CompilePool(CompileConfig(cache_dir=str(cache_dir), max_parallel=2), toolchain)
    build = anyio.run(pool.build, ws)
    assert build.result.ok, build.result.log
    return build


@pytest.fixture
def pool(config, toolchain, warm_cache) -> CompilePool:
    return CompilePool(config, toolchain)


def make_workspace(path: Path) -> Path:
    shutil.copytree(FIXTURE, path)
    for item in TEMPLATE.iterdir():
        shutil.copy(item, path / item.name)
    return path


@pytest.fixture
def workspace(tmp_path) -> Path:
    return make_workspace(tmp_path / "ws")


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def load_in_subprocess(so_path: str, code: str) -> subprocess.CompletedProcess:
    script = f"from rewards.build.loader import load_extension\nm = load_extension({so_path!r})\n{code}"
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


# -- builds and the cache ----------------------------------------------------------------------


async def test_good_workspace_builds_a_module(pool, workspace, warm_cache):
    assert warm_cache.result.built_units == 3 and warm_cache.link_s > 0
    build = await pool.build(workspace)
    assert build.result.ok, build.result.log
    assert build.result.built_units + build.result.cached_units == 3
    so = Path(build.artifact.so_path)
    assert so.name == "cuda_extension" + pool.toolchain.ext_suffix and so.is_file()
    assert Path(build.artifact.installed_path).read_bytes() == so.read_bytes()


async def test_second_build_is_all_cache_hits(pool, workspace):
    first = await pool.build(workspace)
    second = await pool.build(workspace)
    assert (second.result.cached_units, second.result.built_units) == (3, 0)
    assert second.artifact.key == first.artifact.key
    stats = pool.statistics()
    assert isinstance(stats, CompilePoolStatistics) and stats.link_cache_hits >= 1
    with pytest.raises(AttributeError):
        stats.builds = 0  # frozen


async def test_editing_one_kernel_rebuilds_only_that_unit(pool, workspace):
    before = await pool.build(workspace)
    edit(workspace / "kernels" / "relu.cu", "const int threads = 256;", "const int threads = 128;")
    after = await pool.build(workspace)
    assert after.result.ok, after.result.log
    assert (after.result.built_units, after.result.cached_units) == (1, 2)
    assert after.artifact.key != before.artifact.key


async def test_editing_a_local_header_rebuilds_the_kernel_that_includes_it(pool, workspace):
    (workspace / "kernels" / "tile.cuh").write_text("#pragma once\nconstexpr int kThreads = 256;\n")
    edit(workspace / "kernels" / "relu.cu", "const int threads = 256;", 'const int threads = kThreads;')
    edit(workspace / "kernels" / "relu.cu", "#include <cuda_runtime.h>", '#include <cuda_runtime.h>\n#include "tile.cuh"')
    assert (await pool.build(workspace)).result.ok
    (workspace / "kernels" / "tile.cuh").write_text("#pragma once\nconstexpr int kThreads = 512;\n")
    again = await pool.build(workspace)
    assert (again.result.built_units, again.result.cached_units) == (1, 2)


# -- errors the agent sees -----------------------------------------------------------------------


async def test_cuda_syntax_error_is_a_trimmed_log_with_file_and_line(pool, workspace):
    edit(workspace / "kernels" / "relu.cu", "float v = x[i];", "float v = x[i]")
    build = await pool.build(workspace)
    assert not build.result.ok and build.artifact is None
    assert re.search(r"^kernels/relu\.cu\(8\): error: expected a \";\"", build.result.log, re.MULTILINE)
    assert str(workspace) not in build.result.log
    assert "Traceback" not in build.result.log
    assert len(build.result.log) < 1000


async def test_binding_error_is_a_trimmed_log_with_file_and_line(pool, workspace):
    edit(workspace / "kernels" / "relu_binding.cpp", "auto y = torch::empty_like(x);", "auto y = torch::empty_like(x) x;")
    build = await pool.build(workspace)
    assert not build.result.ok
    assert re.search(r"^kernels/relu_binding\.cpp:15:\d+: error: ", build.result.log, re.MULTILINE)
    assert str(workspace) not in build.result.log and "site-packages" not in build.result.log


async def test_launcher_name_mismatch_is_a_link_error_not_an_import_error(pool, workspace):
    edit(workspace / "kernels" / "relu.cu", 'extern "C" void relu_launcher(', 'extern "C" void relu_launch(')
    build = await pool.build(workspace)
    assert not build.result.ok
    assert "undefined reference to 'relu_launcher'" in build.result.log


async def test_cu_including_torch_is_rejected_before_compiling(pool, workspace):
    edit(workspace / "kernels" / "relu.cu", "#include <cuda_runtime.h>", "#include <torch/extension.h>")
    built_before = pool.statistics().units_built
    build = await pool.build(workspace)
    assert not build.result.ok
    assert "kernels/relu.cu:2: includes <torch/extension.h>" in build.result.log
    assert "pure CUDA" in build.result.log and "kernels/relu_binding.cpp" in build.result.log
    assert pool.statistics().units_built == built_before


async def test_kernel_without_binding_is_rejected(pool, workspace):
    (workspace / "kernels" / "gelu.cu").write_text("#include <cuda_runtime.h>\n")
    build = await pool.build(workspace)
    assert not build.result.ok
    assert "kernels/gelu.cu has no kernels/gelu_binding.cpp" in build.result.log


async def test_modified_fixed_file_is_rejected(pool, workspace):
    edit(workspace / "binding_registry.h", "#pragma once", "#pragma once\n#define SNEAKY 1")
    build = await pool.build(workspace)
    assert not build.result.ok and "binding_registry.h was modified" in build.result.log


async def test_include_outside_the_workspace_is_rejected(pool, workspace):
    edit(workspace / "kernels" / "relu.cu", "#include <cuda_runtime.h>", '#include <cuda_runtime.h>\n#include "/etc/hostname"')
    build = await pool.build(workspace)
    assert not build.result.ok and "absolute paths are not allowed" in build.result.log


async def test_a_header_the_machine_lacks_raises_machine_error_not_a_failed_build(pool, workspace, toolchain):
    if toolchain.torch_has_cuda:
        pytest.skip("this torch is a CUDA build: its c10/cuda headers are complete")
    edit(workspace / "kernels" / "relu_binding.cpp", "#include <cuda_runtime.h>",
         "#include <cuda_runtime.h>\n#include <c10/cuda/CUDAStream.h>")
    with pytest.raises(MachineError, match=r"has no CUDA headers \(c10/cuda/impl/cuda_cmake_macros\.h is missing\)"):
        await pool.build(workspace)


async def test_a_header_the_candidate_names_but_lacks_is_its_failed_build(pool, workspace):
    edit(workspace / "kernels" / "relu_binding.cpp", "#include <cuda_runtime.h>",
         "#include <cuda_runtime.h>\n#include <relu_helpers.h>")
    build = await pool.build(workspace)
    assert not build.result.ok and "relu_helpers.h: No such file or directory" in build.result.log


# -- timeouts and concurrency ---------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_hanging_compiler_is_killed_with_its_process_group(config, toolchain, warm_cache, workspace, tmp_path):
    pid_file = tmp_path / "child.pid"
    fake = tmp_path / "fake-nvcc"
    fake.write_text(f'#!/bin/sh\nsleep 300 &\necho $! > "{pid_file}"\nwait\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    pool = CompilePool(
        msgspec.structs.replace(config, unit_timeout_s=2.0),
        msgspec.structs.replace(toolchain, nvcc=str(fake)),
    )
    build = await pool.build(workspace)
    assert not build.result.ok
    assert "kernels/relu.cu: compiler timed out after 2 s and was killed" in build.result.log
    assert pool.statistics().timeouts == 1
    child = int(pid_file.read_text())
    for _ in range(50):
        if not _alive(child):
            break
        await anyio.sleep(0.1)
    assert not _alive(child), "the compiler's child outlived the timeout"


async def test_concurrent_builds_share_the_cache_without_corrupting_it(config, toolchain, warm_cache, tmp_path):
    spaces = [make_workspace(tmp_path / f"ws{i}") for i in range(3)]
    for ws in spaces:
        edit(ws / "kernels" / "relu.cu", "const int threads = 256;", "const int threads = 192;")
    one, other = CompilePool(config, toolchain), CompilePool(config, toolchain)  # like two processes
    builds = []

    async def build(pool, ws):
        builds.append(await pool.build(ws))

    async with anyio.create_task_group() as tg:
        for pool, ws in ((one, spaces[0]), (one, spaces[1]), (other, spaces[2])):
            tg.start_soon(build, pool, ws)
    assert all(b.result.ok for b in builds), [b.result.log for b in builds]
    assert len({b.artifact.key for b in builds}) == 1
    assert one.statistics().units_built <= 1  # the edited .cu, once per pool (bindings are cached)
    again = await CompilePool(config, toolchain).build(spaces[0])
    assert again.result.built_units == 0
    loaded = load_in_subprocess(again.artifact.so_path, "print(sorted(n for n in dir(m) if not n.startswith('_')))")
    assert loaded.returncode == 0, loaded.stderr
    assert "relu_forward" in loaded.stdout


async def test_statistics_tell_a_slow_compiler_from_waiting_for_one(config, toolchain, tmp_path):
    """Fake compilers that take 0.2 s each, one slot, two builds at once: the pool's figures split a
    build's time into compiler processes, their wait for a slot, the precompiled header and links."""
    fake = tmp_path / "slow-compiler"
    fake.write_text('#!/bin/sh\nsleep 0.2\nwhile [ $# -gt 0 ]; do [ "$1" = "-o" ] && echo fake > "$2"; shift; done\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    slow = msgspec.structs.replace(toolchain, nvcc=str(fake), cxx=str(fake))
    pool = CompilePool(msgspec.structs.replace(config, cache_dir=str(tmp_path / "cache"), max_parallel=1), slow)
    spaces = [make_workspace(tmp_path / f"ws{i}") for i in range(2)]
    edit(spaces[1] / "kernels" / "relu.cu", "const int threads = 256;", "const int threads = 128;")
    builds = []

    async def build(ws):
        builds.append(await pool.build(ws))

    async with anyio.create_task_group() as tg:
        for ws in spaces:
            tg.start_soon(build, ws)
    s = pool.statistics()
    assert all(b.result.ok for b in builds), [b.result.log for b in builds]
    assert s.builds == 2 and s.processes == s.units_built + s.links + s.pch_builds == 7, s
    assert s.process_s_mean >= 0.2 and s.slot_wait_seconds_total >= 0.2, s  # one slot: someone waited
    assert s.pch_wait_seconds_total >= 0.2 and s.link_seconds_total >= 2 * 0.2 and s.plan_seconds_total > 0, s
    assert s.build_s_mean >= s.process_s_mean, s


async def test_warm_builds_the_header_and_the_fixed_binding_that_a_first_build_then_finds(config, toolchain, tmp_path):
    """Fake compilers (0.2 s each): warm() runs the precompiled header and binding.cpp's compile; a
    build afterwards compiles only its own two units and finds both in the cache."""
    fake = tmp_path / "slow-compiler"
    fake.write_text('#!/bin/sh\nsleep 0.2\nwhile [ $# -gt 0 ]; do [ "$1" = "-o" ] && echo fake > "$2"; shift; done\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    slow = msgspec.structs.replace(toolchain, nvcc=str(fake), cxx=str(fake))
    pool = CompilePool(msgspec.structs.replace(config, cache_dir=str(tmp_path / "cache")), slow)
    await pool.warm()
    warmed = pool.statistics()
    assert (warmed.pch_builds, warmed.units_built, warmed.links) == (1, 1, 0), warmed
    build = await pool.build(make_workspace(tmp_path / "ws"))
    after = pool.statistics()
    assert build.result.ok, build.result.log
    assert (build.result.cached_units, build.result.built_units) == (1, 2), build.result
    assert after.pch_builds == 1 and after.pch_wait_seconds_total < 0.2, after  # the header was there


# -- loading --------------------------------------------------------------------------------------


async def test_built_module_imports_as_cuda_extension_and_checks_its_inputs(pool, workspace, toolchain):
    if not (Path(toolchain.cuda_lib_dir) / "libcudart.so").exists():
        pytest.skip("libcudart is not installed")
    build = await pool.build(workspace)
    code = (
        "import sys, torch\nassert sys.modules['cuda_extension'] is m\n"
        "try:\n    m.relu_forward(torch.ones(4))\nexcept RuntimeError as e:\n    print(str(e).splitlines()[0])\n"
    )
    loaded = load_in_subprocess(build.artifact.so_path, code)
    assert loaded.returncode == 0, loaded.stderr
    assert "relu_forward: x must be a CUDA tensor" in loaded.stdout


@pytest.mark.gpu
async def test_built_module_computes_relu_on_the_gpu(pool, workspace):
    build = await pool.build(workspace)
    code = (
        "import torch\nx = torch.randn(1 << 20, device='cuda')\n"
        "torch.testing.assert_close(m.relu_forward(x), torch.relu(x))\nprint('ok')\n"
    )
    loaded = load_in_subprocess(build.artifact.so_path, code)
    assert loaded.returncode == 0 and "ok" in loaded.stdout, loaded.stderr


# -- pieces without a compiler ----------------------------------------------------------------------


def test_arch_override_wins_and_bad_arch_is_refused(monkeypatch):
    monkeypatch.setenv("CUDA_AGENT_ARCH", "sm_100a")
    assert resolve_arch() == "sm_100a"
    assert resolve_arch("sm_90a") == "sm_90a"
    with pytest.raises(ToolchainError):
        resolve_arch("compute_90")


def test_long_compiler_output_is_capped_errors_first():
    warnings = [f"kernels/a.cu({i}): warning: unused variable" for i in range(50)]
    errors = [f"kernels/a.cu({100 + i}): error: expected a \";\"\n    x = 1\n    ^" for i in range(200)]
    log = trim_log("\n".join(warnings + errors), max_chars=2000)
    assert len(log) <= 2100
    assert log.startswith("kernels/a.cu(100): error")
    assert "more errors" in log


def test_unrecognised_output_keeps_its_tail():
    log = trim_log("\n".join(f"line {i}" for i in range(1000)), max_chars=200)
    assert log.endswith("line 999") and "earlier lines not shown" in log
