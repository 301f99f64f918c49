"""A zygote child's first torch.compile with and without the zygote's compile warm-up:
`python -m bench.system.compile_warmup`.

What it is: the steps of the profile child's reference phase (rewards.timing.profile_child.
baseline_calls), timed in a child forked from a fresh process that prepared itself as the zygote
does (`rewards.queue.zygote_server.preload`), once without and once with the warm-up
(`rewards.queue.compile_warmup`): load the Inductor artifacts a trusted process recorded
(`torch.compiler.load_cache_artifacts`, into an empty cache dir as the child's scratch), build the
Model and its `torch.compile` wrapper, run the first call (a cache hit; its output is checked
against eager). Each repetition is a new process; medians are printed as JSON. On the CPU,
"linear_relu" shows a cost the warm-up cannot remove: the artifacts carry its C++ kernel's source,
which the child compiles again on its first call.

With `--aot`, a third way: the trusted side also compiles the reference's forward ahead of time
(torch's experimental `torch.compile(fullgraph=True).aot_compile`, saved with
`save_compiled_function`), and the warm child loads it (`torch.compiler.load_compiled_function`)
instead of tracing with Dynamo; every way also reports its steady call time (`steady_ms`, the median
of `STEADY_CALLS` calls after the first), so a launch-bound reference shows whether the loaded
function costs what `torch.compile` costs per call. A reference Dynamo cannot capture whole, or a
torch without the API, is reported as the way's error.

What it is not: a profile job. With `--device cuda` the child also creates its CUDA context (in
"build_ms"), and Inductor's cache keys hash the device and Triton; `bash
bench/device/reward_stability.sh` reports the phases ("child.reference.*") of real paired jobs.

    python -m bench.system.compile_warmup --repeats 5 [--tasks matmul,linear_relu] [--device cuda] [--profile] [--aot]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import linecache
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

TASKS = {  # KernelBench format, small sizes
    "matmul": (  # Inductor calls the extern mm: no generated kernel
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n    def forward(self, a, b):\n        return torch.matmul(a, b)\n\n"
        "def get_inputs():\n    return [torch.rand(256, 256), torch.rand(256, 256)]\n\n"
        "def get_init_inputs():\n    return []\n"
    ),
    "linear_relu": (  # a generated kernel: C++ on the CPU, Triton on CUDA
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n    def __init__(self, n):\n        super().__init__()\n"
        "        self.linear = nn.Linear(n, n)\n\n"
        "    def forward(self, x):\n        return torch.relu(self.linear(x)) * 2.0\n\n"
        "def get_inputs():\n    return [torch.rand(32, 128)]\n\n"
        "def get_init_inputs():\n    return [128]\n"
    ),
}
STEPS = ("load_ms", "build_ms", "first_call_ms")
STEADY_CALLS = 20


def _build(source: str, device: str):
    import torch

    from rewards.timing import baselines

    model, make_inputs = baselines.load_task(source, device=device)
    return model, torch.compile(model, backend=baselines.COMPILE_BACKEND, mode=baselines.COMPILE_MODE), make_inputs


def _importable(model) -> None:
    """Make the task's module importable by its name: aot_compile's guards pickle the Model class
    (a guard on the type of `self`), and loading them imports it again."""
    namespace = type(model).forward.__globals__
    module = types.ModuleType(namespace["__name__"])
    module.__dict__.update(namespace)
    sys.modules[module.__name__] = module


def record(source: str, device: str, out: Path) -> None:
    """The trusted side: compile once in this process and write the recorded Inductor artifacts."""
    import torch

    from rewards.timing.profile import recorded_compiles

    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        with recorded_compiles() as artifacts, torch.no_grad():
            _, compiled, make_inputs = _build(source, device)
            compiled(*make_inputs(0))
    out.write_bytes(b"".join(artifacts))


def record_aot(source: str, device: str, out: Path) -> None:
    """The trusted side of `--aot`: the reference's forward compiled ahead of time, saved to `out`."""
    import torch

    from rewards.timing import baselines

    with tempfile.TemporaryDirectory() as cache, torch.no_grad():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        model, make_inputs = baselines.load_task(source, device=device)
        # aot_compile packages the forward's source (inspect): the task's code gets a linecache
        # entry under the file name load_task compiled it with.
        name = type(model).forward.__code__.co_filename
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
        _importable(model)
        forward = torch.compile(type(model).forward, fullgraph=True, backend=baselines.COMPILE_BACKEND,
                                mode=baselines.COMPILE_MODE)
        forward.aot_compile(((model, *make_inputs(0)), {})).save_compiled_function(str(out))


def _steady_ms(call, inputs, device: str) -> float:
    import torch

    times = []
    for _ in range(STEADY_CALLS):
        start = time.perf_counter()
        call(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def child_aot(source: str, device: str, saved: Path) -> dict:
    """In the forked child, the `--aot` way: load the saved function, build the Model, first call."""
    import torch

    t0 = time.perf_counter()
    from rewards.timing import baselines

    model, make_inputs = baselines.load_task(source, device=device)
    _importable(model)
    t1 = time.perf_counter()
    with saved.open("rb") as f:
        forward = torch.compiler.load_compiled_function(f, f_globals=type(model).forward.__globals__)
    t2 = time.perf_counter()
    with torch.no_grad():
        inputs = make_inputs(0)
        fused = forward(model, *inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        t3 = time.perf_counter()
        ok = bool(torch.allclose(fused, model(*inputs)))
        steady = _steady_ms(lambda *xs: forward(model, *xs), inputs, device)
    # the Model is built before the load here (the function needs its globals): build_ms and
    # load_ms keep their meaning, in the other order
    return {"load_ms": (t2 - t1) * 1e3, "build_ms": (t1 - t0) * 1e3, "first_call_ms": (t3 - t2) * 1e3,
            "ok": ok, "hit": True, "steady_ms": steady}


def child_steps(source: str, device: str, artifacts: bytes, profile: bool = False) -> dict:
    """In the forked child: the reference phase's steps, timed; `ok` when compile equals eager,
    `hit` when the compile was served from the loaded artifacts; with `profile`, the first call's
    functions by cumulative time (`first_call_profile`)."""
    import torch
    from torch._dynamo.utils import counters

    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        t0 = time.perf_counter()
        torch.compiler.load_cache_artifacts(artifacts)
        t1 = time.perf_counter()
        model, compiled, make_inputs = _build(source, device)
        t2 = time.perf_counter()
        profiler = cProfile.Profile() if profile else None
        with torch.no_grad():
            if profiler:
                profiler.enable()
            fused = compiled(*make_inputs(0))
            if device == "cuda":
                torch.cuda.synchronize()
            t3 = time.perf_counter()
            if profiler:
                profiler.disable()
            ok = bool(torch.allclose(fused, model(*make_inputs(0))))
            steady = _steady_ms(compiled, make_inputs(0), device)
    ms = [(b - a) * 1e3 for a, b in ((t0, t1), (t1, t2), (t2, t3))]
    out = dict(zip(STEPS, ms)) | {"ok": ok, "hit": counters["aot_autograd"]["autograd_cache_hit"] > 0,
                                  "steady_ms": steady}
    return out | ({"first_call_profile": _top(profiler)} if profiler else {})


def _top(profiler: cProfile.Profile, n: int = 40) -> list[str]:
    """The `n` functions with the most cumulative time, as 'ms file:line(function)' lines."""
    rows = pstats.Stats(profiler).stats.items()  # (file, line, name) -> (calls, prim, tottime, cumtime, callers)
    top = sorted(rows, key=lambda kv: -kv[1][3])[:n]
    return [f"{cum * 1e3:8.1f} ms {Path(f).name}:{line}({name})" for (f, line, name), (_, _, _, cum, _) in top]


def forked(task: str, device: str, warm: bool, artifacts: Path, profile: bool = False, aot: Path | None = None) -> dict:
    """This process prepared as the zygote prepares itself, then the steps in a forked child
    (with `aot`, the saved function's steps instead)."""
    from rewards.queue.zygote_server import preload

    warm_up_ms, error = preload(warm_up=warm)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            if aot is not None:
                result = child_aot(TASKS[task], device, aot)
            else:
                result = child_steps(TASKS[task], device, artifacts.read_bytes(), profile)
        except Exception as exc:  # noqa: BLE001 - reported, the parent prints it
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        result = json.loads(f.read())
    os.waitpid(pid, 0)
    return result | {"warm_up_ms": warm_up_ms, "warm_up_error": error}


def run(task: str, device: str, warm: bool, artifacts: Path, profile: bool = False, aot: Path | None = None) -> dict:
    argv = [sys.executable, "-m", "bench.system.compile_warmup", "--child", task, "--device", device,
            "--artifacts", str(artifacts), *(["--warm"] if warm else []), *(["--profile"] if profile else []),
            *(["--aot-file", str(aot)] if aot else [])]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def summary(runs: list[dict]) -> dict:
    failed = sorted({r["error"] for r in runs if "error" in r})
    runs = [r for r in runs if "error" not in r]
    if not runs:
        return {"ok": False, "errors": failed}
    out = {k: round(statistics.median(r[k] for r in runs), 1) for k in (*STEPS, "warm_up_ms") if k in runs[0]}
    out["steady_ms"] = round(statistics.median(r["steady_ms"] for r in runs), 3)
    out["total_ms"] = round(statistics.median(sum(r[k] for k in STEPS) for r in runs), 1)
    out["all_ms"] = sorted(round(sum(r[k] for k in STEPS), 1) for r in runs)
    return out | {"ok": not failed and all(r["ok"] for r in runs), "cache_hits": sum(r.get("hit", False) for r in runs),
                  "errors": failed + sorted({r.get("warm_up_error", "") for r in runs} - {""})}


def _record_aot(task: str, device: str, tmp: Path) -> Path | str:
    """The saved function's path, or why it could not be made (one line)."""
    saved = tmp / f"{task}.aot"
    code = f"from bench.system.compile_warmup import TASKS, record_aot; from pathlib import Path; " \
           f"record_aot(TASKS[{task!r}], {device!r}, Path({str(saved)!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return f"aot_compile failed: {lines[-1] if lines else 'exit ' + str(done.returncode)}"
    return saved


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per task and way")
    parser.add_argument("--tasks", default="matmul", help=f"comma-separated, of {sorted(TASKS)}")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile each child's first compiled call; the last warm run's top functions are printed")
    parser.add_argument("--aot", action="store_true",
                        help="a third way: the forward compiled ahead of time and loaded (torch's experimental aot_compile)")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)  # one repetition, in its own process
    parser.add_argument("--aot-file", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--artifacts", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(forked(args.child, args.device, args.warm, args.artifacts, args.profile, args.aot_file)))
        return
    report: dict = {"device": args.device, "cpus": len(os.sched_getaffinity(0)), "loadavg_start": os.getloadavg(),
                    "tasks": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks.split(","):
            artifacts = Path(tmp) / f"{task}.bin"
            code = f"from bench.system.compile_warmup import TASKS, record; from pathlib import Path; " \
                   f"record(TASKS[{task!r}], {args.device!r}, Path({str(artifacts)!r}))"
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
            saved = _record_aot(task, args.device, Path(tmp)) if args.aot else None
            ways = {"cold": (False, None), "warm": (True, None)}
            if isinstance(saved, Path):
                ways["aot"] = (True, saved)
            runs: dict[str, list[dict]] = {way: [] for way in ways}
            for _ in range(args.repeats):  # interleaved: load on a shared machine drifts
                for way, (warm, aot) in ways.items():
                    runs[way].append(run(task, args.device, warm, artifacts, args.profile, aot))
            report["tasks"][task] = {way: summary(r) for way, r in runs.items()}
            if isinstance(saved, str):
                report["tasks"][task]["aot"] = {"ok": False, "errors": [saved]}
            if args.profile:
                report["tasks"][task]["warm_first_call_profile"] = runs[True][-1].get("first_call_profile", [])
    report["loadavg_end"] = os.getloadavg()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
