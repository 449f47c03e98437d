"""Fixed-order merge of attention partials (output, LSE): validation and launch."""

from __future__ import annotations

import torch
import triton

from kernels._triton.merge_kernels import _merge_states_kernel

__all__ = ["merge_states"]


def merge_states(outputs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold S attention partials left to right: ``((p0 + p1) + p2) + ...``.

    Args:
        outputs: ``[N, S, H, D]`` normalized partial outputs (any float dtype).
        lses: ``[N, S, H]`` their natural-log LSEs (any float dtype); ``-inf`` marks an empty
            partial, which is an exact no-op (its output is never read, it may be NaN).

    Returns:
        ``(out [N, H, D] float32, lse [N, H] float32)``. A row whose partials are all empty gets
        ``out = 0, lse = -inf``. Uses the same merge helper as the attention kernels.
    """
    if not isinstance(outputs, torch.Tensor) or outputs.ndim != 4:
        got = tuple(outputs.shape) if isinstance(outputs, torch.Tensor) else type(outputs).__name__
        raise ValueError(f"outputs: expected a 4-dim tensor [N, S, H, D], got {got}")
    if not isinstance(lses, torch.Tensor) or lses.ndim != 3:
        got = tuple(lses.shape) if isinstance(lses, torch.Tensor) else type(lses).__name__
        raise ValueError(f"lses: expected a 3-dim tensor [N, S, H], got {got}")
    N, S, H, D = outputs.shape
    if tuple(lses.shape) != (N, S, H):
        raise ValueError(f"lses: expected shape {(N, S, H)} to match outputs, got "
                         f"{tuple(lses.shape)}")
    for name, t in (("outputs", outputs), ("lses", lses)):
        if not t.dtype.is_floating_point:
            raise ValueError(f"{name}: expected a floating dtype, got {t.dtype}")
    if lses.device != outputs.device:
        raise ValueError(f"lses: expected device {outputs.device} (same as outputs), got "
                         f"{lses.device}")
    out = torch.zeros((N, H, D), dtype=torch.float32, device=outputs.device)
    lse = torch.full((N, H), float("-inf"), dtype=torch.float32, device=outputs.device)
    if N == 0 or H == 0 or D == 0:
        return out, lse
    if outputs.stride(-1) != 1:
        outputs = outputs.contiguous()
    BLOCK_H = min(triton.next_power_of_2(H), 16)
    _merge_states_kernel[(N, triton.cdiv(H, BLOCK_H))](
        outputs, lses, out, lse, H, S, D,
        outputs.stride(0), outputs.stride(1), outputs.stride(2),
        lses.stride(0), lses.stride(1), lses.stride(2),
        BLOCK_D=triton.next_power_of_2(D), BLOCK_H=BLOCK_H, num_warps=4)
    return out, lse
