"""merge_states: a fixed left-to-right fold of (output, LSE) partials; state_fold, the raw-state
fold inside the attention kernels. Independent of the dtype under test (states are float32)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernels import merge_states
from kernels._triton.merge_kernels import state_fold

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
# an empty partial (the case state_merge alone would pass through), last.
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


# --- state_fold: the raw-state fold that the attention kernels' plans share --------------------

@triton.jit
def _fold_kernel(m_ptr, l_ptr, acc_ptr, out_m_ptr, out_l_ptr, out_acc_ptr, S,
                 BM: tl.constexpr, D: tl.constexpr):
    """Folds the S raw states ``m/l [S, BM]``, ``acc [S, BM, D]`` left to right from empty."""
    o_m = tl.arange(0, BM)
    o_d = tl.arange(0, D)
    f_m = tl.full([BM], float("-inf"), dtype=tl.float32)
    f_l = tl.zeros([BM], dtype=tl.float32)
    f_acc = tl.zeros([BM, D], dtype=tl.float32)
    for s in range(0, S):
        s_m = tl.load(m_ptr + s * BM + o_m)
        s_l = tl.load(l_ptr + s * BM + o_m)
        s_acc = tl.load(acc_ptr + (s * BM + o_m)[:, None] * D + o_d[None, :])
        f_m, f_l, f_acc = state_fold(f_m, f_l, f_acc, s_m, s_l, s_acc)
    tl.store(out_m_ptr + o_m, f_m)
    tl.store(out_l_ptr + o_m, f_l)
    tl.store(out_acc_ptr + o_m[:, None] * D + o_d[None, :], f_acc)


def _fold(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor):
    S, BM, D = acc.shape
    out = (torch.empty(BM, device=m.device), torch.empty(BM, device=m.device),
           torch.empty(BM, D, device=m.device))
    _fold_kernel[(1,)](m.contiguous(), l.contiguous(), acc.contiguous(), *out, S, BM=BM, D=D)
    return out


def _raw_states(S: int, BM: int, D: int, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(S, BM, generator=g) * 8
    l = 1 + torch.rand(S, BM, generator=g) * 100  # a non-empty state has l >= 1
    acc = torch.randn(S, BM, D, generator=g) * l[..., None]
    return m.to(device), l.to(device), acc.to(device)


def test_state_fold_matches_float64(device: torch.device) -> None:
    m, l, acc = _raw_states(5, 16, 32, device)
    f_m, f_l, f_acc = _fold(m, l, acc)
    m64, l64, acc64 = m.double(), l.double(), acc.double()
    top = m64.max(0).values
    w = torch.exp2(m64 - top)  # [S, BM]
    ref_l = (w * l64).sum(0)
    ref_o = (w[..., None] * acc64).sum(0) / ref_l[:, None]
    assert bool((f_m.double() == top).all())
    torch.testing.assert_close(f_l.double(), ref_l, rtol=1e-6, atol=0)
    torch.testing.assert_close((f_acc / f_l[:, None]).double(), ref_o, rtol=1e-5, atol=1e-5)


def _canonical_nan(t: torch.Tensor) -> torch.Tensor:
    """``t`` with every NaN replaced by one NaN: GPU arithmetic returns its canonical NaN, the
    interpreter keeps a NaN's payload, and neither is a property of the fold."""
    return torch.where(t != t, torch.full_like(t, float("nan")), t)


@pytest.mark.parametrize("specials", [
    pytest.param(False, id="finite-nonzero"),
    # -0.0 and NaN: on an H100 with Triton 3.6 a -0.0 came out +0.0, because Triton 3.6 turned
    # the literal -0.0 weight into +0.0; state_fold now builds it
    # from its bits. A deliberate break (the literal back) fails this case on the GPU.
    pytest.param(True, id="signed-zero-and-nan"),
])
def test_state_fold_empty_states_are_exact_noops(device: torch.device, assert_same_bits,
                                                 specials: bool) -> None:
    """Empty states as the kernels make them (m = -inf, l = 0, acc = +0), before, between and
    after real ones, change no bit: a real state comes out as one fold of it alone makes it,
    and that is the state itself (with ``specials``, -0.0 keeps its sign and a NaN stays a NaN,
    its payload the hardware's)."""
    m, l, acc = _raw_states(3, 16, 32, device, seed=1)
    if specials:
        acc[0, 0, 0] = -0.0
        acc[0, 1, 1] = float("nan")
        acc[1, 2, 2] = -0.0
    e_m = torch.full_like(m[:1], float("-inf"))
    e_l = torch.zeros_like(l[:1])
    e_acc = torch.zeros_like(acc[:1])
    order = [None, None, 0, None, 1, 2, None, None]

    def pick(real: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
        return torch.cat([empty if i is None else real[i:i + 1] for i in order])

    mixed = _fold(pick(m, e_m), pick(l, e_l), pick(acc, e_acc))
    assert_same_bits(mixed, _fold(m, l, acc), "empty states interleaved vs none")
    for i in range(3):
        once = _fold(m[i:i + 1], l[i:i + 1], acc[i:i + 1])  # one fold, from the empty state
        assert_same_bits((*once[:2], _canonical_nan(once[2])),
                         (m[i], l[i], _canonical_nan(acc[i])), f"state {i} folded alone")
        for before in (1, 2):  # the fold starts from the empty state: 2 or 3 empties first
            alone = _fold(torch.cat([e_m] * before + [m[i:i + 1], e_m]),
                          torch.cat([e_l] * before + [l[i:i + 1], e_l]),
                          torch.cat([e_acc] * before + [acc[i:i + 1], e_acc]))
            assert_same_bits(alone, once, f"state {i} after {before} empties")
    all_empty = _fold(e_m.repeat(2, 1), e_l.repeat(2, 1), e_acc.repeat(2, 1, 1))
    assert_same_bits(all_empty, (e_m[0], e_l[0], e_acc[0]), "only empty states")
