"""Is the milestone reward the same whenever it is measured? `python -m bench.system.timing
--reward-stability` (this module does the work; `bench.system.timing` parses the flags).

What it is: for each task, the same candidate is profiled in `--runs` fresh processes both ways,
side by side (run i of each way back to back), through the real GPU queue and the env's own
`profile_workspace` (children forked from the queue's zygote, as in training):
- old: the candidate alone in its own child against baselines measured once by the queue's
  worker (another process and moment), as the agent's `profile` tool does;
- paired: candidate, eager and torch.compile timed together in one child in rotated rounds, as
  the final evaluation does (`rewards.timing.paired`).
The candidate is the task's demo of rl/demos/ where one exists, else the timing-only harness mode
(`candidate="reference"`: the reference's own ops timed as the candidate, a flag of the profile
job that the evaluator never sets and refuses to score; the placeholder model_new.py written here
has no ModelNew, so it could not pass verification either). Milestones are computed as if the
candidate had been verified: the old way with `rewards.reward.score`, the paired way with
`rewards.reward.score_paired`.

Per task it reports milestone agreement (k of N with the modal milestone), the speedup spread
(max / min over runs), the median interval width and the inconclusive count; targets: paired
agreement at least 9 of 10 on every task, paired spread at most 1.05 where the old spread is 1.5
or more. The cost, in the same run: verify (quick and final) and profile job wall times of the
level-1 problem 1 demo (NOTES.md has the figures to compare with), the paired profile job of every
task (the timing part of a final evaluation; no level-3 demo exists to verify), and that demo's
whole final evaluation (`rewards.evaluate.FinalEvaluator.evaluate_prepared`: verify, then paired
profile) two ways, alternated: the profile job after the verdict, and beside the verification
(`EvaluateConfig.overlap`; the queue has two lanes so that it can start).

Output: DIR/task_<name>.json per task, DIR/cost.json, and DIR/reward_stability.{json,md} over every
task file in DIR, so runs of a few tasks each fill one table. What it is not: a test (nothing
is asserted) or a benchmark of the sampler itself (`bench.system.timing` without the flag).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import anyio
import msgspec

from agentcore.types import CompileResult, Task
from bench.system.gpu_queue_real import BuiltDemo, NeedsGpu, build_demos, run_job
from rewards.build.compile_pool import Build, BuildArtifact, CompileConfig, CompilePool
from rewards.env import EnvConfig, Prepared, RewardsKernelEnv, queue_config
from rewards.evaluate import EvaluateConfig, FinalEvaluator
from rewards.queue.gpu_queue import GpuQueue, count_gpus
from rewards.queue.jobs import Job, JobResult
from rewards.reward import score, score_paired
from rewards.timing.baselines import Baselines
from rewards.timing.paired import PairedConfig
from rewards.timing.profile import Profile, ProfileConfig, ProfileInfrastructureError, profile_workspace
from rewards.verdict import Verdict, VerdictStatus
from rl.config import apply_overrides
from rl.data.kernelbench import default_problems_path
from rl.demonstrations import DemoTask, demo_tasks

TASKS = ("4_LeNet5", "9_ResNet18", "20_MobileNetV2", "22_EfficientNetB0", "1_Square_matrix_multiplication_",
         "23_Softmax")
COST_TASK = "1_Square_matrix_multiplication_"  # level 1 problem 1: the verify + profile cost
AGREEMENT_TARGET, SPREAD_TARGET, UNPAIRED_SPREAD_FLOOR = 0.9, 1.05, 1.5
HARNESS_MODEL_NEW = ("# Timing-only harness mode of bench.system.timing --reward-stability: the profile job\n"
                     "# times the task's own Model as the candidate. No ModelNew: this never passes verification.\n")
_OK = Verdict(status=VerdictStatus.OK, message="not verified: a benchmark of the timer")


class Subject(msgspec.Struct, frozen=True, kw_only=True):
    """A task and the candidate profiled on it."""

    task: Task
    level: int
    workspace: str
    so_path: str  # "" for the harness mode
    candidate: str  # "demo:<name>" or "reference"


class _Recorded:
    """Stands in for the GpuQueue in profile_workspace and keeps the JobResult (its wall time)."""

    def __init__(self, queue: GpuQueue) -> None:
        self.queue, self.result = queue, None

    async def submit(self, job: Job, **hooks) -> JobResult:
        self.result = await self.queue.submit(job, gpu=0, **hooks)
        return self.result


# ---------------------------------------------------------------------------------------------
# Summaries: plain data in, plain data out (tested on the CPU).


def old_row(outcome: Profile, wall_s: float) -> dict:
    """One run the old way: the candidate's own-process time against the worker's baselines."""
    if not outcome.ok:
        return {"ok": False, "wall_s": wall_s, "error": outcome.message[-500:]}
    s = score(_OK, outcome.candidate, outcome.eager, outcome.compiled)
    return {"ok": True, "wall_s": wall_s, "milestone": s.milestone, "speedup_vs_eager": s.speedup_vs_eager,
            "speedup_vs_compile": s.speedup_vs_compile, "candidate_ms": outcome.candidate.median_ms,
            "eager_ms": outcome.eager.median_ms, "compile_ms": outcome.compiled.median_ms}


def paired_row(outcome: Profile, wall_s: float) -> dict:
    """One run the paired way: rounds, speedups with intervals, each subject's evidence."""
    if not outcome.ok or outcome.paired is None:
        return {"ok": False, "wall_s": wall_s, "error": outcome.message[-500:]}
    p, s = outcome.paired, score_paired(_OK, outcome.paired)
    subjects = {f"{x.role}:{x.label}" if x.label else x.role: {
        "median_ms": x.measurement.timing.median_ms, "host_ratio": x.measurement.host_ratio,
        "launch_ratio": x.measurement.launch_ratio, "graph_ms": x.measurement.graph_info_ms,
        "graph_error": x.measurement.graph_info_error, "samples": x.measurement.timing.samples,
        "samples_per_round": x.samples_per_round} for x in p.subjects}
    phases = {k: round(v, 1) for k, v in outcome.phases_ms.items()}
    return {"ok": True, "wall_s": wall_s, "alone_s": outcome.job_alone_s, "milestone": s.milestone,
            "inconclusive": s.inconclusive, "note": s.breakdown.get("inconclusive_note", ""), "speedup_vs_eager": p.vs_eager.estimate,
            "speedup_vs_compile": p.vs_compile.estimate, "ci_vs_eager": [p.vs_eager.ci_low, p.vs_eager.ci_high],
            "ci_vs_compile": [p.vs_compile.ci_low, p.vs_compile.ci_high], "rounds": len(p.rounds), "stop": p.stop,
            "rounds_s": p.seconds, "method": p.method, "subjects": subjects, "phases_ms": phases}


def way_summary(rows: list[dict]) -> dict:
    """Agreement with the modal milestone, speedup spreads (max / min), interval widths."""
    ok = [r for r in rows if r["ok"]]
    out: dict = {"runs": len(rows), "failed": len(rows) - len(ok)}
    if not ok:
        return out
    counts = Counter(r["milestone"] for r in ok)
    modal, agree = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))
    out |= {"milestones": dict(sorted(counts.items())), "modal_milestone": modal, "agreement": agree,
            "wall_s_median": statistics.median(r["wall_s"] for r in ok)}
    for name in ("vs_eager", "vs_compile"):
        values = [r[f"speedup_{name}"] for r in ok]
        out[f"spread_{name}"] = max(values) / min(values)
        out[f"speedup_{name}_median"] = statistics.median(values)
        if all(f"ci_{name}" in r for r in ok):
            widths = [(r[f"ci_{name}"][1] - r[f"ci_{name}"][0]) / r[f"speedup_{name}"] for r in ok]
            out[f"ci_width_{name}_median"] = statistics.median(widths)
    if all("inconclusive" in r for r in ok):
        out["inconclusive"] = sum(r["inconclusive"] for r in ok)
    return out


def targets(old: dict, paired: dict) -> dict:
    """Paired: the modal milestone in at least 90% of the runs; spread at most 1.05 where the old
    spread is 1.5 or more (None where that does not apply)."""
    ok_runs = paired.get("runs", 0) - paired.get("failed", 0)
    agreement = paired.get("agreement", 0) >= math.ceil(AGREEMENT_TARGET * ok_runs) if ok_runs else False
    spread: dict[str, bool | None] = {}
    for name in ("vs_eager", "vs_compile"):
        applies = old.get(f"spread_{name}", 0.0) >= UNPAIRED_SPREAD_FLOOR
        spread[name] = paired.get(f"spread_{name}", math.inf) <= SPREAD_TARGET if applies else None
    return {"paired_agreement_ok": agreement, "paired_spread_ok": spread}


def markdown(tasks: list[dict], cost: dict | None) -> str:
    """The table of every task, then the cost."""
    def f(x, fmt=".3f") -> str:
        return "-" if x is None else format(x, fmt)

    lines = ["| task | candidate | N | old: agree | old: spread e / c | paired: agree | paired: spread e / c "
             "| paired: CI width e / c | inconclusive | paired job s | targets |",
             "|" + "---|" * 11]
    for t in tasks:
        o, p, g = t["summary"]["old"], t["summary"]["paired"], t["summary"]["targets"]
        spread_ok = [v for v in g["paired_spread_ok"].values() if v is not None]
        verdict = "ok" if g["paired_agreement_ok"] and all(spread_ok) else "MISSED"
        lines.append(
            f"| {t['task']} | {t['candidate']} | {p.get('runs', 0)} "
            f"| {o.get('agreement', 0)} (m{o.get('modal_milestone', '-')}) "
            f"| {f(o.get('spread_vs_eager'))} / {f(o.get('spread_vs_compile'))} "
            f"| {p.get('agreement', 0)} (m{p.get('modal_milestone', '-')}) "
            f"| {f(p.get('spread_vs_eager'))} / {f(p.get('spread_vs_compile'))} "
            f"| {f(p.get('ci_width_vs_eager_median'), '.2%')} / {f(p.get('ci_width_vs_compile_median'), '.2%')} "
            f"| {p.get('inconclusive', '-')} | {f(p.get('wall_s_median'), '.1f')} | {verdict} |")
    defaults = msgspec.to_builtins(PairedConfig())
    changed = sorted({f"{k}={v}" for t in tasks for k, v in t.get("paired_config", {}).items() if defaults.get(k) != v})
    if changed:
        lines += ["", f"Paired runs with PairedConfig {' '.join(changed)} (the rest default)."]
    if cost:
        lines += ["", "| cost (job wall time, median s) | value |", "|---|---|"]
        lines += [f"| {k} | {f(v, '.2f')} |" for k, v in cost.items() if isinstance(v, (int, float))]
    return "\n".join(lines) + "\n"


def write_tables(out: Path) -> None:
    """DIR/reward_stability.{json,md} over every task file in DIR."""
    tasks = [json.loads(p.read_text()) for p in sorted(out.glob("task_*.json"))]
    cost_path = out / "cost.json"
    cost = json.loads(cost_path.read_text()) if cost_path.is_file() else None
    (out / "reward_stability.json").write_text(json.dumps({"tasks": tasks, "cost": cost}, indent=1))
    (out / "reward_stability.md").write_text(markdown(tasks, cost))


# ---------------------------------------------------------------------------------------------
# The GPU run.


def problem_rows(names: list[str]) -> dict[str, dict]:
    found = {}
    for line in default_problems_path().read_text().splitlines():
        row = json.loads(line)
        if row["name"] in names:
            found[row["name"]] = row
    missing = sorted(set(names) - set(found))
    if missing:
        raise SystemExit(f"not in {default_problems_path()}: {missing}")
    return found


async def prepare(names: list[str], root: Path) -> list[Subject]:
    """Each task with its demo (built through the real compile pool) or the harness mode."""
    rows = problem_rows(names)
    demos: dict[str, DemoTask] = {}
    for demo in demo_tasks():
        for name, row in rows.items():
            if demo.task.source == row["code"]:
                demos.setdefault(name, demo)
    built: dict[str, BuiltDemo] = {}
    for b in await build_demos(list(demos.values()), root / "demos", CompileConfig()):
        built[b.name] = b
    subjects = []
    for name in names:
        row = rows[name]
        task = Task(task_id=name, source=row["code"], name=name, level=row["level"])
        if name in demos:
            b = built[demos[name].task.task_id]
            subjects.append(Subject(task=task, level=row["level"], workspace=b.workspace, so_path=b.so_path,
                                    candidate=f"demo:{b.name}"))
            continue
        ws = root / "harness" / name
        ws.mkdir(parents=True)
        (ws / "model.py").write_text(row["code"])
        (ws / "model_new.py").write_text(HARNESS_MODEL_NEW)
        subjects.append(Subject(task=task, level=row["level"], workspace=str(ws), so_path="", candidate="reference"))
    return subjects


async def profiled(queue: GpuQueue, s: Subject, config: ProfileConfig, **kw) -> tuple[Profile, float]:
    via = _Recorded(queue)
    outcome = await profile_workspace(via, Path(s.workspace), s.task, s.so_path or None, config=config,
                                      candidate="reference" if s.candidate == "reference" else "model_new", **kw)
    return outcome, via.result.wall_s


async def one_task(queue: GpuQueue, s: Subject, runs: int, config: ProfileConfig,
                   deadline: float) -> tuple[dict, Baselines]:
    """The baselines job, then `runs` old and paired jobs, back to back."""
    first, first_wall = await profiled(queue, s, config)
    if first.baselines is None:
        raise ProfileInfrastructureError(f"{s.task.name}: no baselines: {first.message[-500:]}")
    cache = first.compile_cache
    old, paired = [], []
    for i in range(runs):
        if time.monotonic() > deadline:
            _progress(f"{s.task.name}: deadline reached after {i} of {runs} runs")
            break
        outcome, wall = await profiled(queue, s, config, baselines=first.baselines)
        old.append(old_row(outcome, wall))
        outcome, wall = await profiled(queue, s, config, paired=True, compile_cache=cache)
        cache = cache or outcome.compile_cache
        paired.append(paired_row(outcome, wall))
        _progress(f"{s.task.name} run {i + 1}: old m{old[-1].get('milestone')} "
                  f"paired m{paired[-1].get('milestone')} ({paired[-1].get('stop')}, {wall:.1f} s)")
    summary = {"old": way_summary(old), "paired": way_summary(paired)}
    summary["targets"] = targets(summary["old"], summary["paired"])
    b = first.baselines
    return b, {"task": s.task.name, "level": s.level, "candidate": s.candidate, "runs_requested": runs,
            "paired_config": msgspec.to_builtins(config.paired),
            "baselines": {"eager_ms": b.eager.measurement.timing.median_ms,
                          "compile_ms": b.compiled.measurement.timing.median_ms, "method": b.method,
                          "compile_s": b.compile_s, "job_wall_s": first_wall,
                          "compile_cache_bytes": len(first.compile_cache)},
            "old": old, "paired": paired, "summary": summary}


async def cost(queue: GpuQueue, s: Subject, config: EnvConfig, repeats: int, result: dict,
               baselines: Baselines) -> dict:
    """Verify (quick, final) and in-loop profile job wall times of the level-1 problem 1 demo, and
    its paired profile jobs (the timing of a final evaluation) from the stability runs."""
    demo = BuiltDemo(name=s.candidate, task=s.task, workspace=s.workspace, so_path=s.so_path, build_s=0.0,
                     built_units=0, cached_units=0)
    walls: dict[str, list[float]] = {"verify_quick": [], "verify_final": [], "profile_cached": []}
    for _ in range(repeats):
        for kind, mode, name in (("verify", "quick", "verify_quick"), ("verify", "final", "verify_final"),
                                 ("profile", "quick", "profile_cached")):
            record, _ = await run_job(queue, kind, demo, config, mode=mode, baselines=baselines, gpu=0)
            walls[name].append(record.wall_s)
    walls |= await final_evaluations(queue, s, config, repeats)
    paired_walls = [r["wall_s"] for r in result["paired"] if r["ok"]]
    out = {f"{k}_s": statistics.median(v) if v else None for k, v in walls.items()}
    out["profile_paired_s"] = statistics.median(paired_walls) if paired_walls else None
    alone = [r.get("alone_s", 0.0) for r in result["paired"] if r["ok"]]  # of those, with the GPU alone
    out["profile_paired_alone_s"] = statistics.median(alone) if alone else None
    return out | {"repeats": repeats}


FINAL_WAYS = {"final_sequential": EvaluateConfig(overlap=False), "final_overlapped": EvaluateConfig(overlap=True)}


async def final_evaluations(queue: GpuQueue, s: Subject, config: EnvConfig, repeats: int) -> dict[str, list[float]]:
    """Wall seconds of the demo's final evaluation (verify final, paired profile, score), each way
    of `FINAL_WAYS` in turn, `repeats` times; a first round, not counted, runs the task's reference
    compile job. An evaluation that does not score the demo's milestone 1 or better is not counted
    (its reason goes to stderr)."""
    env = RewardsKernelEnv(await anyio.to_thread.run_sync(CompilePool, config.compile), queue, config)
    build = Build(result=CompileResult(ok=True), artifact=BuildArtifact(so_path=s.so_path, key=s.candidate))
    walls: dict[str, list[float]] = {name: [] for name in FINAL_WAYS}
    for round_ in range(repeats + 1):
        for name, way in FINAL_WAYS.items():
            began = time.monotonic()
            scored = await FinalEvaluator(env, way).evaluate_prepared(Path(s.workspace), s.task, Prepared(build=build))
            wall = time.monotonic() - began
            if scored.milestone is None:
                _progress(f"{name}: not scored: {scored.verdict.status.value}: {scored.verdict.message[-300:]}")
            elif round_:
                walls[name].append(wall)
    return walls


def paired_config(fields: list[str], time_cap_s: float = 0.0) -> PairedConfig:
    """PairedConfig with `FIELD=VALUE` overrides (`rl.config.apply_overrides`: values as JSON,
    else strings); a bad field or value is a one-line error."""
    base = PairedConfig(time_cap_s=time_cap_s) if time_cap_s else PairedConfig()
    try:
        return apply_overrides(base, fields)
    except ValueError as error:
        raise SystemExit(f"--paired {' '.join(fields)}: {error}") from None


async def run(args) -> int:
    names = [t for t in args.tasks.split(",") if t] or list(TASKS)
    out = Path(args.out or "reward_stability")
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.deadline_s
    profile = ProfileConfig(paired=paired_config(args.paired, args.time_cap_s))
    env = EnvConfig(gpus=(0,), sandbox="on" if args.sandbox else "off", profile=profile, lanes_per_gpu=2)
    if await count_gpus(env.queue.python) < 1:
        raise NeedsGpu("--reward-stability needs a CUDA GPU")
    with tempfile.TemporaryDirectory(prefix="reward-stability-") as root:
        subjects = await prepare(names, Path(root))
        _progress(f"prepared {[(s.task.name, s.candidate) for s in subjects]}")
        async with GpuQueue(queue_config(env, env.gpus)) as queue:
            for s in subjects:
                if time.monotonic() > deadline:
                    _progress(f"{s.task.name}: skipped, past --deadline-s")
                    continue
                baselines, result = await one_task(queue, s, args.runs, profile, deadline)
                (out / f"task_{s.task.name}.json").write_text(json.dumps(result, indent=1))
                if s.task.name == COST_TASK and s.candidate != "reference" and args.cost_runs > 0:
                    spent = await cost(queue, s, env, args.cost_runs, result, baselines)
                    (out / "cost.json").write_text(json.dumps(spent, indent=1))
                write_tables(out)
    write_tables(out)
    print((out / "reward_stability.md").read_text())
    return 0


def main(args) -> int:
    if args.tables_only:
        out = Path(args.out or "reward_stability")
        write_tables(out)
        print((out / "reward_stability.md").read_text())
        return 0
    try:
        return anyio.run(run, args)
    except NeedsGpu as error:
        print(f"python -m bench.system.timing --reward-stability: {error}", file=sys.stderr)
        return 3


def _progress(line: str) -> None:
    print(f"reward-stability: {line}", file=sys.stderr, flush=True)


__all__ = ["TASKS", "main", "markdown", "old_row", "paired_row", "targets", "way_summary", "write_tables"]
