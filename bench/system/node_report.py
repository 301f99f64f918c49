"""The report of one `bench.system.node` run: per-step time split and throughput, GPU use per group.

What it is: `write_report(run_dir, samples, outcome)` reads `RUN/config.json` (the layout),
`RUN/metrics.jsonl` (one row per training step) and `RUN/bench/metrics.jsonl` (the watcher's
rows), takes the `nvidia-smi` samples, and writes `RUN/node_report.json` (everything, samples
included, so `--report-only` can redo it) and `RUN/node_report.md`. `parse_smi_line` reads one
line of `nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader,nounits`.
What it is not: the driver (`bench.system.node`) or the training metrics themselves (`rl.metrics`).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import msgspec
import orjson

from rl.metrics import read_jsonl


class GpuSample(msgspec.Struct, frozen=True, kw_only=True):
    t_s: float
    gpu: int
    util_pct: float
    mem_mib: float


def parse_smi_line(line: str, t_s: float) -> GpuSample | None:
    """`0, 87, 40312` -> GpuSample; None for anything else (headers, errors, blank lines)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 3:
        return None
    try:
        return GpuSample(t_s=round(t_s, 3), gpu=int(parts[0]), util_pct=float(parts[1]), mem_mib=float(parts[2]))
    except ValueError:
        return None


def _num(row: dict, *keys: str) -> float | None:
    for key in keys:
        if isinstance(row.get(key), (int, float)):
            return float(row[key])
    return None


def step_rows(metrics: list[dict], learner_gpus: int) -> list[dict]:
    """One row per training step: the time split, throughput per learner GPU, MFU, queue use."""
    out = []
    for r in metrics:
        tps = _num(r, "perf/tokens_per_s")
        out.append({
            "step": r.get("step"), "stage": r.get("stage", "?"),
            "rollout_s": _num(r, "time/rollout_s"), "train_s": _num(r, "time/train_s") or 0.0,
            "weight_sync_s": _num(r, "time/weight_sync_s", "sync/weight_sync_s"),
            "tokens": _num(r, "train/tokens"),
            "tokens_per_s_per_gpu": tps / learner_gpus if tps is not None else None,
            "mfu": _num(r, "perf/mfu"), "gpu_queue_busy": _num(r, "gpu_queue/busy_fraction"),
            "reward_mean": _num(r, "rollout/reward_mean", "collect/reward_mean"),
        })
    return out


def gpu_groups(samples: list[GpuSample], layout: dict) -> list[dict]:
    """Mean / p90 utilisation and peak memory of the learner GPUs and of the verification GPUs."""
    groups = [("learner + engines", tuple(layout.get("learner_gpus", ()))),
              ("verification", tuple(layout.get("verify_gpus", ())))]
    out = []
    for name, gpus in groups:
        picked = [s for s in samples if s.gpu in gpus]
        utils = sorted(s.util_pct for s in picked)
        out.append({
            "group": name, "gpus": list(gpus), "samples": len(picked),
            "util_mean_pct": statistics.fmean(utils) if utils else None,
            "util_p90_pct": utils[int(0.9 * (len(utils) - 1))] if utils else None,
            "mem_peak_mib": max((s.mem_mib for s in picked), default=None),
        })
    return out


def scaling(steps: list[dict], single_gpu_json: Path | None) -> dict | None:
    """PPO tokens/s per learner GPU against the single-GPU bench.system.learner figure (first row)."""
    if single_gpu_json is None or not single_gpu_json.is_file():
        return None
    ref = orjson.loads(single_gpu_json.read_bytes())["rows"][0]
    ppo = [s["tokens_per_s_per_gpu"] for s in steps if s["stage"] == "ppo" and s["tokens_per_s_per_gpu"]]
    here = statistics.median(ppo) if ppo else None
    return {"single_gpu_tokens_per_s": ref["tokens_per_s_per_gpu"], "single_gpu_config": {
                k: ref.get(k) for k in ("model", "tokens_per_micro_batch", "world_size", "activation_checkpointing")},
            "run_tokens_per_s_per_gpu": here,
            "ratio": here / ref["tokens_per_s_per_gpu"] if here else None}


def write_report(run_dir: Path, samples: list[GpuSample], outcome: dict, *, single_gpu_json: Path | None = None) -> dict:
    config = orjson.loads((run_dir / "config.json").read_bytes()) if (run_dir / "config.json").is_file() else {}
    layout = config.get("layout", {})
    steps = step_rows(read_jsonl(run_dir / "metrics.jsonl"), max(1, len(layout.get("learner_gpus", ())) or 1))
    report: dict[str, Any] = {
        "recipe": config.get("recipe"), "layout": layout, "outcome": outcome, "steps": steps,
        "groups": gpu_groups(samples, layout), "scaling": scaling(steps, single_gpu_json),
        "checkpoints": sorted(p.name for p in (run_dir / "ckpt").glob("step_*")) if (run_dir / "ckpt").is_dir() else [],
        "watcher": read_jsonl(run_dir / "bench" / "metrics.jsonl"),
        "samples": msgspec.to_builtins(samples),
    }
    (run_dir / "node_report.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    (run_dir / "node_report.md").write_text(markdown(report))
    return report


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def markdown(r: dict) -> str:
    o = r["outcome"]
    lines = [f"# bench.system.node: recipe {r['recipe']}", "",
             (f"Layout: learner + engines on GPUs {r['layout'].get('learner_gpus')}, verification on "
             f"{r['layout'].get('verify_gpus')}. Train exit code {o.get('train_rc')}"
             f"{' (stopped at the time limit)' if o.get('stopped_by_limit') else ''}, wall {_f(o.get('wall_s'), '.0f')} s; "
             f"checkpoints: {', '.join(r['checkpoints']) or 'none'}; watcher rows: {len(r['watcher'])}."), "",
             "| step | stage | rollout s | train s | weight sync s | tokens | tokens/s/GPU | MFU | queue busy | reward |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in r["steps"]:
        lines.append(f"| {s['step']} | {s['stage']} | {_f(s['rollout_s'])} | {_f(s['train_s'])} | "
                     f"{_f(s['weight_sync_s'], '.3f')} | {_f(s['tokens'], '.0f')} | {_f(s['tokens_per_s_per_gpu'], '.0f')} | "
                     f"{_f(s['mfu'] * 100 if s['mfu'] is not None else None, '.1f')}{'%' if s['mfu'] is not None else ''} | "
                     f"{_f(s['gpu_queue_busy'])} | {_f(s['reward_mean'])} |")
    lines += ["", "| GPU group | GPUs | samples | SM util mean % | p90 % | peak memory MiB |", "|---|---|---|---|---|---|"]
    for g in r["groups"]:
        lines.append(f"| {g['group']} | {g['gpus']} | {g['samples']} | {_f(g['util_mean_pct'], '.1f')} | "
                     f"{_f(g['util_p90_pct'], '.0f')} | {_f(g['mem_peak_mib'], '.0f')} |")
    if (sc := r["scaling"]) is not None:
        lines += ["", (f"PPO tokens/s per learner GPU {_f(sc['run_tokens_per_s_per_gpu'], '.0f')} against "
                      f"{_f(sc['single_gpu_tokens_per_s'], '.0f')} single-GPU ({sc['single_gpu_config']}): "
                      f"ratio {_f(sc['ratio'], '.3f')} (the run's batches are smaller and mixed with rollouts).")]
    return "\n".join(lines) + "\n"


__all__ = ["GpuSample", "gpu_groups", "markdown", "parse_smi_line", "scaling", "step_rows", "write_report"]
