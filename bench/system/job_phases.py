"""Where a run's verification and profile jobs spent their seconds, from its rollout files.

What it is: `python -m bench.system.job_phases RUN/rollouts/*.jsonl` reads each trajectory's final
evaluation record (`reward_info`: the verify job's wait for a lane and hold of it,
`breakdown.verify_wait_s` / `verify_held_s`, its phases `breakdown.verify_ms.*`, and the same for
the profile job) and prints, per file, the median and the largest value of every phase that takes
at least `--min-ms` at the median, as a markdown table or JSON (`--json`). The phases nest
(`trial.candidate` holds the child's `child.trial.*`); a phase summed over a verification's trials
is one number.

What it is not: a timer. It reads what `rewards.evaluate` recorded; a trajectory without a final
evaluation (a parse error, a build that failed) has no phases.

    python -m bench.system.job_phases run/rollouts/rft_demos.jsonl run/rollouts/heldout_after_rft.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import orjson

PREFIX = "breakdown."
JOBS = ("verify", "profile")


def phases(path: Path) -> dict[str, list[float]]:
    """Every recorded number of the verify and profile jobs in one rollout file, by key."""
    values: dict[str, list[float]] = defaultdict(list)
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                info = orjson.loads(line).get("reward_info") or {}
            except orjson.JSONDecodeError:
                print(f"job_phases: {path}:{n}: not a JSON line; skipped", file=sys.stderr)
                continue
            for key, value in info.items():
                name = key.removeprefix(PREFIX)
                if key.startswith(PREFIX) and name.startswith(JOBS) and _number(value):
                    values[name].append(float(value))
    return values


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def summary(path: Path, min_ms: float) -> dict:
    rows = {}
    for name, vals in sorted(phases(path).items()):
        median = statistics.median(vals)
        in_ms = median if "_ms." in name else 1e3 * median
        if in_ms >= min_ms or not name.split(".")[0].endswith("_ms"):
            rows[name] = {"n": len(vals), "median": round(median, 3), "max": round(max(vals), 3)}
    return {"file": path.name, "phases": rows}


def markdown(summaries: list[dict]) -> str:
    lines = []
    for s in summaries:
        lines += [f"### {s['file']}", "", "| phase | n | median | max |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['n']} | {v['median']:g} | {v['max']:g} |" for k, v in s["phases"].items()]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.system.job_phases", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="rollout files (RUN/rollouts/*.jsonl)")
    parser.add_argument("--min-ms", type=float, default=40.0, help="hide phases shorter than this at the median")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    summaries = [summary(p, args.min_ms) for p in args.files]
    print(json.dumps(summaries, indent=1) if args.json else markdown(summaries))


if __name__ == "__main__":
    main()
