"""Bitwise comparison: raw bits, signed zeros, NaN payloads, ULP distance, diagnostics."""

from __future__ import annotations

import pytest
import torch

from invariance import AttentionResult, assert_bitwise_equal, compare_bits
from invariance.compare import bits, compare_outputs, compare_runs, ulp_distance
from invariance.schedule import ScheduleOutput

FLOATS = [torch.float16, torch.bfloat16, torch.float32]


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_adjacent_values_are_one_ulp_apart(dt: torch.dtype) -> None:
    x = torch.tensor([1.0, -1.0, 0.0], dtype=dt)
    up = (bits(x) + torch.tensor([1, 1, 1], dtype=bits(x).dtype)).view(dt)  # next bit pattern
    assert ulp_distance(x, up).tolist() == [1, 1, 1]
    d = compare_bits(up, x, name="t")
    assert d.num_different == 3 and d.max_ulp == 1


def test_signed_zeros_differ_by_one_ulp() -> None:
    d = compare_bits(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert d.num_different == 1 and d.max_ulp == 1 and d.max_abs_diff == 0.0


def test_nan_equal_only_with_identical_bits() -> None:
    nan = torch.tensor([float("nan")])
    assert compare_bits(nan, nan.clone()).equal
    other_payload = (bits(nan) + 1).view(torch.float32)
    d = compare_bits(nan, other_payload)
    assert d.num_different == 1 and d.nan_mismatches == 1
    d = compare_bits(nan, torch.tensor([1.0]))
    assert d.nan_mismatches == 1


def test_ulp_across_zero_and_sign() -> None:
    a = torch.tensor([-1.0], dtype=torch.float32)
    b = torch.tensor([1.0], dtype=torch.float32)
    assert int(ulp_distance(a, b)) == 2 * int(bits(b)) + 1


def test_first_difference_is_labelled() -> None:
    a = torch.zeros(3, 2, 4)
    b = a.clone()
    b[1, 1, 2] = 0.5
    b[2, 0, 0] = 1.0
    d = compare_bits(a, b, name="out", dims=("request", "token", "head", "dim"),
                     row_labels=[(7, 0), (7, 1), (9, 4)])
    assert d.first_index == {"request": 7, "token": 1, "head": 1, "dim": 2}
    assert d.first_values is not None and "0x3f000000" in d.first_values[1]
    assert d.num_different == 2 and d.max_abs_diff == 1.0
    assert "2 of 24 elements differ" in d.summary()


def test_compare_rejects_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        compare_bits(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="dtypes differ"):
        compare_bits(torch.zeros(2), torch.zeros(2, dtype=torch.float16))


def test_assert_bitwise_equal_passes_and_fails_readably() -> None:
    out = torch.randn(5, 4, 8)
    lse = torch.randn(5, 4)
    assert_bitwise_equal((out, lse), AttentionResult(out.clone(), lse.clone()))
    lse2 = lse.clone()
    lse2[3, 1] = torch.nextafter(lse2[3, 1], torch.tensor(float("inf")))
    with pytest.raises(AssertionError) as info:
        assert_bitwise_equal((out, lse2), (out, lse))
    text = str(info.value)
    assert "lse: 1 of 20 elements differ" in text and "max 1 ULP" in text
    assert "token=3, head=1" in text and "out:" not in text
    with pytest.raises(AssertionError, match="shape"):
        assert_bitwise_equal(torch.zeros(2), torch.zeros(3))
    with pytest.raises(TypeError, match="expected a tensor"):
        assert_bitwise_equal("x", torch.zeros(1))  # type: ignore[arg-type]


def _output(keys: list[tuple[int, int]], steps: list[int], values: list[float],
            origins: list[tuple[int, int]] | None = None) -> ScheduleOutput:
    out = torch.tensor(values).view(-1, 1, 1).repeat(1, 2, 4)
    return ScheduleOutput(keys, out, out[:, :, 0].clone(), steps, origins or [])


def test_rows_repeated_within_a_schedule_are_compared_with_each_other() -> None:
    # Request 5 token 3 is computed in steps 0 and 2 of schedule b (a decode neighbour of a
    # chunked prefill); schedule a never computes it: only b's own two occurrences can differ.
    a = _output([(0, 0), (0, 1)], [0, 0], [1.0, 2.0])
    b = _output([(0, 0), (5, 3), (0, 1), (5, 3)], [0, 0, 1, 2], [1.0, 7.0, 2.0, 7.5])
    cmp = compare_outputs(a, b)
    assert not cmp.equal and cmp.differing_keys() == [(5, 3)]
    row = cmp.differing_rows[0]
    assert cmp.within(row) == "b" and cmp.sources[row] == (("b", 0), ("b", 2))
    assert "computed twice in schedule b, in steps 0 and 2" in cmp.describe(row)
    # The rows both schedules computed are compared as before, once each.
    assert cmp.keys.count((0, 0)) == 1 and cmp.within(cmp.keys.index((0, 0))) is None
    same = _output([(0, 0), (5, 3), (0, 1), (5, 3)], [0, 0, 1, 2], [1.0, 7.0, 2.0, 7.0])
    assert compare_outputs(a, same).equal  # negative control: equal repeats pass


def test_rows_of_one_origin_are_one_row() -> None:
    # Request 2 repeats request 1's prompt: its token 4 is request 1's token 4, by content.
    b = _output([(1, 4), (2, 4)], [0, 0], [3.0, 3.5], origins=[(1, 4), (1, 4)])
    cmp = compare_outputs(_output([], [], []), b)
    assert cmp.differing_keys() == [(2, 4)] and cmp.within(0) == "b"
    assert compare_outputs(_output([], [], []), b, request=1).keys == []


def test_a_rerun_is_compared_occurrence_by_occurrence() -> None:
    # A deterministic but batch-variant backend: the repeated row differs between its steps,
    # the same way in both runs. Per occurrence, the runs agree (it is not nondeterministic).
    first = _output([(5, 3), (5, 3)], [0, 1], [7.0, 7.5])
    assert compare_runs(first, _output([(5, 3), (5, 3)], [0, 1], [7.0, 7.5])).equal
    changed = compare_runs(first, _output([(5, 3), (5, 3)], [0, 1], [7.0, 7.25]))
    assert changed.differing_rows == [1] and changed.sources[1] == (("run", 1), ("re-run", 1))
    with pytest.raises(ValueError, match="compare_runs: expected two runs of one schedule"):
        compare_runs(first, _output([(5, 3)], [0], [7.0]))
