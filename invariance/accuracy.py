"""Accuracy against the float64 reference: a backend returning zeros is perfectly invariant and
wrong, so every check also measures error (ARCHITECTURE.md, "Numerics contract").

Rows are picked from a schedule's output, recomputed in float64 from the request's own content,
and every element must satisfy ``|out - ref| <= atol + rtol * |ref|`` and every LSE
``|lse - ref| <= lse_atol``, with no NaN row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from invariance.backends.reference import reference_rows
from invariance.report import AccuracyResult
from invariance.schedule import ScheduleOutput
from invariance.workload import Workload, dtype_name

__all__ = ["TOLERANCES", "AccuracyAccumulator"]

#: Accuracy tolerance per dtype: ``(atol, rtol)`` on outputs and ``lse_atol`` on the LSE.
#: Float32 is held to float32 arithmetic (TF32 dots do not pass); fp16/bf16 allow rounding of
#: the output and of the probabilities fed to the PV product.
TOLERANCES: dict[torch.dtype, tuple[float, float, float]] = {
    torch.float32: (1e-4, 1e-4, 1e-4),
    torch.float16: (2e-3, 4e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 3.2e-2, 1e-3),
}


def _picks(n: int, max_rows: int) -> list[int]:
    """``max_rows`` row indices spread evenly over ``[0, n)``, first and last included."""
    return sorted({round(i * (n - 1) / max(1, max_rows - 1)) for i in range(min(n, max_rows))})


@dataclass
class AccuracyAccumulator:
    """Running worst-case error of one (backend, dtype) over the rows measured so far."""

    dtype: torch.dtype
    rows: int = 0
    max_abs_out: float = 0.0
    max_abs_lse: float = 0.0
    worst: float = 0.0
    err_sq: float = 0.0
    ref_sq: float = 0.0
    nan_rows: int = 0

    def add(self, workload: Workload, out: ScheduleOutput, max_rows: int) -> None:
        """Measure up to ``max_rows`` rows of ``out`` (evenly spread, first and last included)."""
        if not out.keys:
            return
        by_request: dict[int, list[int]] = {}
        for i in _picks(len(out.keys), max_rows):
            by_request.setdefault(out.keys[i][0], []).append(i)
        for rid, rows in by_request.items():
            self._add_request(workload, out, rid, rows)

    def _add_request(self, workload: Workload, out: ScheduleOutput, rid: int,
                     rows: list[int]) -> None:
        atol, rtol, lse_atol = TOLERANCES[self.dtype]
        dev = out.out.device
        tokens = [out.keys[i][1] for i in rows]
        stop = max(tokens) + 1
        k = workload.content(rid, "k", 0, stop, dev)
        v = workload.content(rid, "v", 0, stop, dev)
        q = torch.cat([workload.content(rid, "q", t, t + 1, dev) for t in tokens])
        ref_out, ref_lse = reference_rows(q, tokens, k, v, workload.sm_scale)
        idx = torch.tensor(rows, device=dev)
        got_out = out.out[idx].to(torch.float64)
        got_lse = out.lse[idx].to(torch.float64)
        bad_rows = (~torch.isfinite(got_out).flatten(1).all(1)) | torch.isnan(got_lse).any(1)
        self.nan_rows += int(bad_rows.sum())
        err = (got_out - ref_out).abs()
        err = torch.where(torch.isnan(err), torch.full_like(err, float("inf")), err)
        self.max_abs_out = max(self.max_abs_out, float(err.max()))
        self.worst = max(self.worst, float((err / (atol + rtol * ref_out.abs())).max()))
        finite_err = torch.where(torch.isinf(err), torch.zeros_like(err), err)
        self.err_sq += float((finite_err**2).sum())
        self.ref_sq += float((ref_out**2).sum())
        lse_err = torch.where(torch.isinf(ref_lse) & (got_lse == ref_lse),
                              torch.zeros_like(ref_lse), (got_lse - ref_lse).abs())
        lse_err = torch.where(torch.isnan(lse_err), torch.full_like(lse_err, float("inf")),
                              lse_err)
        self.max_abs_lse = max(self.max_abs_lse, float(lse_err.max()))
        self.worst = max(self.worst, float(lse_err.max()) / lse_atol)
        self.rows += len(rows)

    def result(self, backend: str) -> AccuracyResult:
        """The verdict: passes when no row is NaN and the worst error is within tolerance."""
        atol, rtol, lse_atol = TOLERANCES[self.dtype]
        rel = (self.err_sq / self.ref_sq) ** 0.5 if self.ref_sq else 0.0
        return AccuracyResult(
            backend=backend, dtype=dtype_name(self.dtype), rows=self.rows,
            max_abs_err_out=self.max_abs_out, rel_err_out=rel, max_abs_err_lse=self.max_abs_lse,
            worst_ratio=self.worst, atol=atol, rtol=rtol, lse_atol=lse_atol,
            nan_rows=self.nan_rows, passed=self.nan_rows == 0 and self.worst <= 1.0,
        )
