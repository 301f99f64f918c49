"""Single-file KernelBench solutions (`load_inline`) turned into a build the trusted side owns.

What it is: published KernelBench solutions are one model_new.py that calls
`torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., cuda_sources=...,
functions=[...])` at import. Running that file as is would run the compiler on candidate text
inside the candidate child, outside the compile pool and the static checks. Instead, four steps:
(1) `rewards.inline.extract` reads the calls' arguments from the AST without running anything
    (`rewards.inline.fold` folds constants, string operations and names bound once);
(2) `rewards.inline.rewrite` replaces each call by the prebuilt `cuda_extension` (or, when the
    file builds several modules, its submodule);
(3) `rewards.inline.sources` writes what load_inline would compile, for the compile pool;
(4) `rewards.inline.checks` runs the static rules on the rewritten file and the source strings.
This module detects the form, runs the steps (`check_source` for 1, 2, 4 without writing
anything, as a static-only check can; `convert`, `prepare_inline` for all four) and re-exports
the steps' public names. Whatever the candidate's text causes is a verdict: an unsupported form
or an unreadable file a COMPILE_ERROR, a blocking finding a HACK. What was read but not built
with (ignored flags, `**options`, a computed name) is noted in the verdict's
`details["load_inline"]`. Verification and profiling then run as for our layout.

What it is not: a general Python evaluator: nothing of the candidate runs here.

How it is used (by `rewards.evaluate.FinalEvaluator.prepare`):
    if is_inline_solution(snapshot):
        prepared = await prepare_inline(env, snapshot, task)
"""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import msgspec
from msgspec import Struct

from agentcore.types import Task
from rewards.build.plan import Unit
from rewards.inline.checks import split_device_code, static_findings
from rewards.inline.extract import InlineModule, InlineSpec, InvalidSolution, UnsupportedInline, extract
from rewards.inline.rewrite import rewrite
from rewards.inline.sources import binding_file, cuda_file, write_sources
from rewards.verdict import Rules, Verdict, VerdictStatus, hack_verdict

_LOAD_INLINE_CALL = re.compile(r"\bload_inline\s*\(")
NOTES_KEY = "load_inline"
"""`Verdict.details` key: what the extraction read but did not build with (rewards.inline.extract)."""


def is_inline_solution(workspace: Path) -> bool:
    """model_new.py mentions load_inline and kernels/ holds no file: the single-file form."""
    model_new = Path(workspace) / "model_new.py"
    kernels = Path(workspace) / "kernels"
    if not model_new.is_file() or (kernels.is_dir() and any(p.is_file() for p in kernels.rglob("*"))):
        return False
    return bool(_LOAD_INLINE_CALL.search(model_new.read_text(errors="replace")))


class Converted(Struct, frozen=True, kw_only=True):
    """A single file read and checked: the verdict when it must not build, else what to build."""

    verdict: Verdict | None = None
    spec: InlineSpec | None = None
    model_new: str = ""
    """The rewritten model_new.py."""
    notes: tuple[str, ...] = ()
    units: tuple[Unit, ...] = ()
    """What the compile pool builds, once `convert` has written the sources."""


def unsupported(message: str, rules: Rules = "paper") -> Verdict:
    return Verdict(status=VerdictStatus.COMPILE_ERROR, message=f"unsupported load_inline form: {message}", rules=rules)


def with_notes(verdict: Verdict, notes: tuple[str, ...]) -> Verdict:
    """`verdict` with the extraction's notes under `details[NOTES_KEY]`."""
    if not notes:
        return verdict
    return msgspec.structs.replace(verdict, details={**verdict.details, NOTES_KEY: "; ".join(notes)[:2000]})


def check_source(source: str, task: Task, rules: Rules = "paper") -> Converted:
    """Extraction, rewrite and static checks of a model_new.py text; nothing is written or built.
    What the candidate's text causes (a form not read, a syntax error, a file too deep or too
    large for the parser) is a COMPILE_ERROR verdict, a blocking finding a HACK verdict."""
    try:
        spec = extract(source)
        model_new = rewrite(source, spec)
    except UnsupportedInline as exc:
        return Converted(verdict=unsupported(str(exc), rules))
    except (InvalidSolution, RecursionError, MemoryError) as exc:
        message = str(exc) if isinstance(exc, InvalidSolution) else f"model_new.py cannot be read: {type(exc).__name__}"
        return Converted(verdict=Verdict(status=VerdictStatus.COMPILE_ERROR, message=message, rules=rules))
    try:
        findings = static_findings(spec, model_new, task.source)
    except RecursionError:  # the checks walk the AST recursively; `x + x + ...` a thousand terms deep
        message = "model_new.py is nested too deeply for the static checks (RecursionError)"
        return Converted(verdict=with_notes(Verdict(status=VerdictStatus.COMPILE_ERROR, message=message, rules=rules),
                                            spec.notes), notes=spec.notes)
    hack = hack_verdict(findings, rules)
    if hack is not None:
        return Converted(verdict=with_notes(hack, spec.notes), notes=spec.notes)
    return Converted(spec=spec, model_new=model_new, notes=spec.notes)


def convert(workspace: Path, task: Task, rules: Rules = "paper") -> Converted:
    """Rewrite the snapshot `workspace` into the built layout: its verdict when it must not
    build, else the units to build."""
    source = (Path(workspace) / "model_new.py").read_bytes().decode("utf-8", errors="replace")
    converted = check_source(source, task, rules)
    if converted.verdict is not None:
        return converted
    return msgspec.structs.replace(converted, units=write_sources(Path(workspace), converted.spec, converted.model_new))


async def prepare_inline(env, workspace: Path, task: Task):
    """`rewards.env.Prepared` for a single-file solution in the snapshot `workspace`."""
    from rewards.env import Prepared

    rules = env.config.rules
    converted = await anyio.to_thread.run_sync(convert, workspace, task, rules)
    if converted.verdict is not None:
        return Prepared(verdict=converted.verdict)
    build = await env.pool.build(workspace, units=converted.units)
    env.builds[Path(workspace).resolve()] = build
    if not build.result.ok:
        failed = Verdict(status=VerdictStatus.COMPILE_ERROR, message=build.result.log, rules=rules)
        return Prepared(build=build, verdict=with_notes(failed, converted.notes))
    return Prepared(build=build, inline=True, notes=converted.notes)


__all__ = ["Converted", "InlineModule", "InlineSpec", "InvalidSolution", "NOTES_KEY", "UnsupportedInline",
           "binding_file", "check_source", "convert", "cuda_file", "extract", "is_inline_solution", "prepare_inline",
           "rewrite", "split_device_code", "static_findings", "with_notes", "write_sources"]
