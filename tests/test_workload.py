"""Token content is a pure function of (seed, request, token, heads, dtype)."""

from __future__ import annotations

import pytest
import torch

from invariance import HeadConfig, Request, Workload
from invariance.workload import parse_dtype, token_content


def test_content_is_independent_of_the_range_it_is_generated_in(dtype: torch.dtype) -> None:
    whole = token_content(7, 3, "k", 0, 50, 2, 64, dtype)
    part = token_content(7, 3, "k", 17, 23, 2, 64, dtype)
    one = token_content(7, 3, "k", 22, 23, 2, 64, dtype)
    assert torch.equal(whole[17:23].view(torch.int8), part.view(torch.int8))
    assert torch.equal(whole[22:23].view(torch.int8), one.view(torch.int8))


def test_content_differs_by_request_kind_and_seed() -> None:
    base = token_content(0, 1, "q", 0, 4, 2, 64, torch.float32)
    for other in (token_content(0, 2, "q", 0, 4, 2, 64, torch.float32),
                  token_content(0, 1, "k", 0, 4, 2, 64, torch.float32),
                  token_content(1, 1, "q", 0, 4, 2, 64, torch.float32)):
        assert not torch.equal(base, other)


def test_content_is_roughly_standard_normal() -> None:
    x = token_content(0, 0, "v", 0, 512, 4, 64, torch.float32)
    assert abs(float(x.mean())) < 0.02
    assert abs(float(x.std()) - 1.0) < 0.02
    assert bool(torch.isfinite(x).all())


def test_workload_content_checks_range() -> None:
    wl = Workload((Request(0, 8),), HeadConfig(4, 2, 64), torch.float16)
    assert wl.content(0, "q", 0, 8, "cpu").shape == (8, 4, 64)
    assert wl.content(0, "k", 2, 5, "cpu").shape == (3, 2, 64)
    with pytest.raises(ValueError, match="exceeds its length 8"):
        wl.content(0, "k", 0, 9, "cpu")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"num_q_heads": 6, "num_kv_heads": 4}, "multiple of num_kv_heads", id="gqa"),
        pytest.param({"head_dim": 0}, "head_dim", id="head_dim"),
    ],
)
def test_head_config_errors(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HeadConfig(**kwargs)


def test_head_config_parse() -> None:
    assert HeadConfig.parse("32:8:128") == HeadConfig(32, 8, 128)
    with pytest.raises(ValueError, match="Hq:Hkv:D"):
        HeadConfig.parse("32x8")


def test_workload_rejects_duplicate_ids_and_bad_requests() -> None:
    with pytest.raises(ValueError, match="unique ids"):
        Workload((Request(0, 3), Request(0, 4)))
    with pytest.raises(ValueError, match=r"Request\.length"):
        Request(0, -1)


def test_parse_dtype() -> None:
    assert parse_dtype("bf16") is torch.bfloat16
    assert parse_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="expected one of"):
        parse_dtype("float64")
    with pytest.raises(ValueError, match="expected one of"):
        parse_dtype(torch.int8)
