"""Two reports side by side: which (perturbation, dtype) cells changed verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from invariance.report import Report

__all__ = ["CellChange", "ReportComparison", "compare_reports"]

Change = Literal["worse", "better", "changed", "same", "only in A", "only in B"]

_FAILING = ("failed", "error")


@dataclass
class CellChange:
    """One (perturbation, dtype) cell, or one dtype's accuracy (``perturbation == "accuracy"``),
    in reports A and B. Status is ``None`` where the cell is absent."""

    perturbation: str
    dtype: str
    before: str | None
    after: str | None
    ulp_before: int | None = None
    ulp_after: int | None = None

    @property
    def change(self) -> Change:
        if self.before is None:
            return "only in B"
        if self.after is None:
            return "only in A"
        if self.before == self.after:
            return "same"
        if self.before == "passed" and self.after in _FAILING:
            return "worse"
        if self.before in _FAILING and self.after == "passed":
            return "better"
        return "changed"

    @property
    def name(self) -> str:
        return f"{self.perturbation}[{self.dtype}]"


@dataclass
class ReportComparison:
    """What changed from report ``a`` (before) to report ``b`` (after)."""

    a: Report
    b: Report
    cells: list[CellChange] = field(default_factory=list)

    @property
    def worse(self) -> list[CellChange]:
        """Cells that went from passed to failed or error."""
        return [c for c in self.cells if c.change == "worse"]

    @property
    def better(self) -> list[CellChange]:
        return [c for c in self.cells if c.change == "better"]

    @property
    def differences(self) -> list[CellChange]:
        """Every cell whose verdict changed or that only one report has."""
        return [c for c in self.cells if c.change != "same"]

    @property
    def regressed(self) -> bool:
        return bool(self.worse)

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for c in self.cells:
            counts[c.change] = counts.get(c.change, 0) + 1
        parts = [f"{counts[k]} {k}" for k in
                 ("worse", "better", "changed", "only in A", "only in B", "same")
                 if counts.get(k)]
        head = "REGRESSED" if self.regressed else "NO REGRESSION"
        return (f"{head}: {self.a.backend} on {self.a.device} -> {self.b.backend} on "
                f"{self.b.device}: {', '.join(parts) or 'no cells'}")


def _status(passed: bool) -> str:
    return "passed" if passed else "failed"


def compare_reports(a: Report, b: Report) -> ReportComparison:
    """Compare every (perturbation, dtype) cell and every dtype's accuracy of ``a`` and ``b``.

    Cells keep ``a``'s order, then those only in ``b``. Render the result with
    :func:`invariance.render.print_comparison` or :func:`comparison_to_markdown`.
    """
    cells_a = {(r.perturbation, r.dtype): r for r in a.results}
    cells_b = {(r.perturbation, r.dtype): r for r in b.results}
    out = ReportComparison(a, b)
    for key in list(cells_a) + [k for k in cells_b if k not in cells_a]:
        ra, rb = cells_a.get(key), cells_b.get(key)
        out.cells.append(CellChange(
            key[0], key[1], ra.status if ra else None, rb.status if rb else None,
            ra.max_ulp if ra else None, rb.max_ulp if rb else None))
    acc_a = {x.dtype: x for x in a.accuracy}
    acc_b = {x.dtype: x for x in b.accuracy}
    for dt in list(acc_a) + [d for d in acc_b if d not in acc_a]:
        xa, xb = acc_a.get(dt), acc_b.get(dt)
        out.cells.append(CellChange(
            "accuracy", dt, _status(xa.passed) if xa else None,
            _status(xb.passed) if xb else None))
    return out
