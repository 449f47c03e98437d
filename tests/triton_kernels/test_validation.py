"""Every invalid input raises ValueError naming the offending argument."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from kernels import tile_config, unified_attention
from kernels.testing import build_batch, make_request

Args = dict[str, Any]


@pytest.fixture
def args(dtype: torch.dtype, device: torch.device) -> Args:
    """A valid call: two requests (a prefill chunk and a decode row), page size 4."""
    r0 = make_request(0, 20, 4, 2, 64, dtype, device)
    r1 = make_request(1, 9, 4, 2, 64, dtype, device)
    batch = build_batch([(r0, 12, 20), (r1, 8, 9)], 4, extra_columns=1)
    return dict(q=batch.q, k_cache=batch.k_cache, v_cache=batch.v_cache,
                cu_seqlens_q=batch.cu_seqlens_q, kv_lens=batch.kv_lens,
                block_table=batch.block_table)


def _set(name: str, fn: Callable[[Args], Any]) -> Callable[[Args], Args]:
    def mutate(a: Args) -> Args:
        a = dict(a)
        a[name] = fn(a)
        return a
    return mutate


def _other_float(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float16 if t.dtype != torch.float16 else torch.float32)


def _int(values: list[int], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=like.device)


def _with_page(a: Args, col: int, value: int) -> torch.Tensor:
    bt = a["block_table"].clone()
    bt[0, col] = value  # a page request 0 needs
    return bt


# (id, mutation of a valid call, the argument the message must name).
INVALID = [
    ("q-ndim", _set("q", lambda a: a["q"][0]), "q"),
    ("q-dtype-int", _set("q", lambda a: a["q"].to(torch.int32)), "q"),
    ("q-float64", _set("q", lambda a: a["q"].double()), "q"),
    ("k-dtype", _set("k_cache", lambda a: _other_float(a["k_cache"])), "k_cache"),
    ("v-dtype", _set("v_cache", lambda a: _other_float(a["v_cache"])), "v_cache"),
    ("k-ndim", _set("k_cache", lambda a: a["k_cache"][0]), "k_cache"),
    ("v-shape", _set("v_cache", lambda a: a["v_cache"][:, :2]), "v_cache"),
    ("head-dim-unsupported", lambda a: dict(
        a, q=a["q"][..., :32].contiguous(), k_cache=a["k_cache"][..., :32].contiguous(),
        v_cache=a["v_cache"][..., :32].contiguous()), "head_dim"),
    ("k-head-dim-mismatch", _set("k_cache", lambda a: torch.cat([a["k_cache"]] * 2, -1)),
     "k_cache"),
    ("gqa-not-divisible", lambda a: dict(a, q=a["q"][:, :3].contiguous()), "k_cache"),
    ("page-size-not-pow2", lambda a: dict(
        a, k_cache=a["k_cache"][:, :3].contiguous(), v_cache=a["v_cache"][:, :3].contiguous()),
     "page_size"),
    ("cu-dtype", _set("cu_seqlens_q", lambda a: a["cu_seqlens_q"].long()), "cu_seqlens_q"),
    ("kv-dtype", _set("kv_lens", lambda a: a["kv_lens"].long()), "kv_lens"),
    ("bt-dtype", _set("block_table", lambda a: a["block_table"].long()), "block_table"),
    ("cu-shape", _set("cu_seqlens_q", lambda a: a["cu_seqlens_q"][:2]), "cu_seqlens_q"),
    ("bt-rows", _set("block_table", lambda a: a["block_table"][:1]), "block_table"),
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
]


@pytest.mark.parametrize(("mutate", "name"), [pytest.param(m, n, id=i) for i, m, n in INVALID])
def test_invalid_argument(args: Args, mutate: Callable[[Args], Args], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        unified_attention(**mutate(args))


def test_unused_block_table_columns_are_not_checked(args: Args) -> None:
    # Columns past ceil(kv_len / page_size) may hold anything (here -1): never read, never checked.
    assert int(args["block_table"][0, -1]) == -1
    unified_attention(**args)


def test_device_mismatch(args: Args) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: all tensors live on the CPU here")
    with pytest.raises(ValueError, match="kv_lens"):
        unified_attention(**dict(args, kv_lens=args["kv_lens"].cpu()))


@pytest.mark.parametrize("split_size", [0, -64, 3, 64.0, True], ids=str)
def test_bad_split_size(args: Args, split_size: Any) -> None:
    with pytest.raises(ValueError, match="split_size"):
        unified_attention(**args, split_size=split_size)


def test_split_size_not_multiple_of_block_n(args: Args, dtype: torch.dtype) -> None:
    block_n = tile_config(dtype, 64).block_n
    with pytest.raises(ValueError, match="split_size"):
        unified_attention(**args, split_size=block_n + block_n // 2)


def test_unknown_plan(args: Args) -> None:
    with pytest.raises(ValueError, match="plan"):
        unified_attention(**args, plan="fastest")


def test_validate_false_skips_value_checks(args: Args) -> None:
    # kv_lens < q_len is only detectable by reading values; validate=False must not sync for it.
    # (The result is then garbage, but no error and no out-of-bounds read: kv_lens is shorter.)
    bad = dict(args, cu_seqlens_q=_int([0, 8, 9], args["q"]), kv_lens=_int([8, 1], args["q"]))
    unified_attention(**bad, validate=False)
    with pytest.raises(ValueError, match="kv_lens"):
        unified_attention(**dict(args, kv_lens=_int([7, 1], args["q"])))


def test_tile_config_rejects_unsupported() -> None:
    with pytest.raises(ValueError, match="head_dim"):
        tile_config(torch.float16, 96)
    with pytest.raises(ValueError, match="dtype"):
        tile_config(torch.float64, 64)
