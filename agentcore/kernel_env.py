"""What the `compile`, `verify` and `profile` tools call: a small protocol that `rewards`
implements with the real compile pool and GPU queue, and a fake of it for CPU tests.

The protocol takes the workspace directory and the task; it returns result Structs. A kernel
that fails to build, a wrong answer or a detected hack is a result with `ok=False`; only broken
infrastructure raises.

Example:
    env = FakeKernelEnv(latency_s=0.01)
    result = await env.compile(workspace_dir, task)
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

import anyio
from msgspec import Struct

from agentcore.types import CompileResult, ProfileResult, Task, VerifyResult


@runtime_checkable
class KernelEnv(Protocol):
    async def compile(self, workspace: Path, task: Task) -> CompileResult: ...

    async def verify(self, workspace: Path, task: Task) -> VerifyResult: ...

    async def profile(self, workspace: Path, task: Task) -> ProfileResult: ...


class FakeKernelEnvConfig(Struct, frozen=True, kw_only=True):
    latency_s: float = 0.0
    """Simulated seconds per call (compile, verify and profile alike)."""
    candidate_ms: float = 1.0
    """What `profile` reports for the candidate."""
    eager_ms: float = 1.2
    """What `profile` reports for eager PyTorch."""
    compile_ms: float = 1.1
    """What `profile` reports for torch.compile."""


class FakeKernelEnv:
    """A stand-in for CPU tests: compiles when `kernels/` holds a `.cu` file, verifies when
    `model_new.py` defines `ModelNew`, and profiles with fixed times. No GPU, no compiler."""

    def __init__(self, config: FakeKernelEnvConfig = FakeKernelEnvConfig()) -> None:
        self.config = config
        self.calls = {"compile": 0, "verify": 0, "profile": 0}

    async def _wait(self, name: str) -> None:
        self.calls[name] += 1
        if self.config.latency_s:
            await anyio.sleep(self.config.latency_s)

    async def compile(self, workspace: Path, task: Task) -> CompileResult:
        await self._wait("compile")
        units = sorted((workspace / "kernels").glob("*.cu"))
        if not units:
            return CompileResult(ok=False, log="no kernels/*.cu to build")
        return CompileResult(ok=True, log="fake build ok", built_units=len(units))

    async def verify(self, workspace: Path, task: Task) -> VerifyResult:
        await self._wait("verify")
        path = workspace / "model_new.py"
        if not path.exists() or "class ModelNew" not in path.read_text(errors="replace"):
            return VerifyResult(ok=False, message="model_new.py does not define ModelNew")
        return VerifyResult(ok=True, message="fake verify ok", trials=5, max_abs_err=0.0)

    async def profile(self, workspace: Path, task: Task) -> ProfileResult:
        await self._wait("profile")
        c = self.config
        return ProfileResult(
            ok=True, candidate_ms=c.candidate_ms, eager_ms=c.eager_ms, compile_ms=c.compile_ms
        )
