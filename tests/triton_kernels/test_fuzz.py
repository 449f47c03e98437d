"""Fuzzing the kernels' arguments: every input ends in a ValueError with a message, or in a correct
result (the float64 reference within the harness's bound, conftest.py); never another exception.

A valid tiny call (built by the harness's ``materialize``) is damaged by up to three drawn
mutations: wrong ranks, types, dtypes, devices and shapes, random index values, malformed
``sm_scale`` / ``split_size`` / ``plan`` / ``validate`` / ``tuning``. Independent of the dtype
under test (the dtype is drawn). ``INVARIANCE_FUZZ_EXAMPLES`` sets the example budget (default
small: every valid example runs the interpreter).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from invariance import (
    Chunk,
    HeadConfig,
    PageLayout,
    Request,
    Step,
    Workload,
    materialize,
)
from kernels import PLANS, Tuning, merge_states, unified_attention

EXAMPLES = int(os.environ.get("INVARIANCE_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

TENSORS = ("q", "k_cache", "v_cache", "cu_seqlens_q", "kv_lens", "block_table")
INDEX = ("cu_seqlens_q", "kv_lens", "block_table")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
OTHER_DTYPES = (*DTYPES, torch.float64, torch.int32, torch.int64, torch.int8, torch.bool)
Call = dict[str, Any]
Draw = Callable[[st.SearchStrategy[Any]], Any]


def _pick_tensor(draw: Draw, call: Call, names: tuple[str, ...] = TENSORS) -> str | None:
    """One of ``names`` that is still a tensor with data (earlier mutations may have replaced
    some, or moved them to the meta device)."""
    tensors = [n for n in names
               if isinstance(call[n], torch.Tensor) and call[n].device.type != "meta"]
    return draw(st.sampled_from(tensors)) if tensors else None


def _mutate_rank(draw: Draw, call: Call) -> None:
    name = _pick_tensor(draw, call)
    if name is None:
        return
    t = call[name]
    call[name] = draw(st.sampled_from([
        t.unsqueeze(0), t[0] if t.ndim and t.shape[0] else t.reshape(-1), t.tolist(), None, 3,
    ]))


def _mutate_dtype(draw: Draw, call: Call) -> None:
    name = _pick_tensor(draw, call)
    if name is not None:
        call[name] = call[name].to(draw(st.sampled_from(OTHER_DTYPES)))


def _mutate_device(draw: Draw, call: Call) -> None:
    name = _pick_tensor(draw, call)
    if name is None:
        return
    devices = ["meta", "cpu"] if call[name].device.type == "cuda" else ["meta"]
    call[name] = call[name].to(draw(st.sampled_from(devices)))


def _mutate_shape(draw: Draw, call: Call) -> None:
    """Shrink or grow one dimension of one tensor (a view: strides may become odd)."""
    name = _pick_tensor(draw, call)
    if name is None or call[name].ndim == 0:
        return
    t = call[name]
    dim = draw(st.integers(0, t.ndim - 1))
    size = draw(st.integers(0, 2 * t.shape[dim] + 1))
    if size <= t.shape[dim]:
        call[name] = t.narrow(dim, 0, size)
    elif t.shape[dim] == 0:
        call[name] = t.new_zeros((*t.shape[:dim], size, *t.shape[dim + 1:]))
    else:
        call[name] = torch.cat([t] * (size // max(t.shape[dim], 1) + 1), dim).narrow(dim, 0, size)


def _mutate_values(draw: Draw, call: Call) -> None:
    """Random values in one index tensor (same shape, int32)."""
    name = _pick_tensor(draw, call, INDEX)
    if name is None or call[name].numel() > 64:
        return
    t = call[name]
    bound = draw(st.sampled_from([8, 64, 2**31 - 1]))
    values = draw(st.lists(st.integers(-bound, bound), min_size=t.numel(), max_size=t.numel()))
    call[name] = torch.tensor(values, dtype=torch.int32, device=t.device).reshape(t.shape)


# sm_scale values: moderate valid ones (where float32 attention is well conditioned, so the
# result can be held to the float64 reference) and every kind of invalid one.
SM_SCALES = st.one_of(
    st.floats(min_value=1e-3, max_value=10.0), st.integers(-2, 3), st.booleans(),
    st.sampled_from([0.0, -0.0, -0.125, math.nan, math.inf, -math.inf, 1e300, 1e-300]),
    st.text(max_size=3), st.none())


def _mutate_option(draw: Draw, call: Call) -> None:
    name, values = draw(st.sampled_from([
        ("sm_scale", SM_SCALES),
        ("split_size", st.one_of(st.integers(-64, 300), st.none(), st.floats(),
                                 st.text(max_size=3))),
        ("plan", st.one_of(st.sampled_from(PLANS), st.text(max_size=6), st.none())),
        ("validate", st.one_of(st.just(True), st.integers(0, 2), st.text(max_size=2))),
        ("tuning", st.one_of(st.none(), st.integers(), st.builds(
            Tuning, block_m=st.sampled_from([None, 16, 32, 64]),
            num_warps=st.sampled_from([None, 2, 4]), num_stages=st.sampled_from([None, 1, 2])))),
    ]))
    call[name] = draw(values)


MUTATIONS = [_mutate_rank, _mutate_dtype, _mutate_device, _mutate_shape, _mutate_values,
             _mutate_option]


@st.composite
def damaged_calls(draw: Draw, device: torch.device) -> Call:
    dtype = draw(st.sampled_from(DTYPES))
    page_size = draw(st.sampled_from([1, 4, 16]))
    lengths = draw(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 5)), min_size=1,
                            max_size=3))
    shape = [(min(q, kv), kv) for kv, q in lengths]
    requests = tuple(Request(i, kv) for i, (_, kv) in enumerate(shape))
    step = Step(tuple(Chunk(i, kv - q, kv) for i, (q, kv) in enumerate(shape)))
    batch = materialize(Workload(requests, HeadConfig(4, 2, 64), dtype), step,
                        PageLayout(page_size, "shuffled", extra_columns=1), device)
    call: Call = {name: getattr(batch, name) for name in TENSORS}
    for mutate in draw(st.lists(st.sampled_from(MUTATIONS), max_size=3)):
        mutate(draw, call)
    return call


def _describe(call: Call) -> str:
    """The call in a line: tensor shapes, dtypes, strides, index values, options."""
    parts = []
    for name, value in call.items():
        if isinstance(value, torch.Tensor):
            text = f"{tuple(value.shape)} {value.dtype} stride {value.stride()}"
            if name in INDEX:
                text += f" = {value.tolist()}"
            parts.append(f"{name}: {text}")
        else:
            parts.append(f"{name}={value!r}")
    return "; ".join(parts)


@FUZZ
@given(data=st.data())
def test_unified_attention_rejects_or_is_correct(device: torch.device, assert_accurate,
                                                 data: st.DataObject) -> None:
    call = data.draw(damaged_calls(device), label="call")
    try:
        out, lse = unified_attention(**call)
    except ValueError as exc:
        assert str(exc), "ValueError without a message"
        event(f"ValueError on {str(exc).split(':')[0]}")
        return
    event("result")
    try:
        assert_accurate(out, lse, [call[name] for name in TENSORS], call.get("sm_scale"))
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_describe(call)}") from None


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy on garbage rows (interpreter)
@FUZZ
@given(data=st.data())
def test_validate_false_rejects_or_returns(device: torch.device, data: st.DataObject) -> None:
    # With validate=False malformed index values are trusted: any rows may come out, but only
    # a ValueError (from the checks that always run) may be raised, and nothing reads out of
    # bounds (on a GPU, benchmarks/gpu_sanitize.sh checks that with compute-sanitizer).
    call = data.draw(damaged_calls(device), label="call")
    call["validate"] = False
    try:
        out, lse = unified_attention(**call)
    except ValueError as exc:
        assert str(exc), "ValueError without a message"
        return
    assert out.shape == call["q"].shape and lse.shape == call["q"].shape[:2]


@st.composite
def merge_inputs(draw: Draw, device: torch.device) -> tuple[Any, Any]:
    n, s, h, d = (draw(st.integers(0, 3)) for _ in range(4))
    special = st.sampled_from([0.0, 1.5, -2.0, math.inf, -math.inf, math.nan])
    o = torch.tensor(draw(st.lists(special, min_size=n * s * h * d, max_size=n * s * h * d)),
                     device=device).reshape(n, s, h, d)
    lse = torch.tensor(draw(st.lists(special, min_size=n * s * h, max_size=n * s * h)),
                       device=device).reshape(n, s, h)
    o = draw(st.sampled_from([o, o.half(), o[0] if n else o, o.int(), o.tolist()]))
    lse = draw(st.sampled_from([lse, lse.double(), lse.unsqueeze(0), lse.to("meta"), None]))
    return o, lse


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy on inf - inf (interpreter)
@FUZZ
@given(data=st.data())
def test_merge_states_rejects_or_follows_the_rule(device: torch.device,
                                                  data: st.DataObject) -> None:
    o, lse = data.draw(merge_inputs(device), label="inputs")
    try:
        out, out_lse = merge_states(o, lse)
    except ValueError as exc:
        assert str(exc), "ValueError without a message"
        return
    # The documented rule: NaN or +inf in a row's LSEs -> that row is NaN.
    bad = (torch.isnan(lse) | torch.isposinf(lse)).any(1)
    assert bool(torch.isnan(out_lse[bad]).all()) and bool(torch.isnan(out[bad]).all())
    empty = torch.isneginf(lse).all(1)
    assert bool((out[empty] == 0).all()) and bool(torch.isneginf(out_lse[empty]).all())
