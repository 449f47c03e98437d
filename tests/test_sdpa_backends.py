"""torch SDPA forced per backend: one request at a time from the pages, row blocks under a
memory budget, the row-blocked LSE, plan."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import invariance.backends.sdpa as sdpa_mod
import invariance.backends.torch_backends as tb
from invariance import (
    Chunk,
    Features,
    HeadConfig,
    PageLayout,
    Request,
    Step,
    Workload,
    materialize,
)
from invariance.backends import capabilities, planner, resolve
from invariance.backends.reference import reference_backend
from invariance.backends.sdpa import SdpaBackend
from invariance.batch import AttentionBatch

NAMES = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math")
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _batch(dtype: torch.dtype = torch.float32, device: str = "cpu") -> AttentionBatch:
    """Decode, prefill from 0, a chunk (q_len < kv_len), a request with no token; GQA."""
    wl = Workload(tuple(Request(i, n) for i, n in enumerate((9, 7, 12, 5))),
                  HeadConfig(4, 2, 64), dtype, seed=4)
    step = Step((Chunk(0, 8, 9), Chunk(1, 0, 7), Chunk(2, 5, 12), Chunk(3, 5, 5)))
    layout = PageLayout(page_size=4, placement="shuffled", seed=2)
    return materialize(wl, step, layout, device).validate()


def _record_sdpa(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record the shapes of every SDPA call of the adapter (and still run it)."""
    calls: list[dict[str, Any]] = []
    real: Callable[..., torch.Tensor] = torch.nn.functional.scaled_dot_product_attention

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
        mask = kw.get("attn_mask")
        calls.append({"q": tuple(q.shape), "k": tuple(k.shape),
                      "mask": tuple(mask.shape) if isinstance(mask, torch.Tensor) else mask})
        return real(q, k, v, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("max_bytes", [None, 1], ids=["one-block", "row-per-block"])
def test_math_matches_the_reference(dtype: torch.dtype, max_bytes: int | None) -> None:
    batch = _batch(dtype)
    result = SdpaBackend("math", max_bytes=max_bytes)(batch)
    ref = reference_backend(batch)
    assert result.out.dtype == dtype and result.lse.dtype == torch.float32
    assert result.out.shape == batch.q.shape and result.lse.shape == (batch.num_tokens, 4)
    tol = TOL[dtype]
    torch.testing.assert_close(result.out, ref.out, rtol=tol, atol=tol)
    torch.testing.assert_close(result.lse, ref.lse, rtol=1e-5, atol=1e-5)


def test_one_request_at_a_time_never_the_padded_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _record_sdpa(monkeypatch)
    SdpaBackend("math")(_batch())
    # (q_len, kv_len) per request with a token: the decode, the prefill, the chunk.
    assert [(c["q"][2], c["k"][2]) for c in calls] == [(1, 9), (7, 7), (7, 12)]
    for c in calls:
        assert c["q"][:2] == (1, 4) and c["k"][:2] == (1, 4)  # K/V repeated to the query heads
        assert c["mask"] == (1, 1, c["q"][2], c["k"][2])


def test_row_blocks_follow_the_request_and_the_budget() -> None:
    assert tb.row_blocks(0, 10, 100) == []
    assert tb.row_blocks(7, 0, 1) == [(0, 7)]
    assert tb.row_blocks(7, 30, 100) == [(0, 3), (3, 6), (6, 7)]
    assert tb.row_blocks(3, 1000, 100) == [(0, 1), (1, 2), (2, 3)]  # at least one row
    math = SdpaBackend("math", max_bytes=2 * 4 * 12 * 4 * 4)  # two rows of 12 keys, Hq=4
    assert math.blocks(7, 12, 4, torch.float32) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert SdpaBackend("math").blocks(7, 12, 4, torch.float32) == [(0, 7)]
    # efficient / cudnn count the mask and the bias torch derives from it: L * (1 + 2 * itemsize).
    eff = SdpaBackend("efficient", max_bytes=12 * 5 * 3)
    assert eff.blocks(7, 12, 4, torch.bfloat16) == [(0, 3), (3, 6), (6, 7)]
    assert SdpaBackend("flash", max_bytes=1).blocks(7, 12, 4, torch.bfloat16) == [(0, 7)]
    # 32k-token prefill at Hq=32 under the default 1 GiB: bounded blocks, not one 128 GiB call.
    big = SdpaBackend("math").blocks(32774, 32774, 32, torch.bfloat16)
    assert big[0] == (0, 63) and big[-1] == (32760, 32774)  # 16 MiB a row
    assert all(b - a == 63 for a, b in big[:-1])
    with pytest.raises(ValueError, match="max_bytes"):
        SdpaBackend("math", max_bytes=0)


def test_blocking_changes_only_the_call_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = _batch()
    whole = SdpaBackend("math")(batch)
    calls = _record_sdpa(monkeypatch)
    tiny = SdpaBackend("math", max_bytes=3 * 4 * 12 * 4 * 4)  # 3 rows of 12 keys at Hq=4
    blocked = tiny(batch)
    # The decode in one call; the prefill (7 rows over 7 keys) in blocks of 5 rows, the chunk
    # (7 rows over 12 keys) in blocks of 3, each block over all the request's keys.
    shapes = [(c["q"][2], c["k"][2]) for c in calls]
    assert shapes == [(1, 9), (5, 7), (2, 7), (3, 12), (3, 12), (1, 12)]
    assert all(c["mask"] == (1, 1, r, kv) for c, (r, kv) in zip(calls, shapes, strict=True))
    assert blocked.lse.shape == whole.lse.shape and blocked.out.shape == whole.out.shape
    torch.testing.assert_close(blocked.out, whole.out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(blocked.lse, whole.lse, rtol=1e-6, atol=1e-6)
    assert torch.isfinite(blocked.lse).all()


def test_a_kernel_refusing_one_key_gets_a_masked_zero_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # cuDNN refuses kv_len 1; the same path on math (which takes it) must not change the result.
    monkeypatch.setitem(sdpa_mod._MIN_KEYS, "math", 3)
    wl = Workload((Request(0, 1), Request(1, 2), Request(2, 6)), HeadConfig(4, 2, 64), seed=1)
    batch = materialize(wl, Step((Chunk(0, 0, 1), Chunk(1, 0, 2), Chunk(2, 5, 6))),
                        PageLayout(page_size=4), "cpu")
    calls = _record_sdpa(monkeypatch)
    result = SdpaBackend("math")(batch)
    assert [c["k"][2] for c in calls] == [3, 3, 6]
    ref = reference_backend(batch)
    torch.testing.assert_close(result.out, ref.out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result.lse, ref.lse, rtol=1e-5, atol=1e-5)


def test_causal_lse_is_row_blocked_under_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    n, L, Hq, Hkv, D = 9, 14, 4, 2, 8
    q, k = torch.randn(n, Hq, D), torch.randn(L, Hkv, D)
    # The naive float64 LSE, bottom-right causal, K heads repeated.
    s = torch.einsum("nhd,lhd->hnl", q.double(), k.double().repeat_interleave(2, dim=1)) * 0.3
    pos = L - n + torch.arange(n)
    s = s.masked_fill(torch.arange(L)[None, None, :] > pos[None, :, None], float("-inf"))
    naive = torch.logsumexp(s, dim=-1).t().float()
    sizes: list[int] = []
    real = torch.matmul

    def spy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        r = real(a, b)
        sizes.append(r.numel() * r.element_size())
        return r

    whole = tb.causal_lse(q, k, 0.3)
    monkeypatch.setattr(torch, "matmul", spy)
    budget = 2 * L * (Hq * 8 * 3 + 1)  # two rows a block (float64 scores, 3 copies)
    blocked = tb.causal_lse(q, k, 0.3, max_bytes=budget)
    assert len(sizes) == 5 and max(sizes) * 3 <= budget  # 5 blocks, scores x3 under the budget
    assert blocked.shape == whole.shape == (n, Hq) and blocked.dtype == torch.float32
    torch.testing.assert_close(whole, naive, rtol=1e-5, atol=1e-5)
    # Computed in float64, rounded once: the row count of the product does not show.
    assert torch.equal(blocked, whole)
    assert tb.causal_lse(q[:0], k, 0.3).shape == (0, Hq)


def test_lse_of_the_sdpa_adapters_matches_the_dense_one() -> None:
    # The adapters' per-request, row-blocked LSE equals the padded dense problem's.
    batch = _batch()
    torch.testing.assert_close(SdpaBackend("math")(batch).lse, tb.sdpa_backend(batch).lse,
                               rtol=1e-6, atol=1e-6)


def test_sdpa_backend_refactor_keeps_its_result() -> None:
    batch = _batch(torch.bfloat16)
    result = tb.sdpa_backend(batch)
    ref = reference_backend(batch)
    torch.testing.assert_close(result.out, ref.out, rtol=2e-2, atol=2e-2)
    empty = materialize(Workload((Request(0, 3),), HeadConfig(4, 2, 64)),
                        Step((Chunk(0, 3, 3),)), PageLayout(), "cpu")
    r = tb.sdpa_backend(empty)
    assert r.out.shape == (0, 4, 64) and r.lse.shape == (0, 4)
    r = SdpaBackend("math")(empty)
    assert r.out.shape == (0, 4, 64) and r.lse.shape == (0, 4)


def test_plan_takes_the_only_host_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = _batch()
    backend = resolve("sdpa-math")
    plan = planner(backend)
    assert plan is not None
    plan(batch, True)

    def no_sync(batch: AttentionBatch) -> None:
        raise AssertionError("host sync in the call")

    def no_tolist(self: torch.Tensor) -> None:
        raise AssertionError("host sync in the call (tolist)")

    monkeypatch.setattr(sdpa_mod, "batch_lengths", no_sync)
    monkeypatch.setattr(torch.Tensor, "tolist", no_tolist)
    monkeypatch.setattr(torch.Tensor, "item", no_tolist)
    monkeypatch.setattr(torch.Tensor, "__bool__", no_tolist)
    monkeypatch.setattr(torch.Tensor, "__int__", no_tolist)
    backend(batch)
    monkeypatch.undo()
    monkeypatch.setattr(sdpa_mod, "batch_lengths", no_sync)
    other = _batch()  # not planned: the call takes the lengths itself
    with pytest.raises(AssertionError, match="host sync"):
        backend(other)


def test_names_capabilities_and_descriptions() -> None:
    from invariance.backends import BUILTIN

    caps = {n: capabilities(resolve(n)) for n in NAMES}
    assert caps["sdpa-flash"].devices == ("cuda",)
    assert caps["sdpa-flash"].dtypes == ("float16", "bfloat16")
    assert caps["sdpa-cudnn"].dtypes == ("float16", "bfloat16")
    assert caps["sdpa-efficient"].devices == ("cuda",)
    assert "float32" in caps["sdpa-efficient"].dtypes
    assert caps["sdpa-math"].devices == ("cpu", "cuda")
    for n in NAMES:
        desc = BUILTIN[n].description
        assert "logsumexp" in desc and "per request" in desc and "padded" not in desc
        assert caps[n].cuda_graphs
        assert resolve(n).fn.max_bytes == sdpa_mod.MAX_BYTES == 1 << 30  # type: ignore[attr-defined]
    assert "SdpaBackend('math', max_bytes=" in repr(resolve("sdpa-math").fn)
    with pytest.raises(ValueError, match="kernel"):
        SdpaBackend("fast")  # type: ignore[arg-type]


def test_check_refuses_gpu_only_kernels_on_cpu() -> None:
    from invariance.spec import CheckSpec

    with pytest.raises(ValueError, match="runs on cuda"):
        CheckSpec.build("sdpa-flash", device="cpu", dtype="bfloat16")


def _skip_unsupported(name: str, fn: Callable[[], object]) -> object:  # pragma: no cover
    """Run ``fn``; skip when torch says this GPU / build has no such kernel for the inputs."""
    try:
        return fn()
    except RuntimeError as e:
        if "No available kernel" in str(e):
            pytest.skip(f"{name}: {e}".splitlines()[0])
        raise


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", NAMES)
def test_each_kernel_on_gpu(name: str) -> None:  # pragma: no cover
    batch = _batch(torch.bfloat16, "cuda")
    backend = resolve(name)
    result: Any = _skip_unsupported(name, lambda: backend(batch))
    ref = reference_backend(batch)
    torch.testing.assert_close(result.out.float(), ref.out.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(result.lse, ref.lse, rtol=1e-4, atol=1e-4)
    fn: SdpaBackend = backend.fn  # type: ignore[assignment]
    blocked = SdpaBackend(fn.kernel, max_bytes=1)(batch)
    torch.testing.assert_close(blocked.out.float(), ref.out.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(blocked.lse, result.lse, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", NAMES)
def test_planned_call_does_no_host_sync_on_gpu(name: str) -> None:  # pragma: no cover
    batch = _batch(torch.bfloat16, "cuda")
    backend = resolve(name)
    plan = planner(backend)
    assert plan is not None
    _skip_unsupported(name, lambda: backend(batch))  # warm up (lazy inits may sync)
    plan(batch, True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        backend(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")


# --------------------------------------------------------------------------------------------
# Features: a window and sinks through masks; the rest refused
# --------------------------------------------------------------------------------------------

def _feature_batch(features: Features, dtype: torch.dtype = torch.float32,
                   device: str = "cpu") -> AttentionBatch:
    """Rows on both sides of a window of 4: decodes, a prefill from 0, a chunk."""
    wl = Workload(tuple(Request(i, n, family=f) for i, (n, f) in enumerate(
        [(11, "gaussian"), (9, "large"), (14, "alternating"), (5, "gaussian")])),
        HeadConfig(4, 2, 64), dtype, seed=6, features=features)
    step = Step((Chunk(0, 10, 11), Chunk(1, 0, 9), Chunk(2, 5, 14), Chunk(3, 5, 5)))
    return materialize(wl, step, PageLayout(page_size=4, placement="shuffled", seed=2),
                       device).validate()


@pytest.mark.parametrize("features", [Features(window=4), Features(window=0),
                                      Features(sinks=True), Features(window=3, sinks=True)],
                         ids=["window", "window0", "sinks", "window+sinks"])
@pytest.mark.parametrize("max_bytes", [None, 1], ids=["one-block", "row-per-block"])
def test_math_takes_windows_and_sinks_through_masks(features: Features,
                                                    max_bytes: int | None) -> None:
    batch = _feature_batch(features)
    result = SdpaBackend("math", max_bytes=max_bytes)(batch)
    ref = reference_backend(batch)
    torch.testing.assert_close(result.out, ref.out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result.lse, ref.lse, rtol=1e-5, atol=1e-5)
    plain = reference_backend(_feature_batch(Features()))
    assert not torch.allclose(result.lse, plain.lse)  # the features changed the rows


def test_causal_lse_with_a_window_and_sinks() -> None:
    torch.manual_seed(1)
    n, L, Hq, Hkv, D = 7, 12, 4, 2, 8
    q, k = torch.randn(n, Hq, D), torch.randn(L, Hkv, D)
    sinks = torch.tensor([-3.0, 0.5, 2.0, 9.0])
    from invariance.backends.reference import reference_rows

    for window, blocks in ((2, None), (0, 1), (-1, 1)):
        got = tb.causal_lse(q, k, 0.3, blocks, window_left=window, sinks=sinks)
        _, want = reference_rows(q, list(range(L - n, L)), k, k, 0.3, window_left=window,
                                 sinks=sinks)
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)


def test_sdpa_features_declared_and_refused() -> None:
    from invariance.spec import CheckSpec

    caps = {n: capabilities(resolve(n)) for n in NAMES}
    assert caps["sdpa-flash"].features == frozenset()
    for n in ("sdpa-efficient", "sdpa-cudnn", "sdpa-math"):
        assert caps[n].features == {"window", "sinks"}
    with pytest.raises(ValueError, match="features: backend sdpa-math takes sinks, window, not "
                                         "softcap"):
        CheckSpec.build("sdpa-math", device="cpu", features={"softcap": 5.0})
    with pytest.raises(ValueError, match="not fp8_kv"):
        CheckSpec.build("sdpa-math", device="cpu", kv_dtype="fp8")
    for features in (Features(softcap=3.0), Features(kv_dtype="fp8_e4m3")):
        batch = _feature_batch(features, torch.bfloat16)
        with pytest.raises(ValueError, match="backend sdpa-math: expected a batch without"):
            SdpaBackend("math")(batch)
    with pytest.raises(ValueError, match="backend sdpa-flash: expected a batch without window"):
        SdpaBackend("flash")(_feature_batch(Features(window=2)))


def test_math_check_with_features_is_accurate() -> None:
    """The whole check through sdpa-math with a window and sinks: accurate at bfloat16 (the sink
    is rounded to bfloat16 in the mask; the bound absorbs it). Its verdicts on invariance are
    SDPA's own (the math kernel's rounding follows the number of query rows on CPU)."""
    import invariance

    report = invariance.check("sdpa-math", device="cpu", dtype="bfloat16",
                              perturbations=["mixed", "repeat", "paging"],
                              features={"window": 16, "sinks": True})
    assert report.accurate and report.invariant, report.summary()
