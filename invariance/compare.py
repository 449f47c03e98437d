"""Bitwise comparison with diagnostics a person can act on.

Equality is decided on raw bits (``tensor.view(int dtype)``), never on float ``==``:

- ``+0.0`` and ``-0.0`` are *different* (their bits differ); they are 1 ULP apart.
- NaNs are equal only when their bit patterns are equal (same sign and payload); a NaN against
  any other value is a difference with an undefined ULP distance, counted in ``nan_mismatches``.
- ``inf`` equals ``inf`` of the same sign.

ULP distance is the distance between the two values on the monotonic integer line of the
format (``-0`` sits one step below ``+0``), so 1 ULP means adjacent representable numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from invariance.schedule import ScheduleOutput

__all__ = [
    "CaseComparison",
    "TensorDiff",
    "bits",
    "compare_bits",
    "compare_outputs",
    "compare_runs",
    "ulp_distance",
]

_INT_VIEW = {
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a floating tensor as a same-width integer tensor."""
    if t.dtype not in _INT_VIEW:
        raise ValueError(f"tensor dtype: expected one of {list(_INT_VIEW)}, got {t.dtype}")
    return t.contiguous().view(_INT_VIEW[t.dtype])


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """Map float bits to int64 keys that increase with the float value (-0 just below +0)."""
    b = bits(t).to(torch.int64)
    width = {torch.int16: 16, torch.int32: 32, torch.int64: 64}[_INT_VIEW[t.dtype]]
    if width == 64:
        magnitude = b & 0x7FFFFFFFFFFFFFFF
        return torch.where(b < 0, -magnitude - 1, b)
    b = b & ((1 << width) - 1)  # unsigned view
    sign = b >> (width - 1)
    magnitude = b & ((1 << (width - 1)) - 1)
    return torch.where(sign == 1, -magnitude - 1, magnitude)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Element-wise ULP distance (int64) between same-dtype tensors; meaningless where either is
    NaN (callers mask those)."""
    return (_ordered(a) - _ordered(b)).abs()


@dataclass
class TensorDiff:
    """How two tensors differ, bit for bit.

    ``first_index`` is the first differing element in row-major order, labelled by ``dims``
    (e.g. ``("request", "token", "head", "dim")``); ``first_values`` the two values there, as
    ``(actual, expected)`` floats with their bits in hex.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    num_elements: int
    num_different: int
    nan_mismatches: int
    max_abs_diff: float
    max_ulp: int
    first_index: dict[str, int] | None
    first_values: tuple[str, str] | None

    @property
    def equal(self) -> bool:
        return self.num_different == 0

    def summary(self) -> str:
        if self.equal:
            return f"{self.name}: {self.num_elements} elements bit-identical"
        text = (f"{self.name}: {self.num_different} of {self.num_elements} elements differ "
                f"(max |diff| {self.max_abs_diff:.3g}, max {self.max_ulp} ULP")
        if self.nan_mismatches:
            text += f", {self.nan_mismatches} NaN mismatches"
        text += ")"
        if self.first_index is not None and self.first_values is not None:
            where = ", ".join(f"{k}={v}" for k, v in self.first_index.items())
            text += (f"; first at {where}: {self.first_values[0]} vs {self.first_values[1]}")
        return text

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["first_values"] = list(self.first_values) if self.first_values else None
        if math.isinf(self.max_abs_diff) or math.isnan(self.max_abs_diff):
            d["max_abs_diff"] = str(self.max_abs_diff)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TensorDiff:
        d = dict(d)
        d["shape"] = tuple(d["shape"])
        d["max_abs_diff"] = float(d["max_abs_diff"])
        fv = d.get("first_values")
        d["first_values"] = tuple(fv) if fv else None
        return cls(**d)


def _fmt(x: torch.Tensor) -> str:
    value = float(x.to(torch.float64))
    width = x.element_size()
    raw = int(bits(x.reshape(1))[0]) & ((1 << (8 * width)) - 1)
    return f"{value!r} (0x{raw:0{2 * width}x})"


def compare_bits(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    name: str = "tensor",
    dims: Sequence[str] | None = None,
    row_labels: Sequence[Sequence[int]] | None = None,
) -> TensorDiff:
    """Compare two tensors bit for bit.

    ``dims`` names each dimension for the first-difference report. ``row_labels`` (optional)
    replaces the first dimension by a tuple of labels per row, e.g. ``(request, token)`` for row
    ``i`` of a per-token output; then ``dims`` must name those labels followed by the remaining
    dimensions.
    """
    if actual.shape != expected.shape:
        raise ValueError(
            f"{name}: shapes differ: actual {tuple(actual.shape)} vs expected "
            f"{tuple(expected.shape)}"
        )
    if actual.dtype != expected.dtype:
        raise ValueError(
            f"{name}: dtypes differ: actual {actual.dtype} vs expected {expected.dtype}"
        )
    a, e = actual.detach(), expected.detach().to(actual.device)
    diff_mask = bits(a) != bits(e)
    num_different = int(diff_mask.sum())
    n = a.numel()
    nan_mismatch = diff_mask & (torch.isnan(a) | torch.isnan(e))
    nan_count = int(nan_mismatch.sum())
    max_abs = 0.0
    max_ulp = 0
    first_index: dict[str, int] | None = None
    first_values: tuple[str, str] | None = None
    if num_different:
        numeric = diff_mask & ~nan_mismatch
        if bool(numeric.any()):
            a64, e64 = a.to(torch.float64), e.to(torch.float64)
            with torch.no_grad():
                absdiff = (a64 - e64).abs()[numeric]
                finite = absdiff[~torch.isnan(absdiff)]
                max_abs = float(finite.max()) if finite.numel() else float("inf")
                max_ulp = int(ulp_distance(a, e)[numeric].max())
        if nan_count:
            max_abs = max_abs or float("nan")
        flat = int(torch.nonzero(diff_mask.reshape(-1))[0, 0])
        idx = _unravel(flat, tuple(a.shape))
        names = list(dims) if dims is not None else [f"dim{i}" for i in range(a.dim())]
        if row_labels is not None:
            labels = list(row_labels[idx[0]])
            values = labels + list(idx[1:])
        else:
            values = list(idx)
        if len(names) != len(values):
            names = [f"dim{i}" for i in range(len(values))]
        first_index = dict(zip(names, values, strict=True))
        first_values = (_fmt(a.reshape(-1)[flat]), _fmt(e.reshape(-1)[flat]))
    return TensorDiff(
        name=name,
        shape=tuple(a.shape),
        dtype=str(a.dtype).removeprefix("torch."),
        num_elements=n,
        num_different=num_different,
        nan_mismatches=nan_count,
        max_abs_diff=max_abs,
        max_ulp=max_ulp,
        first_index=first_index,
        first_values=first_values,
    )


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for size in reversed(shape):
        out.append(flat % size)
        flat //= size
    return list(reversed(out))


#: One row of a schedule's output: ``(side, step)`` of the schedule (``"a"`` or ``"b"``; for a
#: re-run, ``"run"`` and ``"re-run"``) and the step (call) that computed it.
Source = tuple[str, int]


@dataclass
class CaseComparison:
    """Bitwise comparison of rows that must agree: every (request, token) two schedules both
    computed, and every row computed more than once within one schedule.

    Pair ``i`` compares two rows; ``keys[i]`` labels it (the (request, token) of its second
    row) and ``sources[i]`` says where its two rows come from (:data:`Source`): ``("a", s)``
    and ``("b", t)`` for a row both schedules computed; ``("b", s)`` and ``("b", t)`` for a row
    schedule b computed twice (a neighbour repeated in every step, two requests with one
    prompt), which differs only if the backend does not give one row the same bits in every
    batch. ``differing_rows`` are the indices of the pairs whose output row or LSE differs in
    any bit; ``out`` and ``lse`` compare the first rows of all pairs with their second rows."""

    keys: list[tuple[int, int]]
    out: TensorDiff
    lse: TensorDiff
    differing_rows: list[int]
    sources: list[tuple[Source, Source]] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return self.out.equal and self.lse.equal

    def differing_keys(self, request_id: int | None = None) -> list[tuple[int, int]]:
        """The differing (request, token) keys, of one request when given."""
        return [self.keys[i] for i in self.differing_rows
                if request_id is None or self.keys[i][0] == request_id]

    def first_differing_token(self, request_id: int) -> int | None:
        """The smallest differing token index of ``request_id``; ``None`` when none differs."""
        return min((t for _, t in self.differing_keys(request_id)), default=None)

    def within(self, i: int) -> str | None:
        """The schedule whose own two rows pair ``i`` compares (``"a"``, ``"b"``), or
        ``None`` when it compares rows of two schedules (or two runs)."""
        if not self.sources:
            return None
        (x, _), (y, _) = self.sources[i]
        return x if x == y else None

    def describe(self, i: int) -> str:
        """Pair ``i`` in words, e.g. ``request 3 token 7: schedule b's step 0 vs its step 2``."""
        rid, token = self.keys[i]
        head = f"request {rid} token {token}"
        if not self.sources:
            return head
        (x, sx), (y, sy) = self.sources[i]
        if x == y:
            return (f"{head} computed twice in schedule {x}, in steps {sx} and {sy}: one row, "
                    "two results")
        return f"{head}: schedule {x} step {sx} vs schedule {y} step {sy}"


def _pairs_compared(x_out: torch.Tensor, x_lse: torch.Tensor, y_out: torch.Tensor,
                    y_lse: torch.Tensor, keys: list[tuple[int, int]],
                    sources: list[tuple[Source, Source]]) -> CaseComparison:
    out = compare_bits(x_out, y_out, name="out", dims=("request", "token", "head", "dim"),
                       row_labels=keys)
    lse = compare_bits(x_lse, y_lse, name="lse", dims=("request", "token", "head"),
                       row_labels=keys)
    differing: list[int] = []
    if not (out.equal and lse.equal):
        row_diff = (bits(x_out) != bits(y_out)).flatten(1).any(1) | (
            bits(x_lse) != bits(y_lse)).any(1)
        differing = torch.nonzero(row_diff).flatten().tolist()
    return CaseComparison(keys, out, lse, differing, sources)


def compare_outputs(a: ScheduleOutput, b: ScheduleOutput, *,
                    request: int | None = None) -> CaseComparison:
    """Compare every row that must agree, bit for bit: each row both ``a`` and ``b`` computed
    (the first occurrence in ``a`` with the first in ``b``, in ``a``'s order), then each row
    computed again within ``a`` and within ``b`` with that schedule's first occurrence of it.

    Rows are matched by origin (:meth:`ScheduleOutput.origin_of`): a token of a request that
    repeats another's prompt matches the prompt's row. Every occurrence is thus compared with
    every other, through the first ones. ``request``: only the pairs labelled with that
    request."""
    first: dict[str, dict[tuple[int, int], int]] = {"a": {}, "b": {}}
    for side, o in (("a", a), ("b", b)):
        for i in range(len(o.keys)):
            first[side].setdefault(o.origin_of(i), i)
    outputs = {"a": a, "b": b}
    pairs: list[tuple[tuple[int, int], str, int, str, int]] = [
        (a.keys[i], "a", i, "b", first["b"][origin])
        for origin, i in first["a"].items() if origin in first["b"]]
    for side, o in (("a", a), ("b", b)):
        pairs += [(o.keys[i], side, first[side][o.origin_of(i)], side, i)
                  for i in range(len(o.keys)) if first[side][o.origin_of(i)] != i]
    if request is not None:
        pairs = [p for p in pairs if p[0][0] == request]
    dev = a.out.device
    # Both schedules' rows in one tensor: a's rows, then b's.
    offset = {"a": 0, "b": len(a.keys)}
    all_out = torch.cat([a.out, b.out.to(dev)])
    all_lse = torch.cat([a.lse, b.lse.to(dev)])
    ix = torch.tensor([offset[p[1]] + p[2] for p in pairs], dtype=torch.long, device=dev)
    iy = torch.tensor([offset[p[3]] + p[4] for p in pairs], dtype=torch.long, device=dev)
    sources = [((sx, outputs[sx].step_of(i)), (sy, outputs[sy].step_of(j)))
               for _, sx, i, sy, j in pairs]
    return _pairs_compared(all_out[ix], all_lse[ix], all_out[iy], all_lse[iy],
                           [p[0] for p in pairs], sources)


def compare_runs(first: ScheduleOutput, again: ScheduleOutput) -> CaseComparison:
    """Compare two runs of one schedule occurrence by occurrence: row ``i`` of ``first`` (a
    (request, token, step)) with row ``i`` of ``again``. ``ValueError`` when the runs did not
    compute the same occurrences."""
    occurrences = [(k, first.step_of(i)) for i, k in enumerate(first.keys)]
    if occurrences != [(k, again.step_of(i)) for i, k in enumerate(again.keys)]:
        raise ValueError("compare_runs: expected two runs of one schedule (the same (request, "
                         "token, step) occurrences in the same order), got different rows")
    dev = first.out.device
    sources = [(("run", s), ("re-run", s)) for _, s in occurrences]
    return _pairs_compared(first.out, first.lse, again.out.to(dev), again.lse.to(dev),
                           list(first.keys), sources)
