"""A GPU-queue "baseline" handler for CPU tests: answers a real `rewards.timing.baselines.Baselines` with
times read from the task source instead of timing it on a GPU (the one edge a CPU box lacks).

A task source may carry `# fake_baseline eager_ms=2.0 compile_ms=1.0 drift=0.3 fail=0`: the first
job of that source answers those times, every later one multiplies them by (1 + drift); `fail=1`
makes the job raise. Calls are counted in files under $FAKE_BASELINE_DIR (jobs may run in fresh
processes), and each job appends "<sha> <pid> <cache_dir>" to $FAKE_BASELINE_DIR/calls.log.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from rewards.queue.jobs import JobContext, decode, encode
from rewards.timing.baselines import BaselineRequest, Baselines, SubjectRun, make_key, task_sha256
from rewards.timing.sampling import Measurement, TimingConfig
from rewards.verdict import Timing

METHOD = "cuda_graph"
_MARK = re.compile(r"#\s*fake_baseline\s+(.*)")


def _params(source: str) -> dict[str, float]:
    found = _MARK.search(source)
    params = {"eager_ms": 2.0, "compile_ms": 1.0, "drift": 0.0, "fail": 0.0}
    for item in (found.group(1).split() if found else []):
        key, _, value = item.partition("=")
        params[key] = float(value)
    return params


def _measurement(ms: float) -> Measurement:
    timing = Timing(median_ms=ms, mean_ms=ms, std_ms=0.0, rel_stderr=0.0, samples=10, min_ms=ms, max_ms=ms,
                    method=METHOD)
    return Measurement(timing=timing, stop="converged", rel_stderr_median=0.001, outliers=0, calls_per_sample=1,
                       input_pool=1, warmup_calls=1, warmup_s=0.0, sampling_s=0.0, l2_bytes=0, flush_bytes=0,
                       flush_ms=0.0, host_median_ms=ms, host_ratio=1.0, side_work_suspect=False)


def fake_baselines(request: BaselineRequest, call: int) -> Baselines:
    p = _params(request.source)
    scale = 1.0 if call == 0 else 1.0 + p["drift"]
    key = make_key(request.source, gpu_name="fake", torch_version="0", cuda_version="0", policy_name=request.policy,
                   config=TimingConfig())
    eager = SubjectRun(subject="eager", mode="ieee", measurement=_measurement(p["eager_ms"] * scale))
    compiled = SubjectRun(subject="compile", mode="ieee", measurement=_measurement(p["compile_ms"] * scale))
    return Baselines(key=key, eager=eager, compiled=compiled, method=METHOD, compile_s=0.0, runs=(eager, compiled))


def baseline(payload: bytes, ctx: JobContext) -> bytes:
    request = decode(payload, BaselineRequest)
    root = Path(os.environ["FAKE_BASELINE_DIR"])
    sha = task_sha256(request.source)[:16]
    with open(root / "calls.log", "a") as f:
        f.write(f"{sha} {os.getpid()} {request.cache_dir or '-'}\n")
    if _params(request.source)["fail"]:
        raise RuntimeError("fake baseline failure")
    counter = root / f"{sha}.count"
    call = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(call + 1))
    return encode(fake_baselines(request, call))
