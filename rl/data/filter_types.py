"""The runtime filters' names and boundary Structs: what a filter job is asked, what it answers.

What it is: the job kind and handler path (`KIND`, `HANDLER`), the filter stages in run order
(`STAGES`) and the rejection reasons mapped to them (`REASONS`), and the frozen Structs that cross
the GPU-queue boundary: `FilterConfig` (what a candidate must satisfy), `FilterRequest` (job
payload), `FilterResult` with its `FilterMeasurements` (job answer).
What it is not: the checks (`rl.data.filter_checks`) or the job and its queue side
(`rl.data.filters`, which re-exports every name here; import them from there).
"""

from __future__ import annotations

from msgspec import Struct

from rewards.timing.sampling import TimingConfig

KIND = "synth_filter"
HANDLER = "rl.data.filters:filter_job"

STAGES = ("load", "eager", "finite", "memory", "deterministic", "non_constant", "input_sensitive", "runtime", "compile")
"""The filters in the order they run; acceptance per filter is counted over these."""

REASONS: dict[str, str] = {
    "load_error": "load", "eager_error": "eager", "nonfinite": "finite", "memory": "memory",
    "stochastic": "deterministic", "constant_output": "non_constant", "input_independent": "input_sensitive",
    "too_fast": "runtime", "too_slow": "runtime", "compile_error": "compile", "compile_mismatch": "compile",
    "timeout": "job", "crashed": "job",
}
"""Rejection reason -> the filter stage that rejected ("job": the queue killed or lost the job)."""

QUICK_TIMING = TimingConfig(warmup_s=0.05, warmup_max_s=0.3, min_samples=5, max_samples=40, max_time_s=1.0,
                            target_rel_stderr=0.02, input_pool=1, graph="never")
"""A filter only needs the order of magnitude: a short run, no CUDA graphs."""


class FilterConfig(Struct, frozen=True, kw_only=True):
    """What a candidate must satisfy, and how it is measured."""

    device: str = "auto"
    """"cuda", "cpu", or "auto" (CUDA when the worker sees a GPU)."""
    min_ms: float = 1.0
    """Eager runtime floor (the paper keeps 1-100 ms)."""
    max_ms: float = 100.0
    """Eager runtime ceiling."""
    memory_gib: float = 16.0
    """Peak memory of model, inputs and one forward (CPU: parameter, input and output bytes)."""
    atol: float = 1e-2
    """Absolute tolerance under which two outputs count as the same (the reward's correctness tolerance)."""
    rtol: float = 1e-2
    """Relative tolerance of the same comparison."""
    repeat_atol: float = 1e-5
    """Two runs on the same inputs may differ by this much (atomics, algorithm choice) and still agree."""
    repeat_rtol: float = 1e-3
    """...plus this fraction of the value."""
    compile: bool = True
    """Run the model under torch.compile and compare with eager."""
    compile_backend: str = "inductor"
    """torch.compile backend (tests on CPU use "eager": dynamo traces, no C++ build)."""
    compile_mode: str = "default"
    """torch.compile mode."""
    timing: TimingConfig = QUICK_TIMING
    """CUDA timing of the eager forward."""
    host_repeats: int = 5
    """CPU: timed calls after one warm-up; the median is the runtime."""
    slow_factor: float = 5.0
    """A first call slower than slow_factor * max_ms is too slow without a precise timing."""
    init_seed: int = 0
    """Seed before Model(*get_init_inputs())."""
    input_seed: int = 1
    """Seed of the first input draw; the other draws derive from it."""
    gpu_lock: str = ""
    """A file to flock while running on the GPU (lanes sharing a GPU); empty: none."""


class FilterRequest(Struct, frozen=True, kw_only=True):
    task_id: str
    source: str
    config: FilterConfig = FilterConfig()


class FilterMeasurements(Struct, frozen=True, kw_only=True):
    """What the filters saw; fields stay None where the run stopped before measuring them."""

    device: str = ""
    eager_ms: float | None = None
    eager_rel_stderr: float | None = None
    timer: str = ""
    first_call_ms: float | None = None
    peak_mem_mib: float | None = None
    param_count: int | None = None
    output_shape: str = ""
    output_std: float | None = None
    repeat_max_diff: float | None = None
    min_pair_diff: float | None = None
    compile_s: float | None = None
    compile_max_diff: float | None = None


class FilterResult(Struct, frozen=True, kw_only=True):
    ok: bool
    reason: str = ""
    message: str = ""
    measurements: FilterMeasurements = FilterMeasurements()

    @property
    def stage(self) -> str:
        return REASONS.get(self.reason, "")


class FilterInfrastructureError(RuntimeError):
    """The filter job failed as a job (the handler raised): a bug or broken worker, not the task."""
