"""Helpers to build paged attention batches from per-request content (kernel tests, benchmarks).

A :class:`RequestData` holds the q, k, v of every position of one request, generated from its
seed alone. A step item ``(request, q_start, q_end)`` asks for the query rows of positions
``[q_start, q_end)`` over ``kv_len = q_end`` keys. :func:`build_batch` lays a list of items out as
the kernels' tensor contract (``kernels/README.md``), with pages placed by a seeded permutation, so
the same (request, position) can be computed under many schedules and compared bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "LSE_TOLERANCE",
    "OUT_TOLERANCE",
    "Batch",
    "RequestData",
    "bits",
    "build_batch",
    "describe_bit_mismatch",
    "make_request",
]

# (atol, rtol) of out against the float64 reference: out is rounded to the dtype and, for half
# types, P is rounded to the dtype before P @ V.
OUT_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (2e-3, 4e-3),
    torch.bfloat16: (1.6e-2, 3e-2),
}
# lse only depends on the scores: exact products of the inputs, summed in fp32.
LSE_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (2e-5, 1e-5),
    torch.float16: (1e-4, 1e-5),
    torch.bfloat16: (1e-4, 1e-5),
}


@dataclass(frozen=True)
class RequestData:
    """Content of one request: q ``[L, Hq, D]``, k and v ``[L, Hkv, D]``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.q.shape[0])


def make_request(
    seed: int,
    length: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> RequestData:
    """Deterministic content for a request of ``length`` positions (standard normal, then cast)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(length, num_q_heads, head_dim, generator=g)
    k = torch.randn(length, num_kv_heads, head_dim, generator=g)
    v = torch.randn(length, num_kv_heads, head_dim, generator=g)
    return RequestData(q.to(device=device, dtype=dtype), k.to(device=device, dtype=dtype),
                       v.to(device=device, dtype=dtype))


@dataclass(frozen=True)
class Batch:
    """One attention call: the kernel arguments plus where each item's rows landed."""

    q: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor  # [num_pages, page_size, Hkv, D]
    v_cache: torch.Tensor  # [num_pages, page_size, Hkv, D]
    cu_seqlens_q: torch.Tensor  # [B + 1] int32
    kv_lens: torch.Tensor  # [B] int32
    block_table: torch.Tensor  # [B, max_pages] int32
    row_slices: tuple[slice, ...]  # rows of q belonging to each item

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.q, self.k_cache, self.v_cache, self.cu_seqlens_q, self.kv_lens,
                self.block_table)


def build_batch(
    items: list[tuple[RequestData, int, int]],
    page_size: int,
    *,
    seed: int = 0,
    extra_pages: int = 3,
    extra_columns: int = 0,
    fill: float = float("nan"),
) -> Batch:
    """Lay out ``items`` (request, q_start, q_end) as one paged batch.

    Physical pages are a seeded permutation (``seed``) with ``extra_pages`` unused pages; unused
    page slots and unused pages are filled with ``fill`` (NaN by default, so a kernel that reads
    past a request's KV length poisons its output). ``extra_columns`` adds block-table columns
    holding out-of-range page ids (-1), which must never be read.
    """
    if not items:
        raise ValueError("items: expected at least one item")
    first = items[0][0]
    D = first.q.shape[2]
    Hkv = first.k.shape[1]
    dtype, device = first.q.dtype, first.q.device
    pages_per = [(end + page_size - 1) // page_size for _, _, end in items]
    num_pages = sum(pages_per) + extra_pages
    max_pages = max([*pages_per, 1]) + extra_columns
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_pages, generator=g).tolist()
    k_cache = torch.full((num_pages, page_size, Hkv, D), fill, dtype=dtype, device=device)
    v_cache = torch.full_like(k_cache, fill)
    block_table = torch.full((len(items), max_pages), -1, dtype=torch.int32)
    q_parts, cu, kv = [], [0], []
    nxt = 0
    slices = []
    for b, (req, start, end) in enumerate(items):
        if not 0 <= start <= end <= req.length:
            raise ValueError(f"items[{b}]: expected 0 <= q_start <= q_end <= {req.length}, "
                             f"got ({start}, {end})")
        pages = perm[nxt:nxt + pages_per[b]]
        nxt += pages_per[b]
        block_table[b, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
        for i, p in enumerate(pages):
            lo, hi = i * page_size, min((i + 1) * page_size, end)
            k_cache[p, : hi - lo] = req.k[lo:hi]
            v_cache[p, : hi - lo] = req.v[lo:hi]
        q_parts.append(req.q[start:end])
        slices.append(slice(cu[-1], cu[-1] + end - start))
        cu.append(cu[-1] + end - start)
        kv.append(end)
    return Batch(
        q=torch.cat(q_parts).contiguous(),
        k_cache=k_cache,
        v_cache=v_cache,
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
        kv_lens=torch.tensor(kv, dtype=torch.int32, device=device),
        block_table=block_table.to(device),
        row_slices=tuple(slices),
    )


def bits(t: torch.Tensor) -> torch.Tensor:
    """Reinterpret a float tensor as integers of the same width (for bit-exact comparison)."""
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(width)


def describe_bit_mismatch(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """None if ``a`` and ``b`` are bit-identical, else a short description of the differences."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype differ: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
    diff = bits(a) != bits(b)
    if not bool(diff.any()):
        return None
    idx = tuple(int(i) for i in torch.nonzero(diff)[0])
    return (f"{int(diff.sum())} of {diff.numel()} elements differ; first at {idx}: "
            f"{a[idx].item()!r} vs {b[idx].item()!r}")
