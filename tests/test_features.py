"""Attention features (sliding window, attention sinks, logit soft-cap, FP8 KV): the batch
contract and its validation, the float64 reference against an independent naive computation,
the workloads that make each feature bite, the check settings (API, negotiation, reports,
case files) and the accuracy bound's negative controls."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest
import torch

import invariance
from _invariance_options import OptionError, collect, feature_settings, parse_feature
from invariance import (
    AttentionBatch,
    AttentionResult,
    Capabilities,
    Chunk,
    Features,
    HeadConfig,
    PageLayout,
    Request,
    Step,
    Workload,
    materialize,
)
from invariance.accuracy import TANH_ERR, measure_accuracy
from invariance.backends.reference import reference_backend
from invariance.features import FP8_MAX, SINK_LADDER, sink_values
from invariance.perturb import SCALES
from invariance.render import to_junit, to_markdown
from invariance.replay import case_from_dict, case_to_dict, reproducer
from invariance.report import Report, ReportError
from invariance.schedule import Schedule, run_schedule
from invariance.spec import CheckSpec
from invariance.workload import token_content

FP8 = torch.float8_e4m3fn


HEADS = HeadConfig(4, 2, 64)


def _batch(features: Features, dtype: torch.dtype = torch.float32, seed: int = 3,
           heads: HeadConfig = HEADS) -> AttentionBatch:
    """Decodes, a prefill from 0, a chunk, a one-token prefill and a request without a query
    token, on shuffled pages with NaN in unused slots; lengths straddle a window of 5."""
    wl = Workload(tuple(Request(i, n, family=f) for i, (n, f) in enumerate(
        [(23, "gaussian"), (9, "large"), (40, "ties"), (1, "zeros"), (6, "alternating"),
         (17, "large")])), heads, dtype, seed, features)
    step = Step((Chunk(0, 22, 23), Chunk(1, 0, 9), Chunk(2, 30, 40), Chunk(3, 0, 1),
                 Chunk(4, 6, 6), Chunk(5, 16, 17)))
    layout = PageLayout(page_size=4, placement="shuffled", seed=1, extra_pages=2, fill="nan")
    return materialize(wl, step, layout, "cpu").validate()


# --------------------------------------------------------------------------------------------
# An independent naive computation
# --------------------------------------------------------------------------------------------

def _naive(batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row from scratch: keys read token by token through the block table, dequantized
    by hand, the full score row, a boolean window/causal mask, the sink as one more column of a
    softmax (probability of a value vector of zeros), LSE by logsumexp over the same columns.
    Float64; ``out`` in float64 too (the caller rounds)."""
    T, Hq, D = batch.q.shape
    Hkv = batch.num_kv_heads
    G = Hq // Hkv
    P = batch.page_size
    cu, kv_lens = batch.cu_seqlens_q.tolist(), batch.kv_lens.tolist()

    def scales(s: float | torch.Tensor | None) -> list[float]:
        if s is None:
            return [1.0] * Hkv
        if isinstance(s, torch.Tensor):
            return [float(x) for x in s]
        return [float(s)] * Hkv

    ks, vs = scales(batch.k_scale), scales(batch.v_scale)
    out = torch.zeros(T, Hq, D, dtype=torch.float64)
    lse = torch.full((T, Hq), float("-inf"), dtype=torch.float64)
    for b in range(batch.batch_size):
        n, L = cu[b + 1] - cu[b], kv_lens[b]
        if n == 0:
            continue
        keys = torch.stack([batch.k_cache[int(batch.block_table[b, j // P]), j % P]
                            for j in range(L)]).double()  # [L, Hkv, D]
        vals = torch.stack([batch.v_cache[int(batch.block_table[b, j // P]), j % P]
                            for j in range(L)]).double()
        keys *= torch.tensor(ks, dtype=torch.float64)[None, :, None]
        vals *= torch.tensor(vs, dtype=torch.float64)[None, :, None]
        for i in range(n):
            p = L - n + i
            for h in range(Hq):
                qv = batch.q[cu[b] + i, h].double()
                s = (keys[:, h // G] @ qv) * batch.sm_scale  # [L]
                if batch.logits_soft_cap:
                    s = batch.logits_soft_cap * torch.tanh(s / batch.logits_soft_cap)
                j = torch.arange(L)
                ok = j <= p
                if batch.window_left >= 0:
                    ok &= j >= p - batch.window_left
                s = torch.where(ok, s, torch.full_like(s, float("-inf")))
                v = vals[:, h // G]
                if batch.sinks is not None:
                    s = torch.cat([s, batch.sinks[h].double().view(1)])
                    v = torch.cat([v, torch.zeros(1, D, dtype=torch.float64)])
                out[cu[b] + i, h] = torch.softmax(s, 0) @ v
                lse[cu[b] + i, h] = torch.logsumexp(s, 0)
    return out, lse


CASES = {
    "none": Features(),
    "window": Features(window=5),
    "window0": Features(window=0),
    "sinks": Features(sinks=True),
    "softcap": Features(softcap=3.0),
    "window+sinks": Features(window=7, sinks=True),
    "window+softcap": Features(window=3, softcap=20.0),
    "sinks+softcap": Features(sinks=True, softcap=2.5),
    "all": Features(window=6, sinks=True, softcap=4.0),
}
FP8_CASES = {
    "fp8": Features(kv_dtype="fp8_e4m3"),
    "fp8-head": Features(kv_dtype="fp8_e4m3", kv_scale="head"),
    "fp8-all": Features(window=5, sinks=True, softcap=8.0, kv_dtype="fp8_e4m3",
                        kv_scale="head"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_reference_matches_a_naive_computation(name: str) -> None:
    batch = _batch(CASES[name])
    got = reference_backend(batch)
    want_out, want_lse = _naive(batch)
    torch.testing.assert_close(got.out.double(), want_out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got.lse.double(), want_lse, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", list(FP8_CASES))
@pytest.mark.parametrize("qdtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_reference_matches_a_naive_computation_fp8(name: str, qdtype: torch.dtype) -> None:
    batch = _batch(FP8_CASES[name], qdtype)
    assert batch.k_cache.dtype == FP8 and batch.kv_fp8
    got = reference_backend(batch)
    want_out, want_lse = _naive(batch)
    u = 2.0**-8 if qdtype == torch.bfloat16 else 2.0**-11
    scale = want_out.abs().amax().item()
    torch.testing.assert_close(got.out.double(), want_out, rtol=0, atol=u * scale)
    torch.testing.assert_close(got.lse.double(), want_lse, rtol=1e-6, atol=1e-5)


def test_features_change_the_result() -> None:
    """Each feature moves the reference (a reference that ignored one would pass the naive
    comparison only if the naive computation ignored it too: here they are compared with the
    feature-less result)."""
    base = reference_backend(_batch(Features()))
    for name, feats in list(CASES.items())[1:]:
        other = reference_backend(_batch(feats))
        assert not torch.equal(other.out, base.out), name
        assert not torch.equal(other.lse, base.lse), name


def test_window_zero_sees_only_its_own_key_and_sinks_by_hand() -> None:
    """``window_left=0``: the output is the row's own value; with a sink ``z``, scaled by
    ``e^s / (e^s + e^z)``; the LSE is ``log(e^s + e^z)``."""
    batch = _batch(Features(window=0, sinks=True))
    out, lse = (t.double() for t in (reference_backend(batch).out, reference_backend(batch).lse))
    b, i = 0, 22  # request 0's decode of token 22: row 0
    P, G = batch.page_size, 2
    for h in range(4):
        page = int(batch.block_table[b, i // P])
        k = batch.k_cache[page, i % P, h // G].double()
        v = batch.v_cache[page, i % P, h // G].double()
        s = float(batch.q[0, h].double() @ k) * batch.sm_scale
        z = float(batch.sinks[h])  # type: ignore[index]
        w = math.exp(s) / (math.exp(s) + math.exp(z))
        torch.testing.assert_close(out[0, h], (v * w).float().double(), rtol=1e-6, atol=1e-7)
        assert lse[0, h].item() == pytest.approx(math.log(math.exp(s) + math.exp(z)), abs=1e-5)


def test_dominant_and_negligible_sinks() -> None:
    """A sink far above every score takes all the mass (the output underflows to zero, the
    LSE is the sink); one far below changes no bit."""
    batch = _batch(Features())
    H = batch.num_q_heads
    plain = reference_backend(batch)
    high = reference_backend(replace(batch, sinks=torch.full((H,), 1000.0)))
    low = reference_backend(replace(batch, sinks=torch.full((H,), -1000.0)))
    assert bool((high.out == 0).all()) and bool((high.lse == 1000.0).all())
    assert torch.equal(low.out, plain.out) and torch.equal(low.lse, plain.lse)


def test_softcap_bounds_the_scores() -> None:
    """With a cap ``c`` every score is in ``(-c, c)``, so the LSE of a row of ``L`` keys is
    below ``c + log L``, whatever the magnitudes (the large family's scores are far past it)."""
    batch = _batch(Features(softcap=1.0))
    lse = reference_backend(batch).lse
    kv = batch.kv_lens.tolist()
    cu = batch.cu_seqlens_q.tolist()
    for b in range(batch.batch_size):
        for r in range(cu[b], cu[b + 1]):
            assert float(lse[r].max()) < 1.0 + math.log(kv[b]) + 1e-6


# --------------------------------------------------------------------------------------------
# The batch contract
# --------------------------------------------------------------------------------------------

def _fp8(batch: AttentionBatch) -> AttentionBatch:
    return replace(batch, k_cache=batch.k_cache.to(FP8), v_cache=batch.v_cache.to(FP8))


BAD = [
    pytest.param(lambda b: replace(b, window_left=-2), r"window_left: expected an int >= 0, "
                 r"or -1 \(no window\), got -2", id="window-negative"),
    pytest.param(lambda b: replace(b, window_left=True), "window_left: expected an int",
                 id="window-bool"),
    pytest.param(lambda b: replace(b, window_left=4.0), "window_left: expected an int",
                 id="window-float"),
    pytest.param(lambda b: replace(b, logits_soft_cap=-1.0), "logits_soft_cap: expected 0.0",
                 id="softcap-negative"),
    pytest.param(lambda b: replace(b, logits_soft_cap=float("nan")), "logits_soft_cap",
                 id="softcap-nan"),
    pytest.param(lambda b: replace(b, logits_soft_cap=True), "logits_soft_cap", id="cap-bool"),
    pytest.param(lambda b: replace(b, sinks=torch.zeros(3)), r"sinks: expected a float32 "
                 r"tensor of shape \[4\] \(Hq\)", id="sinks-shape"),
    pytest.param(lambda b: replace(b, sinks=torch.zeros(4, dtype=torch.float64)),
                 "sinks: expected a float32", id="sinks-dtype"),
    pytest.param(lambda b: replace(b, sinks=torch.tensor([0.0, float("inf"), 0.0, 0.0])),
                 "sinks: expected finite logits", id="sinks-inf"),
    pytest.param(lambda b: replace(b, sinks=[0.0] * 4), "sinks: expected None or a float32",
                 id="sinks-list"),
    pytest.param(lambda b: replace(_fp8(b), q=b.q.float()), r"k_cache.dtype: expected "
                 r"torch.float32 \(q's dtype; an FP8 cache needs q in float16 or bfloat16\)",
                 id="fp8-with-fp32-q"),
    pytest.param(lambda b: replace(_fp8(b), v_cache=b.v_cache), r"v_cache.dtype: expected "
                 r"torch.float8_e4m3fn \(k_cache's dtype\)", id="fp8-k-only"),
    pytest.param(lambda b: replace(b, k_scale=0.5), r"k_scale: expected None or 1.0 for a "
                 r"torch.bfloat16 cache", id="scale-without-fp8"),
    pytest.param(lambda b: replace(b, v_scale=torch.ones(2)), "v_scale: expected None or 1.0",
                 id="tensor-scale-without-fp8"),
    pytest.param(lambda b: replace(_fp8(b), k_scale=0.0), "k_scale: expected None, a finite "
                 "float > 0", id="scale-zero"),
    pytest.param(lambda b: replace(_fp8(b), k_scale=float("inf")), "k_scale", id="scale-inf"),
    pytest.param(lambda b: replace(_fp8(b), v_scale=True), "v_scale", id="scale-bool"),
    pytest.param(lambda b: replace(_fp8(b), k_scale=torch.ones(3)), r"k_scale: expected a "
                 r"float, or a float32 tensor of shape \[2\] \(Hkv\)", id="scale-shape"),
    pytest.param(lambda b: replace(_fp8(b), k_scale=torch.ones(2, dtype=torch.float64)),
                 "k_scale: expected a float, or a float32 tensor", id="scale-dtype"),
    pytest.param(lambda b: replace(_fp8(b), v_scale=torch.tensor([1.0, -1.0])),
                 r"v_scale: expected finite scales > 0, got \[1.0, -1.0\]", id="scale-negative"),
]


@pytest.mark.parametrize(("mutate", "message"), BAD)
def test_feature_fields_are_validated(mutate: Any, message: str) -> None:
    batch = _batch(Features(), torch.bfloat16)
    with pytest.raises(ValueError, match=message):
        mutate(batch).validate()


def test_valid_feature_fields_and_features_used() -> None:
    plain = _batch(Features(), torch.bfloat16)
    assert plain.features_used() == frozenset()
    replace(plain, k_scale=1.0, v_scale=None).validate()  # 1.0 means "no scale"
    fp8 = replace(_fp8(plain), k_scale=0.25, v_scale=torch.tensor([0.5, 2.0])).validate()
    assert fp8.features_used() == {"fp8_kv_head"}
    assert replace(fp8, v_scale=None).features_used() == {"fp8_kv"}
    full = replace(fp8, window_left=0, sinks=torch.zeros(4), logits_soft_cap=30.0).validate()
    assert full.features_used() == {"window", "sinks", "softcap", "fp8_kv_head"}


def test_backends_without_a_feature_refuse_it() -> None:
    batch = _batch(Features(window=4), torch.bfloat16)
    for name in ("sdpa", "torch-batch-variant"):
        with pytest.raises(ValueError, match=rf"backend {name}: expected a batch without "
                                             r"window \(it takes no features\)"):
            invariance.resolve_backend(name)(batch)
    with pytest.raises(ValueError, match="backend sdpa-math: expected a batch without softcap"):
        invariance.resolve_backend("sdpa-math")(_batch(Features(softcap=2.0)))


# --------------------------------------------------------------------------------------------
# Workloads that make the features bite
# --------------------------------------------------------------------------------------------

def test_fp8_content_spans_the_format_and_is_a_pure_function() -> None:
    whole = token_content(7, 3, "k", 0, 600, 2, 64, torch.bfloat16, fp8=True)
    part = token_content(7, 3, "k", 250, 260, 2, 64, torch.float16, fp8=True)
    assert whole.dtype == FP8 and part.dtype == FP8
    assert torch.equal(whole[250:260].view(torch.uint8), part.view(torch.uint8))
    x = whole.float().abs()
    assert (x == 0).float().mean() > 0.02  # zeros
    assert ((x > 0) & (x < 2**-6)).float().mean() > 0.1  # subnormals
    assert 256 <= float(x.max()) <= FP8_MAX and not torch.isnan(x).any()
    q = token_content(7, 3, "q", 0, 10, 4, 64, torch.bfloat16, fp8=True)
    assert q.dtype == torch.bfloat16  # queries stay in the query dtype
    # Pages of a batch hold different maxima: a scale taken from a batch would move.
    pages = x.view(150, 4 * 2 * 64).amax(1)
    assert len(set(pages.tolist())) > 5


def test_sinks_are_fixed_by_the_seed_and_some_dominate() -> None:
    a, b = sink_values(5, 8), sink_values(5, 8)
    assert a == b and sink_values(6, 8) != a
    assert sink_values(5, 3) == a[:3]  # a head's sink does not depend on the head count
    for seed in range(20):
        s = sink_values(seed, 4)
        assert max(s) >= min(SINK_LADDER[2:4]) - 0.5  # dominates a gaussian row's LSE
        assert min(s) <= SINK_LADDER[1] + 0.5  # below short rows' LSE or far below
        assert all(struct_f32(x) == x for x in s)
    wl = Workload((Request(0, 4),), HeadConfig(4, 2, 64), seed=9, features=Features(sinks=True))
    assert wl.sinks("cpu").tolist() == sink_values(9, 4)  # type: ignore[union-attr]


def struct_f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def test_softcap_grows_the_large_family_past_the_cap() -> None:
    assert Features().large_scale == 8.0
    f = Features(softcap=50.0)
    assert f.large_scale == pytest.approx(math.sqrt(200.0))
    q = token_content(0, 1, "q", 0, 64, 4, 64, torch.float32, family="large", large=f.large_scale)
    k = token_content(0, 1, "k", 0, 64, 2, 64, torch.float32, family="large",
                      large=f.large_scale)
    s = torch.einsum("thd,jhd->thj", q[:, :2], k) / 8.0
    assert float((s.abs() > 2 * 50.0).float().mean()) > 0.25  # far past the cap, often


def test_kv_scales_are_fixed_per_head() -> None:
    f = Features(kv_dtype="fp8_e4m3", kv_scale="head")
    k, v = f.kv_scale_values("k", 8), f.kv_scale_values("v", 8)
    assert len(set(k)) == 4 and k[:4] == k[4:] and k != v
    assert Features(kv_dtype="fp8_e4m3").kv_scale_values("k", 3) == [k[0]] * 3
    wl = Workload((Request(0, 4),), HeadConfig(4, 2, 64), torch.float16, features=f)
    assert wl.kv_scale("k", "cpu").tolist() == k[:2]  # type: ignore[union-attr]
    assert Workload((Request(0, 4),), dtype=torch.float16).kv_scale("k", "cpu") is None


def test_scale_for_window_puts_rows_on_both_sides_of_the_edge() -> None:
    small = SCALES["small"]
    assert small.for_window(None) is small
    w = small.for_window(128)
    assert w.long > 2 * 128 and w.short[1] >= 2 * 128 and w.prefill_len[0] > 128
    assert small.for_window(0).short == small.short
    big = SCALES["large"].for_window(4096)
    assert big.long == 32768 and big.short == (64, 8194)


@pytest.mark.parametrize("window", [0, 16, 128])
def test_every_perturbation_compares_rows_on_both_sides_of_the_window(window: int) -> None:
    scale = SCALES["small"].for_window(window)
    feats = Features(window=window)
    for p in invariance.PERTURBATIONS.values():
        past = inside = 0
        for case in p.cases(scale=scale, heads=HeadConfig(), dtype=torch.float32, seed=1,
                            budget=1, features=feats):
            assert case.workload.features == feats
            a = {(c.request_id, t) for st in case.a.steps for c in st.chunks
                 for t in range(c.start, c.stop)}
            b = {(c.request_id, t) for st in case.b.steps for c in st.chunks
                 for t in range(c.start, c.stop)}
            pos = [t for r, t in a & b if not case.workload.request(r).padding]
            past += sum(t > window for t in pos)
            inside += sum(t <= window for t in pos)
        assert past > 0, p.name
        # prefix_sharing's prompts are all longer than the window; spec_verify compares draft
        # tokens at split boundaries, past the window: every row the window cuts.
        if window and p.name not in ("prefix_sharing", "spec_verify"):
            assert inside > 0, p.name


# --------------------------------------------------------------------------------------------
# Settings: the API, negotiation, options
# --------------------------------------------------------------------------------------------

def test_features_build_from_every_form() -> None:
    want = Features(window=128, sinks=True, softcap=50.0, kv_dtype="fp8_e4m3", kv_scale="head")
    for given in ({"window": 128, "sinks": True, "softcap": 50, "kv_scale": "head"},
                  ["window=128", "sinks", "softcap=50", "kv_scale=head"],
                  "window=128,sinks,softcap=50.0,kv_scale=head",
                  [("window", 128), ("sinks", True), ("softcap", 50.0), ("kv_scale", "head")]):
        assert Features.build(given, "fp8") == want
    assert Features.build(Features(window=3), "float8_e4m3fn") == Features(
        window=3, kv_dtype="fp8_e4m3")
    assert Features.build(None, None) == Features() and not Features()
    assert Features.from_dict(want.to_dict()) == want
    assert Features().to_dict() == {} and want.required == {"window", "sinks", "softcap",
                                                             "fp8_kv_head"}
    assert want.describe() == ("window 128, sinks, softcap 50, fp8_e4m3 KV (per-head scales)")


@pytest.mark.parametrize(("features", "kv_dtype", "message"), [
    ({"window": -1}, None, r"feature window: expected window=N \(an int >= 0\), got -1"),
    ({"window": True}, None, "feature window: expected"),
    ({"softcap": 0}, None, r"feature softcap: expected softcap=X \(a finite float > 0\), got 0"),
    ({"softcap": float("inf")}, None, "feature softcap"),
    ({"sinks": "maybe"}, None, "feature sinks: expected sinks"),
    ({"size": 4}, None, "feature: expected one of window, sinks, softcap, kv_scale, got 'size'"),
    (["window=1", "window=2"], None, r"feature window: given twice \(1 and 2\)"),
    ({"kv_scale": "head"}, None, "features.kv_scale: expected 'tensor'"),
    ({"kv_scale": "row"}, "fp8", "feature kv_scale: expected kv_scale=tensor|head"),
    (None, "fp16", "kv_dtype: expected one of fp8_e4m3"),
    (42, None, "features: expected a dict"),
])
def test_bad_features_name_the_setting(features: Any, kv_dtype: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CheckSpec.build("reference", device="cpu", features=features, kv_dtype=kv_dtype)


def test_option_parsing_is_shared_by_the_faces() -> None:
    assert collect({"features": ["window=128", "sinks,softcap=50"], "kv_dtype": "e4m3"}) == {
        "features": {"window": 128, "sinks": True, "softcap": 50.0}, "kv_dtype": "fp8_e4m3"}
    assert parse_feature("sinks=off") == ("sinks", False)
    assert feature_settings({"WINDOW": "7"}) == {"window": 7}
    with pytest.raises(OptionError, match="feature softcap: expected softcap=X"):
        parse_feature("softcap")


class _Counting:
    """A backend that counts its calls (negotiation must refuse before any)."""

    def __init__(self, caps: Capabilities) -> None:
        self.capabilities = caps
        self.calls = 0

    def __call__(self, batch: AttentionBatch) -> AttentionResult:
        self.calls += 1
        return reference_backend(batch)


def test_negotiation_refuses_missing_features_before_anything_runs() -> None:
    plain = _Counting(Capabilities())
    with pytest.raises(ValueError, match=r"features: backend .* takes no features, not sinks, "
                                         r"window \(its capabilities say so\), got window 8, "
                                         r"sinks"):
        invariance.check(plain, device="cpu", features={"window": 8, "sinks": True})
    some = _Counting(Capabilities(features=frozenset({"window", "fp8_kv"})))
    with pytest.raises(ValueError, match="takes fp8_kv, window, not fp8_kv_head"):
        invariance.check(some, device="cpu", kv_dtype="fp8", features={"kv_scale": "head"})
    torn = _Counting(Capabilities(features=frozenset({"sinks", "softcap"}),
                                  feature_conflicts=(frozenset({"sinks", "softcap"}),)))
    with pytest.raises(ValueError, match="cannot combine sinks and softcap"):
        invariance.check(torn, device="cpu", features={"sinks": True, "softcap": 5.0})
    with pytest.raises(ValueError, match=r"features: backend sdpa takes no features"):
        invariance.check("sdpa", device="cpu", features=["window=4"])
    assert plain.calls == some.calls == torn.calls == 0
    # What it declares runs.
    report = invariance.check(torn, device="cpu", features={"sinks": True},
                              perturbations=["repeat"])
    assert report.passed and torn.calls > 0


def test_fp8_needs_half_precision_queries() -> None:
    spec = CheckSpec.build("reference", device="cpu", kv_dtype="fp8_e4m3")
    assert spec.dtypes == (torch.bfloat16,)  # the CPU default becomes bfloat16
    assert CheckSpec.build("reference", device="cpu", kv_dtype="fp8",
                           dtype=["fp16", "bf16"]).dtypes == (torch.float16, torch.bfloat16)
    with pytest.raises(ValueError, match=r"dtype: expected float16 or bfloat16 with kv_dtype "
                                         r"fp8_e4m3 .*, got float32"):
        CheckSpec.build("reference", device="cpu", kv_dtype="fp8", dtype="float32")
    with pytest.raises(ValueError, match=r"Workload\.dtype: expected float16 or bfloat16"):
        Workload((Request(0, 3),), features=Features(kv_dtype="fp8_e4m3"))


def test_spec_grows_the_scale_and_rebuilds_with_its_features() -> None:
    spec = CheckSpec.build("reference", device="cpu", features={"window": 300, "sinks": True},
                           kv_dtype="fp8")
    assert spec.scale.long >= 601 and spec.features.window == 300
    again = CheckSpec.build(**{**spec.rebuild_arguments(), "perturbations": ["mixed"]})
    assert again.features == spec.features and again.scale == spec.scale


# --------------------------------------------------------------------------------------------
# A check with features: the report, case files, reproducers
# --------------------------------------------------------------------------------------------

def test_check_records_features_in_the_report() -> None:
    report = invariance.check("reference", device="cpu", perturbations=["mixed"],
                              features={"window": 16, "sinks": True, "softcap": 20.0},
                              kv_dtype="fp8_e4m3")
    assert report.passed, report.summary()
    assert report.features == {"window": 16, "sinks": True, "softcap": 20.0,
                               "kv_dtype": "fp8_e4m3", "kv_scale": "tensor"}
    assert "(bfloat16; window 16, sinks, softcap 20, fp8_e4m3 KV (per-tensor scales))" in \
        report.summary()
    cov = report.results[0].coverage
    assert cov["rows_past_window_edge"] > 0 and cov["rows_inside_window"] > 0
    data = json.loads(report.to_json())
    assert data["version"] == "1.2" and data["features"] == report.features
    assert Report.from_dict(data).features == report.features
    md = to_markdown(report)
    assert "| features | window 16, sinks, softcap 20, fp8_e4m3 KV (per-tensor scales) |" in md
    assert 'name="features"' in to_junit(report)


def test_report_features_across_schema_versions() -> None:
    data = json.loads(invariance.check("reference", device="cpu",
                                       perturbations=["repeat"]).to_json())
    assert data["features"] == {}
    old = {k: v for k, v in data.items() if k != "features"}
    assert Report.from_dict({**old, "version": "1.1"}).features == {}  # before 1.2: absent
    with pytest.raises(ReportError, match="features: expected object, got nothing"):
        Report.from_dict(old)  # 1.2 writes it: a 1.2 file without it is malformed
    with pytest.raises(ReportError, match="features: expected object, got list"):
        Report.from_dict({**data, "features": []})
    a = Report.from_dict(data)
    b = Report.from_dict({**data, "features": {"window": 4}})
    assert Report.combine([a, a]).features == {}
    both = Report.combine([a, b])
    assert both.features == {"per_check": [{}, {"window": 4}]}
    assert "(float32; none | window 4)" in both.summary()


def test_case_files_and_reproducers_keep_the_features() -> None:
    feats = Features(window=3, sinks=True, softcap=7.0, kv_dtype="fp8_e4m3", kv_scale="head")
    case = next(invariance.PERTURBATIONS["mixed"].cases(
        scale=SCALES["small"].for_window(3), heads=HeadConfig(), dtype=torch.bfloat16, seed=0,
        budget=1, features=feats))
    data = json.loads(json.dumps(case_to_dict(case, backend="reference", device="cpu")))
    assert data["workload"]["features"] == feats.to_dict()
    back = case_from_dict(data)
    assert back.workload == case.workload
    without = {**data, "workload": {k: v for k, v in data["workload"].items()
                                    if k != "features"}}
    assert case_from_dict(without).workload.features == Features()  # older case files
    with pytest.raises(ValueError, match=r"workload\.features: expected keys"):
        case_from_dict({**data, "workload": {**data["workload"], "features": {"wndow": 3}}})
    with pytest.raises(ValueError, match="features: backend sdpa takes no features, not "
                                         "fp8_kv_head, sinks, softcap, window"):
        invariance.replay("sdpa", back.workload, back.a, back.b)
    code = reproducer(case, "reference", "cpu")
    assert "features=Features(window=3, sinks=True, softcap=7.0" in code
    exec(compile(code, "<reproducer>", "exec"), {})  # replays (and agrees) in a fresh namespace


# --------------------------------------------------------------------------------------------
# Accuracy: the bound with features, and backends that get a feature wrong
# --------------------------------------------------------------------------------------------

def _wrong(kind: str) -> Any:
    """A backend that declares every feature and gets ``kind`` wrong: it drops the window, the
    sinks or the soft-cap, or swaps the K and V scales."""

    def backend(batch: AttentionBatch) -> AttentionResult:
        if kind == "window":
            batch = replace(batch, window_left=-1)
        elif kind == "sinks":
            batch = replace(batch, sinks=None)
        elif kind == "softcap":
            batch = replace(batch, logits_soft_cap=0.0)
        elif kind == "scale":  # K and V scales swapped
            batch = replace(batch, k_scale=batch.v_scale, v_scale=batch.k_scale)
        return reference_backend(batch)

    backend.capabilities = Capabilities(  # type: ignore[attr-defined]
        features=frozenset({"window", "sinks", "softcap", "fp8_kv"}))
    return backend


@pytest.mark.parametrize(("kind", "settings"), [
    ("window", {"features": {"window": 16}}),
    ("sinks", {"features": {"sinks": True}}),
    ("softcap", {"features": {"softcap": 30.0}}),
    ("scale", {"kv_dtype": "fp8_e4m3"}),
])
def test_a_backend_that_gets_a_feature_wrong_is_inaccurate(kind: str,
                                                           settings: dict[str, Any]) -> None:
    report = invariance.check(_wrong(kind), device="cpu", perturbations=["mixed", "repeat"],
                              **settings)
    assert report.invariant and not report.accurate, report.summary()
    # The control: the same check of the reference passes, so the features themselves are not
    # what fails.
    assert invariance.check("reference", device="cpu", perturbations=["mixed", "repeat"],
                            **settings).passed


def _workload(feats: Features, qdtype: torch.dtype) -> tuple[Workload, Schedule]:
    wl = Workload(tuple(Request(i, n, family=f) for i, (n, f) in enumerate(
        [(60, "large"), (33, "gaussian"), (50, "alternating")])), HeadConfig(4, 2, 64), qdtype,
        seed=2, features=feats)
    sched = Schedule((Step((Chunk(0, 30, 60), Chunk(1, 32, 33), Chunk(2, 0, 50))),),
                     PageLayout(page_size=8))
    return wl, sched


@pytest.mark.parametrize("qdtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_bound_covers_fp8_values_rounded_to_the_query_dtype(qdtype: torch.dtype) -> None:
    """A kernel that scales the FP8 K and V in float32 and rounds them to the query dtype
    before its products (vLLM's Triton attention does) is within the bound, with every other
    feature on; the same values scaled 3% off are not."""
    feats = Features(window=20, sinks=True, softcap=10.0, kv_dtype="fp8_e4m3", kv_scale="head")
    wl, sched = _workload(feats, qdtype)

    def rounded(off: float) -> Any:
        def backend(batch: AttentionBatch) -> AttentionResult:
            ks, vs = batch.k_scale, batch.v_scale
            assert isinstance(ks, torch.Tensor) and isinstance(vs, torch.Tensor)
            k = (batch.k_cache.float() * ks[None, None, :, None] * off).to(qdtype)
            v = (batch.v_cache.float() * vs[None, None, :, None]).to(qdtype)
            return reference_backend(replace(batch, k_cache=k, v_cache=v, k_scale=None,
                                             v_scale=None))
        return backend

    ok = measure_accuracy(wl, run_schedule(rounded(1.0), wl, sched, "cpu"), rows=200)
    assert ok.passed and ok.worst_ratio > 0, ok
    bad = measure_accuracy(wl, run_schedule(rounded(1.03), wl, sched, "cpu"), rows=200)
    assert not bad.passed, bad


def test_bound_covers_an_approximate_tanh() -> None:
    """The soft-cap's tanh may be off by ``TANH_ERR`` (a hardware approximation): a cap scaled by
    ``1 + TANH_ERR / 2`` (a tanh off by at most half that) passes, one scaled by ``1 + 4 *
    TANH_ERR`` fails (in the LSE: saturated scores all move by the same amount)."""
    wl, sched = _workload(Features(window=20, softcap=10.0), torch.float16)

    def scaled(factor: float) -> Any:
        def backend(batch: AttentionBatch) -> AttentionResult:
            return reference_backend(replace(batch,
                                             logits_soft_cap=batch.logits_soft_cap * factor))
        return backend

    ok = measure_accuracy(wl, run_schedule(scaled(1 + TANH_ERR / 2), wl, sched, "cpu"),
                          rows=200)
    assert ok.passed, ok
    bad = measure_accuracy(wl, run_schedule(scaled(1 + 4 * TANH_ERR), wl, sched, "cpu"),
                           rows=200)
    assert not bad.passed, bad


def test_isolated_cells_run_with_the_features() -> None:
    """``isolate`` rebuilds the check in a child process: the features go with it."""
    report = invariance.check("reference", device="cpu", perturbations=["mixed"],
                              features={"window": 8}, isolate=True)
    assert report.passed, report.summary()
    assert report.results[0].coverage["rows_past_window_edge"] > 0
