"""The Gluon kernels (kernels/_gluon) against the Triton kernels they replace, bit for bit, at
both tile widths: the 128-key contract's fused and split kernels (the default on Hopper) and the
64-key prefill tile (``Tuning(block_n=64)``). Prompts, chunks and decode rows in one batch,
several GQA groups, page sizes and placements, split sizes down to one tile (many folds), NaN in
every unused cache slot and block-table column, both slot orders, CUDA-graph capture. Gluon has
no CPU interpreter: these run on a Hopper GPU with Triton 3.6 only and skip elsewhere (the plan
rules are tested on CPU in test_plans.py)."""

from __future__ import annotations

import pytest
import torch

import kernels._device
import kernels.launch
import kernels.plan
from invariance import HeadConfig, PageLayout
from kernels import Tuning, plan_attention, unified_attention


def _gluon_here() -> bool:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        return False
    from kernels import _gluon

    return _gluon.available()


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _gluon_here(),
                                 reason="needs a Hopper GPU and Triton 3.6 (Gluon)")]

GLUON, TRITON = Tuning(gluon=True), Tuning(gluon=False)
#: The 64-key contract (the earlier Gluon prefill tile: CHANGELOG.md) and the 128-key default.
NARROW = {"gluon": Tuning(gluon=True, block_n=64), "triton": Tuning(gluon=False, block_n=64)}
# Prompts longer than a split, a chunk after a long context, decode rows and a short prompt: the
# blocks' first tiles unmasked, their diagonal tiles masked, last pages partly filled.
SHAPE = [(1500, 1500), (300, 2600), (1, 3000), (1, 777), (130, 130), (17, 1049)]
HEADS = {"g4": HeadConfig(32, 8, 128), "g8": HeadConfig(16, 2, 128),
         "g1": HeadConfig(4, 4, 128), "g3": HeadConfig(12, 4, 128),
         "g16": HeadConfig(32, 2, 128)}
LAYOUTS = {
    "p16": PageLayout(16, "shuffled", extra_pages=7, extra_columns=5, fill="nan", seed=3),
    "p32": PageLayout(32, "interleaved", extra_columns=2, fill="nan"),
    "p64": PageLayout(64, "reversed", extra_pages=2, fill="nan"),
    "p256": PageLayout(256, "shuffled", extra_columns=1, fill="nan", seed=5),
}


def _half(dtype: torch.dtype) -> None:
    if dtype == torch.float32:
        pytest.skip("the Gluon kernel serves half precision only (float32 runs FMA dots)")


def _both(args, plan="fused", **kw):
    lp = plan_attention(*args, plan=plan, tuning=GLUON, **kw)
    assert lp.gluon and lp.block_m == 128 and lp.num_warps == 8 and lp.block_n == 128
    gluon = unified_attention(*args, plan=plan, tuning=GLUON, **kw)
    triton = unified_attention(*args, plan=plan, tuning=TRITON, **kw)
    return gluon, triton


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("split", [1024, 384, 128])
def test_gluon_gives_the_triton_kernels_bits(dtype, make_batch, args_of, assert_same_bits,
                                             assert_accurate, layout: str, split: int) -> None:
    # At 128 keys, in both plans: the Gluon fused and split kernels, the Triton fused and split
    # kernels, all one set of bits.
    _half(dtype)
    batch = make_batch(dtype, SHAPE, LAYOUTS[layout], HEADS["g4"])
    gluon, triton = _both(args_of(batch), split_size=split)
    assert_same_bits(gluon, triton, f"Gluon vs Triton fused kernel ({layout}, split {split})")
    assert_accurate(*gluon, args_of(batch))
    if layout != "p16" or split != 384:
        return  # the split plan on one layout and split size (each kernel compiles per shape)
    g, t = _both(args_of(batch), plan="split", split_size=split)
    assert_same_bits(g, gluon, f"Gluon split plan vs Gluon fused ({layout}, split {split})")
    assert_same_bits(t, gluon, f"Triton split plan vs Gluon fused ({layout}, split {split})")


@pytest.mark.parametrize("split", [1024, 192, 64])
def test_the_64_key_gluon_tile_gives_the_triton_kernels_bits(dtype, make_batch, args_of,
                                                             assert_same_bits, assert_accurate,
                                                             split: int) -> None:
    # The 64-key contract (Tuning(block_n=64)): the prefill tile against the Triton fused kernel
    # and the split plan (the earlier default: CHANGELOG.md).
    _half(dtype)
    batch = make_batch(dtype, SHAPE, LAYOUTS["p16"], HEADS["g4"])
    args = args_of(batch)
    lp = plan_attention(*args, plan="fused", tuning=NARROW["gluon"], split_size=split)
    assert lp.gluon and lp.block_n == 64
    gluon = unified_attention(*args, plan="fused", tuning=NARROW["gluon"], split_size=split)
    for plan in ("fused", "split"):
        triton = unified_attention(*args, plan=plan, tuning=NARROW["triton"], split_size=split)
        assert_same_bits(gluon, triton, f"64-key Gluon vs Triton {plan} (split {split})")
    assert_accurate(*gluon, args)


@pytest.mark.parametrize("heads", sorted(HEADS))
def test_gluon_gives_the_triton_kernels_bits_for_every_group(dtype, make_batch, args_of,
                                                             assert_same_bits,
                                                             heads: str) -> None:
    _half(dtype)
    batch = make_batch(dtype, SHAPE, LAYOUTS["p16"], HEADS[heads])
    for slot_order in (False, True):
        args = args_of(batch)
        kw = dict(split_size=256)
        gluon = unified_attention(*args, plan="fused", tuning=Tuning(gluon=True,
                                  slot_order=slot_order), **kw)
        triton = unified_attention(*args, plan="fused", tuning=Tuning(gluon=False,
                                   slot_order=slot_order), **kw)
        assert_same_bits(gluon, triton, f"Gluon vs Triton ({heads}, slot order {slot_order})")
    split = unified_attention(*args, plan="split", tuning=GLUON, split_size=256)
    assert_same_bits(split, gluon, f"Gluon split vs fused plan ({heads})")


def test_the_comparison_sees_a_different_split(dtype, make_batch, args_of) -> None:
    # The control of the tests above: the Gluon kernel at two split sizes differs in some bit,
    # so a bit comparison of two kernels that reduce in different orders fails.
    _half(dtype)
    batch = make_batch(dtype, SHAPE, LAYOUTS["p16"], HEADS["g4"])
    a = unified_attention(*args_of(batch), plan="fused", tuning=GLUON, split_size=128)
    b = unified_attention(*args_of(batch), plan="fused", tuning=GLUON, split_size=1024)
    assert not torch.equal(a[0].view(torch.int16), b[0].view(torch.int16))
    # ... and so does the tile width: the 64-key tile's bits are not the 128-key tile's.
    c = unified_attention(*args_of(batch), plan="fused", tuning=NARROW["gluon"])
    assert not torch.equal(c[0].view(torch.int16), b[0].view(torch.int16))


def _replayed(args, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """``unified_attention(*args, **kw)`` captured in a CUDA graph (compiled outside it), its
    outputs filled with NaN, then replayed: what the replay wrote."""
    unified_attention(*args, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = unified_attention(*args, **kw)
    captured[0].fill_(float("nan"))
    captured[1].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return captured


@pytest.mark.parametrize("plan", ["fused", "split"])
def test_gluon_under_cuda_graph_capture(dtype, make_batch, args_of, assert_same_bits,
                                        plan: str) -> None:
    # Unchecked (validate=False) and captured: the descriptors are built on the host from shapes
    # and pointers, so the replay gives the eager launch's bits.
    _half(dtype)
    batch = make_batch(dtype, SHAPE, LAYOUTS["p16"], HEADS["g4"])
    args = args_of(batch)
    eager = unified_attention(*args, plan=plan, tuning=GLUON)
    assert_same_bits(_replayed(args, plan=plan, tuning=GLUON, validate=False), eager,
                     "CUDA-graph replay vs eager (Gluon)")


def test_auto_takes_gluon_in_both_plans_at_128_keys(dtype, make_batch, args_of,
                                                    assert_same_bits) -> None:
    _half(dtype)
    prefill = make_batch(dtype, SHAPE, LAYOUTS["p16"], HEADS["g4"])
    decode = make_batch(dtype, [(1, 900)] * 8, LAYOUTS["p16"], HEADS["g4"])
    for batch in (prefill, decode):
        for plan in ("auto", "fused", "split"):
            assert plan_attention(*args_of(batch), plan=plan).gluon
        assert not plan_attention(*args_of(batch), plan="fused", tuning=TRITON).gluon
    # One split per row (900 tokens, one split size): the Gluon split kernel stores the result
    # itself (IS_DIRECT), with the bits of the merged and the fused paths.
    args = args_of(decode)
    lp = plan_attention(*args, plan="split", **ONE_SIZE)
    assert lp.gluon and lp.num_splits == 1
    direct = unified_attention(*args, plan="split", **ONE_SIZE)
    for plan, tuning in (("fused", GLUON), ("split", TRITON), ("fused", TRITON)):
        assert_same_bits(unified_attention(*args, plan=plan, tuning=tuning, **ONE_SIZE), direct,
                         f"Gluon split, one split per row, vs {plan} {tuning}")
    merged = unified_attention(*args, plan="split", split_size=256)
    assert plan_attention(*args, plan="split", split_size=256).num_splits > 1
    # The control: another split size differs in some bit of out or lse.
    assert not (torch.equal(merged[0].view(torch.int16), direct[0].view(torch.int16))
                and torch.equal(merged[1].view(torch.int32), direct[1].view(torch.int32)))
    # At 64 keys only prefill-like batches take the Gluon prefill tile.
    assert plan_attention(*args_of(prefill), plan="fused", tuning=Tuning(block_n=64)).gluon
    assert not plan_attention(*args_of(decode), plan="fused", tuning=Tuning(block_n=64)).gluon
    # Pages of 8 tokens: the Triton kernels at 128 keys, the Gluon kernels' bits.
    small = make_batch(dtype, SHAPE, PageLayout(8, "shuffled", fill="nan", seed=2), HEADS["g4"])
    assert not plan_attention(*args_of(small), plan="fused").gluon
    with pytest.raises(ValueError, match="page_size 8"):
        unified_attention(*args_of(small), plan="fused", tuning=GLUON)
    assert_same_bits(unified_attention(*args_of(small)), unified_attention(*args_of(prefill)),
                     "Triton on 8-token pages vs Gluon on 16-token pages")


def test_gluon_at_tile_multiples_next_to_nan_pages(dtype, make_batch, args_of,
                                                   assert_same_bits) -> None:
    # KV lengths on 64- and 128-key tile boundaries and one past them (no V tail to zero, or
    # one row), NaN in the pages after them.
    _half(dtype)
    shape = [(64, 128), (1, 192), (128, 128), (65, 257), (200, 1024), (1, 256), (3, 129)]
    batch = make_batch(dtype, shape, LAYOUTS["p16"], HEADS["g4"])
    for plan in ("fused", "split"):
        gluon, triton = _both(args_of(batch), plan=plan, split_size=128)
        assert_same_bits(gluon, triton, f"Gluon vs Triton at tile multiples ({plan})")


def test_gluon_with_a_strided_q_and_unchecked_lengths(dtype, make_batch, args_of,
                                                      assert_same_bits) -> None:
    # q as a view of a fused qkv projection (row stride 3 * Hq * D), and validate=False.
    _half(dtype)
    batch = make_batch(dtype, SHAPE, LAYOUTS["p16"], HEADS["g4"])
    q, *rest = args_of(batch)
    qkv = torch.zeros(q.shape[0], 3 * q.shape[1], q.shape[2], dtype=q.dtype, device=q.device)
    qkv[:, : q.shape[1]] = q
    view = qkv[:, : q.shape[1]]
    assert view.stride(0) == 3 * q.shape[1] * q.shape[2]
    gluon, triton = _both((view, *rest))
    assert_same_bits(gluon, triton, "Gluon vs Triton with a strided q")
    unchecked = unified_attention(view, *rest, plan="fused", tuning=GLUON, validate=False)
    assert_same_bits(unchecked, gluon, "Gluon with validate=False vs validate=True")


def test_a_misaligned_cache_runs_the_triton_kernel(dtype, make_batch, args_of,
                                                   assert_same_bits) -> None:
    # Caches starting 2 bytes past an aligned address cannot be read by TMA: the plan takes the
    # Triton kernel, whose bits equal the Gluon kernel's on an aligned copy.
    _half(dtype)
    batch = make_batch(dtype, SHAPE, LAYOUTS["p16"], HEADS["g4"])
    q, k, v, *rest = args_of(batch)

    def shifted(c: torch.Tensor) -> torch.Tensor:
        flat = torch.empty(c.numel() + 1, dtype=c.dtype, device=c.device)
        out = flat[1:].view(c.shape)
        out.copy_(c)
        return out

    k2, v2 = shifted(k), shifted(v)
    assert k2.data_ptr() % 16 != 0
    assert not plan_attention(q, k2, v2, *rest, plan="fused").gluon
    with pytest.raises(ValueError, match="16-byte aligned"):
        unified_attention(q, k2, v2, *rest, plan="fused", tuning=GLUON)
    aligned = unified_attention(q, k, v, *rest, plan="fused", tuning=GLUON)
    assert_same_bits(unified_attention(q, k2, v2, *rest, plan="fused"), aligned,
                     "Triton on a misaligned cache vs Gluon on an aligned one")


@pytest.mark.parametrize("value_blocks", [2, 4])
@pytest.mark.parametrize("layout", ["p16", "p64"])
def test_gluon_value_blocks_give_the_same_bits(dtype, make_batch, args_of, assert_same_bits,
                                               layout: str, value_blocks: int) -> None:
    # Several splits per row (256 tokens: rows of 1-12 splits, the last one partial, NaN in
    # every unused slot): each program's share of V's columns changes the schedule, not the
    # bits. Then one split per row (decode at 1024 tokens: the direct store).
    _half(dtype)
    batch = make_batch(dtype, SHAPE, LAYOUTS[layout], HEADS["g4"])
    args = args_of(batch)
    tuning = Tuning(gluon=True, value_blocks=value_blocks)
    lp = plan_attention(*args, plan="split", split_size=256, tuning=tuning)
    assert lp.gluon and lp.num_splits > 1 and lp.value_blocks == value_blocks
    got = unified_attention(*args, plan="split", split_size=256, tuning=tuning)
    ref = unified_attention(*args, plan="split", split_size=256,
                            tuning=Tuning(gluon=True, value_blocks=1))
    assert_same_bits(got, ref, f"Gluon split, {value_blocks} V blocks vs 1")
    assert_same_bits(got, unified_attention(*args, plan="fused", split_size=256, tuning=GLUON),
                     f"Gluon split, {value_blocks} V blocks vs Gluon fused")
    decode = make_batch(dtype, [(1, 777), (1, 1024), (1, 130), (1, 1)], LAYOUTS[layout],
                        HEADS["g4"])
    args = args_of(decode)
    lp = plan_attention(*args, plan="split", tuning=tuning, **ONE_SIZE)
    assert lp.gluon and lp.num_splits == 1 and lp.value_blocks == value_blocks
    fused = unified_attention(*args, plan="fused", tuning=GLUON, **ONE_SIZE)
    assert_same_bits(unified_attention(*args, plan="split", tuning=tuning, **ONE_SIZE), fused,
                     f"Gluon split, {value_blocks} V blocks, one split per row, vs fused")
    # On the 128-row tile without a block count the rule picks it: 4 decode rows on 8 KV heads
    # are 32 programs at one split size, 4 blocks on an H100's 132 SMs. (Without any Tuning a
    # decode batch takes the keys-as-rows tile: test_keys_rows_tile_gives_the_same_bits.)
    lp = plan_attention(*args, plan="split", tuning=Tuning(keys_rows=False), **ONE_SIZE)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert not lp.keys_rows and lp.value_blocks == (4 if sms >= 32 * 4 else 1)
    assert_same_bits(unified_attention(*args, plan="split", tuning=Tuning(keys_rows=False),
                                       **ONE_SIZE),
                     fused, f"Gluon split, the rule's {lp.value_blocks} V blocks, vs fused")


def test_gluon_split_schedules_under_cuda_graph_capture(dtype, make_batch, args_of,
                                                        assert_same_bits) -> None:
    # The merge as a dependent launch that every split program lets start at once
    # (griddepcontrol), and as an ordinary launch, with 1, 2 and 4 V column blocks: captured and
    # replayed, the bits of the Triton split kernel and merge (no Gluon, ordinary launch).
    _half(dtype)
    batch = make_batch(dtype, SHAPE, LAYOUTS["p16"], HEADS["g4"])
    args = args_of(batch)
    ref = unified_attention(*args, plan="split", split_size=256,
                            tuning=Tuning(gluon=False, dependent_merge=False))
    for tuning in (GLUON, Tuning(gluon=True, value_blocks=2),
                   Tuning(gluon=True, value_blocks=4, dependent_merge=False)):
        kw = dict(plan="split", split_size=256, tuning=tuning, validate=False)
        lp = plan_attention(*args, **kw)
        assert lp.gluon and lp.num_splits > 1
        assert lp.dependent_merge == (tuning.dependent_merge is None)
        assert_same_bits(_replayed(args, **kw), ref,
                         f"CUDA-graph replay ({tuning}) vs the Triton kernels")
        assert_same_bits(unified_attention(*args, **kw), ref,
                         f"eager ({tuning}) vs the Triton kernels")


#: Decode rows (one split, several, a partial last tile, one key) beside short chunks.
#: The default split size as one size (no lead splits).
ONE_SIZE = dict(lead_split_size=1024)
DECODE = [(1, 777), (1, 3000), (1, 130), (1, 1), (1, 1024), (5, 1000), (2, 129)]
KEYS_ROWS, ROWS_128 = Tuning(keys_rows=True), Tuning(keys_rows=False)


@pytest.mark.parametrize("layout", ["p16", "p64", "p256"])
@pytest.mark.parametrize("heads", sorted(HEADS))
def test_keys_rows_tile_gives_the_same_bits(dtype, make_batch, args_of, assert_same_bits,
                                            heads: str, layout: str) -> None:
    # The keys-as-rows decode tile (keys on the MMA's M, blocks of 8-32 rows, the row sum in
    # the 128-row tile's order) against the 128-row split tile and the fused plan: one split
    # per row (4096 tokens: the direct store), 1024- and 256-token splits (the merge), NaN in
    # every unused slot. Forced: the chunks of 5 tokens hold more than a block of groups 8 and
    # 16 (auto keeps the 128-row tile there).
    _half(dtype)
    batch = make_batch(dtype, DECODE, LAYOUTS[layout], HEADS[heads])
    args = args_of(batch)
    from kernels import _gluon

    group = HEADS[heads].num_q_heads // HEADS[heads].num_kv_heads
    results = {}
    for split in (4096, 1024, 256):
        kw = dict(split_size=split, lead_split_size=split)  # one size (lead splits: below)
        lp = plan_attention(*args, plan="split", tuning=KEYS_ROWS, **kw)
        assert lp.keys_rows and lp.gluon and lp.value_blocks in (1, 2)  # kt_value_blocks' rule
        assert lp.num_splits == (1 if split == 4096 else -(-3000 // split))
        assert lp.block_m == _gluon.kt_rows(group) and lp.block_q == lp.block_m // group
        got = results[split] = unified_attention(*args, plan="split", tuning=KEYS_ROWS, **kw)
        assert_same_bits(got, unified_attention(*args, plan="split", tuning=ROWS_128, **kw),
                         f"keys-as-rows vs 128-row split tile ({heads}, {layout}, {split})")
        assert_same_bits(got, unified_attention(*args, plan="fused", **kw),
                         f"keys-as-rows vs fused plan ({heads}, {layout}, {split})")
    # The control: the tile at another split size differs in some bit of out or lse, so the
    # comparisons above can fail.
    a, b = results[1024], results[256]
    assert not (torch.equal(a[0].view(torch.int16), b[0].view(torch.int16))
                and torch.equal(a[1].view(torch.int32), b[1].view(torch.int32)))


@pytest.mark.parametrize("layout", ["p16", "p64"])
@pytest.mark.parametrize("heads", ["g4", "g16"])
def test_keys_rows_tile_with_lead_splits(dtype, make_batch, args_of, assert_same_bits,
                                         heads: str, layout: str, monkeypatch) -> None:
    # The default contract's lead splits (the first 1024 keys in splits of 128) on the
    # keys-as-rows tile, one program per lead split (walk_lead False, the merge folds them) and
    # walking programs (the tile folds them; one and two splits of 1024 per program), in both
    # issue orders, against the 128-row split tile and the fused plan. The control: one split
    # size differs in some bit.
    _half(dtype)
    args = args_of(make_batch(dtype, DECODE, LAYOUTS[layout], HEADS[heads]))
    ref = unified_attention(*args, plan="split", tuning=ROWS_128)
    assert plan_attention(*args, plan="split", tuning=ROWS_128).lead_tokens == 128
    assert_same_bits(unified_attention(*args, plan="fused"), ref,
                     f"fused vs 128-row split tile, lead splits ({heads}, {layout})")
    for walk, walk_splits in ((False, 1), (True, 1), (True, 2)):
        monkeypatch.setattr(kernels.plan, "kt_walk_splits", lambda p, s, k=walk_splits: k)
        for ahead in (False, True):
            tuning = Tuning(keys_rows=True, value_blocks=2, scores_ahead=ahead, walk_lead=walk)
            lp = plan_attention(*args, plan="split", tuning=tuning)
            assert lp.keys_rows and lp.walk_lead == walk and lp.walk_splits == walk_splits
            assert lp.num_splits == (3 if walk else 8 + 2)  # 3000 keys
            assert_same_bits(unified_attention(*args, plan="split", tuning=tuning), ref,
                             f"keys-as-rows, walk {walk} x{walk_splits}, ahead {ahead}, vs "
                             f"128-row split tile ({heads}, {layout})")
    one = unified_attention(*args, plan="split", tuning=ROWS_128, **ONE_SIZE)
    assert not (torch.equal(one[0].view(torch.int16), ref[0].view(torch.int16))
                and torch.equal(one[1].view(torch.int32), ref[1].view(torch.int32)))


#: The keys-as-rows tile's scheduling settings: (value_blocks, scores_ahead).
KT_SCHEDULES = [(1, False), (2, False), (1, True), (2, True)]


@pytest.mark.parametrize("layout", ["p16", "p64"])
@pytest.mark.parametrize("heads", ["g1", "g4", "g16"])
def test_keys_rows_schedules_give_the_same_bits(dtype, make_batch, args_of, assert_same_bits,
                                                heads: str, layout: str) -> None:
    # 2 V column blocks (a ring of 4 slots) and the next tile's scores issued ahead, each and
    # together, forced on the keys-as-rows tile against the 128-row split tile: one split per
    # row (the direct store) and 256-token splits (the merge; splits of one and two tiles).
    # Captured in a CUDA graph, the replay of both together gives the same bits. The control:
    # the results at the two split sizes (which the tile's equal) differ.
    _half(dtype)
    args = args_of(make_batch(dtype, DECODE, LAYOUTS[layout], HEADS[heads]))
    refs = {}
    for split in (4096, 256):
        ref = refs[split] = unified_attention(*args, plan="split", split_size=split,
                                              tuning=ROWS_128)
        for blocks, ahead in KT_SCHEDULES:
            tuning = Tuning(keys_rows=True, value_blocks=blocks, scores_ahead=ahead)
            lp = plan_attention(*args, plan="split", split_size=split, tuning=tuning)
            assert lp.keys_rows and (lp.value_blocks, lp.scores_ahead) == (blocks, ahead)
            assert_same_bits(unified_attention(*args, plan="split", split_size=split,
                                               tuning=tuning), ref,
                             f"keys-as-rows ({blocks} V blocks, ahead {ahead}) vs 128-row "
                             f"split tile ({heads}, {layout}, {split})")
    kw = dict(plan="split", split_size=256, validate=False,
              tuning=Tuning(keys_rows=True, value_blocks=2, scores_ahead=True))
    assert_same_bits(_replayed(args, **kw), refs[256],
                     f"keys-as-rows, 2 V blocks, ahead: CUDA-graph replay ({heads}, {layout})")
    a, b = refs[4096], refs[256]
    assert not (torch.equal(a[0].view(torch.int16), b[0].view(torch.int16))
                and torch.equal(a[1].view(torch.int32), b[1].view(torch.int32)))


def test_keys_rows_tile_on_prompts_and_under_capture(dtype, make_batch, args_of,
                                                     assert_same_bits) -> None:
    # Forced on a batch of prompts (blocks of 2 tokens x 4 heads, masked diagonal tiles) it
    # still gives the fused plan's bits; auto keeps the 128-row tile there. Captured in a CUDA
    # graph without checks, the replay gives the eager bits.
    _half(dtype)
    batch = make_batch(dtype, SHAPE, LAYOUTS["p16"], HEADS["g4"])
    args = args_of(batch)
    assert not plan_attention(*args, plan="split").keys_rows
    assert plan_attention(*args, plan="split", tuning=KEYS_ROWS).keys_rows
    for split in (1024, 384):
        assert_same_bits(unified_attention(*args, plan="split", split_size=split,
                                           tuning=KEYS_ROWS),
                         unified_attention(*args, plan="fused", split_size=split),
                         f"keys-as-rows on prompts vs fused plan ({split})")
    decode = args_of(make_batch(dtype, DECODE, LAYOUTS["p16"], HEADS["g4"]))
    for split in (1024, 256):
        kw = dict(plan="split", split_size=split, validate=False)
        assert plan_attention(*decode, **kw).keys_rows
        assert_same_bits(_replayed(decode, **kw), unified_attention(*decode, **kw),
                         f"keys-as-rows: CUDA-graph replay vs eager ({split})")
    with pytest.raises(ValueError, match="keys_rows=True needs the split plan"):
        unified_attention(*decode, plan="fused", tuning=KEYS_ROWS)


#: Head dim 64, whose contract is also 128-key tiles: the Gluon kernels run it only where a
#: measured table entry or a Tuning asks (the rules keep the Triton kernels).
HEADS_64 = {"g8": HeadConfig(64, 8, 64), "g4": HeadConfig(16, 4, 64),
            "g1": HeadConfig(4, 4, 64), "g16": HeadConfig(32, 2, 64)}


@pytest.mark.parametrize("heads", sorted(HEADS_64))
@pytest.mark.parametrize("split", [1024, 256])
def test_head_dim_64_gluon_gives_the_triton_kernels_bits(dtype, make_batch, args_of,
                                                         assert_same_bits, assert_accurate,
                                                         heads: str, split: int) -> None:
    # The rules' Triton launch against the Gluon fused kernel, the Gluon split kernel (one and
    # two V blocks of 32 columns) and, on decode rows, the keys-as-rows tile (one block, both
    # issue orders, lead splits walked or one program each): one set of bits, NaN in every
    # unused cache slot.
    _half(dtype)
    args = args_of(make_batch(dtype, SHAPE, LAYOUTS["p16"], HEADS_64[heads]))
    kw = dict(split_size=split)
    assert not plan_attention(*args, plan="fused", **kw).gluon
    triton = unified_attention(*args, plan="fused", **kw)
    assert_accurate(*triton, args)
    for plan, tuning in (("fused", GLUON), ("split", Tuning(gluon=True, value_blocks=1)),
                         ("split", Tuning(gluon=True, value_blocks=2))):
        lp = plan_attention(*args, plan=plan, tuning=tuning, **kw)
        assert lp.gluon and not lp.keys_rows and (lp.block_m, lp.block_n) == (128, 128)
        assert_same_bits(unified_attention(*args, plan=plan, tuning=tuning, **kw), triton,
                         f"head dim 64: Gluon {plan} {tuning} vs Triton fused ({heads})")
    decode = args_of(make_batch(dtype, DECODE, LAYOUTS["p64"], HEADS_64[heads]))
    triton = unified_attention(*decode, plan="split", **kw)
    for ahead in (False, True):
        for walk in (False, True):
            tuning = Tuning(keys_rows=True, scores_ahead=ahead, walk_lead=walk)
            lp = plan_attention(*decode, plan="split", tuning=tuning, **kw)
            assert lp.keys_rows and lp.gluon and lp.value_blocks == 1
            assert_same_bits(unified_attention(*decode, plan="split", tuning=tuning, **kw),
                             triton, f"head dim 64: keys-as-rows {tuning} vs Triton ({heads})")
    # Captured in a CUDA graph without checks, the replay gives the eager bits.
    graph_kw = dict(plan="split", split_size=split, validate=False, tuning=Tuning(keys_rows=True))
    assert_same_bits(_replayed(decode, **graph_kw), triton,
                     f"head dim 64: keys-as-rows replay vs Triton ({heads})")


def test_head_dim_64_comparison_sees_a_different_split(dtype, make_batch, args_of) -> None:
    # The control of the test above: at head dim 64 the Gluon tiles at two split sizes differ
    # in some bit of out or lse.
    _half(dtype)
    args = args_of(make_batch(dtype, SHAPE, LAYOUTS["p16"], HEADS_64["g8"]))
    a = unified_attention(*args, plan="fused", tuning=GLUON, split_size=128)
    b = unified_attention(*args, plan="fused", tuning=GLUON, split_size=1024)
    assert not (torch.equal(a[0].view(torch.int16), b[0].view(torch.int16))
                and torch.equal(a[1].view(torch.int32), b[1].view(torch.int32)))


#: Head dim 256, whose contract is 64-key tiles: the keys-as-rows tile runs them (by default
#: for decode batches of groups up to 16). Blocks of 8 rows (groups 1, 2, 4, 8: one block
#: holds 8, 4, 2 or 1 tokens), 16 and 32 (2 ring slots on one V block).
HEADS_256 = {"g2": HeadConfig(16, 8, 256), "g1": HeadConfig(4, 4, 256),
             "g4": HeadConfig(16, 4, 256), "g8": HeadConfig(16, 2, 256),
             "g16": HeadConfig(32, 2, 256), "g32": HeadConfig(32, 1, 256)}
#: (value_blocks, scores_ahead, walk_lead) of the 64-key tile: every V block count, both issue
#: orders, both ways of taking the lead splits.
KT_256 = [(1, False, False), (2, False, True), (4, False, False), (1, True, True),
          (2, True, False), (4, True, True)]


@pytest.mark.parametrize("layout", ["p16", "p64"])
@pytest.mark.parametrize("heads", sorted(HEADS_256))
def test_head_dim_256_keys_rows_tile_gives_the_triton_kernels_bits(
        dtype, make_batch, args_of, assert_same_bits, assert_accurate, heads: str,
        layout: str) -> None:
    # The Triton split kernel (64-key tiles) against the keys-as-rows tile at 64 keys (the
    # default for decode) in every schedule above: the default splits (1024 with leads of 128), one
    # split per row (the direct store) and 256-token splits (the merge), NaN in every unused
    # slot; accurate against the float64 reference. Then a CUDA-graph replay, and the control:
    # the Triton kernel at two split sizes differs in some bit, so these comparisons can fail.
    _half(dtype)
    args = args_of(make_batch(dtype, DECODE, LAYOUTS[layout], HEADS_256[heads]))
    group = HEADS_256[heads].num_q_heads // HEADS_256[heads].num_kv_heads
    refs = {}
    for kw in ({}, dict(split_size=4096, lead_split_size=4096),
               dict(split_size=256, lead_split_size=256)):
        assert not plan_attention(*args, plan="split", tuning=ROWS_128, **kw).keys_rows
        ref = refs[kw.get("split_size", 1024)] = unified_attention(*args, plan="split",
                                                                   tuning=ROWS_128, **kw)
        assert_accurate(*ref, args)
        # The default: the tile where a block holds as many tokens per request as the batch
        # has on average (groups 1, 2 and 4 here; the chunks of 5 tokens are too many for
        # blocks of one token, groups 8 and 16) and the group is at most 16.
        from kernels import _gluon

        per_block = _gluon.kt_rows(group) // group
        decode_like = per_block * len(DECODE) >= sum(q for q, _ in DECODE) and group <= 16
        assert plan_attention(*args, plan="split", **kw).keys_rows == decode_like
        assert_same_bits(unified_attention(*args, **kw), ref,
                         f"head dim 256: default vs Triton split ({heads}, {layout}, {kw})")
        # Every schedule with the default splits (lead splits walked or not), two elsewhere.
        for blocks, ahead, walk in KT_256 if not kw else KT_256[::5]:
            if ahead and blocks == 1 and group > 16:
                continue  # refused: shared memory (test_plans.py)
            tuning = Tuning(keys_rows=True, value_blocks=blocks, scores_ahead=ahead,
                            walk_lead=walk)
            lp = plan_attention(*args, plan="split", tuning=tuning, **kw)
            assert lp.keys_rows and lp.gluon and lp.block_n == 64 and lp.value_blocks == blocks
            assert_same_bits(unified_attention(*args, plan="split", tuning=tuning, **kw), ref,
                             f"head dim 256: keys-as-rows {tuning} vs Triton split ({heads}, "
                             f"{layout}, {kw})")
    graph_kw = dict(plan="split", validate=False, tuning=Tuning(keys_rows=True))
    assert_same_bits(_replayed(args, **graph_kw), refs[1024],
                     f"head dim 256: keys-as-rows replay vs Triton ({heads}, {layout})")
    a, b = refs[4096], refs[256]
    assert not (torch.equal(a[0].view(torch.int16), b[0].view(torch.int16))
                and torch.equal(a[1].view(torch.int32), b[1].view(torch.int32)))
