"""Assertions for tests: bitwise equality with a diff a person can act on."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from invariance.batch import AttentionResult
from invariance.compare import TensorDiff, compare_bits

__all__ = ["assert_bitwise_equal"]

_Pair = AttentionResult | Sequence[torch.Tensor] | torch.Tensor


def _tensors(value: _Pair, what: str) -> list[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        return [("tensor", value)]
    if isinstance(value, AttentionResult):
        return [("out", value.out), ("lse", value.lse)]
    if isinstance(value, Sequence) and len(value) == 2 and all(
            isinstance(t, torch.Tensor) for t in value):
        return [("out", value[0]), ("lse", value[1])]
    raise TypeError(
        f"assert_bitwise_equal: {what}: expected a tensor, an AttentionResult or an (out, lse) "
        f"pair, got {type(value).__name__}"
    )


def assert_bitwise_equal(actual: _Pair, expected: _Pair, *, msg: str | None = None) -> None:
    """Assert that ``actual`` and ``expected`` have identical bits.

    Accepts two tensors, two :class:`AttentionResult`, or two ``(out, lse)`` pairs (both out and
    LSE are compared). Shapes and dtypes must match. On failure the ``AssertionError`` says, per
    tensor, how many elements differ, the largest absolute and ULP differences, NaN mismatches,
    and the first differing index with both values and their bits. ``+0.0`` vs ``-0.0`` and NaNs
    with different payloads count as differences (see :mod:`invariance.compare`).
    """
    __tracebackhide__ = True  # pytest shows the caller's line and this message, not our source
    a_parts = _tensors(actual, "actual")
    e_parts = _tensors(expected, "expected")
    if len(a_parts) != len(e_parts):
        raise AssertionError(
            f"cannot compare a {len(a_parts)}-tensor value with a {len(e_parts)}-tensor value")
    diffs: list[TensorDiff] = []
    problems: list[str] = []
    for (name, a), (_, e) in zip(a_parts, e_parts, strict=True):
        if a.shape != e.shape:
            problems.append(f"{name}: shape {tuple(a.shape)} != expected {tuple(e.shape)}")
            continue
        if a.dtype != e.dtype:
            problems.append(f"{name}: dtype {a.dtype} != expected {e.dtype}")
            continue
        dims: tuple[str, ...] | None = None
        if name == "out" and a.dim() == 3:
            dims = ("token", "head", "dim")
        elif name == "lse" and a.dim() == 2:
            dims = ("token", "head")
        d = compare_bits(a, e, name=name, dims=dims)
        if not d.equal:
            diffs.append(d)
    if problems or diffs:
        lines = [msg] if msg else []
        lines.append("tensors are not bitwise equal:")
        lines += [f"  {p}" for p in problems]
        lines += [f"  {d.summary()}" for d in diffs]
        raise AssertionError("\n".join(lines))
