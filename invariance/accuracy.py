"""Accuracy against the float64 reference: a backend returning zeros is perfectly invariant and
wrong, so every check also measures error (ARCHITECTURE.md, "Numerics contract").

Rows are picked from every schedule's output (evenly spread, the first and last rows and the last
row of each of its four longest requests included), recomputed in float64 from the request's own
content, and held to a bound derived from the dtype's unit roundoff ``u`` (2^-11 float16,
2^-8 bfloat16, 2^-24 float32; ``u32`` = 2^-24) and the row's own magnitudes:

- output, every element of row ``i`` (KV length ``L``, head ``h``)::

      |out - ref| <= (C_OUT * u + L * u32 + 4 * D * u32 * s_abs) * max_{j <= pos, d} |v[j, h, d]|

  (the output is a convex combination of V rows: rounding the probabilities and the output to
  the dtype costs a few ``u`` of the largest V entry; the fp32 sum over ``L`` keys at most
  ``L * u32``; an error ``e`` in a score is a relative error ``e`` of its probability, on both
  the numerator and the normalisation);
- LSE, every head::

      |lse - ref| <= C_LSE * u + L * u32 + 2 * D * u32 * s_abs,
      s_abs = sm_scale * max_{j <= pos} sum_d |q_d k_jd|

  (rounded probabilities in the denominator, its fp32 sum, and the fp32 dot products'
  error, which grows with the magnitude of the scores, e.g. for large-magnitude content);
- no NaN in a row whose reference is finite.

The worst error is reported as a ratio to this bound (``<= 1`` passes).

**Features** (``invariance.features``; the reference computes each exactly, in float64). Both
bounds are built from a *score error* ``e``: the LSE's error is at most the largest error of a
term of its sum, the output's at most twice that (numerator and normalisation), so::

    |out - ref| <= (C_OUT * u + L * u32 + 2 * e) * vmax,    |lse - ref| <= C_LSE * u + L * u32 + e
    e = max(2 * D * u32 * s_abs [+ terms below], 2 * |sink| * u32)

- **window**: ``L``, ``vmax`` and ``s_abs`` are taken over the keys the row sees,
  ``[max(0, pos - window), pos]`` (a window makes the bound tighter, never looser).
- **sinks**: the sink is one more term of the denominator (``L + 1``), a float32 logit whose
  only rounding is its conversion in the kernel's exponent (``sink * log2(e)``: ``2 |sink|
  u32``); it has no value vector, so ``vmax`` is unchanged. A dominant sink makes the output
  small, not less accurate in absolute terms.
- **softcap**: ``cap * tanh(s / cap)`` has slope at most 1, so the score's own error passes
  through undamped, plus the tanh's: ``+ cap * (TANH_ERR + 2 u32)`` with ``TANH_ERR = 2^-10``,
  the absolute error of a hardware tanh approximation (PTX ``tanh.approx.f32``, relative error
  ``2^-10.987``, which FlashInfer and FA3 use) with a factor 2 of margin, and two float32
  roundings (``s / cap``, ``cap * t``). ``s_abs`` is the score before the cap.
- **FP8 KV**: the reference attends over the same dequantized values ``float(fp8) * scale``
  (exact in float64), so the bound covers only the kernel's arithmetic. Converting an e4m3
  value to float16, bfloat16 or float32 is exact; the scale enters as one more float32
  product (on K or V, or folded into the softmax scale or the output: ``u32``-sized, within the
  terms above), and a kernel may round the scaled K and V to the query dtype before its matrix
  products (vLLM's Triton attention does): ``u * s_abs`` more score error and ``u * vmax`` more
  output error. ``s_abs`` and ``vmax`` are computed from the dequantized values, so a wrong
  scale is an error the bound does not hide.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from invariance.backends.reference import reference_rows
from invariance.features import Features
from invariance.report import AccuracyResult
from invariance.schedule import ScheduleOutput
from invariance.workload import Workload, dtype_name

__all__ = [
    "C_LSE",
    "C_OUT",
    "TANH_ERR",
    "TOLERANCES",
    "UNIT_ROUNDOFF",
    "AccuracyAccumulator",
    "accuracy_bound",
    "measure_accuracy",
]

#: Unit roundoff of each dtype (half the distance from 1 to the next number).
UNIT_ROUNDOFF: dict[torch.dtype, float] = {
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
    torch.float32: 2.0**-24,
}
U32 = 2.0**-24
#: Multiples of the unit roundoff allowed for the output (per unit of the largest V entry) and
#: for the LSE (see the module docstring).
C_OUT, C_LSE = 4.0, 2.0
#: Absolute error allowed of the soft-cap's tanh (a value in [-1, 1]): twice the relative error
#: bound of PTX ``tanh.approx.f32``, 2^-10.987 (module docstring, "softcap").
TANH_ERR = 2.0**-10

#: The dtype part of the bound, as ``(C_OUT * u, u32, C_LSE * u)``: what reports show as
#: ``atol`` (times max |v|), ``rtol`` (times L) and ``lse_atol``.
TOLERANCES: dict[torch.dtype, tuple[float, float, float]] = {
    dt: (C_OUT * u, U32, C_LSE * u) for dt, u in UNIT_ROUNDOFF.items()
}


#: Requests per schedule whose last (longest) row is always measured.
LONGEST = 4


def _picks(n: int, max_rows: int) -> list[int]:
    """``max_rows`` row indices spread evenly over ``[0, n)``, first and last included."""
    return sorted({round(i * (n - 1) / max(1, max_rows - 1)) for i in range(min(n, max_rows))})


def accuracy_bound(q: torch.Tensor, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   sm_scale: float, dtype: torch.dtype,
                   features: Features | None = None,
                   sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The bound of the module docstring for query rows ``q`` ``[n, Hq, D]`` at absolute
    positions ``pos`` ``[n]`` over a request's keys ``k, v`` ``[L, Hkv, D]`` (as the attention
    sees them: dequantized for an FP8 cache; row ``i`` sees ``[0, pos[i]]``, or its window)
    with ``features`` and the heads' ``sinks`` ``[Hq]``: ``(out_bound, lse_bound)``, each
    ``[n, Hq]`` float64 (the output bound applies to every element of the row)."""
    feats = features if features is not None else Features()
    c_out, u32, c_lse = TOLERANCES[dtype]
    u = UNIT_ROUNDOFF[dtype]
    G = q.shape[1] // k.shape[1]
    k64, v64 = k.to(torch.float64), v.to(torch.float64)
    keys = torch.arange(k.shape[0], device=q.device)
    visible = keys[None, :] <= pos[:, None]  # [n, L]
    if feats.window is not None:
        visible &= keys[None, :] >= (pos - feats.window)[:, None]
    # max |v| over the visible keys and dims, per KV head -> per query head  [n, Hq]
    vabs = v64.abs().amax(-1)  # [L, Hkv]
    vmax = (vabs[None] * visible[..., None]).amax(1).repeat_interleave(G, dim=1)
    # sm_scale * max_j sum_d |q_d k_jd| over the visible keys  [n, Hq]
    dots = torch.einsum("nhd,lhd->nhl", q.to(torch.float64).abs(),
                        k64.abs().repeat_interleave(G, dim=1))
    s_abs = sm_scale * dots.masked_fill(~visible[:, None, :], 0.0).amax(-1)
    L = visible.sum(1).to(torch.float64)[:, None]  # keys each row sees  [n, 1]
    score_err = 2 * q.shape[2] * u32 * s_abs  # fp32 dot products  [n, Hq]
    if feats.kv_dtype is not None:  # scaled K rounded to q's dtype, V likewise
        score_err = score_err + u * s_abs
        c_out += u
    if feats.softcap is not None:
        score_err = score_err + feats.softcap * (TANH_ERR + 2 * u32)
    if sinks is not None:
        L = L + 1
        sink_err = 2 * u32 * sinks.to(device=q.device, dtype=torch.float64).abs()[None, :]
        score_err = torch.maximum(score_err, sink_err)
    return (c_out + L * u32 + 2 * score_err) * vmax, c_lse + L * u32 + score_err


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
        """Measure up to ``max_rows`` rows of ``out`` spread evenly, plus the last (longest) row
        of the :data:`LONGEST` longest requests in it."""
        if not out.keys:
            return
        last: dict[int, int] = {}
        for i, (rid, _) in enumerate(out.keys):
            last[rid] = i
        longest = sorted(last.values(), key=lambda i: out.keys[i][1])[-LONGEST:]
        by_request: dict[int, list[int]] = {}
        for i in sorted(set(_picks(len(out.keys), max_rows)) | set(longest)):
            by_request.setdefault(out.keys[i][0], []).append(i)
        for rid, rows in by_request.items():
            self._add_request(workload, out, rid, rows)

    def _add_request(self, workload: Workload, out: ScheduleOutput, rid: int,
                     rows: list[int]) -> None:
        dev = out.out.device
        tokens = [out.keys[i][1] for i in rows]
        stop = max(tokens) + 1
        feats = workload.features
        k = workload.dequantized(rid, "k", 0, stop, dev)
        v = workload.dequantized(rid, "v", 0, stop, dev)
        q = torch.cat([workload.content(rid, "q", t, t + 1, dev) for t in tokens])
        sinks = workload.sinks(dev)
        ref_out, ref_lse = reference_rows(q, tokens, k, v, workload.sm_scale,
                                          window_left=feats.window_left, sinks=sinks,
                                          logits_soft_cap=feats.logits_soft_cap)
        pos = torch.tensor(tokens, device=dev)
        out_bound, lse_bound = accuracy_bound(q, pos, k, v, workload.sm_scale, self.dtype,
                                              feats, sinks)
        out_bound = out_bound.clamp(min=1e-12)[..., None]  # [n, Hq, 1]
        idx = torch.tensor(rows, device=dev)
        got_out = out.out[idx].to(torch.float64)
        got_lse = out.lse[idx].to(torch.float64)
        bad_rows = (~torch.isfinite(got_out).flatten(1).all(1)) | torch.isnan(got_lse).any(1)
        self.nan_rows += int(bad_rows.sum())
        err = (got_out - ref_out).abs()
        err = torch.where(torch.isnan(err), torch.full_like(err, float("inf")), err)
        self.max_abs_out = max(self.max_abs_out, float(err.max()))
        ratio = torch.where(err == 0, torch.zeros_like(err), err / out_bound)
        self.worst = max(self.worst, float(ratio.max()))
        finite_err = torch.where(torch.isinf(err), torch.zeros_like(err), err)
        self.err_sq += float((finite_err**2).sum())
        self.ref_sq += float((ref_out**2).sum())
        lse_err = torch.where(torch.isinf(ref_lse) & (got_lse == ref_lse),
                              torch.zeros_like(ref_lse), (got_lse - ref_lse).abs())
        lse_err = torch.where(torch.isnan(lse_err), torch.full_like(lse_err, float("inf")),
                              lse_err)
        self.max_abs_lse = max(self.max_abs_lse, float(lse_err.max()))
        self.worst = max(self.worst, float((lse_err / lse_bound).max()))
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


def measure_accuracy(workload: Workload, output: ScheduleOutput, *, rows: int = 16,
                     backend: str = "") -> AccuracyResult:
    """The accuracy verdict of one schedule's output (``run_schedule``'s result) against the
    float64 reference, with the bound of the module docstring."""
    acc = AccuracyAccumulator(workload.dtype)
    acc.add(workload, output, rows)
    return acc.result(backend)
