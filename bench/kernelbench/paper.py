"""The published KernelBench results of the CUDA Agent paper, to print beside ours.

What it is: `PAPER_ROWS`, the rows of the paper's results table (arXiv 2602.24286, its KernelBench
results table): CUDA Agent overall and per level, Claude Opus 4.5, Gemini 3 Pro and
the base model (overall only). Rates are fractions, speedups are geometric means over the correct
solutions. What it is not: anything measured here; these numbers are the paper's, taken on its
hardware (H20) with its evaluator (5 warm-ups, 10 profiled iterations, no L2 flush).

Note: the paper's abstract gives 92% faster-than-compile on level 3; its table (below) 90%.

Example:
    for row in PAPER_ROWS:
        print(row.label, row.pass_rate)
"""

from __future__ import annotations

from msgspec import Struct

SOURCE = "CUDA Agent paper (arXiv 2602.24286), KernelBench L1/L2/L3 = 100/100/50 tasks"


class PaperRow(Struct, frozen=True, kw_only=True):
    """One published row; `level` None is the overall row."""

    model: str
    level: int | None
    pass_rate: float
    faster_than_eager_rate: float
    faster_than_compile_rate: float
    speedup_vs_eager: float
    speedup_vs_compile: float

    @property
    def label(self) -> str:
        return f"{self.model} (paper) {'overall' if self.level is None else f'L{self.level}'}"


def _row(model: str, level: int | None, p: float, e: float, c: float, se: float, sc: float) -> PaperRow:
    return PaperRow(model=model, level=level, pass_rate=p / 100, faster_than_eager_rate=e / 100,
                    faster_than_compile_rate=c / 100, speedup_vs_eager=se, speedup_vs_compile=sc)


PAPER_ROWS: tuple[PaperRow, ...] = (
    _row("CUDA Agent", None, 98.8, 98.4, 96.8, 2.60, 2.11),
    _row("CUDA Agent", 1, 100.0, 99.0, 97.0, 2.48, 1.87),
    _row("CUDA Agent", 2, 100.0, 100.0, 100.0, 3.27, 2.80),
    _row("CUDA Agent", 3, 94.0, 94.0, 90.0, 1.80, 1.52),
    _row("Claude Opus 4.5", None, 95.2, 90.4, 66.4, 1.99, 1.46),
    _row("Gemini 3 Pro", None, 91.2, 87.6, 69.6, 1.92, 1.42),
    _row("base model", None, 74.0, 43.6, 27.2, 0.95, 0.69),
)
