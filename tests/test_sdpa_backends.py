"""torch SDPA forced per backend: padding shared with ``sdpa``, masks per request, LSE, plan."""

from __future__ import annotations

import pytest
import torch

import invariance.backends.sdpa as sdpa_mod
import invariance.backends.torch_backends as tb
from invariance import Chunk, HeadConfig, PageLayout, Request, Step, Workload, materialize
from invariance.backends import capabilities, planner, resolve
from invariance.backends.reference import reference_backend
from invariance.backends.sdpa import SdpaBackend
from invariance.batch import AttentionBatch

NAMES = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math")


def _batch(dtype: torch.dtype = torch.float32, device: str = "cpu") -> AttentionBatch:
    """Decode, prefill from 0, a chunk (q_len < kv_len), a request with no token; GQA."""
    wl = Workload(tuple(Request(i, n) for i, n in enumerate((9, 7, 12, 5))),
                  HeadConfig(4, 2, 64), dtype, seed=4)
    step = Step((Chunk(0, 8, 9), Chunk(1, 0, 7), Chunk(2, 5, 12), Chunk(3, 5, 5)))
    layout = PageLayout(page_size=4, placement="shuffled", seed=2)
    return materialize(wl, step, layout, device).validate()


@pytest.mark.parametrize("per_request", [False, True], ids=["padded", "per-request"])
def test_math_matches_the_reference(per_request: bool) -> None:
    batch = _batch()
    result = SdpaBackend("math", per_request=per_request)(batch)
    ref = reference_backend(batch)
    torch.testing.assert_close(result.out, ref.out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result.lse, ref.lse, rtol=1e-5, atol=1e-5)


def test_lse_is_the_sdpa_backends_per_request() -> None:
    batch = _batch()
    dense = tb.pad_dense(batch)
    assert dense is not None
    whole = tb.dense_lse(dense, batch.sm_scale)
    parts = tb.dense_lse(dense, batch.sm_scale, per_request=True)
    for b, n in enumerate(dense.q_lens):
        torch.testing.assert_close(parts[b, :, :n], whole[b, :, :n], rtol=1e-6, atol=1e-6)
        assert bool(torch.isneginf(parts[b, :, n:]).all())
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
    assert r.out.shape == (0, 4, 64)


def test_plan_takes_the_only_host_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = _batch()
    backend = resolve("sdpa-math")
    plan = planner(backend)
    assert plan is not None
    plan(batch, True)

    def no_sync(batch: AttentionBatch) -> None:
        raise AssertionError("host sync in the call")

    monkeypatch.setattr(sdpa_mod, "batch_lengths", no_sync)
    backend(batch)
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
        assert "logsumexp" in BUILTIN[n].description and caps[n].cuda_graphs
    assert resolve("sdpa-flash").fn.per_request  # type: ignore[attr-defined]
    assert not resolve("sdpa-efficient").fn.per_request  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="kernel"):
        SdpaBackend("fast")  # type: ignore[arg-type]


def test_check_refuses_gpu_only_kernels_on_cpu() -> None:
    from invariance.spec import CheckSpec

    with pytest.raises(ValueError, match="runs on cuda"):
        CheckSpec.build("sdpa-flash", device="cpu", dtype="bfloat16")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", NAMES)
def test_each_kernel_on_gpu(name: str) -> None:  # pragma: no cover
    batch = _batch(torch.bfloat16, "cuda")
    result = resolve(name)(batch)
    ref = reference_backend(batch)
    torch.testing.assert_close(result.out.float(), ref.out.float(), rtol=2e-2, atol=2e-2)  # type: ignore[union-attr]
