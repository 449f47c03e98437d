"""Two reports side by side: which (perturbation, dtype) cells changed verdict, and what B lost.

Nothing lost, nothing silently wrong: B is *worse* than A (``regressed``) when

- a cell went from passed to failed, error or skipped, or from skipped to failed or error;
- a cell or an accuracy row of A is absent from B (``lost``), or a dtype of A is;
- an accuracy row went from accurate to inaccurate;
- B is an incomplete run (whatever A was).

It is *better* when a failing cell passes, a skipped cell now runs and passes, an inaccurate dtype
is accurate, or an incomplete A is complete in B. Other verdict changes (failed <-> error, a
failing cell now skipped) are ``changed``; cells only B has are ``only in B``.

Cells are matched by (check, perturbation, dtype), accuracy rows by (check, dtype): in combined
reports (a pytest session's) every check's cells are compared with the same check's.

Settings are compared too (:class:`SettingChange`): a different heads, scale, budget or seed means
the same cell names ran different cases, so the two reports are *incomparable*
(``ReportComparison.incomparable``; the CLI refuses them unless asked); a different backend,
device or environment (torch, driver, GPU) is what a comparison is usually for, and is shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from invariance.render._common import STATUS_WORD, row_label
from invariance.report import Report

__all__ = [
    "COMPARISON_HEADER",
    "INCOMPARABLE_SETTINGS",
    "CellChange",
    "Change",
    "ReportComparison",
    "Scope",
    "SettingChange",
    "compare_reports",
]

#: The verdict of one row: ``worse`` rows make the comparison regress.
Change = Literal["worse", "better", "changed", "same", "only in B"]
#: What a row compares: a (perturbation, dtype) cell, a dtype's accuracy, a dtype's presence,
#: or the run as a whole (complete or not).
Scope = Literal["cell", "accuracy", "dtype", "run"]

#: Column titles for :meth:`CellChange.columns`.
COMPARISON_HEADER = ("cell", "A", "B", "change", "kind", "max ULP A -> B")

_FAILING = ("failed", "error")


def _classify(scope: Scope, before: str | None, after: str | None) -> tuple[Change, str]:
    """(change, kind) of one row; ``kind`` says in words what happened."""
    if scope == "run":
        if after == "incomplete":
            return "worse", "B incomplete"
        if before == "incomplete":
            return "better", "now complete"
        return "same", "unchanged"
    if scope == "dtype":
        if after is None:
            return "worse", "dtype lost"
        return "same", "unchanged"
    if before is None:
        return "only in B", "new"
    if after is None:
        return "worse", "lost"
    if before == after:
        return "same", "unchanged"
    if scope == "accuracy":
        if after == "failed":
            return "worse", "now inaccurate"
        return "better", "now accurate"
    if after in _FAILING and before in ("passed", "skipped"):
        return "worse", "now fails" if after == "failed" else "now errors"
    if after == "skipped" and before == "passed":
        return "worse", "now skipped"
    if after == "passed" and before in _FAILING:
        return "better", "fixed"
    if after == "passed" and before == "skipped":
        return "better", "now runs and passes"
    return "changed", f"{before} -> {after}"


@dataclass
class CellChange:
    """One row of a comparison, in reports A (before) and B (after).

    ``scope`` says what the row is: a (perturbation, dtype) ``cell`` (``before``/``after`` are
    statuses, ``None`` where absent), a dtype's ``accuracy`` (``perturbation == "accuracy"``;
    ``passed``/``failed``), a ``dtype`` of A (``present``/``None``), or the ``run`` itself
    (``complete``/``incomplete``; ``detail`` holds B's, else A's, reason for stopping)."""

    perturbation: str
    dtype: str
    before: str | None
    after: str | None
    ulp_before: int | None = None
    ulp_after: int | None = None
    scope: Scope = "cell"
    detail: str = ""
    #: The check of a combined report the row belongs to (``""``: a report of one check).
    check: str = ""

    @property
    def change(self) -> Change:
        return _classify(self.scope, self.before, self.after)[0]

    @property
    def kind(self) -> str:
        """What happened, in words: ``lost``, ``now fails``, ``now skipped``, ``fixed``,
        ``B incomplete``, ``dtype lost``, ``unchanged``, ..."""
        return _classify(self.scope, self.before, self.after)[1]

    @property
    def label(self) -> str:
        """``change (kind)``, e.g. ``worse (lost)``; just ``same`` for an unchanged row."""
        change, kind = _classify(self.scope, self.before, self.after)
        if change == "same":
            return change
        text = f"{change} ({kind})" if kind not in (change, "new") else change
        return f"{text}: {self.detail}" if self.detail else text

    @property
    def name(self) -> str:
        if self.scope == "run":
            return "run"
        if self.scope == "dtype":
            return f"dtype {self.dtype}"
        return f"{row_label(self.check, self.perturbation)}[{self.dtype}]"

    @staticmethod
    def word(status: str | None) -> str:
        """A status as the renderers show it; ``absent`` for ``None``."""
        if status is None:
            return "absent"
        return STATUS_WORD.get(status, status)

    @property
    def ulp_text(self) -> str:
        if self.ulp_before is None and self.ulp_after is None:
            return ""
        return (f"{'-' if self.ulp_before is None else self.ulp_before} -> "
                f"{'-' if self.ulp_after is None else self.ulp_after}")

    def columns(self) -> tuple[str, str, str, str, str, str]:
        """The row as text under :data:`COMPARISON_HEADER`."""
        kind = self.kind + (f": {self.detail}" if self.detail else "")
        return (self.name, self.word(self.before), self.word(self.after), self.change, kind,
                self.ulp_text)


#: Settings that change which cases a cell runs: reports differing in one are incomparable.
INCOMPARABLE_SETTINGS = ("heads", "scale", "budget", "seed")


@dataclass
class SettingChange:
    """A setting (or an environment entry) that differs between A and B, for ``check`` (``""``:
    the reports' own). ``comparable`` is false for :data:`INCOMPARABLE_SETTINGS`: the same cell
    names then stand for different cases."""

    name: str
    a: str
    b: str
    check: str = ""
    comparable: bool = True

    def text(self) -> str:
        where = f" ({self.check})" if self.check else ""
        return f"{self.name}{where}: {self.a} -> {self.b}"


@dataclass
class ReportComparison:
    """What changed from report ``a`` (before) to report ``b`` (after)."""

    a: Report
    b: Report
    cells: list[CellChange] = field(default_factory=list)
    #: Settings and environment entries that differ (see :class:`SettingChange`).
    settings: list[SettingChange] = field(default_factory=list)

    @property
    def incomparable(self) -> list[SettingChange]:
        """Differing settings that make the same cell names run different cases."""
        return [s for s in self.settings if not s.comparable]

    @property
    def worse(self) -> list[CellChange]:
        """Rows that make B worse than A (see the module docstring)."""
        return [c for c in self.cells if c.change == "worse"]

    @property
    def better(self) -> list[CellChange]:
        return [c for c in self.cells if c.change == "better"]

    @property
    def differences(self) -> list[CellChange]:
        """Every row whose verdict changed, that B lost, or that only B has."""
        return [c for c in self.cells if c.change != "same"]

    @property
    def regressed(self) -> bool:
        return bool(self.worse)

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for c in self.cells:
            counts[c.change] = counts.get(c.change, 0) + 1
        kinds: dict[str, int] = {}
        for c in self.worse:
            kinds[c.kind] = kinds.get(c.kind, 0) + 1
        parts = []
        for k in ("worse", "better", "changed", "only in B", "same"):
            if not counts.get(k):
                continue
            part = f"{counts[k]} {k}"
            if k == "worse":
                part += " (" + ", ".join(f"{n} {kind}" for kind, n in kinds.items()) + ")"
            parts.append(part)
        head = "REGRESSED" if self.regressed else "NO REGRESSION"
        return (f"{head}: {self.a.backend} on {self.a.device} -> {self.b.backend} on "
                f"{self.b.device}: {', '.join(parts) or 'no cells'}")


def _status(passed: bool) -> str:
    return "passed" if passed else "failed"


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "none"
    return "-" if value is None or value == "" else str(value)


def _settings(a: Report, b: Report) -> list[SettingChange]:
    """The settings of every check both reports hold, then their environments."""
    out: list[SettingChange] = []
    sa, sb = a.settings(), b.settings()
    for check in sa:
        if check not in sb:
            continue  # its cells show as lost
        for name, va in sa[check].items():
            vb = sb[check][name]
            if name in ("dtypes", "perturbations"):
                continue  # shown cell by cell (lost, only in B)
            if va != vb:
                out.append(SettingChange(name, _shown(va), _shown(vb), check,
                                         name not in INCOMPARABLE_SETTINGS))
    ea, eb = a.environment.to_dict(), b.environment.to_dict()
    for name in dict.fromkeys([*ea, *eb]):
        if name != "device" and ea.get(name) != eb.get(name):
            out.append(SettingChange(name, _shown(ea.get(name)), _shown(eb.get(name))))
    return out


def compare_reports(a: Report, b: Report) -> ReportComparison:
    """Compare the runs, the dtypes, every (check, perturbation, dtype) cell, every (check,
    dtype) accuracy row and the settings of ``a`` and ``b``.

    Rows: the run (only when either report is incomplete), each dtype of ``a`` that ``b`` lacks,
    the cells in ``a``'s order then those only in ``b``, then accuracy likewise. Render with
    :func:`invariance.render.print_comparison` or :func:`comparison_to_markdown`; each row's
    ``change`` is its verdict and ``kind`` what happened (``lost``, ``now skipped``, ...).
    """
    out = ReportComparison(a, b)
    if a.incomplete is not None or b.incomplete is not None:
        out.cells.append(CellChange(
            "run", "", "complete" if a.incomplete is None else "incomplete",
            "complete" if b.incomplete is None else "incomplete", scope="run",
            detail=b.incomplete if b.incomplete is not None else a.incomplete or ""))
    dtypes_b = set(b.dtypes) | {r.dtype for r in b.results}
    dtypes_a = list(dict.fromkeys([*a.dtypes, *(r.dtype for r in a.results)]))
    for dt in dtypes_a:
        if dt not in dtypes_b:
            out.cells.append(CellChange("dtype", dt, "present", None, scope="dtype"))
    cells_a = {r.key: r for r in a.results}
    cells_b = {r.key: r for r in b.results}
    for key in list(cells_a) + [k for k in cells_b if k not in cells_a]:
        ra, rb = cells_a.get(key), cells_b.get(key)
        out.cells.append(CellChange(
            key[1], key[2], ra.status if ra else None, rb.status if rb else None,
            ra.max_ulp if ra else None, rb.max_ulp if rb else None, check=key[0]))
    acc_a = {x.key: x for x in a.accuracy}
    acc_b = {x.key: x for x in b.accuracy}
    for akey in list(acc_a) + [k for k in acc_b if k not in acc_a]:
        xa, xb = acc_a.get(akey), acc_b.get(akey)
        out.cells.append(CellChange(
            "accuracy", akey[1], _status(xa.passed) if xa else None,
            _status(xb.passed) if xb else None, scope="accuracy", check=akey[0]))
    out.settings = _settings(a, b)
    return out
