"""AttentionBatch / AttentionResult validation: every error names the field, expected, actual."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from invariance import (
    AttentionBatch,
    AttentionResult,
    Chunk,
    HeadConfig,
    PageLayout,
    Request,
    Step,
    Workload,
    materialize,
)
from invariance.batch import as_result


def _batch(dtype: torch.dtype = torch.float32) -> AttentionBatch:
    wl = Workload((Request(0, 9), Request(1, 5)), HeadConfig(4, 2, 64), dtype)
    step = Step((Chunk(0, 6, 9), Chunk(1, 4, 5)))
    return materialize(wl, step, PageLayout(page_size=4), "cpu")


def _with(**changes: object) -> Callable[[AttentionBatch], AttentionBatch]:
    return lambda b: replace(b, **changes)  # type: ignore[arg-type]


CASES = [
    pytest.param(lambda b: replace(b, q=b.q[0]), "q: expected 3 dims", id="q-ndim"),
    pytest.param(lambda b: replace(b, q=b.q.double()), "q.dtype", id="q-dtype"),
    pytest.param(lambda b: replace(b, k_cache=b.k_cache.half()), "k_cache.dtype", id="k-dtype"),
    pytest.param(lambda b: replace(b, v_cache=b.v_cache[:, :2]), "v_cache: expected shape",
                 id="v-shape"),
    pytest.param(lambda b: replace(b, k_cache=b.k_cache[..., :32], v_cache=b.v_cache[..., :32]),
                 r"k_cache.shape\[3\]: expected head_dim 64", id="head-dim"),
    pytest.param(lambda b: replace(b, q=b.q[:, :3]), "multiple of Hkv=2", id="gqa"),
    pytest.param(lambda b: replace(b, k_cache=b.k_cache.to("meta"), v_cache=b.v_cache.to("meta")),
                 "k_cache.device", id="device"),
    pytest.param(lambda b: replace(b, kv_lens=b.kv_lens.long()), "kv_lens.dtype: expected "
                 "torch.int32", id="kv-lens-dtype"),
    pytest.param(lambda b: replace(b, cu_seqlens_q=b.cu_seqlens_q[:2]),
                 r"cu_seqlens_q.shape: expected \[3\]", id="cu-shape"),
    pytest.param(lambda b: replace(b, block_table=b.block_table[:1]),
                 r"block_table.shape\[0\]: expected 2", id="table-rows"),
    pytest.param(lambda b: replace(b, cu_seqlens_q=torch.tensor([1, 3, 4], dtype=torch.int32)),
                 r"cu_seqlens_q\[0\]: expected 0, got 1", id="cu-start"),
    pytest.param(lambda b: replace(b, cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int32)),
                 r"cu_seqlens_q\[-1\]: expected 4", id="cu-end"),
    pytest.param(lambda b: replace(b, q=torch.zeros(4, 4, 64),
                                   cu_seqlens_q=torch.tensor([0, 5, 4], dtype=torch.int32)),
                 r"cu_seqlens_q\[2\]: expected >= cu_seqlens_q\[1\]=5", id="cu-decreasing"),
    pytest.param(lambda b: replace(b, kv_lens=torch.tensor([2, 1], dtype=torch.int32)),
                 r"kv_lens\[0\]: expected >= q_len=3, got 2", id="kv-short"),
    pytest.param(lambda b: replace(b, kv_lens=torch.tensor([13, 1], dtype=torch.int32)),
                 r"kv_lens\[0\]: expected <= max_pages \* page_size = 12", id="kv-long"),
    pytest.param(lambda b: replace(b, block_table=torch.full_like(b.block_table, 99)),
                 r"block_table\[0, :3\]: expected page ids in \[0, 5\), got 99", id="page-oob"),
    pytest.param(lambda b: replace(b, block_table=torch.full_like(b.block_table, -1)),
                 r"page ids in \[0, 5\), got -1", id="page-negative"),
    pytest.param(lambda b: replace(b, sm_scale=0.0), "sm_scale: expected a finite positive float",
                 id="sm-scale"),
    pytest.param(lambda b: replace(b, request_ids=(1,)), "request_ids: expected 2 ids",
                 id="request-ids"),
]


@pytest.mark.parametrize(("mutate", "message"), CASES)
def test_validation_errors(mutate: Callable[[AttentionBatch], AttentionBatch],
                           message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mutate(_batch()).validate()


def test_valid_batch_passes_and_reports_sizes(dtype: torch.dtype) -> None:
    b = _batch(dtype).validate()
    assert (b.batch_size, b.num_tokens, b.num_q_heads, b.num_kv_heads, b.head_dim) == (2, 4, 4, 2,
                                                                                        64)
    assert b.page_size == 4 and b.q_lens() == [3, 1] and b.dtype == dtype


def test_unused_block_table_columns_are_not_validated() -> None:
    b = _batch()
    table = b.block_table.clone()
    table[1, 2:] = 10_000  # request 1 needs 2 pages; later columns are never read
    replace(b, block_table=table).validate()


def test_result_validation() -> None:
    b = _batch()
    good = (torch.zeros_like(b.q), torch.zeros(4, 4))
    assert isinstance(as_result(good, b), AttentionResult)
    with pytest.raises(ValueError, match=r"result.out.shape: expected \[4, 4, 64\]"):
        as_result((torch.zeros(3, 4, 64), torch.zeros(4, 4)), b)
    with pytest.raises(ValueError, match=r"result\.lse\.dtype: expected torch\.float32"):
        as_result((torch.zeros_like(b.q), torch.zeros(4, 4, dtype=torch.float64)), b)
    with pytest.raises(ValueError, match=r"result\.out\.dtype"):
        as_result((torch.zeros_like(b.q).half(), torch.zeros(4, 4)), b)
    with pytest.raises(TypeError, match="AttentionResult or an"):
        as_result(torch.zeros(1), b)
