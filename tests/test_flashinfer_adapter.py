"""FlashInfer adapters without FlashInfer: a fake ``flashinfer`` module (inserted into
``sys.modules``) records what the adapter passes to the wrappers and computes attention from that
metadata alone (float64, LSE in base 2, as FlashInfer returns it), so that a wrong conversion,
row split, scatter or base change shows as a wrong result."""

from __future__ import annotations

import importlib.util
import math
import sys
import types
from typing import Any

import pytest
import torch

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
from invariance.backends import BUILTIN, available, capabilities, planner, resolve
from invariance.backends.flashinfer import (
    MIB,
    MIN_WORKSPACE,
    FlashInferBackend,
    FlashInferOptions,
    paged_metadata,
    split_requests,
    workspace_bound,
)
from invariance.backends.reference import reference_backend, reference_rows
from invariance.batch import AttentionBatch
from invariance.spec import CheckSpec

FI_NAMES = ("flashinfer", "flashinfer-prefill", "flashinfer-fa3", "flashinfer-fixed-split")


# --------------------------------------------------------------------------------------------
# A fake flashinfer
# --------------------------------------------------------------------------------------------

class _FakeWrapper:
    kind = ""

    def __init__(self, log: list[dict[str, Any]], workspace: torch.Tensor, kv_layout: str,
                 **kwargs: Any) -> None:
        self.log = log
        self.init = dict(kwargs, kv_layout=kv_layout, workspace=workspace.numel())
        self.planned: dict[str, Any] = {}
        # FlashInfer allocates its int workspace uninitialised: garbage until someone zeroes it.
        self._int_workspace_buffer = torch.full((64,), 7, dtype=torch.uint8)
        log.append({"event": "init", "kind": self.kind, **self.init})

    def _record(self, names: tuple[str, ...], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> None:
        if kwargs.get("fail"):  # pragma: no cover - not used
            raise RuntimeError
        for name, value in zip(names, args, strict=True):
            self.planned[name] = value.clone() if isinstance(value, torch.Tensor) else value
        self.planned.update(kwargs)
        self.planned["int_workspace_zeroed"] = bool((self._int_workspace_buffer == 0).all())
        self.log.append({"event": "plan", "kind": self.kind, **self.planned})

    def run(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], *args: Any,
            return_lse: bool = False, k_scale: float | None = None,
            v_scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """FlashInfer's semantics: the plan's window and soft-cap; ``k_scale`` folded into the
        softmax scale, ``v_scale`` multiplying the output (decode.py / prefill.py ``run``);
        the sink wrapper's extra arguments ``(sinks, sm_scale)``."""
        assert return_lse
        p = self.planned
        k_cache, v_cache = kv
        assert k_cache.dtype == p["kv_data_type"] and q.dtype == p["q_data_type"]
        sinks, sm_scale = self._extra(args)
        if k_scale is not None:
            sm_scale *= k_scale
        window = p.get("window_left", -1)
        cap = p.get("logits_soft_cap") or 0.0
        self.log.append({"event": "run_args", "kind": self.kind, "args": args,
                         "k_scale": k_scale, "v_scale": v_scale})
        P, Hkv, D = p["page_size"], k_cache.shape[2], k_cache.shape[3]
        indptr, indices, last = (p["kv_indptr"].tolist(), p["kv_indices"].tolist(),
                                 p["kv_last_page_len"].tolist())
        qo = p.get("qo_indptr")
        qo_indptr = qo.tolist() if qo is not None else list(range(len(last) + 1))
        assert qo_indptr[-1] == q.shape[0]
        out = torch.zeros_like(q)
        lse = torch.zeros(q.shape[0], q.shape[1], dtype=torch.float32)
        for i in range(len(last)):
            pages = torch.tensor(indices[indptr[i]:indptr[i + 1]], dtype=torch.long)
            kv_len = (len(pages) - 1) * P + last[i]
            k = k_cache[pages].reshape(-1, Hkv, D)[:kv_len]
            v = v_cache[pages].reshape(-1, Hkv, D)[:kv_len]
            lo, hi = qo_indptr[i], qo_indptr[i + 1]
            if self.kind == "prefill":
                assert p["causal"] is True
            positions = list(range(kv_len - (hi - lo), kv_len))  # bottom-right causal
            o, s = reference_rows(q[lo:hi], positions, k.double(), v.double(), sm_scale,
                                  window_left=window, sinks=sinks, logits_soft_cap=cap)
            out[lo:hi] = (o * (v_scale if v_scale is not None else 1.0)).to(q.dtype)
            lse[lo:hi] = (s / math.log(2.0)).float()  # FlashInfer: base 2
        self.log.append({"event": "run", "kind": self.kind, "rows": q.shape[0]})
        self.log[-1]["out"] = out
        return out, lse


    def _extra(self, args: tuple[Any, ...]) -> tuple[torch.Tensor | None, float]:
        assert not args, args  # plain wrappers take no extra arguments
        return None, float(self.planned["sm_scale"])


class _Decode(_FakeWrapper):
    kind = "decode"

    def plan(self, *args: Any, **kwargs: Any) -> None:
        self._record(("kv_indptr", "kv_indices", "kv_last_page_len", "num_qo_heads",
                      "num_kv_heads", "head_dim", "page_size"), args, kwargs)


class _Prefill(_FakeWrapper):
    kind = "prefill"

    def plan(self, *args: Any, **kwargs: Any) -> None:
        self._record(("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len",
                      "num_qo_heads", "num_kv_heads", "head_dim", "page_size"), args, kwargs)


class _Sink(_Prefill):
    """``BatchAttentionWithAttentionSinkWrapper``: a prefill wrapper whose window is a
    constructor argument and whose ``run`` takes ``(sinks, sm_scale)`` after the cache."""

    kind = "sinks"

    def _extra(self, args: tuple[Any, ...]) -> tuple[torch.Tensor | None, float]:
        sinks, sm_scale = args
        assert isinstance(sinks, torch.Tensor) and sinks.dtype == torch.float32
        assert self.init["window_left"] == self.planned.get("window_left", -1)
        assert "logits_soft_cap" not in self.planned  # the variant has no soft-cap
        return sinks, float(sm_scale)


@pytest.fixture
def fake_fi(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Insert the fake module; returns its event log."""
    log: list[dict[str, Any]] = []
    mod = types.ModuleType("flashinfer")

    def decode(*args: Any, **kwargs: Any) -> _Decode:
        return _Decode(log, *args, **kwargs)

    def prefill(*args: Any, **kwargs: Any) -> _Prefill:
        return _Prefill(log, *args, **kwargs)

    def sink(*args: Any, **kwargs: Any) -> _Sink:
        return _Sink(log, *args, **kwargs)

    mod.BatchDecodeWithPagedKVCacheWrapper = decode  # type: ignore[attr-defined]
    mod.BatchPrefillWithPagedKVCacheWrapper = prefill  # type: ignore[attr-defined]
    mod.BatchAttentionWithAttentionSinkWrapper = sink  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", mod)
    return log


def _events(log: list[dict[str, Any]], event: str, kind: str | None = None) -> list[
        dict[str, Any]]:
    return [e for e in log if e["event"] == event and (kind is None or e["kind"] == kind)]


def _mixed_batch(dtype: torch.dtype = torch.bfloat16, page_size: int = 4,
                 features: Features | None = None) -> AttentionBatch:
    """Decode rows, prefill from 0, a chunk, a one-token prefill and a request with no query
    token, interleaved, on shuffled pages with unused memory NaN."""
    wl = Workload(tuple(Request(i, n) for i, n in enumerate((9, 7, 12, 1, 5, 6))),
                  HeadConfig(4, 2, 64), dtype, seed=3, features=features or Features())
    step = Step((Chunk(0, 8, 9), Chunk(1, 0, 7), Chunk(2, 5, 12), Chunk(3, 0, 1),
                 Chunk(4, 5, 5), Chunk(5, 5, 6)))
    layout = PageLayout(page_size=page_size, placement="shuffled", seed=1, extra_pages=2,
                        fill="nan")
    return materialize(wl, step, layout, "cpu").validate()


# --------------------------------------------------------------------------------------------
# Pure conversions
# --------------------------------------------------------------------------------------------

def test_split_requests() -> None:
    assert split_requests([1, 5, 0, 1, 3]) == ([0, 3], [1, 4])
    assert split_requests([1, 5, 0, 1, 3], decode=False) == ([], [0, 1, 3, 4])
    assert split_requests([0, 0]) == ([], [])


def test_paged_metadata_by_hand() -> None:
    table = torch.tensor([[5, 2, 7, 0], [1, 3, 0, 0], [4, 6, 8, 9], [0, 0, 0, 0]],
                         dtype=torch.int32)
    kv_lens = [40, 17, 64, 3]
    cu = [0, 3, 4, 9, 10]
    m = paged_metadata(table, kv_lens, cu, 16, [0, 1, 2])
    assert m.requests == (0, 1, 2)
    assert m.kv_indptr.tolist() == [0, 3, 5, 9]
    assert m.kv_indices.tolist() == [5, 2, 7, 1, 3, 4, 6, 8, 9]
    assert m.kv_last_page_len.tolist() == [8, 1, 16]
    assert m.qo_indptr.tolist() == [0, 3, 4, 9]
    assert m.rows.tolist() == list(range(9))
    assert m.num_rows == 9 and m.num_pages == 9
    for t in (m.qo_indptr, m.kv_indptr, m.kv_indices, m.kv_last_page_len):
        assert t.dtype == torch.int32
    sub = paged_metadata(table, kv_lens, cu, 16, [1, 3])  # a subset: rows of those requests
    assert sub.kv_indices.tolist() == [1, 3, 0]
    assert sub.kv_last_page_len.tolist() == [1, 3]
    assert sub.qo_indptr.tolist() == [0, 1, 2]
    assert sub.rows.tolist() == [3, 9]
    empty = paged_metadata(table, kv_lens, cu, 16, [])
    assert empty.kv_indptr.tolist() == [0] and empty.kv_indices.numel() == 0
    with pytest.raises(ValueError, match=r"kv_lens\[0\]"):
        paged_metadata(table, [0, 1, 1, 1], cu, 16, [0])


def test_paged_metadata_matches_the_block_table() -> None:
    batch = _mixed_batch()
    q_lens = batch.q_lens()
    kv = batch.kv_lens.tolist()
    reqs = [b for b, n in enumerate(q_lens) if n]
    m = paged_metadata(batch.block_table, kv, batch.cu_seqlens_q.tolist(), batch.page_size, reqs)
    indptr = m.kv_indptr.tolist()
    for i, b in enumerate(reqs):
        n = -(-kv[b] // batch.page_size)
        assert m.kv_indices[indptr[i]:indptr[i + 1]].tolist() == batch.block_table[b, :n].tolist()
        assert (n - 1) * batch.page_size + int(m.kv_last_page_len[i]) == kv[b]


def test_workspace_bound_arithmetic() -> None:
    # fixed split: per request (q*G + 128) packed rows times ceil(pages / split) chunks.
    rows = (1 * 4 + 128) * 2 + (10 * 4 + 128) * 1  # kv 4096 -> 256 pages -> 2 chunks of 128
    need = 32 * rows * 129 * 4 + 16 * MIB
    got = workspace_bound([1, 10], [4096, 100], 32, 8, 128, 16, fixed_split_size=128)
    assert got == max(MIN_WORKSPACE, -(-need // MIB) * MIB)
    big = workspace_bound([1] * 256, [8192] * 256, 32, 8, 128, 16, fixed_split_size=8)
    assert big > MIN_WORKSPACE and big % MIB == 0
    assert workspace_bound([1] * 256, [8192] * 256, 32, 8, 128, 16,
                           disable_split_kv=True) == MIN_WORKSPACE
    heuristic = workspace_bound([1], [4096], 32, 8, 128, 16, num_sms=132)
    assert heuristic == max(MIN_WORKSPACE,
                            -(-(32 * (128 * 66 + 132) * 129 * 4 + 16 * MIB) // MIB) * MIB)


# --------------------------------------------------------------------------------------------
# The adapter against the fake
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_engine_style_matches_the_reference(fake_fi: list[dict[str, Any]],
                                            dtype: torch.dtype) -> None:
    batch = _mixed_batch(dtype)
    backend = FlashInferBackend(workspace_mb=1)
    result = backend(batch)  # plans itself when called without plan()
    ref = reference_backend(batch)
    assert torch.equal(result.out, ref.out)  # scattered back to the batch's rows
    torch.testing.assert_close(result.lse, ref.lse, rtol=1e-6, atol=1e-6)  # base 2 -> e
    # Decode wrapper: q_len == 1 requests (0, 3, 5), in batch order; prefill: 1 and 2.
    (dplan,) = _events(fake_fi, "plan", "decode")
    (pplan,) = _events(fake_fi, "plan", "prefill")
    kv = batch.kv_lens.tolist()
    assert dplan["kv_last_page_len"].tolist() == [
        kv[b] - (-(-kv[b] // 4) - 1) * 4 for b in (0, 3, 5)]
    assert pplan["qo_indptr"].tolist() == [0, 7, 14]
    assert pplan["causal"] is True
    for p in (dplan, pplan):
        assert (p["num_qo_heads"], p["num_kv_heads"], p["head_dim"], p["page_size"]) == (
            4, 2, 64, 4)
        assert p["q_data_type"] == dtype and p["kv_data_type"] == dtype
        assert p["sm_scale"] == batch.sm_scale
        assert "fixed_split_size" not in p and "disable_split_kv" not in p
    assert [e["rows"] for e in _events(fake_fi, "run")] == [3, 14]
    (dinit,) = _events(fake_fi, "init", "decode")
    (pinit,) = _events(fake_fi, "init", "prefill")
    assert dinit["kv_layout"] == "NHD" and dinit["use_cuda_graph"] is False
    assert dinit["use_tensor_cores"] is False and pinit["backend"] == "auto"
    assert dinit["workspace"] == MIB


def test_prefill_only_runs_every_row_through_the_prefill_wrapper(
        fake_fi: list[dict[str, Any]]) -> None:
    batch = _mixed_batch()
    result = resolve("flashinfer-prefill:workspace_mb=1").fn(batch)
    assert torch.equal(result.out, reference_backend(batch).out)  # type: ignore[attr-defined]
    assert not _events(fake_fi, "plan", "decode")
    (pplan,) = _events(fake_fi, "plan", "prefill")
    assert pplan["qo_indptr"].tolist() == [0, 1, 8, 15, 16, 17]  # request 4 (no token) left out


def test_one_wrapper_for_every_row_returns_its_output_as_is(
        fake_fi: list[dict[str, Any]]) -> None:
    # A pure decode batch: the decode wrapper's output is the result (no gather, no scatter: what
    # `invariance bench` times is FlashInfer's kernels and one LSE scaling); a mixed batch is
    # scattered into a fresh tensor.
    wl = Workload(tuple(Request(i, n) for i, n in enumerate((33, 2, 17))), HeadConfig(4, 4, 64),
                  torch.float16, seed=9)
    step = Step((Chunk(0, 32, 33), Chunk(1, 1, 2), Chunk(2, 16, 17)))
    batch = materialize(wl, step, PageLayout(page_size=16), "cpu")
    result = FlashInferBackend(workspace_mb=1)(batch)
    (run,) = _events(fake_fi, "run")
    assert result.out is run["out"]
    assert torch.equal(result.out, reference_backend(batch).out)
    fake_fi.clear()
    mixed = _mixed_batch()
    result = FlashInferBackend(workspace_mb=1)(mixed)
    assert all(result.out is not e["out"] for e in _events(fake_fi, "run"))
    assert torch.equal(result.out, reference_backend(mixed).out)


def test_lse_base_change_and_row_order(fake_fi: list[dict[str, Any]]) -> None:
    # Only decodes, in an order that is not the batch order of a sorted split.
    wl = Workload(tuple(Request(i, n) for i, n in enumerate((33, 2, 17))), HeadConfig(4, 4, 64),
                  torch.float16, seed=9)
    step = Step((Chunk(2, 16, 17), Chunk(0, 32, 33), Chunk(1, 1, 2)))
    batch = materialize(wl, step, PageLayout(page_size=16, placement="reversed"), "cpu")
    result = FlashInferBackend(workspace_mb=1)(batch)
    ref = reference_backend(batch)
    assert torch.equal(result.out, ref.out)
    assert torch.allclose(result.lse, ref.lse, rtol=1e-6, atol=0)
    assert not _events(fake_fi, "plan", "prefill")


def test_plan_then_call_plans_once_and_graph_plan_sizes_buffers(
        fake_fi: list[dict[str, Any]]) -> None:
    batch = _mixed_batch()
    backend = FlashInferBackend(workspace_mb=1)
    plan = planner(resolve(backend))
    assert plan is not None
    plan(batch, False)
    backend(batch)
    backend(batch)
    assert len(_events(fake_fi, "plan")) == 2  # one per wrapper, not per call
    assert not any(e["int_workspace_zeroed"] for e in _events(fake_fi, "plan"))
    plan(batch, True)
    # Graph plans start from a zeroed int workspace (FlashInfer issue #4002's padded CTAs).
    assert all(e["int_workspace_zeroed"] for e in _events(fake_fi, "plan")[-2:])
    inits = _events(fake_fi, "init")
    dinit, pinit = inits[-2], inits[-1]
    assert dinit["use_cuda_graph"] is True and pinit["use_cuda_graph"] is True
    n_pages_dec = sum(-(-int(batch.kv_lens[b]) // 4) for b in (0, 3, 5))
    assert dinit["paged_kv_indptr_buffer"].shape == (4,)
    assert dinit["paged_kv_indices_buffer"].shape == (n_pages_dec,)
    assert dinit["paged_kv_last_page_len_buffer"].shape == (3,)
    assert pinit["qo_indptr_buf"].shape == (3,) and pinit["paged_kv_last_page_len_buf"].shape == (
        2,)
    assert torch.equal(backend(batch).out, reference_backend(batch).out)
    # Eager plans reuse one pair of wrappers.
    plan(batch, False)
    plan(batch, False)
    assert len(_events(fake_fi, "init")) == 4


def test_split_options_reach_plan_and_wrappers(fake_fi: list[dict[str, Any]]) -> None:
    batch = _mixed_batch()
    resolve("flashinfer-fixed-split:workspace_mb=1").fn(batch)
    dplan, pplan = _events(fake_fi, "plan", "decode")[0], _events(fake_fi, "plan", "prefill")[0]
    assert dplan["fixed_split_size"] == 2048 and pplan["fixed_split_size"] == 2048
    dinit, pinit = _events(fake_fi, "init", "decode")[0], _events(fake_fi, "init", "prefill")[0]
    assert dinit["use_tensor_cores"] is True  # FlashInfer's decode needs them for a fixed split
    assert pinit["backend"] == "fa2"  # fa3 ignores fixed_split_size
    fake_fi.clear()
    resolve("flashinfer:disable_split_kv=true,workspace_mb=1").fn(batch)
    assert _events(fake_fi, "plan", "decode")[0]["disable_split_kv"] is True
    fake_fi.clear()
    resolve("flashinfer-fa3:workspace_mb=1").fn(batch)
    assert _events(fake_fi, "init", "prefill")[0]["backend"] == "fa3"


def test_workspace_overflow_is_a_value_error(fake_fi: list[dict[str, Any]],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    def overflow(self: _Prefill, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("Error in function 'aligned_alloc' at allocator.h:49: Buffer "
                           "overflow when allocating memory for batch_prefill_tmp_v")

    monkeypatch.setattr(_Prefill, "plan", overflow)
    with pytest.raises(ValueError, match=r"workspace_mb: .*prefill plan .* 1 MiB"):
        FlashInferBackend(workspace_mb=1)(_mixed_batch())


def test_default_workspace_is_sized_from_the_batch(fake_fi: list[dict[str, Any]]) -> None:
    batch = _mixed_batch()
    FlashInferBackend(fixed_split_size=1)(batch)
    q, kv = batch.q_lens(), batch.kv_lens.tolist()
    live = [b for b in range(len(q)) if q[b]]
    want = workspace_bound([q[b] for b in live], [kv[b] for b in live], 4, 2, 64, 4,
                           fixed_split_size=1)
    assert _events(fake_fi, "init")[0]["workspace"] == want


# --------------------------------------------------------------------------------------------
# Registry: names, options, listing, capabilities
# --------------------------------------------------------------------------------------------

def test_options_from_the_cli_string() -> None:
    spec = "flashinfer:fixed_split_size=2048,backend=fa2,use_tensor_cores=true,workspace_mb=256"
    b = resolve(spec)
    assert b.name == spec and isinstance(b.fn, FlashInferBackend)
    assert b.fn.options == FlashInferOptions(decode=True, backend="fa2", fixed_split_size=2048,
                                             use_tensor_cores=True, workspace_mb=256)
    assert resolve("flashinfer-prefill:backend=fa3").fn.options.decode is False  # type: ignore[attr-defined]
    assert resolve("flashinfer-fixed-split:fixed_split_size=none").fn.options == (  # type: ignore[attr-defined]
        FlashInferOptions())
    for bad, match in [
            ("flashinfer:nope=1", "unknown"),
            ("flashinfer:fixed_split_size=0", "fixed_split_size: expected an int >= 1"),
            ("flashinfer:decode=maybe", "expected true or false"),
            ("flashinfer:backend=fa9", "backend: expected one of auto, fa2, fa3"),
            ("flashinfer-fa3:fixed_split_size=16", "fa2 kernels only"),
            ("flashinfer:fixed_split_size=16,use_tensor_cores=false", "tensor cores"),
            ("flashinfer:oops", "key=value"),
            ("flashinfer:a=1,a=2", "given twice")]:
        with pytest.raises(ValueError, match=match):
            resolve(bad)


def test_module_attr_meaning_is_kept_for_other_names() -> None:
    assert not BUILTIN["sdpa"].options
    with pytest.raises(ValueError, match="cannot import module 'sdpa'"):
        resolve("sdpa:x")
    b = resolve("invariance.backends.flashinfer:FlashInferBackend")
    assert b.fn is FlashInferBackend


def test_listed_with_the_reason_when_flashinfer_is_missing() -> None:
    if importlib.util.find_spec("flashinfer") is not None:  # pragma: no cover - GPU machines
        pytest.skip("flashinfer is installed here")
    infos = {b.name: b for b in available()}
    for name in FI_NAMES:
        assert not infos[name].importable
        assert "No module named 'flashinfer'" in infos[name].reason
        assert infos[name].description
    assert "flashinfer" not in sys.modules  # listing imports nothing of it


def test_capabilities() -> None:
    for name in FI_NAMES:
        caps = capabilities(resolve(name))
        assert caps.dtypes == ("float16", "bfloat16") and caps.head_dims == (64, 128, 256)
        assert caps.devices == ("cuda",) and caps.cuda_graphs
        fp8 = set() if name == "flashinfer-fa3" else {"fp8_kv"}
        assert caps.features == {"window", "softcap", "sinks", *fp8}
        assert set(caps.feature_conflicts) == {frozenset({"sinks", "softcap"}),
                                               frozenset({"sinks", "fp8_kv"})}


# --------------------------------------------------------------------------------------------
# Features: window, soft-cap, sinks, FP8 KV
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("decode", [True, False], ids=["engine-style", "prefill-only"])
def test_window_and_softcap_reach_both_wrappers(fake_fi: list[dict[str, Any]],
                                                decode: bool) -> None:
    batch = _mixed_batch(torch.float16, features=Features(window=3, softcap=2.0))
    result = FlashInferBackend(decode=decode, workspace_mb=1)(batch)
    ref = reference_backend(batch)
    assert torch.equal(result.out, ref.out)
    torch.testing.assert_close(result.lse, ref.lse, rtol=1e-6, atol=1e-6)
    plans = _events(fake_fi, "plan")
    assert [p["kind"] for p in plans] == (["decode", "prefill"] if decode else ["prefill"])
    for p in plans:
        assert p["window_left"] == 3 and p["logits_soft_cap"] == 2.0
        assert p["kv_data_type"] == torch.float16


def test_feature_arguments_are_left_out_without_features(fake_fi: list[dict[str, Any]]) -> None:
    FlashInferBackend(workspace_mb=1)(_mixed_batch())
    for p in _events(fake_fi, "plan"):
        assert "window_left" not in p and "logits_soft_cap" not in p
    assert all(e["args"] == () and e["k_scale"] is None for e in _events(fake_fi, "run_args"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_fp8_cache_with_per_tensor_scales(fake_fi: list[dict[str, Any]],
                                          dtype: torch.dtype) -> None:
    batch = _mixed_batch(dtype, features=Features(window=4, kv_dtype="fp8_e4m3"))
    assert batch.k_cache.dtype == torch.float8_e4m3fn
    result = FlashInferBackend(workspace_mb=1)(batch)
    ref = reference_backend(batch)
    u = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11  # v_scale applied after rounding
    torch.testing.assert_close(result.out.double(), ref.out.double(), rtol=2 * u, atol=1e-6)
    torch.testing.assert_close(result.lse, ref.lse, rtol=1e-6, atol=1e-5)
    for p in _events(fake_fi, "plan"):
        assert p["kv_data_type"] == torch.float8_e4m3fn and p["q_data_type"] == dtype
    for e in _events(fake_fi, "run_args"):
        assert (e["k_scale"], e["v_scale"]) == (batch.k_scale, batch.v_scale)


def test_sinks_run_every_row_through_the_sink_wrapper(fake_fi: list[dict[str, Any]]) -> None:
    batch = _mixed_batch(features=Features(window=5, sinks=True))
    backend = FlashInferBackend(workspace_mb=1)
    result = backend(batch)
    ref = reference_backend(batch)
    assert torch.equal(result.out, ref.out)
    torch.testing.assert_close(result.lse, ref.lse, rtol=1e-6, atol=1e-6)
    assert not _events(fake_fi, "plan", "decode") and not _events(fake_fi, "plan", "prefill")
    (init,) = _events(fake_fi, "init", "sinks")
    assert init["window_left"] == 5 and init["q_data_type"] == torch.bfloat16
    assert (init["head_dim_qk"], init["head_dim_vo"]) == (64, 64)
    (plan,) = _events(fake_fi, "plan", "sinks")
    assert plan["qo_indptr"].tolist() == [0, 1, 8, 15, 16, 17] and plan["causal"] is True
    (run,) = _events(fake_fi, "run_args", "sinks")
    sinks, sm_scale = run["args"]
    assert sinks is batch.sinks and sm_scale == batch.sm_scale
    backend(_mixed_batch(features=Features(window=5, sinks=True)))
    backend(_mixed_batch(features=Features(window=6, sinks=True)))
    # One eager wrapper per JIT specialisation (the window is one).
    assert [e["window_left"] for e in _events(fake_fi, "init", "sinks")] == [5, 6]


def test_feature_negotiation_and_refusals(fake_fi: list[dict[str, Any]]) -> None:
    for name, settings, message in [
            ("flashinfer-fa3", {"kv_dtype": "fp8"}, "takes sinks, softcap, window, not fp8_kv"),
            ("flashinfer", {"kv_dtype": "fp8", "features": {"kv_scale": "head"}},
             "takes fp8_kv, sinks, softcap, window, not fp8_kv_head"),
            ("flashinfer", {"features": {"sinks": True, "softcap": 9.0}},
             "cannot combine sinks and softcap"),
            ("flashinfer-prefill", {"features": {"sinks": True}, "kv_dtype": "fp8"},
             "cannot combine fp8_kv and sinks")]:
        with pytest.raises(ValueError, match=f"^features: backend {name} {message}"):
            CheckSpec.build(name, **settings)
    head = _mixed_batch(features=Features(kv_dtype="fp8_e4m3", kv_scale="head"))
    with pytest.raises(ValueError, match="expected a batch without fp8_kv_head"):
        FlashInferBackend(workspace_mb=1)(head)
    both = _mixed_batch(features=Features(sinks=True, softcap=3.0))
    with pytest.raises(ValueError, match="expected a batch without sinks and softcap together"):
        FlashInferBackend(workspace_mb=1)(both)
    assert not _events(fake_fi, "run")


def test_a_flashinfer_without_the_sink_wrapper_is_named(
        fake_fi: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(sys.modules["flashinfer"], "BatchAttentionWithAttentionSinkWrapper")
    with pytest.raises(ValueError, match="expected a FlashInfer with "
                                         "BatchAttentionWithAttentionSinkWrapper"):
        FlashInferBackend(workspace_mb=1)(_mixed_batch(features=Features(sinks=True)))
