"""Turns raw compiler and linker output into the few lines an agent can act on.

What: `trim_log(text, replacements)` shortens absolute paths (the workspace becomes relative,
torch's includes `<torch>/`, ...), then keeps errors first and warnings after, each with its
file:line header, the source excerpt and caret, the one or two "In function"/"included from"
lines before it and at most two notes; it drops the rest and says how much it dropped.
`undefined_symbols(text)` lists what a link left unresolved.
What not: it does not decide success (exit codes do), and never adds a Python traceback.
How used: by `rewards.build.compile_pool` on every unit's and the link's output.

    trim_log(output, {"/abs/ws/": "", "/site-packages/torch/include/": "<torch>/"})
"""

from __future__ import annotations

import re

from msgspec import Struct

# kernels/a_binding.cpp:15:38: error: ...        (g++)
_GCC = re.compile(r"^(?P<loc>[^\s:][^:]*:\d+(?::\d+)?): (?P<sev>fatal error|error|warning|note): ")
# kernels/a.cu(7): error: ...                     (nvcc front end)
_NVCC = re.compile(r"^(?P<loc>[^\s(][^(]*\(\d+\)): (?P<sev>catastrophic error|error|warning|remark)\b")
# ptxas, nvlink and ld: "ptxas error   : ...", "x.o:f: multiple definition of ..."
_TOOL = re.compile(r"(?P<sev>ptxas fatal|ptxas error|nvlink error|undefined reference to|multiple definition of|cannot find -l)")
_CONTEXT = re.compile(
    r"^(In file included from |\s+from |[^\s:][^:]*: (In (?:member )?function|In instantiation of|"
    r"In lambda function|In constructor|At global scope)|[^\s:][^:]*:\d+:\d+:\s+required )"
)
_NOISE = re.compile(
    r"^(compilation terminated\.|\d+ errors? detected in the compilation|collect2: error: ld returned"
    r"|# --error 0x)"
)
_UNDEFINED = re.compile(r"undefined reference to [`']([^'`]+)'")

MAX_LINE_CHARS = 240
CONTINUATION_LINES = 4
NOTES_PER_ERROR = 2


class Diagnostic(Struct, kw_only=True):
    severity: str
    lines: list[str]
    notes: int = 0
    tail: int = 0
    """Continuation lines kept since the last header or note."""


def shorten_paths(text: str, replacements: dict[str, str]) -> str:
    """Replace each prefix (longest first) so paths read relative to the workspace."""
    for old in sorted(replacements, key=len, reverse=True):
        text = text.replace(old, replacements[old])
    return text


def _clip(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 3] + "..."


def _severity(line: str) -> str | None:
    for pattern in (_GCC, _NVCC):
        match = pattern.match(line)
        if match:
            sev = match.group("sev")
            return "note" if sev in ("note", "remark") else ("warning" if sev == "warning" else "error")
    return "error" if _TOOL.search(line) else None


def parse_diagnostics(text: str) -> list[Diagnostic]:
    """Group lines into diagnostics; notes fold into the diagnostic before them."""
    diagnostics: list[Diagnostic] = []
    context: list[str] = []
    current: Diagnostic | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or _NOISE.match(line):
            continue
        severity = _severity(line)
        if severity == "note" and current is not None:
            current.notes += 1
            keep = current.notes <= NOTES_PER_ERROR
            if keep:
                current.lines.append(_clip(line))
            current.tail = 0 if keep else CONTINUATION_LINES
            continue
        if severity is not None:
            current = Diagnostic(severity=severity, lines=[*context[-2:], _clip(line)])
            diagnostics.append(current)
            context = []
        elif _CONTEXT.match(line):
            context.append(_clip(line))
            current = None
        elif current is not None and current.tail < CONTINUATION_LINES:
            current.lines.append(_clip(line))
            current.tail += 1
    return diagnostics


def trim_log(text: str, replacements: dict[str, str] | None = None, *, max_chars: int = 4000) -> str:
    """The useful lines of `text`, errors first, at most `max_chars` characters."""
    text = shorten_paths(text, replacements or {})
    diagnostics = parse_diagnostics(text)
    if not diagnostics:
        return _tail(text, max_chars)
    ordered = [d for d in diagnostics if d.severity == "error"]
    ordered += [d for d in diagnostics if d.severity == "warning"]
    kept: list[str] = []
    used = 0
    shown = 0
    for diagnostic in ordered:
        block = "\n".join(diagnostic.lines)
        if used + len(block) > max_chars and shown:
            break
        kept.append(block[:max_chars])
        used += len(block) + 1
        shown += 1
    hidden = ordered[shown:]
    if hidden:
        errors = sum(d.severity == "error" for d in hidden)
        kept.append(f"[{errors} more errors and {len(hidden) - errors} more warnings not shown]")
    return "\n".join(kept)


def _tail(text: str, max_chars: int) -> str:
    lines = [_clip(line.rstrip()) for line in text.splitlines() if line.strip()]
    out: list[str] = []
    used = 0
    for line in reversed(lines):
        if used + len(line) + 1 > max_chars:
            out.append(f"[{len(lines) - len(out)} earlier lines not shown]")
            break
        out.append(line)
        used += len(line) + 1
    return "\n".join(reversed(out))


def undefined_symbols(text: str) -> list[str]:
    """Symbols the linker reported unresolved, in first-seen order, without repeats."""
    return list(dict.fromkeys(_UNDEFINED.findall(text)))
