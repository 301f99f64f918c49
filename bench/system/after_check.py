"""What the paired profile's after-timing check costs, by comparison, in fresh processes, as JSON.

What it is: `python -m bench.system.after_check` runs, for each KernelBench task and each way of
comparing, one fresh process that does what `rewards.timing.profile_child.after_timing_check` does
(two fresh input sets; the reference's output twice, as candidate and as eager; the comparison at
10x the verifier's tolerance), `--repeats` times, and reports each step's milliseconds: the first
check (what a paired job pays: its child is fresh) and the median of the later ones. The ways:

    float64   `rewards.verify.compare.check_output` with the fused kernels off (the child's way
              before `within_tolerance`: chunks in float64, ~45 kernels, their first launches)
    fused     `check_output` with the CuPy kernels (`rewards.verify.fused`), compiled by NVRTC here
    within    `rewards.verify.compare.within_tolerance` (torch.isclose in the tensors' dtype)

and, side by side, each way's first and steady check as a ratio of float64's.

What it is not: a paired job. No candidate, no rounds, no sandbox: the check's own steps alone.

    python -m bench.system.after_check --device cuda
    python -m bench.system.after_check --device cpu --tasks 19_ReLU --repeats 2      # the plumbing
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

WAYS = ("float64", "fused", "within")
TASKS = ("1_Square_matrix_multiplication_", "23_Softmax")
STEPS = ("inputs", "forward", "compare")


def child(task: str, way: str, device: str, repeats: int) -> dict:
    """In this (fresh) process: each repeat's two checks, each step's ms."""
    import torch

    from rewards.timing import baselines
    from rewards.timing.profile_child import AFTER_CHECK_INPUTS, after_check_tolerance
    from rewards.verdict import VerdictStatus
    from rewards.verify import fused
    from rewards.verify.compare import check_output, within_tolerance

    def timed(fn, *args, **kwargs):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3, result

    if way != "fused":
        fused.keep_off()
    load_ms, (model, make_inputs) = timed(baselines.load_task, _source(task), device=device)
    checks = []
    with torch.no_grad():
        for _ in range(repeats):
            for index in AFTER_CHECK_INPUTS:
                steps = dict.fromkeys(STEPS, 0.0)
                outs = []
                for _role in ("candidate", "eager"):
                    ms, inputs = timed(make_inputs, index)
                    steps["inputs"] += ms
                    ms, out = timed(model, *inputs)
                    steps["forward"] += ms
                    outs.append(out)
                    inputs = None  # the inputs go once the call returns, as in the child
                scale = after_check_tolerance(outs[1].dtype)
                if way == "within":
                    ms, ok = timed(within_tolerance, outs[0], outs[1], **scale)
                else:
                    ms, check = timed(check_output, outs[0], outs[1], **scale)
                    ok = check.status is VerdictStatus.OK
                steps["compare"] = ms
                checks.append({**{k: round(v, 3) for k, v in steps.items()}, "passed": bool(ok)})
    return {"task": task, "way": way, "load_ms": round(load_ms, 1), "inputs_per_check": len(AFTER_CHECK_INPUTS),
            "checks": checks}


def _source(task: str) -> str:
    from bench.kernelbench.problems import read_problems
    from rl.data.kernelbench import default_problems_path

    path = default_problems_path()
    if code := next((p.code for p in read_problems(path) if p.name == task), None):
        return code
    raise SystemExit(f"--tasks: no KernelBench problem named {task!r} in {path}")


def summary(result: dict) -> dict:
    """First check (both input sets: one check of a fresh child) and the median later one, ms."""
    checks, n = result["checks"], result["inputs_per_check"]
    first = {s: sum(c[s] for c in checks[:n]) for s in STEPS}
    later = [{s: sum(c[s] for c in checks[i: i + n]) for s in STEPS} for i in range(n, len(checks), n)]
    steady = {s: statistics.median(c[s] for c in later) for s in STEPS} if later else {}
    return {"first": first, "steady": steady, "passed": all(c["passed"] for c in checks)}


def table(results: list[dict]) -> str:
    rows = ["| task | way | first check ms (inputs / forward / compare) | steady ms "
            "| compare vs float64: first, steady |",
            "|---|---|---|---|---|"]
    base = {r["task"]: summary(r) for r in results if r["way"] == "float64"}
    for r in results:
        s, b = summary(r), base.get(r["task"])
        f, st = s["first"], s["steady"]
        ratio = (f"{f['compare'] / b['first']['compare']:.3f}, {st['compare'] / b['steady']['compare']:.3f}"
                 if b and st and b["steady"] and b["first"]["compare"] and b["steady"]["compare"] else "")
        steady = f"{sum(st.values()):.1f} (compare {st['compare']:.2f})" if st else ""
        rows.append(f"| {r['task']} | {r['way']} | {sum(f.values()):.1f} ({f['inputs']:.1f} / {f['forward']:.1f} / "
                    f"{f['compare']:.1f}) | {steady} | {ratio} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.system.after_check", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tasks", default=",".join(TASKS), help="KernelBench names")
    p.add_argument("--ways", default=",".join(WAYS), help=f"of {', '.join(WAYS)}")
    p.add_argument("--repeats", type=int, default=3, help="checks of two input sets per process (the first is cold)")
    p.add_argument("--out", type=Path, help="also write the JSON here")
    p.add_argument("--child", nargs=2, metavar=("TASK", "WAY"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.device, args.repeats)))
        return 0
    ways = [w for w in args.ways.split(",") if w]
    if unknown := sorted(set(ways) - set(WAYS)):
        raise SystemExit(f"--ways: unknown {', '.join(unknown)} (known: {', '.join(WAYS)})")
    if args.device == "cpu" and "fused" in ways:
        ways.remove("fused")  # CUDA kernels: nothing to compare on a CPU
    results = []
    for task in [t for t in args.tasks.split(",") if t]:
        for way in ways:
            cmd = [sys.executable, "-m", "bench.system.after_check", "--child", task, way, "--device", args.device,
                   "--repeats", str(args.repeats)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
                results.append({"task": task, "way": way, "error": tail})
                print(f"{task} {way}: failed: {tail}", file=sys.stderr)
                continue
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    ok = [r for r in results if "checks" in r]
    report = {"device": args.device, "repeats": args.repeats, "results": results,
              "summary": [{"task": r["task"], "way": r["way"], **summary(r)} for r in ok]}
    print(table(ok))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
