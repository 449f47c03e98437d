"""Every invalid input raises ValueError naming the argument, the expected and the actual value;
with ``validate=False`` malformed values give garbage rows but never an out-of-bounds access.

Independent of the dtype under test: the calls use float16 (the cheapest under the interpreter).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from invariance import PageLayout
from kernels import Tuning, tile_config, unified_attention

Args = dict[str, Any]
DTYPE = torch.float16


@pytest.fixture
def args(make_batch) -> Args:
    """A valid call: a prefill chunk (8 rows, request 0) and a decode row (request 1), page size 4,
    one unused block-table column."""
    batch = make_batch(DTYPE, [(8, 20), (1, 9)], PageLayout(4, extra_columns=1))
    return dict(q=batch.q, k_cache=batch.k_cache, v_cache=batch.v_cache,
                cu_seqlens_q=batch.cu_seqlens_q, kv_lens=batch.kv_lens,
                block_table=batch.block_table)


def _raises(name: str, call: Callable[[], object]) -> str:
    """``call()`` raises a ValueError whose message starts with ``name`` and says what was
    expected and what it got."""
    with pytest.raises(ValueError) as info:
        call()
    msg = str(info.value)
    assert name in msg.split(": ")[0], f"message does not start with {name!r}: {msg}"
    assert "expected" in msg and "got" in msg, f"message lacks expected/got: {msg}"
    return msg


def _set(name: str, fn: Callable[[Args], Any]) -> Callable[[Args], Args]:
    def mutate(a: Args) -> Args:
        return {**a, name: fn(a)}
    return mutate


def _other_float(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32 if t.dtype != torch.float32 else torch.float16)


def _int(values: list[int], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=like.device)


def _with_page(a: Args, col: int, value: int) -> torch.Tensor:
    bt = a["block_table"].clone()
    bt[0, col] = value  # a page request 0 needs
    return bt


def _no_tokens(a: Args, cu: list[int], kv: list[int], bt: list[list[int]]) -> Args:
    """A call with T = 0 and the given (possibly garbage) index values."""
    return {**a, "q": a["q"][:0], "cu_seqlens_q": _int(cu, a["q"]), "kv_lens": _int(kv, a["q"]),
            "block_table": torch.tensor(bt, dtype=torch.int32, device=a["q"].device)}


# (id, mutation of a valid call, the argument the message must name).
INVALID = [
    ("q-not-a-tensor", _set("q", lambda a: a["q"].tolist()), "q"),
    ("q-ndim", _set("q", lambda a: a["q"][0]), "q"),
    ("q-dtype-int", _set("q", lambda a: a["q"].to(torch.int32)), "q"),
    ("q-float64", _set("q", lambda a: a["q"].double()), "q"),
    ("q-no-heads", _set("q", lambda a: a["q"][:, :0]), "q"),
    ("k-dtype", _set("k_cache", lambda a: _other_float(a["k_cache"])), "k_cache"),
    ("v-dtype", _set("v_cache", lambda a: _other_float(a["v_cache"])), "v_cache"),
    ("k-ndim", _set("k_cache", lambda a: a["k_cache"][0]), "k_cache"),
    ("v-shape", _set("v_cache", lambda a: a["v_cache"][:, :2]), "v_cache"),
    ("k-device", _set("k_cache", lambda a: a["k_cache"].to("meta")), "k_cache"),
    ("all-on-meta", lambda a: {k: v.to("meta") for k, v in a.items()}, "q"),
    ("head-dim-unsupported", lambda a: dict(
        a, q=a["q"][..., :32].contiguous(), k_cache=a["k_cache"][..., :32].contiguous(),
        v_cache=a["v_cache"][..., :32].contiguous()), "q"),
    ("k-head-dim-mismatch", _set("k_cache", lambda a: torch.cat([a["k_cache"]] * 2, -1)),
     "k_cache"),
    ("gqa-not-divisible", lambda a: dict(a, q=a["q"][:, :3].contiguous()), "k_cache"),
    ("page-size-not-pow2", lambda a: dict(
        a, k_cache=a["k_cache"][:, :3].contiguous(), v_cache=a["v_cache"][:, :3].contiguous()),
     "k_cache"),
    ("no-pages", lambda a: dict(a, k_cache=a["k_cache"][:0], v_cache=a["v_cache"][:0]),
     "k_cache"),
    ("cu-dtype", _set("cu_seqlens_q", lambda a: a["cu_seqlens_q"].long()), "cu_seqlens_q"),
    ("kv-dtype", _set("kv_lens", lambda a: a["kv_lens"].long()), "kv_lens"),
    ("bt-dtype", _set("block_table", lambda a: a["block_table"].long()), "block_table"),
    ("cu-shape", _set("cu_seqlens_q", lambda a: a["cu_seqlens_q"][:2]), "cu_seqlens_q"),
    ("bt-rows", _set("block_table", lambda a: a["block_table"][:1]), "block_table"),
    ("no-requests-but-tokens", lambda a: dict(
        a, cu_seqlens_q=a["cu_seqlens_q"][:1], kv_lens=a["kv_lens"][:0],
        block_table=a["block_table"][:0]), "kv_lens"),
    ("q-last-dim-strided", _set("q", lambda a: torch.cat([a["q"]] * 2, -1)[..., ::2]), "q"),
    ("cu-not-zero", _set("cu_seqlens_q", lambda a: _int([1, 9, 9], a["q"])), "cu_seqlens_q"),
    ("cu-decreasing", _set("cu_seqlens_q", lambda a: _int([0, 10, 9], a["q"])),
     "cu_seqlens_q"),
    ("cu-last-not-T", _set("cu_seqlens_q", lambda a: _int([0, 8, 8], a["q"])), "cu_seqlens_q"),
    ("kv-negative", _set("kv_lens", lambda a: _int([20, -1], a["q"])), "kv_lens"),
    ("kv-less-than-q", _set("kv_lens", lambda a: _int([7, 9], a["q"])), "kv_lens"),
    ("too-few-pages", _set("kv_lens", lambda a: _int([20, 4 * 6 + 1], a["q"])), "block_table"),
    ("page-id-negative", _set("block_table", lambda a: _with_page(a, 0, -1)), "block_table"),
    ("page-id-too-large", _set("block_table", lambda a: _with_page(a, 1, a["k_cache"].shape[0])),
     "block_table"),
    # T = 0 still validates the index values (no early return before the checks).
    ("T0-cu-garbage", lambda a: _no_tokens(a, [0, 5, 0], [5, 0], [[0, 1], [0, 1]]),
     "cu_seqlens_q"),
    ("T0-kv-negative", lambda a: _no_tokens(a, [0, 0, 0], [3, -7], [[0, 1], [0, 1]]),
     "kv_lens"),
    ("T0-page-id-garbage", lambda a: _no_tokens(a, [0, 0, 0], [3, 9], [[0, 0, 0], [0, 99, 1]]),
     "block_table"),
    ("T0-too-few-pages", lambda a: _no_tokens(a, [0, 0, 0], [3, 90], [[0, 1], [0, 1]]),
     "block_table"),
]


@pytest.mark.parametrize(("mutate", "name"), [pytest.param(m, n, id=i) for i, m, n in INVALID])
def test_invalid_argument(args: Args, mutate: Callable[[Args], Args], name: str) -> None:
    _raises(name, lambda: unified_attention(**mutate(args)))


# The softmax scale: a finite positive real (not bool, not str), whose float32 image is normal.
BAD_SM_SCALES = [0, 0.0, -0.125, math.nan, math.inf, -math.inf, "abc", True, False, 1e300, 1e-300,
                 [0.125], torch.tensor(0.125)]


@pytest.mark.parametrize("sm_scale", BAD_SM_SCALES, ids=repr)
def test_bad_sm_scale(args: Args, sm_scale: Any) -> None:
    msg = _raises("sm_scale", lambda: unified_attention(**args, sm_scale=sm_scale))
    assert "finite positive real" in msg


def test_sm_scale_accepts_int_and_float(args: Args) -> None:
    a = unified_attention(**args, sm_scale=1)
    b = unified_attention(**args, sm_scale=1.0)
    assert torch.equal(a[1], b[1])


@pytest.mark.parametrize("split_size", [None, 128], ids=["control", "split128"])
def test_no_query_tokens(args: Args, split_size: int | None) -> None:
    # T = 0 with valid indices: checked, then empty results (the control mode included).
    call = _no_tokens(args, [0, 0, 0], [3, 9], [[0, 1, 2], [3, 4, 5]])
    for validate in (True, False):
        out, lse = unified_attention(**call, split_size=split_size, validate=validate)
        assert out.shape == (0, 4, 64) and lse.shape == (0, 4)


def test_unused_block_table_columns_are_not_checked(args: Args) -> None:
    # Columns past ceil(kv_len / page_size) may hold anything: never read, never checked.
    bt = args["block_table"].clone()
    bt[:, -1] = -1
    unified_attention(**{**args, "block_table": bt})


@pytest.mark.parametrize("split_size", [0, -64, 3, 64.0, True, "64"], ids=repr)
def test_bad_split_size(args: Args, split_size: Any) -> None:
    _raises("split_size", lambda: unified_attention(**args, split_size=split_size))


def test_split_size_not_multiple_of_block_n(args: Args) -> None:
    block_n = tile_config(DTYPE, 64).block_n
    _raises("split_size", lambda: unified_attention(**args, split_size=block_n + block_n // 2))


@pytest.mark.parametrize("lead", [0, -64, 3, 64.0, True, "64"], ids=repr)
def test_bad_lead_split_size(args: Args, lead: Any) -> None:
    msg = _raises("lead_split_size", lambda: unified_attention(**args, lead_split_size=lead))
    assert "positive multiple of BLOCK_N" in msg


def test_lead_split_size_must_fit_the_tile_and_divide_the_split(args: Args) -> None:
    block_n = tile_config(DTYPE, 64).block_n
    _raises("lead_split_size", lambda: unified_attention(**args, lead_split_size=block_n // 2))
    # 3 tiles per split: a lead of 2 tiles does not divide it (expected and got named).
    msg = _raises("lead_split_size", lambda: unified_attention(
        **args, split_size=3 * block_n, lead_split_size=2 * block_n))
    assert f"a divisor of split_size={3 * block_n}" in msg and f"got {2 * block_n}" in msg
    # At least the split size: one split size, no error (and the control ignores it).
    unified_attention(**args, split_size=2 * block_n, lead_split_size=4 * block_n)
    unified_attention(**args, split_size=None, lead_split_size=block_n)


@pytest.mark.parametrize(("name", "value"), [("plan", "fastest"), ("plan", None),
                                             ("validate", "yes"), ("validate", 1),
                                             ("tuning", {"block_m": 16})])
def test_bad_option(args: Args, name: str, value: Any) -> None:
    _raises(name, lambda: unified_attention(**args, **{name: value}))


@pytest.mark.parametrize(("field", "value"), [("block_m", 24), ("block_m", 0), ("num_warps", 3),
                                              ("num_stages", 0), ("block_n", 8),
                                              ("block_n", True), ("num_warps", 4.0),
                                              ("value_blocks", 3), ("value_blocks", 16),
                                              ("dependent_merge", 1), ("dependent_merge", "yes"),
                                              ("slot_order", 0), ("nested_loop", "yes"),
                                              ("tiles_per_step", 4), ("tiles_per_step", 0),
                                              ("tiles_per_step", True)])
def test_bad_tuning(field: str, value: Any) -> None:
    _raises(f"Tuning.{field}", lambda: Tuning(**{field: value}))


def test_value_blocks_keep_sixteen_columns(args: Args) -> None:
    """Eight V column blocks need head dim 128 or more (16 columns each: tl.dot's least N);
    at head dim 64 the call names the tuning and the bound."""
    msg = _raises("tuning", lambda: unified_attention(**args, plan="split",
                                                      tuning=Tuning(value_blocks=8)))
    assert "value_blocks <= head_dim / 16 = 4" in msg and "head_dim 64" in msg, msg


def test_tile_config_rejects_unsupported() -> None:
    _raises("head_dim", lambda: tile_config(torch.float16, 96))
    _raises("dtype", lambda: tile_config(torch.float64, 64))


# validate=False: malformed values in request 1 (the decode row); request 0's rows must keep
# their bits, and nothing may raise or read out of bounds (the kernels clamp indices).
# (id, argument made malformed, the argument validate=True names, the malformed value).
GARBAGE = [
    ("page-id-huge", "block_table", "block_table", lambda a: _page(a, 1 << 30)),
    ("page-id-negative", "block_table", "block_table", lambda a: _page(a, -5)),
    ("kv-less-than-q", "kv_lens", "kv_lens", lambda a: _int([20, 0], a["q"])),
    ("kv-past-block-table", "kv_lens", "block_table", lambda a: _int([20, 1 << 20], a["q"])),
    ("kv-negative", "kv_lens", "kv_lens", lambda a: _int([20, -(1 << 20)], a["q"])),
    ("cu-past-T", "cu_seqlens_q", "cu_seqlens_q", lambda a: _int([0, 8, 1000], a["q"])),
]


def _page(a: Args, value: int) -> torch.Tensor:
    bt = a["block_table"].clone()
    bt[1, :] = value  # every page of request 1
    return bt


# NOTE: the interpreter's NumPy evaluates both sides of every tl.where and warns about what the
# garbage rows compute (inf - inf, casts of huge page ids); the warnings are not under test.
GARBAGE_WARNINGS = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@GARBAGE_WARNINGS
@pytest.mark.parametrize(("name", "error", "mutate"),
                         [pytest.param(n, e, m, id=i) for i, n, e, m in GARBAGE])
def test_validate_false_never_reads_out_of_bounds(args: Args, assert_same_bits, name: str,
                                                  error: str,
                                                  mutate: Callable[[Args], torch.Tensor]) -> None:
    bad = {**args, name: mutate(args)}
    _raises(error, lambda: unified_attention(**bad))  # what validate=True says
    results = {}
    for plan in ("fused", "split"):
        out, lse = results[plan] = unified_attention(**bad, validate=False, plan=plan)
        ref = unified_attention(**args, validate=False, plan=plan)
        assert out.shape == ref[0].shape and lse.shape == ref[1].shape
        assert_same_bits((out[:8], lse[:8]), (ref[0][:8], ref[1][:8]),
                         f"request 0 next to garbage in {name} ({plan} plan)")
    # The garbage rows too are the same under both plans (every row is written: none is left
    # as uninitialised memory, e.g. by the split plan's direct write of a row with no position).
    assert_same_bits(results["split"], results["fused"], f"garbage in {name}: split vs fused")
    # The fused plan's slot order reads the same garbage lengths to sort the slots: still a
    # permutation, every row the same.
    ordered = unified_attention(**bad, validate=False, plan="fused", tuning=Tuning(slot_order=True))
    assert_same_bits(ordered, results["fused"], f"garbage in {name}: slot order vs plain")


@GARBAGE_WARNINGS
def test_validate_false_with_garbage_everywhere(args: Args) -> None:
    # cu_seqlens_q not starting at 0 and decreasing, page ids out of range: no crash.
    bad = {**args, "cu_seqlens_q": _int([5, 1, 3], args["q"]),
           "block_table": torch.full_like(args["block_table"], -(1 << 30))}
    for plan in ("fused", "split"):
        unified_attention(**bad, validate=False, plan=plan)
    unified_attention(**bad, validate=False, plan="fused", tuning=Tuning(slot_order=True))
