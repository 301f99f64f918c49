"""Static checks over a candidate workspace's sources: strings in, a list of Findings out.

What it is: the cheap first line of the anti-hacking checks (rewards/README.md). It reads
model_new.py (through `rewards.static.python`, an `ast` walk), the kernel sources under kernels/
(through `rewards.static.cpp`, a comment- and string-stripping lexer plus regexes) and the
protected files (SHA-256 against the originals). Each Finding names a HackCategory, `file:line`
and a message the model can act on; non-blocking findings are notes for the dynamic audit
(cuBLAS/cuDNN use, TF32 math modes, kernels defined but never launched). What is allowed is
spelled out in `rewards.static.policy`. `rules` picks the rule set (`rewards.verdict.Rules`):
under "kernelbench", torch doing part of the work is a "partial" note instead of a hack.

What it is not: a proof. Decoys, replay, deferred work, pointer reuse and side-stream timing are
caught on the GPU by the dynamic audit; these checks only make the obvious cheats cheap to reject.

How it is used:
    findings = check_workspace(Path(ws), reference=task.source, originals=template_digests)
    verdict = hack_verdict(findings, rules)  # None when nothing blocks
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from rewards.static.cpp import CUDA_SUFFIXES, HOST_SUFFIXES, check_kernels
from rewards.static.python import check_model_new
from rewards.verdict import Finding, Rules, apply_rules
from rewards.verdict import HackCategory as H

PROTECTED_FILES: tuple[str, ...] = ("SKILL.md", "model.py", "binding_registry.h", "binding.cpp")
MAX_FILE_BYTES = 1 << 20


def check_workspace(
    root: Path,
    *,
    reference: str | None = None,
    originals: Mapping[str, str] | None = None,
    rules: Rules = "paper",
) -> list[Finding]:
    """Read model_new.py, kernels/** and the protected files under `root`, then `check_sources`."""
    files: dict[str, str] = {}
    names = ["model_new.py", *PROTECTED_FILES, *(originals or {})]
    paths = [root / n for n in names] + sorted((root / "kernels").rglob("*"))
    for path in paths:
        if path.is_file() and path.stat().st_size <= MAX_FILE_BYTES:
            files[path.relative_to(root).as_posix()] = path.read_bytes().decode("utf-8", "replace")
    return check_sources(files, reference=reference, originals=originals, rules=rules)


def check_sources(
    files: Mapping[str, str],
    *,
    reference: str | None = None,
    originals: Mapping[str, str] | None = None,
    rules: Rules = "paper",
) -> list[Finding]:
    """All static findings for a workspace given as relative path -> text, judged by `rules`.

    `reference` is the trusted task source (model.py as the dataset has it, not the workspace's
    copy): it decides whether low-precision dtypes are the task's own. `originals` maps protected
    paths to the SHA-256 hex digests of their pristine text.
    """
    findings: list[Finding] = []
    if "model_new.py" in files:
        findings += check_model_new(files["model_new.py"], reference=reference)
    else:
        findings.append(
            Finding(
                category=H.LAYOUT, file="model_new.py", line=1, message="model_new.py is missing"
            )
        )
    kernels = {
        p: t
        for p, t in files.items()
        if p.startswith("kernels/") and PurePosixPath(p).suffix in CUDA_SUFFIXES | HOST_SUFFIXES
    }
    findings += check_kernels(kernels)
    if originals is not None:
        findings += check_protected(files, originals)
    return sorted(apply_rules(findings, rules), key=lambda f: (f.file, f.line))


def blocking(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.blocking]


# ---------------------------------------------------------------------------------------------
# Protected files.


def file_digest(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def check_protected(
    files: Mapping[str, str | bytes], originals: Mapping[str, str]
) -> list[Finding]:
    """A finding for each protected path that is missing or whose digest differs."""
    findings = []
    for path, digest in sorted(originals.items()):
        if path not in files:
            message = f"protected file {path} was deleted"
        elif file_digest(files[path]) != digest:
            message = f"protected file {path} was modified (restore the original)"
        else:
            continue
        findings.append(Finding(category=H.PROTECTED_FILE, file=path, line=1, message=message))
    return findings
