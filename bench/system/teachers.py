"""Does the real evaluator accept every teacher of `rl.data.families`? (GPU)

What it is: each task of both splits (training and held-out) with its teacher files written into
a workspace, then the final evaluation (`rewards.evaluate.FinalEvaluator`: pristine snapshot,
static checks, build, final verification, timing; `--paired` as the reward times) as training
scores a trajectory. Prints one
line per task (verdict, milestone, speedups) and a summary; exit status 1 if any teacher is not
correct.
What it is not: the unit tests of the generator (`tests/test_families.py`, CPU: static checks,
host evaluation of the expressions, nvcc).

    python -m bench.system.teachers [--target-ms 0.1] [--split both|train|heldout] [--paired] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import anyio
import orjson

from rewards.env import EnvConfig, open_kernel_env
from rewards.evaluate import EvaluateConfig, FinalEvaluator, snapshot_solution
from rl.data import families
from rl.demonstrations import DemoTask


async def check(target_ms: float, which: str, out: Path | None, paired: bool) -> int:
    s = families.split(target_ms=target_ms)
    tasks = {"train": list(s.train), "heldout": list(s.heldout)}.get(which, [*s.train, *s.heldout])
    rows, t0 = [], time.monotonic()
    async with open_kernel_env(EnvConfig()) as env:
        evaluator = FinalEvaluator(env, EvaluateConfig(paired=paired))

        async def one(demo: DemoTask) -> None:
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / "src"
                for name, text in demo.files.items():
                    (src / name).parent.mkdir(parents=True, exist_ok=True)
                    (src / name).write_text(text)
                ws = snapshot_solution(src, demo.task, Path(tmp) / "ws")
                started = time.monotonic()
                try:
                    score = await evaluator.evaluate(ws, demo.task)
                except Exception as exc:  # noqa: BLE001 - an infrastructure failure is this task's row
                    rows.append({"task": demo.task.task_id, "status": "infrastructure_error", "hack": None,
                                 "message": f"{type(exc).__name__}: {str(exc)[-300:]}", "reward": None})
                    print(f"{demo.task.task_id:<52} infrastructure error: {str(exc)[-200:]}", flush=True)
                    return
            v = score.verdict
            row = {"task": demo.task.task_id, "status": v.status.value, "hack": v.hack.value if v.hack else None,
                   "message": v.message[:300], "reward": score.reward, "milestone": score.milestone,
                   "speedup_vs_eager": score.speedup_vs_eager, "speedup_vs_compile": score.speedup_vs_compile,
                   "inconclusive": score.inconclusive, "seconds": round(time.monotonic() - started, 2)}
            rows.append(row)
            print(f"{row['task']:<52} {row['status']:<14} reward {row['reward']} "
                  f"x{row['speedup_vs_eager'] or 0:.2f} eager x{row['speedup_vs_compile'] or 0:.2f} compile "
                  f"{row['seconds']:.1f}s {row['message'][:120] if row['status'] != 'ok' else ''}", flush=True)

        async with anyio.create_task_group() as tg:
            limiter = anyio.CapacityLimiter(8)  # builds overlap; the GPU queue orders the rest

            async def guarded(demo: DemoTask) -> None:
                async with limiter:
                    await one(demo)

            for demo in families.family_demos(tasks):
                tg.start_soon(guarded, demo)
    bad = [r for r in rows if r["status"] != "ok"]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} teachers accepted in {time.monotonic() - t0:.0f} s; "
          f"milestones {sorted({r['reward'] for r in rows if r['reward'] is not None})}")
    for r in bad:
        print(f"REJECTED {r['task']}: {r['status']} {r['hack'] or ''} {r['message']}")
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "teachers.json").write_bytes(orjson.dumps(sorted(rows, key=lambda r: r["task"]),
                                                         option=orjson.OPT_INDENT_2))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target-ms", type=float, default=0.1, help="eager-time target the tasks are sized to")
    p.add_argument("--split", choices=["both", "train", "heldout"], default="both")
    p.add_argument("--out", type=Path, help="write teachers.json here")
    p.add_argument("--paired", action="store_true",
                   help="time as the reward does (paired, ~5 s a task); default: cached baselines (~1 s)")
    a = p.parse_args(argv)
    return anyio.run(check, a.target_ms, a.split, a.out, a.paired)


if __name__ == "__main__":
    sys.exit(main())
