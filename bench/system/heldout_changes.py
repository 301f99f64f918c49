"""What PPO changed in the code of the held-out tasks it moved: the lines that differ, read from a run's rollouts.

What it is: `changes(run_dir)` pairs each held-out task's trajectory after rft with its trajectory
after PPO (`rollouts/heldout_<label>.jsonl`, greedy: one a task) and, for every task that passed in
one and failed in the other, returns a `Change`: both rewards, the verdict after PPO, and the lines
of each file the model wrote (`write_file` and `edit_file` calls, replayed on an empty workspace)
that differ between the two. `markdown_lines` turns several seeds' changes into the learning
report's section. A policy that writes a sibling task's formula (log-softmax's output line in a
softmax kernel) shows here as one changed line.
What it is not: a judge (the verdicts are the final evaluation's) or a diff of the workspace (files
the tools made, such as build outputs, are not the model's writing).

    for change in changes("runs/learning/seed0/ppo"):
        print(change.task_id, change.lines)

    python -m bench.system.heldout_changes RUN_DIR...   (the report's section, one seed a run directory)
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

from msgspec import Struct

from agentcore.store import read_trajectories
from agentcore.types import EditFile, Trajectory, WriteFile
from bench.system.heldout_failures import passed, verdict_status

LINE_CHARS = 120
HUNKS = 2


class LineChange(Struct, frozen=True, kw_only=True):
    """One run of differing lines of a file: what rft's trajectory wrote there, what PPO's did."""

    path: str
    before: str
    after: str


class Change(Struct, frozen=True, kw_only=True):
    """A held-out task that passed after rft and failed after PPO, or the other way round."""

    task_id: str
    before: float | None
    after: float | None
    status: str
    """The verdict's status after PPO (ok when it passed)."""
    lines: list[LineChange]


def written_files(traj: Trajectory) -> dict[str, str]:
    """The files the model wrote in a trajectory, as its calls left them: each `write_file` sets a
    file, each `edit_file` replaces its exact strings (a call whose old string is missing changed
    nothing, as the tool refuses it)."""
    files: dict[str, str] = {}
    for turn in traj.turns:
        for call in turn.calls:
            if isinstance(call, WriteFile):
                files[call.path] = call.content
            elif isinstance(call, EditFile) and call.path in files:
                text = files[call.path]
                if all(e.old_string in text for e in call.edits):
                    for e in call.edits:
                        text = text.replace(e.old_string, e.new_string, -1 if e.replace_all else 1)
                    files[call.path] = text
    return files


def line_changes(before: dict[str, str], after: dict[str, str], hunks: int = HUNKS) -> list[LineChange]:
    """Per file (sorted by path), its first `hunks` runs of differing lines, each side's lines
    stripped and joined by " / " (a file one side lacks: "(none)")."""
    out = []
    for path in sorted(before.keys() | after.keys()):
        a, b = before.get(path), after.get(path)
        if a == b:
            continue
        if a is None or b is None:
            out.append(LineChange(path=path, before="(none)" if a is None else "(written)",
                                  after="(none)" if b is None else "(written)"))
            continue
        al, bl = a.splitlines(), b.splitlines()
        ops = [op for op in difflib.SequenceMatcher(a=al, b=bl, autojunk=False).get_opcodes() if op[0] != "equal"]
        for _, i1, i2, j1, j2 in ops[:hunks]:
            out.append(LineChange(path=path, before=_joined(al[i1:i2]), after=_joined(bl[j1:j2])))
    return out


def changes(run_dir: str | Path, before: str = "after_rft", after: str = "after_ppo") -> list[Change]:
    """The held-out tasks whose pass (reward >= 1) differs between the evaluations `before` and
    `after` of a run, in task order ([] when either file is missing)."""
    rollouts = Path(run_dir) / "rollouts"
    first = {t.task_id: t for t in read_trajectories(rollouts / f"heldout_{before}.jsonl")}
    second = {t.task_id: t for t in read_trajectories(rollouts / f"heldout_{after}.jsonl")}
    out = []
    for task_id in sorted(first.keys() & second.keys()):
        a, b = first[task_id], second[task_id]
        if passed(a.reward) == passed(b.reward):
            continue
        out.append(Change(task_id=task_id, before=a.reward, after=b.reward, status=verdict_status(b),
                          lines=line_changes(written_files(a), written_files(b))))
    return out


def markdown_lines(seeds: Iterable[tuple[int, list[Change]]]) -> list[str]:
    """The report's section: per seed each task PPO moved, which way, and the lines it changed."""
    seeds = [(seed, cs) for seed, cs in seeds if cs]
    if not seeds:
        return []
    lines = ["", "What PPO changed in the code of the held-out tasks it moved (greedy, after rft -> after PPO; "
                 "the first differing lines of each file the model wrote):", ""]
    for seed, cs in seeds:
        for c in cs:
            way = "failed -> passed" if passed(c.after) else f"passed -> failed ({c.status})"
            edits = "; ".join(f"`{x.path}`: {_code(x.before)} -> {_code(x.after)}" for x in c.lines)
            lines.append(f"- seed {seed}, `{c.task_id}`, {way}: {edits or 'no file differs'}")
    return lines


def _joined(lines: list[str]) -> str:
    text = " / ".join(line.strip() for line in lines if line.strip())
    return text[:LINE_CHARS] + ("..." if len(text) > LINE_CHARS else "")


def _code(text: str) -> str:
    """Inline code in a Markdown list item: backticks and table pipes cannot break it."""
    return "(nothing)" if not text else "`" + text.replace("`", "'").replace("|", "/") + "`"


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench.system.heldout_changes", description=__doc__.split("\n")[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a PPO run's directory (seed K: the K-th)")
    a = p.parse_args(argv)
    missing = [d for d in a.run_dirs if not (Path(d) / "rollouts").is_dir()]
    if missing:
        print(f"heldout_changes: no rollouts/ in {', '.join(missing)}: not a training run's directory")
        return 2
    print("\n".join(markdown_lines((k, changes(d)) for k, d in enumerate(a.run_dirs))).strip() or "no task moved")
    return 0


__all__ = ["Change", "LineChange", "changes", "line_changes", "markdown_lines", "written_files"]


if __name__ == "__main__":
    raise SystemExit(main())
