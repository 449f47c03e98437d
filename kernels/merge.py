"""Fixed-order merge of attention partials (output, LSE): checks and launch."""

from __future__ import annotations

import os

import torch
import triton

from kernels import _interpreter
from kernels._triton.merge_kernels import _merge_states_kernel

__all__ = ["merge_states"]


def _check(name: str, t: object, ndim: int, dims: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a {ndim}-dim tensor {dims}, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-dim tensor {dims}, got shape "
                         f"{tuple(t.shape)}")
    if not t.dtype.is_floating_point:
        raise ValueError(f"{name}: expected a floating dtype, got {t.dtype}")
    return t


def merge_states(outputs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold S attention partials left to right: ``((p0 + p1) + p2) + ...``.

    Args:
        outputs: ``[N, S, H, D]`` normalized partial outputs (any float dtype).
        lses: ``[N, S, H]`` their natural-log LSEs (any float dtype), on ``outputs``' device.

    Returns:
        ``(out [N, H, D] float32, lse [N, H] float32)``, through ``state_merge``, a fixed
        left-to-right fold of normalized states (the attention kernels fold raw states with
        ``state_fold``; kernels/README.md).

    Special LSE values, per ``(n, h)`` row (kernels/README.md, "merge_states"):

    - ``-inf`` marks an empty partial: an exact no-op (its output is never read, it may be NaN).
      A row whose partials are all empty (or S == 0) gets ``out = 0, lse = -inf``.
    - ``NaN`` or ``+inf`` in any partial makes the row ``out = NaN, lse = NaN`` (every element).
      Decided on the device, no host sync; rows without such a partial keep their bits.
    - The outputs of non-empty partials are used as given: a NaN or inf there propagates as IEEE
      arithmetic does.
    """
    outputs = _check("outputs", outputs, 4, "[N, S, H, D]")
    lses = _check("lses", lses, 3, "[N, S, H]")
    N, S, H, D = outputs.shape
    if tuple(lses.shape) != (N, S, H):
        raise ValueError(f"lses: expected shape {(N, S, H)} to match outputs, got "
                         f"{tuple(lses.shape)}")
    if lses.device != outputs.device:
        raise ValueError(f"lses: expected device {outputs.device} (same as outputs), got "
                         f"{lses.device}")
    interpreting = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if not (outputs.device.type == "cuda" or (outputs.device.type == "cpu" and interpreting)):
        raise ValueError(f"outputs: expected a CUDA tensor (or CPU under TRITON_INTERPRET=1), got "
                         f"device {outputs.device}")
    if interpreting:
        _interpreter.install()
    out = torch.zeros((N, H, D), dtype=torch.float32, device=outputs.device)
    lse = torch.full((N, H), float("-inf"), dtype=torch.float32, device=outputs.device)
    if N == 0 or H == 0:
        return out, lse
    if outputs.stride(-1) != 1:
        outputs = outputs.contiguous()
    BLOCK_H = min(triton.next_power_of_2(H), 16)
    _merge_states_kernel[(N, triton.cdiv(H, BLOCK_H))](
        outputs, lses, out, lse, H, S, D,
        outputs.stride(0), outputs.stride(1), outputs.stride(2),
        lses.stride(0), lses.stride(1), lses.stride(2),
        BLOCK_D=max(triton.next_power_of_2(D), 1), BLOCK_H=BLOCK_H, num_warps=4)
    return out, lse
