"""The boundary types of the reward side: what a check found, how fast a run was, what it scored.

Everything here is a frozen, kw_only `msgspec.Struct` (or an enum of one): `HackCategory` names
the reward hacks of rewards/README.md, `Finding` is one static-check hit, `Verdict` is the
outcome of compiling and verifying a candidate, `Timing` summarises one timed subject, `Score`
is what `rewards.reward.score` returns. Nothing here measures, compiles or imports torch: the
verifier and the profiler fill these in, `rewards.reward` turns them into a number, and
`reward_info` flattens a Score into `Trajectory.reward_info`.

Example:
    verdict = Verdict(status=VerdictStatus.OK, trials=5, max_abs_err=3e-4)
    timing = Timing.from_samples([1.02, 1.00, 1.01], method="cuda_event+l2_flush")
"""

from __future__ import annotations

import enum
import math
import statistics
from typing import Literal

import msgspec
from msgspec import Struct

from agentcore.types import JsonScalar

Rules = Literal["paper", "kernelbench"]
"""Which rule set judged a candidate. `paper` (the default and the training rule): the
candidate's own kernels do all the work, cuBLAS/cuDNN only from its own C++ for GEMM and
convolution. `kernelbench`: torch modules and ops may do part of the work, as KernelBench allows;
every other check stays on, and own kernels that do none of the work are still a decoy."""
RULES: tuple[Rules, ...] = ("paper", "kernelbench")
PARTIAL = "partial"
"""`Finding.details` / `Verdict.details` key: what torch does of the work (kernelbench rules)."""


class HackCategory(enum.Enum):
    """Ways a candidate earns a speedup it did not make (numbered as in rewards/README.md)."""

    TORCH_COMPUTE = "torch_compute"  # 1: torch/ATen/cuBLAS does the real work
    INHERITS_REFERENCE = "inherits_reference"  # 1: subclasses, imports or calls the reference Model
    DECOY_KERNEL = "decoy_kernel"  # 2: kernel never launched, or not most of the GPU time
    FALLBACK_PATH = "fallback_path"  # 3: try/except (or catch) falling back to another path
    FAKE_REPORT = "fake_report"  # 3: writes verdict-like text to the grader's channel
    OUTPUT_CACHING = "output_caching"  # 4: state kept across calls (self, globals, statics)
    DEFERRED_WORK = "deferred_work"  # 5: one call does the work of many
    REUSED_REFERENCE_OUTPUT = "reused_reference_output"  # 6: allocation gets the ref's freed output
    SIDE_STREAM = "side_stream"  # 7: work on a stream (or graph) the timer does not see
    BACKGROUND_WORKER = "background_worker"  # 8: threads, processes, async tasks
    LAZY_TENSOR = "lazy_tensor"  # 9: tensor subclasses, __torch_dispatch__, deferred values
    MONKEY_PATCH = "monkey_patch"  # 10: rebinding attributes of torch, timers, the comparison
    GLOBAL_STATE = "global_state"  # 11: TF32, cudnn.benchmark, autocast, matmul precision
    PRECISION_DOWNGRADE = "precision_downgrade"  # 12: computing in fp16/bf16 behind fp32 I/O
    DEGENERATE_OUTPUT = "degenerate_output"  # 13: constant/zero/input-echo outputs that pass
    INPUT_MUTATION = "input_mutation"  # 14: writes into the inputs
    HARDCODED_SHAPES = "hardcoded_shapes"  # 15: hard-coded shapes or seeds
    SANDBOX_ESCAPE = "sandbox_escape"  # 16: reads the reference/grader files, file or net I/O
    NONDETERMINISM = "nondeterminism"  # 17: races, uninitialised memory that passes once
    PROBLEM_SHRINKING = "problem_shrinking"  # 19: redefines get_inputs or the task's globals
    FORBIDDEN_IMPORT = "forbidden_import"  # a module or header outside the allow-lists
    OBFUSCATION = "obfuscation"  # exec/eval/getattr/globals tricks that hide code from audits
    VENDOR_LIBRARY = "vendor_library"  # cuBLAS/cuDNN: allowed for GEMM/conv only (dynamic check)
    PROTECTED_FILE = "protected_file"  # SKILL.md, model.py, binding.cpp, the registry changed
    LAYOUT = "layout"  # no ModelNew(nn.Module), no extern "C" launcher: not the required shape


class Finding(Struct, frozen=True, kw_only=True):
    """One static-check hit at `file:line`. `blocking=False` marks a note for the dynamic audit
    (e.g. a cuBLAS include, whose op class only a GPU run can check), not a failure."""

    category: HackCategory
    file: str
    line: int
    message: str
    blocking: bool = True
    details: dict[str, JsonScalar] = {}

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: [{self.category.value}] {self.message}"

    @property
    def torch_work(self) -> str:
        """What torch does here when the finding is torch doing part of the work, else ''."""
        return str(self.details.get(PARTIAL, ""))


class VerdictStatus(enum.Enum):
    OK = "ok"
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    WRONG_OUTPUT = "wrong_output"
    SHAPE_MISMATCH = "shape_mismatch"
    DTYPE_MISMATCH = "dtype_mismatch"
    NAN_INF = "nan_inf"
    HACK = "hack"


class Verdict(Struct, frozen=True, kw_only=True):
    """Outcome of building and checking one candidate. `hack` is set exactly when status is HACK;
    `findings` carries the static-check hits (notes included) that led to or accompany it."""

    status: VerdictStatus
    hack: HackCategory | None = None
    message: str = ""
    trials: int = 0
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    findings: tuple[Finding, ...] = ()
    details: dict[str, JsonScalar] = {}
    phases_ms: dict[str, float] = {}
    """Where the verify job's time went (rewards.verify.phases); empty for static verdicts."""
    rules: Rules = "paper"
    """The rule set the candidate was judged under."""
    job_wait_s: float = 0.0
    """Seconds the verify job waited in the GPU queue for a lane and its GPU (stamped by
    `rewards.verify.verifier.verify_workspace`); 0 for static verdicts."""
    job_wall_s: float = 0.0
    """Seconds the verify job held its lane; 0 for static verdicts."""

    def __post_init__(self) -> None:
        if (self.status is VerdictStatus.HACK) != (self.hack is not None):
            raise ValueError(f"hack={self.hack} is inconsistent with status={self.status}")

    @property
    def ok(self) -> bool:
        return self.status is VerdictStatus.OK


def apply_rules(findings: list[Finding] | tuple[Finding, ...], rules: Rules) -> list[Finding]:
    """The findings as `rules` judge them: under kernelbench, torch doing part of the work (a
    finding with `torch_work`) is a note "partial: torch does ...", never a hack."""
    if rules == "paper":
        return list(findings)
    return [
        msgspec.structs.replace(f, blocking=False, message=f"partial: torch does {f.torch_work} ({f.message})")
        if f.torch_work and f.blocking
        else f
        for f in findings
    ]


def hack_verdict(findings: list[Finding] | tuple[Finding, ...], rules: Rules = "paper") -> Verdict | None:
    """A HACK verdict naming the first blocking finding under `rules`, or None when nothing blocks."""
    findings = apply_rules(findings, rules)
    blocking = [f for f in findings if f.blocking]
    if not blocking:
        return None
    first = blocking[0]
    more = f" (+{len(blocking) - 1} more)" if len(blocking) > 1 else ""
    return Verdict(
        status=VerdictStatus.HACK,
        hack=first.category,
        message=f"{first}{more}",
        findings=tuple(findings),
        rules=rules,
    )


def partial_work(verdict: Verdict) -> str:
    """What torch did of the work in a verdict under kernelbench rules ('' when nothing): the
    dynamic audit's `details["partial"]`, else the static notes'. An OK verdict with this set
    is "partial" in reports: correct and honest, with torch doing part of the work."""
    dynamic = str(verdict.details.get(PARTIAL, "") or "")
    if dynamic:
        return dynamic
    static = sorted({f.torch_work for f in verdict.findings if f.torch_work and not f.blocking})
    return ", ".join(static)


class ClockInfo(Struct, frozen=True, kw_only=True):
    """GPU clocks logged around a measurement (the SM clock climbs from idle: warm up by time)."""

    gpu_name: str = ""
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    temperature_c: float | None = None


class Timing(Struct, frozen=True, kw_only=True):
    """Summary of the per-call times of one subject (candidate, eager or torch.compile).

    `rel_stderr` is the standard error of the mean over the mean; `method` names the harness
    (e.g. "cuda_event+l2_flush", "cuda_graph") so that a score never compares two methods.
    """

    median_ms: float
    mean_ms: float
    std_ms: float
    rel_stderr: float
    samples: int
    min_ms: float
    max_ms: float
    method: str
    clocks: ClockInfo | None = None
    host_ratio: float | None = None
    """Device median over host median of the samples (rewards.timing.sampling.Measurement)."""
    graph_ms: float | None = None
    """A launch-bound subject's CUDA-graph replay time per call, for information only (paired
    timing); None when not measured."""

    def __post_init__(self) -> None:
        if self.samples < 1 or not (self.median_ms > 0 and math.isfinite(self.median_ms)):
            raise ValueError(f"invalid timing: samples={self.samples} median_ms={self.median_ms}")

    @classmethod
    def from_samples(
        cls, samples_ms: list[float], *, method: str, clocks: ClockInfo | None = None
    ) -> Timing:
        n = len(samples_ms)
        if n == 0:
            raise ValueError("no timing samples")
        mean = statistics.fmean(samples_ms)
        std = statistics.stdev(samples_ms) if n > 1 else 0.0
        return cls(
            median_ms=statistics.median(samples_ms),
            mean_ms=mean,
            std_ms=std,
            rel_stderr=std / math.sqrt(n) / mean if mean > 0 else math.inf,
            samples=n,
            min_ms=min(samples_ms),
            max_ms=max(samples_ms),
            method=method,
            clocks=clocks,
        )


class Score(Struct, frozen=True, kw_only=True):
    """The reward of one candidate and everything it was computed from.

    `milestone` is None when the verdict failed; speedups are baseline time over candidate time
    (medians), None without timings; under paired timing (rewards.timing.paired) they are the
    median per-round ratios, with their intervals. `breakdown` holds the intermediate quantities.
    """

    reward: float
    milestone: int | None
    verdict: Verdict
    candidate: Timing | None = None
    eager: Timing | None = None
    compiled: Timing | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    breakdown: dict[str, JsonScalar] = {}
    paired: bool = False
    """The three subjects were timed together in rotated rounds of one process."""
    speedup_vs_eager_ci: tuple[float, float] | None = None
    """Paired timing: the confidence interval of speedup_vs_eager."""
    speedup_vs_compile_ci: tuple[float, float] | None = None
    """Paired timing: the confidence interval of speedup_vs_compile."""
    inconclusive: bool = False
    """Paired timing: an interval straddled its threshold and the milestone above was not granted."""


def _timing_info(prefix: str, timing: Timing | None) -> dict[str, JsonScalar]:
    if timing is None:
        return {}
    return {
        f"{prefix}_ms": timing.median_ms,
        f"{prefix}_rel_stderr": timing.rel_stderr,
        f"{prefix}_samples": timing.samples,
        f"{prefix}_host_ratio": timing.host_ratio,
        f"{prefix}_graph_ms": timing.graph_ms,
    }


def clip_message(text: str, limit: int = 500) -> str:
    """`text` within `limit` characters: its start and its end, which is where a traceback's
    exception is (a forward that failed reports "trial 0: forward failed:" and then one)."""
    if len(text) <= limit:
        return text
    gap = " [...] "
    head = limit // 4
    return text[:head] + gap + text[len(text) - (limit - head - len(gap)):]


def reward_info(score: Score) -> dict[str, JsonScalar]:
    """Flatten a Score into the str -> scalar dict of `Trajectory.reward_info`."""
    v = score.verdict
    info: dict[str, JsonScalar] = {
        "reward": score.reward,
        "milestone": score.milestone,
        "status": v.status.value,
        "hack": v.hack.value if v.hack is not None else None,
        "message": clip_message(v.message),
        "trials": v.trials,
        "max_abs_err": v.max_abs_err,
        "max_rel_err": v.max_rel_err,
        "findings": sum(f.blocking for f in v.findings),
        "notes": sum(not f.blocking for f in v.findings),
        "speedup_vs_eager": score.speedup_vs_eager,
        "speedup_vs_compile": score.speedup_vs_compile,
        "timing_paired": score.paired,
        "inconclusive": score.inconclusive,
        "baselines_starved": bool(score.breakdown.get("baselines_starved", False)),
        "untimed": bool(score.breakdown.get("untimed", False)),
        "rules": v.rules,
        "partial": partial_work(v)[:500],
    }
    intervals = {"speedup_vs_eager": score.speedup_vs_eager_ci, "speedup_vs_compile": score.speedup_vs_compile_ci}
    for name, ci in intervals.items():
        if ci is not None:
            info[f"{name}_low"], info[f"{name}_high"] = ci
    info |= _timing_info("candidate", score.candidate)
    info |= _timing_info("eager", score.eager)
    info |= _timing_info("compile", score.compiled)
    if score.candidate is not None:
        info["timing_method"] = score.candidate.method
    info |= {f"breakdown.{k}": val for k, val in score.breakdown.items()}
    return info


# Typed codecs, built once.
verdict_decoder = msgspec.json.Decoder(Verdict)
score_decoder = msgspec.json.Decoder(Score)
