"""Materialising steps: K/V land where the block table says, whatever the layout."""

from __future__ import annotations

import pytest
import torch

from invariance import (
    Chunk,
    HeadConfig,
    PageLayout,
    Request,
    Schedule,
    Step,
    Workload,
    materialize,
    run_schedule,
)
from invariance.backends.reference import gather_kv, reference_backend

LAYOUTS = [
    pytest.param(PageLayout(page_size=1), id="page1"),
    pytest.param(PageLayout(page_size=4, placement="shuffled", seed=3), id="shuffled"),
    pytest.param(PageLayout(page_size=4, placement="reversed", extra_pages=3), id="reversed"),
    pytest.param(PageLayout(page_size=2, placement="interleaved", extra_pages=2), id="interleaved"),
    pytest.param(PageLayout(page_size=8, extra_pages=5, extra_columns=3, fill="nan"), id="nan"),
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gathered_kv_equals_request_content(layout: PageLayout, dtype: torch.dtype) -> None:
    wl = Workload((Request(0, 13), Request(1, 1), Request(2, 0), Request(3, 6)),
                  HeadConfig(4, 2, 64), dtype, seed=5)
    step = Step((Chunk(0, 10, 13), Chunk(1, 0, 1), Chunk(2, 0, 0), Chunk(3, 6, 6)))
    batch = materialize(wl, step, layout, "cpu").validate()
    assert batch.q_lens() == [3, 1, 0, 0]
    assert batch.kv_lens.tolist() == [13, 1, 0, 6]
    for b, c in enumerate(step.chunks):
        k, v = gather_kv(batch, b)
        assert torch.equal(k, wl.content(c.request_id, "k", 0, c.stop, "cpu"))
        assert torch.equal(v, wl.content(c.request_id, "v", 0, c.stop, "cpu"))
    assert torch.equal(batch.q, torch.cat([wl.content(0, "q", 10, 13, "cpu"),
                                           wl.content(1, "q", 0, 1, "cpu")]))
    used = {int(p) for b, c in enumerate(step.chunks)
            for p in batch.block_table[b, : -(-c.stop // layout.page_size)]}
    assert len(used) == sum(-(-c.stop // layout.page_size) for c in step.chunks)  # no sharing
    if layout.fill == "nan":
        pad_page = batch.k_cache.shape[0] - 1
        assert pad_page not in used
        assert bool(torch.isnan(batch.k_cache[pad_page]).all())
        assert int(batch.block_table[1, 1]) == pad_page  # unused columns point at the NaN page


def test_chunk_validation_and_words() -> None:
    with pytest.raises(ValueError, match="0 <= start <= stop"):
        Chunk(0, 5, 4)
    assert "decode of token 9" in Chunk(1, 9, 10).describe()
    assert "prefill of tokens 0..4" in Chunk(1, 0, 5).describe()
    assert "no query token" in Chunk(1, 3, 3).describe()


def test_chunk_beyond_request_length_is_rejected() -> None:
    wl = Workload((Request(0, 4),))
    with pytest.raises(ValueError, match="exceeds request 0's length 4"):
        materialize(wl, Step((Chunk(0, 0, 5),)), PageLayout(), "cpu")


def test_layout_validation() -> None:
    with pytest.raises(ValueError, match="page_size"):
        PageLayout(page_size=0)
    with pytest.raises(ValueError, match="placement"):
        PageLayout(placement="random")  # type: ignore[arg-type]


def test_run_schedule_collects_rows_and_skips_padding() -> None:
    wl = Workload((Request(0, 6), Request(1, 3, padding=True)), HeadConfig(4, 2, 64))
    schedule = Schedule((Step((Chunk(0, 0, 4), Chunk(1, 0, 3))), Step((Chunk(0, 4, 6),))),
                        PageLayout(page_size=2))
    out = run_schedule(reference_backend, wl, schedule, "cpu")
    assert out.keys == [(0, t) for t in range(6)]
    assert out.out.shape == (6, 4, 64) and out.lse.shape == (6, 4)
    words = schedule.describe()
    assert "one call of 2 requests" in words and "; then request 0 prefill" in words
    assert "page size 2" in words


def test_shared_prefix_page_keeps_the_longer_sharers_tokens() -> None:
    # A child sharing the parent's prompt ends mid-page (20 of a 16-token page pair): writing
    # whole pages would overwrite the parent's tokens 20..31 on the shared page with fill.
    wl = Workload((Request(0, 40), Request(1, 36, prefix=(0, 32))), HeadConfig(2, 1, 16),
                  torch.float32, seed=3)
    step = Step((Chunk(0, 39, 40), Chunk(1, 19, 20)))  # parent written first, then the child
    batch = materialize(wl, step, PageLayout(page_size=16, share_prefix=True, fill="nan"), "cpu")
    assert batch.block_table[1, :2].tolist() == batch.block_table[0, :2].tolist()  # shared
    for b, (rid, n) in enumerate(((0, 40), (1, 20))):
        k, v = gather_kv(batch, b, n)
        assert torch.equal(k, wl.content(rid, "k", 0, n, torch.device("cpu")))
        assert torch.equal(v, wl.content(rid, "v", 0, n, torch.device("cpu")))
