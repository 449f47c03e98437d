# mypy: disable-error-code="no-untyped-def"
"""A frozen reference for the split plan's merge: the serial fold, each partial loaded and folded
in turn (:func:`state_fold`), one program per (query token, KV head's group of query heads,
block of head-dim columns). The package's merge kernel schedules the same operations
differently (weights first, loads a step ahead, other program blocks); the test that compares
the two (test_plans.py) shows the schedule changes no bit. Kept here, not in the package: it is
the baseline, and must not change when the merge does."""

import inspect

import triton
import triton.language as tl

from kernels._device import _interpreting
from kernels._triton.common import LN2, _find_request, _split_count
from kernels._triton.merge_kernels import state_fold, state_normalize


@triton.jit(do_not_specialize=["split_tokens", "lead_tokens", "B", "num_splits", "max_kv_len"])
def _serial_merge_kernel(
    # Inputs
    ws_o_ptr,  # [T, Hq, num_splits, D] fp32 raw acc
    ws_ml_ptr,  # [T, Hq, num_splits, 2] fp32 (m in log2 units, l)
    cu_seqlens_q_ptr,  # [B + 1] int32
    kv_lens_ptr,  # [B] int32
    # Outputs
    out_ptr,  # [T, Hq, D]
    lse_ptr,  # [T, Hq] fp32
    # Scalars
    split_tokens,
    lead_tokens,
    B,
    Hq,
    num_splits,
    max_kv_len,
    # Constexprs
    G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    i_t = tl.program_id(0)
    i_kvh = tl.program_id(1)
    i_db = tl.program_id(2)
    i_b = _find_request(cu_seqlens_q_ptr, i_t, B, 1, False)
    q_start = tl.load(cu_seqlens_q_ptr + i_b)
    q_len = tl.load(cu_seqlens_q_ptr + i_b + 1) - q_start
    kv_len = tl.minimum(tl.maximum(tl.load(kv_lens_ptr + i_b), 0), max_kv_len)
    pos = kv_len - q_len + (i_t - q_start)
    n_splits = tl.minimum(_split_count(pos + 1, split_tokens, lead_tokens), num_splits)
    o_g = tl.arange(0, BLOCK_G)
    o_d = i_db * BLOCK_D + tl.arange(0, BLOCK_D)
    m_g = o_g < G
    i_ws = (i_t.to(tl.int64) * Hq + i_kvh * G + o_g) * num_splits  # [BG]
    f_m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    f_l = tl.zeros([BLOCK_G], dtype=tl.float32)
    f_acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for i_s in range(0, n_splits):
        # [BG]
        s_m = tl.load(ws_ml_ptr + 2 * (i_ws + i_s), mask=m_g, other=float("-inf"))
        s_l = tl.load(ws_ml_ptr + 2 * (i_ws + i_s) + 1, mask=m_g, other=0.0)
        # [BG, BD]
        s_acc = tl.load(ws_o_ptr + (i_ws + i_s)[:, None] * HEAD_DIM + o_d[None, :],
                        mask=m_g[:, None], other=0.0)
        f_m, f_l, f_acc = state_fold(f_m, f_l, f_acc, s_m, s_l, s_acc)
    b_o, b_lse = state_normalize(f_acc, f_l, f_m)
    i_row = i_t.to(tl.int64) * Hq + i_kvh * G + o_g
    tl.store(out_ptr + i_row[:, None] * HEAD_DIM + o_d[None, :],
             b_o.to(out_ptr.dtype.element_ty), mask=m_g[:, None])
    tl.store(lse_ptr + i_row, b_lse * LN2, mask=m_g & (o_g * 0 + i_db == 0))


_ARGS = [p for p in inspect.signature(_serial_merge_kernel.fn).parameters]


class SerialMerge:
    """Stands in for ``kernels.launch._merge_splits_kernel``: takes the package merge's launch
    (grid and arguments) and runs the serial merge on its own grid, with the arguments it
    knows (the rest, e.g. the merge's schedule constexprs, are the package's own business)."""

    def __init__(self, G: int) -> None:
        self.G = G

    def __getitem__(self, grid: tuple[int, ...]):
        def launch(*args, **kwargs):
            known = dict(zip(_ARGS, args, strict=False))
            known.update({k: v for k, v in kwargs.items() if k in _ARGS})
            head_dim = known["HEAD_DIM"]
            block_d = head_dim if _interpreting() else min(32, head_dim)
            known.update(G=self.G, BLOCK_G=triton.next_power_of_2(self.G), BLOCK_D=block_d)
            _serial_merge_kernel[(grid[0], known["Hq"] // self.G, head_dim // block_d)](**known)
        return launch
