"""KernelBench's problems, shipped with the package (MIT licence: LICENSE and README.md here).

`default_problems_path()` is what `cuda-agent bench`, `cuda-agent synth` (decontamination) and the
tests read unless told otherwise: $KERNELBENCH_PROBLEMS when set, else `PROBLEMS`.
"""

from __future__ import annotations

import os
from pathlib import Path

PROBLEMS = Path(__file__).resolve().parent / "problems.jsonl"


def default_problems_path() -> Path:
    """$KERNELBENCH_PROBLEMS, else the problems.jsonl shipped here."""
    return Path(env) if (env := os.environ.get("KERNELBENCH_PROBLEMS")) else PROBLEMS


__all__ = ["PROBLEMS", "default_problems_path"]
