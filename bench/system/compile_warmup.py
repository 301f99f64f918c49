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

What it is not: a profile job. With `--device cuda` the child also creates its CUDA context (in
"build_ms"), and Inductor's cache keys hash the device and Triton; `bash
bench/device/reward_stability.sh` reports the phases ("child.reference.*") of real paired jobs.

    python -m bench.system.compile_warmup --repeats 5 [--tasks matmul,linear_relu] [--device cuda] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
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


def _build(source: str, device: str):
    import torch

    from rewards.timing import baselines

    model, make_inputs = baselines.load_task(source, device=device)
    return model, torch.compile(model, backend=baselines.COMPILE_BACKEND, mode=baselines.COMPILE_MODE), make_inputs


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
    ms = [(b - a) * 1e3 for a, b in ((t0, t1), (t1, t2), (t2, t3))]
    out = dict(zip(STEPS, ms)) | {"ok": ok, "hit": counters["aot_autograd"]["autograd_cache_hit"] > 0}
    return out | ({"first_call_profile": _top(profiler)} if profiler else {})


def _top(profiler: cProfile.Profile, n: int = 40) -> list[str]:
    """The `n` functions with the most cumulative time, as 'ms file:line(function)' lines."""
    rows = pstats.Stats(profiler).stats.items()  # (file, line, name) -> (calls, prim, tottime, cumtime, callers)
    top = sorted(rows, key=lambda kv: -kv[1][3])[:n]
    return [f"{cum * 1e3:8.1f} ms {Path(f).name}:{line}({name})" for (f, line, name), (_, _, _, cum, _) in top]


def forked(task: str, device: str, warm: bool, artifacts: Path, profile: bool = False) -> dict:
    """This process prepared as the zygote prepares itself, then the steps in a forked child."""
    from rewards.queue.zygote_server import preload

    warm_up_ms, error = preload(warm_up=warm)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
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


def run(task: str, device: str, warm: bool, artifacts: Path, profile: bool = False) -> dict:
    argv = [sys.executable, "-m", "bench.system.compile_warmup", "--child", task, "--device", device,
            "--artifacts", str(artifacts), *(["--warm"] if warm else []), *(["--profile"] if profile else [])]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def summary(runs: list[dict]) -> dict:
    out = {k: round(statistics.median(r[k] for r in runs), 1) for k in (*STEPS, "warm_up_ms") if k in runs[0]}
    out["total_ms"] = round(statistics.median(sum(r[k] for k in STEPS) for r in runs), 1)
    out["all_ms"] = sorted(round(sum(r[k] for k in STEPS), 1) for r in runs)
    return out | {"ok": all(r["ok"] for r in runs), "cache_hits": sum(r.get("hit", False) for r in runs),
                  "errors": sorted({r.get("warm_up_error", "") for r in runs} - {""})}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per task and way")
    parser.add_argument("--tasks", default="matmul", help=f"comma-separated, of {sorted(TASKS)}")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile each child's first compiled call; the last warm run's top functions are printed")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)  # one repetition, in its own process
    parser.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--artifacts", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(forked(args.child, args.device, args.warm, args.artifacts, args.profile)))
        return
    report: dict = {"device": args.device, "cpus": len(os.sched_getaffinity(0)), "loadavg_start": os.getloadavg(),
                    "tasks": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks.split(","):
            artifacts = Path(tmp) / f"{task}.bin"
            code = f"from bench.system.compile_warmup import TASKS, record; from pathlib import Path; " \
                   f"record(TASKS[{task!r}], {args.device!r}, Path({str(artifacts)!r}))"
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
            runs: dict[bool, list[dict]] = {False: [], True: []}
            for _ in range(args.repeats):  # interleaved: load on a shared machine drifts
                for warm in (False, True):
                    runs[warm].append(run(task, args.device, warm, artifacts, args.profile))
            report["tasks"][task] = {"cold": summary(runs[False]), "warm": summary(runs[True])}
            if args.profile:
                report["tasks"][task]["warm_first_call_profile"] = runs[True][-1].get("first_call_profile", [])
    report["loadavg_end"] = os.getloadavg()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
