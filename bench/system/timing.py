"""Benchmark of the GPU timer itself: is `rewards.timing.sampling` reproducible across fresh processes, and
does it agree with `triton.testing.do_bench`? Prints one JSON object.

What it is: `python -m bench.system.timing` (on a GPU machine) spawns `--runs` fresh worker processes
(`python -m bench.system.timing --child kernels`), one after another, each timing the same kernels with
`rewards.timing.gpu_timer.measure` and, in the same process, with `triton.testing.do_bench` (median):

    saxpy_64m    CuPy RawKernel (NVRTC), y = 2x + 1 over 64M fp32: memory-bound, ~130-170 us
    add_16m      torch.add over 16M fp32: ~45-65 us, also timed in event AND graph mode
    matmul_4096  torch.mm 4096^3 in true fp32 (TF32 off): ~2-3 ms
    relu_256k    torch.relu over 256K fp32: ~3 us, CUDA-graph mode (vs do_bench_cudagraph)

Then it times the eager and torch.compile baselines of a few KernelBench problems twice,
each in its own process (`--child baselines`, no cache); `--cpu-load N` and `--pin-cores K`
repeat them beside busy CPUs (`load_report`). The targets are at `SPREAD_TARGET`.

`--reward-stability` checks the reward instead (`bench.system.reward_stability`): six tasks,
four launch-bound level-3 models and two heavy level-1 kernels, each profiled in `--runs` (10)
fresh processes the old way (the candidate alone against baselines from another process) and the
paired way (candidate, eager and torch.compile timed together in rotated rounds of one process,
as the final evaluation does), side by side; per task the milestone agreement, the speedup
spread, the interval widths, and the job costs, into --out DIR (a table over every task in DIR,
so runs of a few tasks each fill one table); `--deadline-s` stops starting runs in time.

What it is not: a benchmark of kernels or of torch; no test asserts these numbers.

    python -m bench.system.timing                              # 5 runs, 3 problems, JSON on stdout
    python -m bench.system.timing --runs 5 --out timing.json --problems 19_ReLU,40_LayerNorm
    python -m bench.system.timing --runs 1 --problems 4_LeNet5,20_MobileNetV2 --cpu-load 16   # contention
    python -m bench.system.timing --runs 1 --problems 4_LeNet5 --cpu-load 16 --pin-cores 2    # + pinned lane
    python -m bench.system.timing --reward-stability --tasks 4_LeNet5,9_ResNet18 --out bench/results/stability
    python -m bench.system.timing --reward-stability --tables-only --out bench/results/stability   # merge
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from rewards.timing import stats
from rewards.timing.gpu_timer import measure
from rewards.timing.sampling import METHOD_EVENT, METHOD_GRAPH, Measurement, TimingConfig, forced
from rl.data.kernelbench import default_problems_path

PROBLEMS = ("19_ReLU", "1_Square_matrix_multiplication_", "40_LayerNorm")
PROBLEM_FILES = (
    "shared/kernelbench/problems.jsonl",
    "../shared/kernelbench/problems.jsonl",
    "/work/shared/kernelbench/problems.jsonl",
)
# Targets: spread of medians (max - min) / median <= 1% across the processes for kernels of 50 us
# or more; agreement with do_bench within 3%; baselines of two independent processes within 10%
# of each other.
SPREAD_TARGET, DO_BENCH_TARGET, BASELINE_TARGET = 0.01, 0.03, 0.10
SPREAD_MIN_MS = 0.05  # the spread target applies to kernels of 50 us or more

_SAXPY = r"""
extern "C" __global__ void saxpy(const float* __restrict__ x, float* __restrict__ y,
                                 float a, float b, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = a * x[i] + b;
}
"""


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.system.timing", description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, help="fresh processes timing the kernels (5); --reward-stability: "
                   "fresh processes per task and way (10)")
    p.add_argument("--problems", default=",".join(PROBLEMS), help="KernelBench names (any level); empty: none")
    p.add_argument(
        "--problems-file", type=Path, help="problems.jsonl (default: $KERNELBENCH_PROBLEMS, shared/)"
    )
    p.add_argument("--baseline-runs", type=int, default=2, help="independent processes per problem")
    p.add_argument("--policy", default="fp32-ieee", help="precision policy of the baselines")
    p.add_argument("--cpu-load", type=int, default=0, metavar="N",
                   help="also time the baselines while N busy-looping processes hold the CPUs")
    p.add_argument("--pin-cores", type=int, default=0, metavar="K",
                   help="with --cpu-load: once more with the baseline process on K cores of its own, "
                        "the busy processes on the others (does pinning a GPU lane undo the contention?)")
    p.add_argument("--out", type=Path, help="also write the JSON report here; --reward-stability: the output DIR")
    g = p.add_argument_group("--reward-stability (bench.system.reward_stability)")
    g.add_argument("--reward-stability", action="store_true",
                   help="is the milestone the same in every fresh process, old way vs paired?")
    g.add_argument("--tasks", default="", help="KernelBench names, any level (default: the six of the module doc)")
    g.add_argument("--time-cap-s", type=float, default=0.0,
                   help="PairedConfig.time_cap_s of the paired runs (0: the default, 10 s)")
    g.add_argument("--paired", action="append", default=[], metavar="FIELD=VALUE",
                   help="a PairedConfig field of the paired runs (repeatable), e.g. min_rounds=6 round_target_ms=10")
    g.add_argument("--deadline-s", type=float, default=510.0,
                   help="start no new run after this many seconds (the tables cover the runs done)")
    g.add_argument("--cost-runs", type=int, default=3,
                   help="verify (quick, final) and profile jobs of L1 problem 1 for the cost, each")
    g.add_argument("--sandbox", action="store_true", help="run the GPU worker in bubblewrap, as training does")
    g.add_argument("--tables-only", action="store_true",
                   help="only rebuild DIR/reward_stability.{json,md} from the task files in DIR (no GPU)")
    p.add_argument("--child", choices=("kernels", "baselines"), help=argparse.SUPPRESS)
    p.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--problem", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Child: kernels.


def _saxpy(n: int):
    """The CuPy kernel as fn(x, y) on cupy views of torch tensors; launched on torch's stream."""
    import cupy
    import numpy
    import torch

    kernel = cupy.RawKernel(_SAXPY, "saxpy")
    grid, a, b, count = (
        (min((n + 255) // 256, 1 << 20),),
        numpy.float32(2.0),
        numpy.float32(1.0),
        numpy.int64(n),
    )

    def fn(x, y):
        kernel(grid, (256,), (x, y, a, b, count))

    def make_inputs(i: int):
        x = torch.rand(n, device="cuda", generator=torch.Generator("cuda").manual_seed(i))
        return cupy.asarray(x), cupy.asarray(torch.empty_like(x))

    return fn, make_inputs


def _torch_kernel(name: str):
    import torch

    def rand(*shape, i: int):
        return torch.rand(*shape, device="cuda", generator=torch.Generator("cuda").manual_seed(i))

    if name == "add_16m":
        return (lambda x, y, z: torch.add(x, y, out=z)), lambda i: (
            rand(1 << 24, i=i), rand(1 << 24, i=i + 100), torch.empty(1 << 24, device="cuda")
        )  # fmt: skip
    if name == "matmul_4096":
        return (lambda a, b, c: torch.mm(a, b, out=c)), lambda i: (
            rand(4096, 4096, i=i), rand(4096, 4096, i=i + 100), torch.empty(4096, 4096, device="cuda")
        )  # fmt: skip
    if name == "relu_256k":
        return torch.relu, lambda i: (rand(1 << 18, i=i),)
    raise ValueError(name)


def _do_bench(fn, inputs, graph: bool) -> float | None:
    """triton's median on the same kernel and inputs, in this process; None without triton."""
    try:
        import torch
        import triton.testing
    except ImportError:
        return None
    call = lambda: fn(*inputs)  # noqa: E731
    if not graph:
        return float(triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median"))
    with torch.cuda.stream(torch.cuda.Stream()):  # older triton refuses to capture on the default stream
        try:
            return float(triton.testing.do_bench_cudagraph(call, rep=100, return_mode="median"))
        except TypeError:
            return float(triton.testing.do_bench_cudagraph(call, rep=100))


def _summary(m: Measurement) -> dict:
    return {
        "median_ms": m.timing.median_ms,
        "rel_stderr_median": m.rel_stderr_median,
        "rel_stderr_mean": m.timing.rel_stderr,
        "samples": m.timing.samples,
        "stop": m.stop,
        "method": m.timing.method,
        "calls_per_sample": m.calls_per_sample,
        "outliers": m.outliers,
        "host_ratio": m.host_ratio,
        "side_work_suspect": m.side_work_suspect,
        "flush_ms": m.flush_ms,
        "flush_bytes": m.flush_bytes,
        "l2_bytes": m.l2_bytes,
        "sm_mhz_before": m.clocks_before.sm_clock_mhz if m.clocks_before else None,
        "sm_mhz_after": m.clocks_after.sm_clock_mhz if m.clocks_after else None,
        "warmup_s": m.warmup_s,
        "sampling_s": m.sampling_s,
    }


def _time_kernel(name: str, config: TimingConfig) -> dict:
    import torch

    from rewards.timing.gpu_timer import external_stream
    from rewards.verify.precision import precision_flags

    fn, make_inputs = _saxpy(1 << 26) if name == "saxpy_64m" else _torch_kernel(name)
    stream = external_stream(torch.cuda.current_stream(), torch.cuda.current_device())
    with stream, precision_flags("ieee"):  # cupy launches on torch's stream; true fp32 matmul
        m = measure(fn, make_inputs, config)
        result = {"ours": _summary(m), "do_bench_ms": _do_bench(fn, make_inputs(0), name == "relu_256k")}
        if name == "add_16m":
            for method in (METHOD_EVENT, METHOD_GRAPH):
                result[method] = _summary(measure(fn, make_inputs, forced(config, method)))
    return result


def _guarded(fn, *args) -> dict:
    """One kernel's failure (say NVRTC missing) must not cost the others' numbers."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported in the JSON, the run goes on
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}


def _versions() -> dict:
    import importlib.metadata as md

    found = {}
    for dist in ("cupy-cuda13x", "cupy-cuda12x", "triton"):
        try:
            found[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return found


def child_kernels() -> dict:
    import torch

    config = TimingConfig()
    names = ("saxpy_64m", "add_16m", "matmul_4096", "relu_256k")
    return {
        "pid": os.getpid(),
        "gpu": torch.cuda.get_device_name(),
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "versions": _versions(),
        "kernels": {name: _guarded(_time_kernel, name, config) for name in names},
    }


# ---------------------------------------------------------------------------------------------
# Child: baselines of one KernelBench problem, no cache.


def _problem_source(name: str, problems_file: Path | None) -> str:
    env = os.environ.get("KERNELBENCH_PROBLEMS")
    candidates = [problems_file] if problems_file else [
        Path(p) for p in ([env] if env else []) + list(PROBLEM_FILES) + [str(default_problems_path())]]
    for path in candidates:
        if path.is_file():
            for line in path.read_text().splitlines():
                row = json.loads(line)
                if row.get("name") == name:  # names are unique across levels ("1_MLP" is L3's)
                    return row["code"]
            raise SystemExit(f"{name} not found in {path}")
    raise SystemExit(f"no problems file among {[str(c) for c in candidates]}: pass --problems-file")


def child_baselines(problem: str, policy: str, problems_file: Path | None) -> dict:
    from rewards.timing.baselines import BaselineRequest, measure_baselines

    source = _problem_source(problem, problems_file)
    start = time.perf_counter()
    b = measure_baselines(BaselineRequest(source=source, name=problem, policy=policy))
    return {
        "problem": problem,
        "pid": os.getpid(),
        "eager": _summary(b.eager.measurement),
        "compile": _summary(b.compiled.measurement),
        "method": b.method,
        "compile_s": b.compile_s,
        "wall_s": time.perf_counter() - start,
        "key": msgspec.to_builtins(b.key),
    }


# ---------------------------------------------------------------------------------------------
# Parent: fresh processes, aggregation.


def _spawn(extra: list[str], timeout_s: float = 900.0, cpus: set[int] | None = None) -> dict:
    """Run one fresh child process (on `cpus` only, if given); its stdout goes to our stderr, its
    result through a file."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "child.json"
        cmd = [sys.executable, "-m", "bench.system.timing", *extra, "--child-out", str(out)]
        subprocess.run(cmd, check=True, timeout=timeout_s, stdout=sys.stderr, preexec_fn=_pin(cpus))
        return json.loads(out.read_text())


def _pin(cpus: set[int] | None):
    """A preexec_fn that confines the child to `cpus` (None: no confinement)."""
    return None if cpus is None else lambda: os.sched_setaffinity(0, cpus)


def split_cores(pinned: int) -> tuple[set[int], set[int]]:
    """(the last `pinned` CPUs this process may use, the rest): a lane's own cores and the load's."""
    cpus = sorted(os.sched_getaffinity(0))
    if not 0 < pinned < len(cpus):
        raise SystemExit(f"--pin-cores {pinned}: need 1 to {len(cpus) - 1} of this machine's {len(cpus)} CPUs")
    return set(cpus[-pinned:]), set(cpus[:-pinned])


@contextlib.contextmanager
def cpu_load(processes: int, cpus: set[int] | None = None) -> Iterator[list[subprocess.Popen]]:
    """`processes` busy-looping Python processes for the block (on `cpus` only, if given), killed
    after it."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(processes):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_pin(cpus)))
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def load_report(quiet: list[dict], loaded: list[dict], processes: int, pinned: list[dict] | None = None,
                pin_cores: int = 0) -> dict:
    """Baselines under CPU load against the same number of quiet runs: median of the runs'
    medians each way, and loaded / quiet (> 1: slower under load); with `pinned` (the runs on
    cores of their own, the load on the rest) also pinned / quiet. `--cpu-load N` runs as many
    baseline processes again while N busy-looping processes hold the CPUs (a compile pool at
    work beside the GPU queue); `--pin-cores K` adds a third set with the baseline process on K
    cores of its own and the busy processes on the others."""
    out: dict = {"processes": processes}
    if pinned is not None:
        out["pin_cores"] = pin_cores
    for subject in ("eager", "compile"):
        q = stats.median([r[subject]["median_ms"] for r in quiet])
        l_ = stats.median([r[subject]["median_ms"] for r in loaded])
        out[subject] = {"quiet_ms": q, "loaded_ms": l_, "loaded_over_quiet": l_ / q,
                        "within_10pct": max(l_ / q, q / l_) <= 1 + BASELINE_TARGET}
        if pinned is not None:
            p_ = stats.median([r[subject]["median_ms"] for r in pinned])
            out[subject] |= {"pinned_ms": p_, "pinned_over_quiet": p_ / q,
                             "pinned_within_10pct": max(p_ / q, q / p_) <= 1 + BASELINE_TARGET}
    return out


def _baseline_runs(extra: list[str], runs: int, cpus: set[int] | None = None) -> list[dict] | str:
    try:
        return [_spawn(extra, cpus=cpus) for _ in range(runs)]
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"


def _kernel_report(name: str, runs: list[dict]) -> dict:
    per = [r["kernels"][name] for r in runs]
    errors = [p["error"] for p in per if "error" in p]
    if errors:
        return {"errors": errors, "spread_ok": None, "do_bench_ok": None}
    medians = [p["ours"]["median_ms"] for p in per]
    ratios = [p["ours"]["median_ms"] / p["do_bench_ms"] for p in per if p.get("do_bench_ms")]
    spread = stats.relative_spread(medians)
    applies = stats.median(medians) >= SPREAD_MIN_MS  # the targets are for kernels of 50 us or more
    report = {
        "medians_ms": medians,
        "median_ms": stats.median(medians),
        "spread": spread,
        "targets_apply": applies,
        "spread_ok": spread <= SPREAD_TARGET if applies else None,
        "rel_stderr_median": [p["ours"]["rel_stderr_median"] for p in per],
        "samples": [p["ours"]["samples"] for p in per],
        "method": per[0]["ours"]["method"],
        "sm_mhz_after": [p["ours"]["sm_mhz_after"] for p in per],
        "do_bench_ms": [p.get("do_bench_ms") for p in per],
        "ratio_to_do_bench": ratios,
        "do_bench_max_dev": max((abs(r - 1) for r in ratios), default=None),
        "do_bench_ok": all(abs(r - 1) <= DO_BENCH_TARGET for r in ratios) if ratios and applies else None,
    }
    if METHOD_GRAPH in per[0]:
        graph_over_event = [p[METHOD_GRAPH]["median_ms"] / p[METHOD_EVENT]["median_ms"] for p in per]
        report["graph_over_event"] = graph_over_event
    return report


def _baseline_report(problem: str, runs: list[dict]) -> dict:
    out: dict = {"problem": problem, "method": runs[0]["method"], "compile_s": [r["compile_s"] for r in runs]}
    for subject in ("eager", "compile"):
        ms = [r[subject]["median_ms"] for r in runs]
        diff = (max(ms) - min(ms)) / min(ms)
        out[subject] = {"medians_ms": ms, "rel_diff": diff, "within_10pct": diff <= BASELINE_TARGET}
        out[subject]["rel_stderr_median"] = [r[subject]["rel_stderr_median"] for r in runs]
    return out


def parent(args: argparse.Namespace) -> dict:
    kernel_runs = [_spawn(["--child", "kernels"]) for _ in range(args.runs)]
    names = list(kernel_runs[0]["kernels"])
    kernels = {name: _kernel_report(name, kernel_runs) for name in names}
    print(json.dumps(kernels), file=sys.stderr, flush=True)  # early, in case the baselines run out of time
    problems = [p for p in args.problems.split(",") if p]
    baselines = []
    for problem in problems:
        extra = ["--child", "baselines", "--problem", problem, "--policy", args.policy]
        if args.problems_file:
            extra += ["--problems-file", str(args.problems_file)]
        runs = _baseline_runs(extra, args.baseline_runs)
        report = (
            _baseline_report(problem, runs) if isinstance(runs, list) else {"problem": problem, "error": runs}
        )
        if args.cpu_load > 0 and isinstance(runs, list):
            with cpu_load(args.cpu_load):
                loaded = _baseline_runs(extra, args.baseline_runs)
            pinned = None
            if args.pin_cores > 0:
                own, rest = split_cores(args.pin_cores)
                with cpu_load(args.cpu_load, rest):
                    pinned = _baseline_runs(extra, args.baseline_runs, own)
            failed = next((r for r in (loaded, pinned) if isinstance(r, str)), None)
            report["under_cpu_load"] = (
                {"error": failed} if failed else load_report(runs, loaded, args.cpu_load, pinned, args.pin_cores)
            )
        print(json.dumps(report), file=sys.stderr, flush=True)
        baselines.append(report)
    pairs = [b[s]["within_10pct"] for b in baselines if "error" not in b for s in ("eager", "compile")]
    return {
        "gpu": kernel_runs[0]["gpu"],
        "torch": kernel_runs[0]["torch"],
        "cuda": kernel_runs[0]["cuda"],
        "versions": kernel_runs[0]["versions"],
        "runs": args.runs,
        "kernels": kernels,
        "baselines": baselines,
        "targets": {
            "spread_le_1pct": all(k["spread_ok"] for k in kernels.values() if k["spread_ok"] is not None),
            "do_bench_within_3pct": all(
                k["do_bench_ok"] for k in kernels.values() if k["do_bench_ok"] is not None
            ),
            "baselines_within_10pct_share": sum(pairs) / len(pairs) if pairs else None,
        },
    }


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    if args.reward_stability:
        from bench.system import reward_stability

        args.runs = args.runs or 10
        sys.exit(reward_stability.main(args))
    args.runs = args.runs or 5
    if args.child == "kernels":
        result = child_kernels()
    elif args.child == "baselines":
        result = child_baselines(args.problem, args.policy, args.problems_file)
    else:
        result = parent(args)
    text = json.dumps(result, indent=1)
    if args.child_out:
        args.child_out.write_text(text)
        return
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
