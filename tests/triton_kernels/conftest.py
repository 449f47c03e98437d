"""Shared set-up of the kernel tests: batches built by the harness, checks against one table.

Batches come from ``invariance.materialize`` (request content is a pure function of the request
and token, so the same row can be computed under many batches and compared bit for bit); accuracy
is judged against the float64 reference ``kernels.reference`` within the harness's one bound,
``invariance.accuracy.accuracy_bound``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from invariance import (
    AttentionBatch,
    Chunk,
    HeadConfig,
    PageLayout,
    Request,
    Step,
    Workload,
    compare_bits,
    materialize,
)
from invariance.accuracy import accuracy_bound
from kernels.reference import reference_attention

#: The smallest head configuration with a GQA group (2 query heads per KV head) and a supported
#: head dim: the interpreter's cost grows with every dimension.
HEADS = HeadConfig(4, 2, 64)

#: ``(q_len, kv_len)`` of each request of a step.
Shape = Sequence[tuple[int, int]]
BatchFactory = Callable[..., AttentionBatch]


def workload_and_step(dtype: torch.dtype, shape: Shape, heads: HeadConfig = HEADS,
                      seed: int = 0) -> tuple[Workload, Step]:
    """Request ``i`` has ``kv_len`` tokens; its chunk is its last ``q_len`` tokens."""
    requests = tuple(Request(i, kv) for i, (_, kv) in enumerate(shape))
    step = Step(tuple(Chunk(i, kv - q, kv) for i, (q, kv) in enumerate(shape)))
    return Workload(requests, heads, dtype, seed), step


@pytest.fixture(scope="session")
def make_batch(device: torch.device) -> BatchFactory:
    """``make_batch(dtype, shape, layout=PageLayout(16), heads=HEADS, seed=0)``: one step of the
    requests of ``shape``, materialised on the test device."""

    def make(dtype: torch.dtype, shape: Shape, layout: PageLayout | None = None,
             heads: HeadConfig = HEADS, seed: int = 0) -> AttentionBatch:
        workload, step = workload_and_step(dtype, shape, heads, seed)
        return materialize(workload, step, layout or PageLayout(16), device)

    return make


def kernel_args(batch: AttentionBatch) -> tuple[torch.Tensor, ...]:
    """The six tensors of ``kernels.unified_attention``, in order."""
    return (batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
            batch.block_table)


@pytest.fixture(scope="session")
def args_of() -> Callable[[AttentionBatch], tuple[torch.Tensor, ...]]:
    return kernel_args


def _bounds(args: Sequence[torch.Tensor], sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row error bounds ``[T, Hq]`` of out (per element) and lse: the harness's one bound,
    ``invariance.accuracy.accuracy_bound``, applied to each request of the batch."""
    q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table = args
    T, Hq, D = q.shape
    page_size, Hkv = k_cache.shape[1], k_cache.shape[2]
    out_bound = torch.zeros(T, Hq, dtype=torch.float64, device=q.device)
    lse_bound = torch.zeros(T, Hq, dtype=torch.float64, device=q.device)
    cu, kv = cu_seqlens_q.tolist(), kv_lens.tolist()
    for b, n in enumerate(kv):
        q0, q1 = cu[b], cu[b + 1]
        if q1 == q0 or n == 0:
            continue  # no rows, or rows attending to nothing: exact 0 / -inf expected
        pages = block_table[b, : -(-n // page_size)].long()
        k = k_cache[pages].reshape(-1, Hkv, D)[:n]
        v = v_cache[pages].reshape(-1, Hkv, D)[:n]
        pos = torch.arange(n - (q1 - q0), n, device=q.device)
        out_bound[q0:q1], lse_bound[q0:q1] = accuracy_bound(q[q0:q1], pos, k, v, sm_scale,
                                                            q.dtype)
    return out_bound, lse_bound


def _worst(err: torch.Tensor, bound: torch.Tensor, got: torch.Tensor,
           ref: torch.Tensor) -> str:
    i = tuple(int(x) for x in torch.nonzero(err == err.max())[0])
    return (f"worst at {i}: got {float(got[i])!r}, reference {float(ref[i])!r}, |error| "
            f"{float(err[i]):.3g} > bound {float(bound[i]):.3g}")


def _assert_accurate(out: torch.Tensor, lse: torch.Tensor, args: Sequence[torch.Tensor],
                     sm_scale: float | None = None) -> None:
    """``(out, lse)`` of ``unified_attention(*args, sm_scale=sm_scale)`` agree with the float64
    reference ``kernels.reference`` within the harness's bound (:func:`_bounds`); equal
    infinities agree, NaN never does."""
    q = args[0]
    scale = 1.0 / math.sqrt(q.shape[2]) if sm_scale is None else float(sm_scale)
    ref_out, ref_lse = reference_attention(*args, sm_scale=scale, out_dtype=torch.float64)
    out_bound, lse_bound = _bounds(args, scale)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert out.shape == q.shape and lse.shape == q.shape[:2]
    err = (out.double() - ref_out).abs().nan_to_num(math.inf)
    err = torch.where(out.double() == ref_out, 0.0, err)
    bound = out_bound[..., None].expand_as(err)
    assert bool((err <= bound).all()), "out: " + _worst(err, bound, out, ref_out)
    lse_err = (lse.double() - ref_lse).abs().nan_to_num(math.inf)
    lse_err = torch.where(lse.double() == ref_lse, 0.0, lse_err)
    assert bool((lse_err <= lse_bound).all()), "lse: " + _worst(lse_err, lse_bound, lse, ref_lse)


@pytest.fixture(scope="session")
def assert_accurate() -> Callable[..., None]:
    """``assert_accurate(out, lse, args, sm_scale=None)``: see :func:`_assert_accurate`."""
    return _assert_accurate


def _assert_same_bits(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], what: str) -> None:
    """Tensors ``a[i]`` and ``b[i]`` (``(out, lse)`` pairs, or any sequence) are bit-identical."""
    assert len(a) == len(b), f"{what}: {len(a)} vs {len(b)} tensors"
    names = ("out", "lse") if len(a) == 2 else [f"tensor {i}" for i in range(len(a))]
    for name, x, y in zip(names, a, b, strict=True):
        diff = compare_bits(x, y, name=name)
        assert diff.equal, f"{what}: {diff.summary()}"


@pytest.fixture(scope="session")
def assert_same_bits() -> Callable[..., None]:
    return _assert_same_bits


def _span(t: torch.Tensor) -> tuple[int, int]:
    """``[first byte, last byte + 1)`` of the elements of view ``t``."""
    if t.numel() == 0:
        return (0, 0)
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
    return (t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size())


@pytest.fixture(autouse=True)
def interpreter_bounds_check(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A memcheck for CPU runs: under the Triton interpreter, a kernel load or store (of a lane
    its mask keeps) outside every tensor passed to that launch fails the test. On a GPU,
    benchmarks/gpu_sanitize.sh runs compute-sanitizer instead. A no-op without the interpreter
    or where Triton's interpreter internals differ from the ones patched here (triton 3.x)."""
    from triton.runtime import interpreter as ti

    grid = getattr(ti, "GridExecutor", None)
    builder = getattr(ti, "InterpreterBuilder", None)
    names = ("_init_args_hst", "create_masked_load", "create_masked_store")
    if (os.environ.get("TRITON_INTERPRET", "0") in ("", "0") or grid is None or builder is None
            or not all(hasattr(grid if n.startswith("_") else builder, n) for n in names)):
        yield
        return
    spans: list[tuple[int, int]] = []
    init_args, load, store = grid._init_args_hst, builder.create_masked_load, \
        builder.create_masked_store

    def init_args_checked(self: Any, args: Any, kwargs: Any) -> Any:
        args_hst, kwargs_hst = init_args(self, args, kwargs)
        spans[:] = [_span(t) for t in [*args_hst, *kwargs_hst.values()]
                    if isinstance(t, torch.Tensor)]
        return args_hst, kwargs_hst

    def check(kind: str, ptrs: Any, mask: Any) -> None:
        size = np.dtype(ti._get_np_dtype(ptrs.get_element_ty())).itemsize
        addr = np.broadcast_to(ptrs.data, np.shape(mask.data))[np.asarray(mask.data, bool)]
        addr = addr.astype(np.int64)
        inside = np.zeros(addr.shape, dtype=bool)
        for lo, hi in spans:
            inside |= (addr >= lo) & (addr + size <= hi)
        if not inside.all():
            bad = int(addr[~inside][0])
            raise AssertionError(
                f"out-of-bounds {kind}: {int((~inside).sum())} lanes, first at {bad:#x}; the "
                f"launch's tensors span {[(hex(lo), hex(hi)) for lo, hi in spans]}")

    def load_checked(self: Any, ptrs: Any, mask: Any, *rest: Any) -> Any:
        check("load", ptrs, mask)
        return load(self, ptrs, mask, *rest)

    def store_checked(self: Any, ptrs: Any, value: Any, mask: Any, *rest: Any) -> Any:
        check("store", ptrs, mask)
        return store(self, ptrs, value, mask, *rest)

    monkeypatch.setattr(grid, "_init_args_hst", init_args_checked)
    monkeypatch.setattr(builder, "create_masked_load", load_checked)
    monkeypatch.setattr(builder, "create_masked_store", store_checked)
    yield
