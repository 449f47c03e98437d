"""The ``kernels`` adapters with attention features (window, sinks, soft-cap, FP8 KV).

The adapter passes a batch's features to ``kernels.unified_attention`` as ``window_left=``,
``sinks=``, ``logits_soft_cap=``, ``k_scale=`` / ``v_scale=`` (only those the batch uses) and
refuses, naming the parameter, when the kernel's signature lacks one. The checks through the
kernels (CPU, Triton interpreter, small shapes) are skipped while the installed ``kernels`` does
not take the feature's parameters (issue 48's kernel side).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import invariance
from invariance import Chunk, Features, HeadConfig, PageLayout, Request, Step, Workload, materialize
from invariance.backends import capabilities, resolve
from invariance.backends.kernels import KernelsBackend, feature_kwargs, kernel_parameters
from invariance.backends.reference import reference_backend
from invariance.batch import AttentionBatch


def _batch(features: Features, dtype: torch.dtype = torch.bfloat16) -> AttentionBatch:
    wl = Workload(tuple(Request(i, n) for i, n in enumerate((70, 9, 130))),
                  HeadConfig(4, 2, 64), dtype, seed=5, features=features)
    step = Step((Chunk(0, 69, 70), Chunk(1, 0, 9), Chunk(2, 100, 130)))
    return materialize(wl, step, PageLayout(page_size=16, placement="shuffled", seed=1),
                       "cpu").validate()


# --------------------------------------------------------------------------------------------
# The adapter (no kernel runs)
# --------------------------------------------------------------------------------------------

def _takes_all(q: Any, k: Any, v: Any, cu: Any, kv: Any, bt: Any, *, sm_scale: float = 1.0,
               window_left: int = -1, sinks: Any = None, logits_soft_cap: float = 0.0,
               k_scale: Any = None, v_scale: Any = None) -> None:
    """The feature signature of the kernel side (issue 48)."""


def _takes_none(q: Any, k: Any, v: Any, cu: Any, kv: Any, bt: Any, *,
                sm_scale: float = 1.0) -> None:
    """A kernel from before the features."""


def test_feature_arguments_are_only_those_the_batch_uses() -> None:
    assert feature_kwargs(_batch(Features()), _takes_none) == {}  # the old call, unchanged
    assert feature_kwargs(_batch(Features(window=16)), _takes_all) == {"window_left": 16}
    batch = _batch(Features(window=0, sinks=True, softcap=30.0, kv_dtype="fp8_e4m3",
                            kv_scale="head"))
    kwargs = feature_kwargs(batch, _takes_all)
    assert set(kwargs) == {"window_left", "sinks", "logits_soft_cap", "k_scale", "v_scale"}
    assert kwargs["window_left"] == 0 and kwargs["logits_soft_cap"] == 30.0
    assert kwargs["sinks"] is batch.sinks and kwargs["k_scale"] is batch.k_scale
    assert feature_kwargs(_batch(Features(kv_dtype="fp8_e4m3")), _takes_all) == {
        "k_scale": pytest.approx(0.0391), "v_scale": pytest.approx(0.0713)}
    assert {"sm_scale", "window_left"} <= kernel_parameters(_takes_all)


@pytest.mark.parametrize(("features", "parameter"), [
    (Features(window=8), "window_left"), (Features(sinks=True), "sinks"),
    (Features(softcap=5.0), "logits_soft_cap"), (Features(kv_dtype="fp8_e4m3"), "k_scale")])
def test_a_kernel_without_the_parameter_is_refused(features: Features, parameter: str) -> None:
    with pytest.raises(ValueError, match=f"kernels.unified_attention: expected a parameter "
                                         f"'{parameter}' for the batch's"):
        feature_kwargs(_batch(features), _takes_none)


def test_every_kernels_backend_declares_every_feature() -> None:
    for name in ("kernels", "kernels-fused", "kernels-split", "kernels-heuristic"):
        caps = capabilities(resolve(name))
        assert caps.features == {"window", "sinks", "softcap", "fp8_kv", "fp8_kv_head"}


# --------------------------------------------------------------------------------------------
# Through the kernels (skipped until kernels.unified_attention takes the features)
# --------------------------------------------------------------------------------------------

# A multiple of every BLOCK_N at head dim 64 (32 keys for float32, 128 for half precision).
SPLIT = 128
PLANS = [pytest.param(KernelsBackend(split_size=SPLIT, kernel_plan="fused"), id="fused"),
         pytest.param(KernelsBackend(split_size=SPLIT, kernel_plan="split"), id="split")]
# The interpreter is slow: perturbations that mix decodes and prefills, cut prompts into
# decodes and move pages, at small shapes; the GPU runs the full check.
PERTURBATIONS = ["mixed", "prefill_vs_decode", "paging"]

CASES = [
    pytest.param({"features": {"window": 48}}, "bfloat16",
                 id="window"),
    pytest.param({"features": {"sinks": True}}, "float32", id="sinks"),
    pytest.param({"features": {"softcap": 30.0}}, "float16",
                 id="softcap"),
    pytest.param({"kv_dtype": "fp8_e4m3"}, "bfloat16", id="fp8"),
    pytest.param({"kv_dtype": "fp8_e4m3", "features": {"kv_scale": "head"}}, "float16",
                 id="fp8-per-head"),
    pytest.param({"features": {"window": 100, "sinks": True, "softcap": 50.0}, "kv_dtype": "fp8"},
                 "bfloat16", id="all"),
]


@pytest.mark.parametrize(("settings", "dtype_name"), CASES)
@pytest.mark.parametrize("backend", PLANS)
@pytest.mark.slow
def test_kernels_pass_with_features(backend: KernelsBackend, settings: dict[str, Any],
                                    dtype_name: str) -> None:
    report = invariance.check(backend, dtype=dtype_name, device="cpu",
                              perturbations=PERTURBATIONS, **settings)
    assert report.passed, report.summary()
    assert report.features and report.accuracy[0].rows > 30


@pytest.mark.parametrize("backend", PLANS)
def test_kernels_match_the_reference_on_one_batch(backend: KernelsBackend) -> None:
    batch = _batch(Features(window=40, sinks=True, softcap=20.0, kv_dtype="fp8_e4m3",
                            kv_scale="head"))
    got, ref = backend(batch), reference_backend(batch)
    torch.testing.assert_close(got.out.float(), ref.out.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got.lse, ref.lse, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_heuristic_control_with_a_window_is_caught() -> None:
    report = invariance.check("kernels-heuristic", dtype="float32", device="cpu",
                              perturbations=["neighbors"], shrink=False,
                              features={"window": 256})
    assert report.accurate and not report.invariant, report.summary()


def _stand_in(drop: str = "") -> Any:
    """A stand-in for ``kernels.unified_attention`` with the feature signature: the float64
    reference on the arguments it received (``drop``: one feature argument ignored)."""

    def unified_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          cu_seqlens_q: torch.Tensor, kv_lens: torch.Tensor,
                          block_table: torch.Tensor, *, sm_scale: float,
                          window_left: int = -1, sinks: torch.Tensor | None = None,
                          logits_soft_cap: float = 0.0, k_scale: Any = None,
                          v_scale: Any = None, **launch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        given = {"window_left": window_left, "sinks": sinks, "logits_soft_cap": logits_soft_cap,
                 "k_scale": k_scale, "v_scale": v_scale}
        given.pop(drop, None)
        batch = AttentionBatch(q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table,
                               sm_scale, **given)
        result = reference_backend(batch)
        return result.out, result.lse

    return unified_attention


SETTINGS = {"features": {"window": 20, "sinks": True, "softcap": 10.0, "kv_scale": "head"},
            "kv_dtype": "fp8"}


def test_the_adapter_hands_every_feature_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a stand-in kernel with the feature signature: every feature reaches it (the
    check passes); a stand-in that drops one of them fails the check (each argument
    matters)."""
    import kernels

    monkeypatch.setattr(kernels, "unified_attention", _stand_in())
    report = invariance.check(KernelsBackend(), device="cpu", perturbations=["mixed"],
                              **SETTINGS)
    assert report.passed, report.summary()
    for drop in ("window_left", "sinks", "logits_soft_cap", "k_scale", "v_scale"):
        monkeypatch.setattr(kernels, "unified_attention", _stand_in(drop))
        report = invariance.check(KernelsBackend(), device="cpu", perturbations=["mixed"],
                                  **SETTINGS)
        assert not report.accurate, (drop, report.summary())
