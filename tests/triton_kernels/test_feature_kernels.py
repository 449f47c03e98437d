"""The kernels' features (sliding window, attention sinks, logit soft-cap, FP8 KV cache) under
the interpreter: accurate against the float64 reference, the same bits in both plans, the same
bits for a request alone and inside a batch (with the batch-dependent control, which must
differ, as the negative control), and named errors for bad feature arguments.

Rows straddle the window's edge and several splits (split size 2 tiles, lead splits of one),
sinks dominate some rows, scores run far past the cap, and FP8 values span e4m3's range."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from invariance import HeadConfig, PageLayout, compare_bits
from invariance.accuracy import accuracy_bound
from kernels import tile_config, unified_attention
from kernels.reference import reference_attention

FP8 = torch.float8_e4m3fn
# A decode over several splits (3 at half precision's 128-key tiles), a prefill chunk crossing
# the window edge and split boundaries, a short prompt, a one-token request.
SHAPE = [(1, 300), (7, 210), (5, 40), (1, 1)]
HEADS = HeadConfig(4, 2, 64)

#: name -> feature arguments of ``unified_attention`` (tensors built per device and dtype).
FEATURES: dict[str, dict[str, Any]] = {
    "window": {"window_left": 100},
    "window0": {"window_left": 0},  # each query sees only itself
    "sinks": {"sinks": "sinks"},
    "softcap": {"logits_soft_cap": 5.0},
    "window-sinks-softcap": {"window_left": 64, "sinks": "sinks", "logits_soft_cap": 8.0},
}
FP8_FEATURES: dict[str, dict[str, Any]] = {
    "fp8": {"k_scale": 0.02, "v_scale": 0.5},
    "fp8-per-head": {"k_scale": "per-head", "v_scale": "per-head"},
    "fp8-all": {"k_scale": 0.03, "v_scale": 2.0, "window_left": 80, "sinks": "sinks",
                "logits_soft_cap": 6.0},
}


def _sinks(Hq: int, device: torch.device) -> torch.Tensor:
    """Per-head sinks: one far above any score (it dominates its rows), one far below (it
    vanishes), two near the scores."""
    return torch.tensor([30.0, -30.0, 0.5, -1.0][:Hq], dtype=torch.float32, device=device)


def _resolve(spec: dict[str, Any], Hq: int, Hkv: int, device: torch.device) -> dict[str, Any]:
    out = dict(spec)
    if out.get("sinks") == "sinks":
        out["sinks"] = _sinks(Hq, device)
    for name in ("k_scale", "v_scale"):
        if out.get(name) == "per-head":
            out[name] = torch.linspace(0.01, 0.05, Hkv, dtype=torch.float32, device=device)
    return out


def _fp8_batch(make_batch: Any, dtype: torch.dtype, layout: PageLayout, shape: Any = SHAPE) -> Any:
    """The batch with its caches quantized to e4m3: values scaled up first so that they span
    the format's range (subnormals to hundreds)."""
    batch = make_batch(dtype, shape, layout, heads=HEADS)
    scale = torch.logspace(-2, 2.3, batch.k_cache.shape[-1], device=batch.k_cache.device)
    batch.k_cache = (batch.k_cache.float() * scale).clamp(-448, 448).to(FP8)
    batch.v_cache = (batch.v_cache.float() * scale.flip(0)).clamp(-448, 448).to(FP8)
    return batch


def _bounds(args: tuple[torch.Tensor, ...], sm_scale: float, feats: dict[str, Any],
            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The harness's bound (invariance.accuracy.accuracy_bound) on the dequantized caches, plus
    the soft-cap's formula error (a few float32 roundoffs of the cap, on every score)."""
    q, k_cache, v_cache, cu, kv, table = args
    Hkv, D, page = k_cache.shape[2], q.shape[2], k_cache.shape[1]
    ks = _per_head(feats.get("k_scale"), Hkv)
    vs = _per_head(feats.get("v_scale"), Hkv)
    out_b = torch.zeros(q.shape[:2], dtype=torch.float64)
    lse_b = torch.zeros(q.shape[:2], dtype=torch.float64)
    cap = float(feats.get("logits_soft_cap", 0.0))
    u32 = 2.0 ** -24
    for b, n in enumerate(kv.tolist()):
        q0, q1 = cu[b].item(), cu[b + 1].item()
        pages = table[b, : -(-n // page)].long()
        k = k_cache[pages].reshape(-1, Hkv, D)[:n].double() * ks[None, :, None]
        v = v_cache[pages].reshape(-1, Hkv, D)[:n].double() * vs[None, :, None]
        pos = torch.arange(n - (q1 - q0), n)
        o, lb = accuracy_bound(q[q0:q1], pos, k.to(q.dtype) if dtype != torch.float32 else k,
                               v, sm_scale, dtype)
        out_b[q0:q1] = o + 32 * u32 * cap * v.abs().max()
        lse_b[q0:q1] = lb + 32 * u32 * cap
    return out_b, lse_b


def _per_head(scale: Any, Hkv: int) -> torch.Tensor:
    if scale is None:
        return torch.ones(Hkv, dtype=torch.float64)
    if isinstance(scale, torch.Tensor):
        return scale.double().cpu()
    return torch.full((Hkv,), float(scale), dtype=torch.float64)


def _check_accurate(out: torch.Tensor, lse: torch.Tensor, args: tuple[torch.Tensor, ...],
                    feats: dict[str, Any], dtype: torch.dtype) -> None:
    """Against the float64 reference, on the CPU (the bounds are computed there)."""
    out, lse = out.cpu(), lse.cpu()
    args = tuple(a.cpu() for a in args)
    feats = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in feats.items()}
    sm_scale = 1.0 / math.sqrt(args[0].shape[2])
    ref_out, ref_lse = reference_attention(*args, sm_scale=sm_scale, out_dtype=torch.float64,
                                           **feats)
    out_b, lse_b = _bounds(args, sm_scale, feats, dtype)
    err = (out.double() - ref_out).abs()
    assert bool((err <= out_b[..., None]).all()), (
        f"out: max error {float(err.max()):.3g}, worst ratio "
        f"{float((err / out_b[..., None]).max()):.3g}")
    lse_err = (lse.double() - ref_lse).abs()
    assert bool((lse_err <= lse_b).all()), (
        f"lse: max error {float(lse_err.max()):.3g}, worst ratio "
        f"{float((lse_err / lse_b).max()):.3g}")


def _small_splits(dtype: torch.dtype) -> dict[str, int]:
    """Splits of two tiles with lead splits of one: rows cross several split boundaries."""
    n = tile_config(dtype, HEADS.head_dim).block_n
    return {"split_size": 2 * n, "lead_split_size": n}


def _cases() -> list[Any]:
    cases = [pytest.param(name, spec, False, id=name) for name, spec in FEATURES.items()]
    cases += [pytest.param(name, spec, True, id=name) for name, spec in FP8_FEATURES.items()]
    return cases


@pytest.mark.parametrize(("name", "spec", "fp8"), _cases())
def test_feature_is_accurate_and_plan_independent(name: str, spec: dict[str, Any], fp8: bool,
                                                  dtype: torch.dtype, make_batch: Any,
                                                  args_of: Any, device: torch.device) -> None:
    if fp8 and dtype == torch.float32:
        pytest.skip("an FP8 cache goes with float16 or bfloat16 queries")
    layout = PageLayout(16, "shuffled", seed=2)
    batch = (_fp8_batch(make_batch, dtype, layout) if fp8
             else make_batch(dtype, SHAPE, layout, heads=HEADS))
    feats = _resolve(spec, HEADS.num_q_heads, HEADS.num_kv_heads, device)
    args = args_of(batch)
    fused = unified_attention(*args, plan="fused", **_small_splits(dtype), **feats)
    split = unified_attention(*args, plan="split", **_small_splits(dtype), **feats)
    for t, u, what in zip(fused, split, ("out", "lse"), strict=True):
        diff = compare_bits(t, u, name=what)
        assert diff.equal, f"{name}: fused vs split: {diff.summary()}"
    _check_accurate(fused[0], fused[1], args, feats, dtype)


#: Every feature at once, with a window wide enough (150 keys) that the control's batch-dependent
#: split boundaries fall inside it.
INVARIANCE_CASES = [
    pytest.param("features", {"window_left": 150, "sinks": "sinks", "logits_soft_cap": 8.0}, False,
                 id="features"),
    pytest.param("fp8-all", {**FP8_FEATURES["fp8-all"], "window_left": 150}, True, id="fp8-all")]


@pytest.mark.parametrize(("name", "spec", "fp8"), INVARIANCE_CASES)
def test_feature_rows_are_batch_invariant(name: str, spec: dict[str, Any], fp8: bool,
                                          dtype: torch.dtype, make_batch: Any, args_of: Any,
                                          device: torch.device,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Request 0 alone and as the first of a batch (other lengths, other pages): the same bits
    under the contract; the batch-dependent control (``split_size=None``) differs, so the
    comparison can fail (on 8 SMs, so that a batch of 8 fills the GPU and the control's split
    count changes)."""
    import kernels.plan

    monkeypatch.setattr(kernels.plan, "_num_sms", lambda device: 8)
    if fp8 and dtype == torch.float32:
        pytest.skip("an FP8 cache goes with float16 or bfloat16 queries")
    feats = _resolve(spec, HEADS.num_q_heads, HEADS.num_kv_heads, device)
    target = [SHAPE[0]]
    crowd = [SHAPE[0], (1, 50), (1, 20), (3, 30), (1, 7), (1, 9), (2, 11), (1, 13)]
    build = (lambda shape, layout: _fp8_batch(make_batch, dtype, layout, shape)) if fp8 else (
        lambda shape, layout: make_batch(dtype, shape, layout, heads=HEADS))
    alone = build(target, PageLayout(16))
    batch = build(crowd, PageLayout(16, "reversed", extra_pages=3, seed=1))
    splits = _small_splits(dtype)
    for plan in ("auto", "fused", "split"):
        a = unified_attention(*args_of(alone), plan=plan, **splits, **feats)
        b = unified_attention(*args_of(batch), plan=plan, **splits, **feats)
        for t, u, what in zip(a, b, ("out", "lse"), strict=True):
            diff = compare_bits(t[:1], u[:1], name=what)
            assert diff.equal, f"{name} ({plan}): alone vs batched: {diff.summary()}"
    a = unified_attention(*args_of(alone), split_size=None, **feats)
    b = unified_attention(*args_of(batch), split_size=None, **feats)
    assert not (compare_bits(a[0][:1], b[0][:1]).equal and compare_bits(a[1][:1], b[1][:1]).equal
                ), "the control gave the same bits: the comparison could not have failed"


def test_a_window_skips_the_keys_before_it(make_batch: Any, args_of: Any,
                                           device: torch.device) -> None:
    """Keys before a row's window are never read: poisoning them (NaN) changes no bit."""
    dtype = torch.float32
    batch = make_batch(dtype, [(1, 300)], PageLayout(16), heads=HEADS)
    args = args_of(batch)
    clean = unified_attention(*args, window_left=40, **_small_splits(dtype))
    pages = batch.block_table[0, : (300 - 1 - 40) // 16].long()
    batch.k_cache[pages] = float("nan")
    batch.v_cache[pages] = float("nan")
    poisoned = unified_attention(*args_of(batch), window_left=40, **_small_splits(dtype))
    for t, u in zip(clean, poisoned, strict=True):
        assert compare_bits(t, u).equal


BAD: list[tuple[dict[str, Any], str]] = [
    ({"window_left": -2}, r"window_left: expected an int >= -1"),
    ({"window_left": 1.5}, r"window_left: expected an int >= -1.*got 1.5"),
    ({"window_left": True}, r"window_left: expected an int"),
    ({"logits_soft_cap": -1.0}, r"logits_soft_cap: expected a finite real >= 0"),
    ({"logits_soft_cap": float("inf")}, r"logits_soft_cap: expected a finite real"),
    ({"logits_soft_cap": 1e39},
     r"logits_soft_cap: expected 0 \(none\) or a cap in \[0.001, 10000\]"),
    ({"logits_soft_cap": 1e-9}, r"logits_soft_cap: expected 0 \(none\) or a cap in"),
    ({"sinks": [1.0, 2.0]}, r"sinks: expected a float32 tensor of shape \(4,\)"),
    ({"sinks": "shape"}, r"sinks: expected a float32 tensor of shape \(4,\).*shape \(3,\)"),
    ({"sinks": "nan"}, r"sinks: expected finite values, got sinks\[1\]=nan"),
    ({"k_scale": 2.0}, r"k_scale: expected None or 1.0 for a non-FP8 cache"),
    ({"v_scale": "tensor"}, r"v_scale: expected None for a torch.float32 cache"),
]


@pytest.mark.parametrize(("kwargs", "match"), BAD)
def test_bad_feature_arguments_are_named(kwargs: dict[str, Any], match: str, make_batch: Any,
                                         args_of: Any, device: torch.device) -> None:
    batch = make_batch(torch.float32, [(1, 20)], heads=HEADS)
    kwargs = dict(kwargs)
    if kwargs.get("sinks") == "shape":
        kwargs["sinks"] = torch.zeros(3, device=device)
    if kwargs.get("sinks") == "nan":
        kwargs["sinks"] = torch.tensor([0.0, float("nan"), 0.0, 0.0], device=device)
    if kwargs.get("v_scale") == "tensor":
        kwargs["v_scale"] = torch.ones(2, device=device)
    with pytest.raises(ValueError, match=match):
        unified_attention(*args_of(batch), **kwargs)


def test_bad_fp8_arguments_are_named(make_batch: Any, args_of: Any,
                                     device: torch.device) -> None:
    batch = _fp8_batch(make_batch, torch.float16, PageLayout(16), [(1, 20)])
    args = args_of(batch)
    for kwargs, match in (
            ({"k_scale": 0.0}, r"k_scale: expected a positive finite real"),
            ({"v_scale": float("nan")}, r"v_scale: expected a positive finite real"),
            ({"k_scale": torch.ones(3, device=device)},
             r"k_scale: expected a float32 tensor of shape \(2,\)"),
            ({"k_scale": torch.tensor([1.0, -1.0], device=device)},
             r"k_scale: expected positive finite values, got k_scale\[1\]=-1.0"),
            ({"v_scale": torch.tensor(-2.0, device=device)},
             r"v_scale: expected positive finite values, got v_scale\[0\]=-2.0")):
        with pytest.raises(ValueError, match=match):
            unified_attention(*args, **kwargs)
    # A one-element scale tensor is a per-tensor scale: the bits of the same float.
    a = unified_attention(*args, k_scale=0.5, v_scale=2.0)
    b = unified_attention(*args, k_scale=torch.tensor(0.5, device=device),
                          v_scale=torch.tensor([2.0], device=device))
    assert all(compare_bits(x, y).equal for x, y in zip(a, b, strict=True))
    with pytest.raises(ValueError, match=r"v_cache: expected dtype torch.float16 \(same as q\) "
                                         r"or torch.float8_e4m3fn for both caches"):
        unified_attention(batch.q, batch.k_cache, batch.v_cache.half(), *args[3:])
    q32 = batch.q.float()
    with pytest.raises(ValueError, match=r"k_cache: expected dtype torch.float32 \(same as q\), "
                                         r"got torch.float8_e4m3fn"):
        unified_attention(q32, *args[1:])


def test_fp8_v_blocks_of_32_columns_are_refused_though_the_interpreter_agrees(
        make_batch: Any, args_of: Any, device: torch.device,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 32-column V blocks with an FP8 cache compute wrong values on an H200 (the tuner's
    # admission rejected them; the float64 reference shows them wrong: reports/h200/
    # tune-features): refused, named. Under the interpreter, with the refusal lifted, they give
    # one block's bits (so the fault is the GPU build's: ARCHITECTURE.md, "Tuning"); another
    # split size, the control, does not.
    import kernels.plan
    from kernels import Tuning

    args = args_of(_fp8_batch(make_batch, torch.bfloat16, PageLayout(16)))
    kw: dict[str, Any] = dict(plan="split", k_scale=0.02, v_scale=0.5)
    with pytest.raises(ValueError, match=r"value_blocks other than 2 with an FP8 cache at "
                                         r"head_dim 64 .* got value_blocks=2"):
        unified_attention(*args, tuning=Tuning(value_blocks=2), **kw)
    if device.type == "cuda":
        pytest.skip("the GPU's bits for these blocks are the open question: not asserted")
    one = unified_attention(*args, tuning=Tuning(value_blocks=1), **kw)
    monkeypatch.setattr(kernels.plan, "_FP8_REFUSED_V_COLUMNS", -1)
    two = unified_attention(*args, tuning=Tuning(value_blocks=2), **kw)
    assert all(compare_bits(x, y).equal for x, y in zip(one, two, strict=True))
    other = unified_attention(*args, tuning=Tuning(value_blocks=1), split_size=256, **kw)
    assert not all(compare_bits(x, y).equal for x, y in zip(one, other, strict=True))
