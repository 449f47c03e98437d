"""merge_states: a fixed left-to-right fold of (output, LSE) partials. Independent of the dtype
under test (partials are float32)."""

from __future__ import annotations

import pytest
import torch

from kernels import merge_states

# [N, S, H, D]: a single partial, several partials with a head count that is not a power of two
# and larger than one head block (16), a head dim that is not a power of two.
SHAPES = [
    pytest.param((3, 1, 4, 64), id="N3-S1-H4-D64"),
    pytest.param((5, 7, 20, 128), id="N5-S7-H20-D128"),
    pytest.param((2, 4, 3, 48), id="N2-S4-H3-D48"),
]


def _partials(shape: tuple[int, int, int, int], device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    o = torch.randn(shape, generator=g).to(device)
    lse = (torch.randn(shape[:3], generator=g) * 4).to(device)
    return o, lse


def _reference(o: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lse64 = lse.double()
    total = torch.logsumexp(lse64, dim=1)  # [N, H]
    w = torch.exp(lse64 - total[:, None]).nan_to_num(0.0)  # [N, S, H]
    out = (w[..., None] * o.double().nan_to_num(0.0)).sum(1)
    out = torch.where(torch.isinf(total)[..., None], 0.0, out)
    return out, total


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64_logsumexp(device: torch.device, shape) -> None:
    o, lse = _partials(shape, device)
    out, out_lse = merge_states(o, lse)
    ref_out, ref_lse = _reference(o, lse)
    assert out.dtype == torch.float32 and out_lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_lse.double(), ref_lse, atol=1e-5, rtol=1e-6)


def test_empty_partials_are_exact_noops(device: torch.device, assert_same_bits) -> None:
    o, lse = _partials((4, 3, 5, 64), device, seed=1)
    # Interleave empty partials (lse = -inf) whose outputs are NaN garbage.
    o_e = torch.full_like(o, float("nan"))
    lse_e = torch.full_like(lse, float("-inf"))
    o_mixed = torch.stack([o_e[:, 0], o[:, 0], o_e[:, 1], o[:, 1], o[:, 2], o_e[:, 2]], dim=1)
    lse_mixed = torch.stack([lse_e[:, 0], lse[:, 0], lse_e[:, 1], lse[:, 1], lse[:, 2],
                             lse_e[:, 2]], dim=1)
    assert_same_bits(merge_states(o_mixed, lse_mixed), merge_states(o, lse),
                     "empty partials interleaved vs none")
    # A single non-empty partial among empties comes out unchanged (out exactly).
    single, _ = merge_states(o_mixed[:, :2], lse_mixed[:, :2])
    assert_same_bits((single,), (o[:, 0],), "one partial among empties")


def test_all_empty_gives_zero_and_minus_inf(device: torch.device) -> None:
    o = torch.full((2, 3, 4, 64), float("nan"), device=device)
    lse = torch.full((2, 3, 4), float("-inf"), device=device)
    out, out_lse = merge_states(o, lse)
    assert bool((out == 0).all())
    assert bool(torch.isneginf(out_lse).all())
    # ... and so does a fold over zero partials.
    out, out_lse = merge_states(o[:, :0], lse[:, :0])
    assert bool((out == 0).all()) and bool(torch.isneginf(out_lse).all())


# Where the special LSE sits among the partials of row (n=1, h=2): first (after nothing), after
# an empty partial (the case the shared state_merge alone would pass through), last.
SPECIAL_AT = [pytest.param(0, id="first"), pytest.param(2, id="after-empty"),
              pytest.param(3, id="last")]


# NOTE: the interpreter's NumPy warns on inf - inf; the kernel's rule is what is under test.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("special", [float("nan"), float("inf")], ids=["nan", "+inf"])
@pytest.mark.parametrize("at", SPECIAL_AT)
def test_nan_or_inf_lse_makes_the_row_nan(device: torch.device, assert_same_bits, special: float,
                                          at: int) -> None:
    # The documented rule: a NaN or +inf partial LSE makes its (n, h) row out = NaN, lse = NaN;
    # every other row keeps the bits it has without the special value.
    o, lse = _partials((3, 4, 5, 64), device, seed=2)
    lse[:, 1] = float("-inf")
    base = merge_states(o, lse)
    bad = lse.clone()
    bad[1, at, 2] = special
    out, out_lse = merge_states(o, bad)
    assert bool(torch.isnan(out[1, 2]).all()) and bool(torch.isnan(out_lse[1, 2]))
    keep = torch.ones(3, 5, dtype=torch.bool, device=device)
    keep[1, 2] = False
    assert_same_bits((out[keep], out_lse[keep]), (base[0][keep], base[1][keep]),
                     "rows without a NaN/+inf partial")


def test_rejects_bad_arguments(device: torch.device) -> None:
    o, lse = _partials((2, 3, 4, 64), device)
    with pytest.raises(ValueError, match="outputs"):
        merge_states(o[0], lse)
    with pytest.raises(ValueError, match="lses"):
        merge_states(o, lse[..., :2])
    with pytest.raises(ValueError, match="lses"):
        merge_states(o, lse[0])
    with pytest.raises(ValueError, match="outputs"):
        merge_states(o.to(torch.int32), lse)
    with pytest.raises(ValueError, match="lses"):
        merge_states(o, "lse")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lses"):
        merge_states(o, lse.to("meta"))
