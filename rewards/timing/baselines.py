"""The eager and torch.compile baselines of a task, timed like the candidate and cached on disk.

What it is: `measure_baselines(request) -> Baselines` runs a KernelBench-format task's reference
`Model` eagerly and through `torch.compile(backend="inductor", mode="default")` in this process,
with `rewards.timing.sampling` (same method, same config as the candidate) under each math mode of the
precision policy; the compile and its warm-up are excluded from the times. `baseline(payload,
ctx)` is the GPU-queue handler around it ("baseline" -> "rewards.timing.baselines:baseline" in
`GpuQueueConfig.handlers`). `profile_model` / `measure_model` time any nn.Module (or callable)
under `torch.no_grad()`: the profile child (`rewards.timing.profile_child`) uses them too, with
`candidate_config(baselines, config)` so that the candidate gets the method the baselines got.
`report` puts candidate, eager and compile times, speedups and the noise of each side by side.

What it is not: no correctness check and no candidate loading (`rewards.verify`,
`rewards.timing.profile_child`), no reward (`rewards.reward`).

Cache: one JSON file per `BaselineKey` (`BaselineCache`).

Example:
    request = BaselineRequest(source=task.source, cache_dir="~/.cache/cuda_agent/baselines")
    b = measure_baselines(request)
    b.eager.timing.median_ms, b.compiled.timing.median_ms, b.method
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec
from msgspec import Struct

from rewards.queue.jobs import JobContext, decode, encode
from rewards.timing import stats
from rewards.timing.gpu_timer import measure
from rewards.timing.sampling import (
    METHOD_EVENT,
    GraphCaptureError,
    Measurement,
    TimingConfig,
    config_hash,
    forced,
)
from rewards.verdict import Timing
from rewards.verify.precision import DEFAULT_POLICY, MathMode, policy, precision_flags

log = logging.getLogger(__name__)

Subject = Literal["eager", "compile"]
COMPILE_BACKEND = "inductor"
COMPILE_MODE = "default"


class BaselineRequest(Struct, frozen=True, kw_only=True):
    """The payload of a "baseline" job."""

    source: str
    """KernelBench-format task source: Model, get_inputs, get_init_inputs."""
    name: str = ""
    """For logs only."""
    init_seed: int = 0
    """torch.manual_seed before the Model is built."""
    input_seed: int = 1
    """torch.manual_seed(input_seed + i) before input set i is drawn."""
    policy: str = DEFAULT_POLICY.name
    """Precision policy name (rewards.verify.precision.POLICIES)."""
    config: TimingConfig = TimingConfig()
    """Timing config; the candidate must be timed with the same one."""
    cache_dir: str = ""
    """Disk cache directory; empty: no cache."""


class BaselineKey(Struct, frozen=True, kw_only=True):
    """What a baseline time depends on. Change any field and the cache misses. Seeds are not in
    the key: a baseline's time does not depend on the random values drawn."""

    task_sha256: str
    gpu_name: str
    torch_version: str
    cuda_version: str
    policy: str
    timing_config: str

    def digest(self) -> str:
        return hashlib.sha256(msgspec.json.encode(self)).hexdigest()[:32]


class SubjectRun(Struct, frozen=True, kw_only=True):
    """One subject timed under one math mode."""

    subject: Subject
    mode: MathMode
    measurement: Measurement


class Baselines(Struct, frozen=True, kw_only=True):
    """The baselines of one task. `eager`/`compiled` are the runs that count: under a policy with
    several modes, the fastest of each subject. `method` is what the candidate must be timed with."""

    key: BaselineKey
    eager: SubjectRun
    compiled: SubjectRun
    method: str
    compile_s: float
    runs: tuple[SubjectRun, ...]
    cached: bool = False


class TimingReport(Struct, frozen=True, kw_only=True):
    """Candidate, eager and compile times, speedups, and the noise (rel. stderr of the median) of each."""

    candidate_ms: float
    eager_ms: float
    compile_ms: float
    candidate_noise: float
    eager_noise: float
    compile_noise: float
    speedup_vs_eager: stats.Speedup
    speedup_vs_compile: stats.Speedup
    method: str


# ---------------------------------------------------------------------------------------------
# Keys and the disk cache. No torch.


def task_sha256(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def make_key(
    source: str,
    *,
    gpu_name: str,
    torch_version: str,
    cuda_version: str,
    policy_name: str,
    config: TimingConfig,
) -> BaselineKey:
    return BaselineKey(
        task_sha256=task_sha256(source),
        gpu_name=gpu_name,
        torch_version=torch_version,
        cuda_version=cuda_version,
        policy=policy_name,
        timing_config=config_hash(config),
    )


_baselines_decoder = msgspec.json.Decoder(Baselines)


class BaselineCache:
    """One msgspec-JSON file per key under `root`, written atomically (temp file + rename); a
    missing or unreadable file is a miss. Inside the sandbox only the scratch dir is writable, so
    a sandboxed worker gets `cache_dir=""` and the orchestrator keeps the cache (this class works
    on either side)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()

    def path(self, key: BaselineKey) -> Path:
        return self.root / f"{key.digest()}.json"

    def get(self, key: BaselineKey) -> Baselines | None:
        try:
            found = _baselines_decoder.decode(self.path(key).read_bytes())
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None
        return msgspec.structs.replace(found, cached=True) if found.key == key else None

    def put(self, baselines: Baselines) -> Path:
        """Write atomically: a reader sees the old file or the whole new one, never a part."""
        self.root.mkdir(parents=True, exist_ok=True)
        target = self.path(baselines.key)
        data = msgspec.json.encode(msgspec.structs.replace(baselines, cached=False))
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target


# ---------------------------------------------------------------------------------------------
# Selection and reporting. No torch.


def fastest(runs: Sequence[SubjectRun], subject: Subject) -> SubjectRun:
    """The run of `subject` with the smallest median (ties: the first mode listed)."""
    mine = [r for r in runs if r.subject == subject]
    if not mine:
        raise ValueError(f"no {subject} run")
    return min(mine, key=lambda r: r.measurement.timing.median_ms)


def candidate_config(baselines: Baselines, config: TimingConfig) -> TimingConfig:
    """`config` pinned to the baselines' method: the three timings must be comparable."""
    return forced(config, baselines.method)


def report(candidate: Measurement, baselines: Baselines) -> TimingReport:
    eager, compiled = baselines.eager.measurement, baselines.compiled.measurement
    if candidate.timing.method != baselines.method:
        raise ValueError(f"candidate timed with {candidate.timing.method}, baselines with {baselines.method}")

    def vs(base: Measurement) -> stats.Speedup:
        return stats.speedup(
            baseline_ms=base.timing.median_ms,
            baseline_rel_err=base.rel_stderr_median,
            candidate_ms=candidate.timing.median_ms,
            candidate_rel_err=candidate.rel_stderr_median,
        )

    return TimingReport(
        candidate_ms=candidate.timing.median_ms,
        eager_ms=eager.timing.median_ms,
        compile_ms=compiled.timing.median_ms,
        candidate_noise=candidate.rel_stderr_median,
        eager_noise=eager.rel_stderr_median,
        compile_noise=compiled.rel_stderr_median,
        speedup_vs_eager=vs(eager),
        speedup_vs_compile=vs(compiled),
        method=baselines.method,
    )


# ---------------------------------------------------------------------------------------------
# Running a task. torch is imported inside the functions: a handler module must not touch CUDA
# on import (the fork-per-job worker imports it before forking).


def load_task(
    source: str, *, init_seed: int = 0, input_seed: int = 1, device: str = "cuda"
) -> tuple[Any, Callable[[int], tuple]]:
    """The task's reference Model on `device` and `make_inputs(i)`, the i-th input set, drawn
    directly on `device` (torch.rand under a device context: no multi-GB host round trip)."""
    import torch

    namespace: dict[str, Any] = {"__name__": f"task_{task_sha256(source)[:12]}"}
    exec(compile(source, f"<task {namespace['__name__']}>", "exec"), namespace)
    torch.manual_seed(init_seed)
    model = namespace["Model"](*namespace["get_init_inputs"]()).to(device)
    get_inputs = namespace["get_inputs"]

    def make_inputs(i: int) -> tuple:
        torch.manual_seed(input_seed + i)
        with torch.device(device):
            values = get_inputs()
        return tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in values)

    return model, make_inputs


def measure_model(
    model: Callable[..., Any], make_inputs: Callable[[int], Sequence[Any]], config: TimingConfig
) -> Measurement:
    """`rewards.timing.gpu_timer.measure` of `model(*inputs)` under torch.no_grad()."""
    import torch

    with torch.no_grad():
        return measure(model, make_inputs, config)


def profile_model(
    model: Callable[..., Any], make_inputs: Callable[[int], Sequence[Any]], config: TimingConfig
) -> Timing:
    """`measure_model(...).timing`."""
    return measure_model(model, make_inputs, config).timing


def compile_warmup(compiled: Callable[..., Any], make_inputs: Callable[[int], Sequence[Any]]) -> float:
    """Compile (or recompile for new flags) outside the timed region; returns seconds spent.

    Inductor's local autotune cache stays off for every compile of a reference (the same setting
    everywhere, so the artifacts of one process hit in another): it bakes the compiling process's
    cache dir into each kernel, and a kernel that autotunes at its first call writes its choice
    there, in another lane's directory, read-only in the paired child's sandbox."""
    import torch
    import torch._inductor.config as inductor_config

    start = time.perf_counter()
    with torch.no_grad(), inductor_config.patch(autotune_local_cache=False):
        compiled(*make_inputs(0))
    if torch.cuda.is_initialized():  # a CPU reference (tests, CPU-only hosts) has nothing to wait for
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _time_modes(model, compiled, make_inputs, modes: Sequence[MathMode], config: TimingConfig):
    """Eager then compile under each mode; the first eager run picks the method for all."""
    runs, compile_s, cfg = [], 0.0, config
    for mode in modes:
        with precision_flags(mode):
            eager = measure_model(model, make_inputs, cfg)
            cfg = forced(config, eager.timing.method)
            compile_s += compile_warmup(compiled, make_inputs)
            fused = measure_model(compiled, make_inputs, cfg)
        runs.append(SubjectRun(subject="eager", mode=mode, measurement=eager))
        runs.append(SubjectRun(subject="compile", mode=mode, measurement=fused))
    return runs, compile_s


def current_key(source: str, policy_name: str, config: TimingConfig) -> BaselineKey:
    import torch

    return make_key(
        source,
        gpu_name=torch.cuda.get_device_name(),
        torch_version=str(torch.__version__),
        cuda_version=str(torch.version.cuda),
        policy_name=policy_name,
        config=config,
    )


def measure_baselines(request: BaselineRequest) -> Baselines:
    """Cached baselines of the request's task on this GPU and stack (module docstring)."""
    import torch

    chosen = policy(request.policy)
    key = current_key(request.source, chosen.name, request.config)
    cache = BaselineCache(request.cache_dir) if request.cache_dir else None
    if cache is not None and (hit := cache.get(key)) is not None:
        return hit
    model, make_inputs = load_task(request.source, init_seed=request.init_seed, input_seed=request.input_seed)
    compiled = torch.compile(model, backend=COMPILE_BACKEND, mode=COMPILE_MODE)
    try:
        runs, compile_s = _time_modes(model, compiled, make_inputs, chosen.baseline_modes, request.config)
    except GraphCaptureError:  # the compiled model could not be captured: all in event mode
        if request.config.graph != "auto":
            raise
        event_config = forced(request.config, METHOD_EVENT)
        runs, compile_s = _time_modes(model, compiled, make_inputs, chosen.baseline_modes, event_config)
    result = Baselines(
        key=key,
        eager=fastest(runs, "eager"),
        compiled=fastest(runs, "compile"),
        method=runs[0].measurement.timing.method,
        compile_s=compile_s,
        runs=tuple(runs),
    )
    if cache is not None:
        try:
            cache.put(result)
        except OSError as exc:  # a read-only cache must not throw away a measurement
            log.warning("baseline cache %s not written: %s", cache.root, exc)
    return result


def baseline(payload: bytes, ctx: JobContext) -> bytes:
    """GPU-queue handler: msgpack `BaselineRequest` in, msgpack `Baselines` out."""
    return encode(measure_baselines(decode(payload, BaselineRequest)))
