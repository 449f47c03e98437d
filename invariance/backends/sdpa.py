"""torch ``scaled_dot_product_attention`` forced to one backend each: ``sdpa-flash``,
``sdpa-efficient``, ``sdpa-cudnn``, ``sdpa-math``.

The batch is padded to dense per request with the ``sdpa`` backend's code
(:func:`invariance.backends.torch_backends.pad_dense`: request ``b`` in slot ``b`` of ``[B, H,
max_q, max_kv]``, a boolean causal + padding mask) and run under
``torch.nn.attention.sdpa_kernel(SDPBackend.X)``, so that torch cannot fall back to another
kernel (it raises instead):

- **efficient / cudnn / math**: one call on the padded batch with the boolean mask, K/V heads
  repeated to the query heads (GQA without ``enable_gqa``, which not every kernel takes);
- **flash**: FlashAttention takes no mask, so one dense call per request on its slot, causal
  aligned bottom-right (``torch.nn.attention.bias.causal_lower_right``; plain ``is_causal`` when
  ``q_len == kv_len``, no mask for one query row), ``enable_gqa``.

SDPA returns no LSE: ``lse`` is a separate float32 ``logsumexp`` of ``q·kᵀ`` under the same mask,
as the ``sdpa`` backend computes it (:func:`~invariance.backends.torch_backends.dense_lse`), one
request at a time so that its memory follows the largest request rather than ``B * max_q *
max_kv``; only ``out`` comes from the kernel.

CUDA graphs: :meth:`SdpaBackend.plan` (the planning protocol of :mod:`invariance.backends`)
takes the batch's lengths on the host, so the call itself does no host sync.
"""

from __future__ import annotations

import weakref
from typing import Literal

import torch
import torch.nn.functional as F

from invariance.backends import Capabilities
from invariance.backends.torch_backends import (
    DenseBatch,
    batch_lengths,
    dense_lse,
    pad_dense,
    unpad,
)
from invariance.batch import AttentionBatch, AttentionResult

__all__ = ["KERNELS", "SdpaBackend", "cudnn", "efficient", "flash", "math"]

Kernel = Literal["flash", "efficient", "cudnn", "math"]
#: Our kernel names -> ``torch.nn.attention.SDPBackend`` member names.
KERNELS: dict[str, str] = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                           "cudnn": "CUDNN_ATTENTION", "math": "MATH"}

_CAPABILITIES: dict[str, Capabilities] = {
    "flash": Capabilities(dtypes=("float16", "bfloat16"), devices=("cuda",)),
    "efficient": Capabilities(devices=("cuda",)),
    "cudnn": Capabilities(dtypes=("float16", "bfloat16"), devices=("cuda",)),
    "math": Capabilities(),
}


class SdpaBackend:
    """SDPA forced to ``kernel`` (module docstring). ``per_request`` (default: only for flash)
    runs one dense call per request instead of one masked call on the padded batch."""

    def __init__(self, kernel: Kernel, *, per_request: bool | None = None) -> None:
        if kernel not in KERNELS:
            raise ValueError(f"SdpaBackend kernel: expected one of {', '.join(KERNELS)}, got "
                             f"{kernel!r}")
        self.kernel: Kernel = kernel
        self.per_request = kernel == "flash" if per_request is None else per_request
        self._planned: tuple[weakref.ref[AttentionBatch],
                             tuple[list[int], list[int], list[int]]] | None = None

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES[self.kernel]

    def __repr__(self) -> str:
        return f"SdpaBackend({self.kernel!r}, per_request={self.per_request})"

    def plan(self, batch: AttentionBatch) -> None:
        """Take the batch's lengths on the host (the only sync of a call)."""
        self._planned = (weakref.ref(batch), batch_lengths(batch))

    def _lengths(self, batch: AttentionBatch) -> tuple[list[int], list[int], list[int]]:
        if self._planned is not None and self._planned[0]() is batch:
            return self._planned[1]
        return batch_lengths(batch)

    def __call__(self, batch: AttentionBatch) -> AttentionResult:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        dense = pad_dense(batch, self._lengths(batch))
        if dense is None:
            return unpad(batch, None, None, None)
        with sdpa_kernel(getattr(SDPBackend, KERNELS[self.kernel])):
            o = self._per_request(dense, batch.sm_scale) if self.per_request else \
                self._padded(dense, batch.sm_scale)
        return unpad(batch, dense, o, dense_lse(dense, batch.sm_scale, per_request=True))

    @staticmethod
    def _padded(dense: DenseBatch, scale: float) -> torch.Tensor:
        G = dense.q.shape[1] // dense.k.shape[1]
        k = dense.k.repeat_interleave(G, dim=1) if G > 1 else dense.k
        v = dense.v.repeat_interleave(G, dim=1) if G > 1 else dense.v
        return F.scaled_dot_product_attention(dense.q, k, v, attn_mask=dense.mask, scale=scale)

    @staticmethod
    def _per_request(dense: DenseBatch, scale: float) -> torch.Tensor:
        from torch.nn.attention.bias import causal_lower_right

        gqa = dense.q.shape[1] != dense.k.shape[1]
        o = torch.zeros_like(dense.q)
        for b, (n, kv) in enumerate(zip(dense.q_lens, dense.kv_lens, strict=True)):
            if n == 0:
                continue
            q = dense.q[b:b + 1, :, :n]
            k, v = dense.k[b:b + 1, :, :kv], dense.v[b:b + 1, :, :kv]
            if n == 1:  # the last position sees every key
                r = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)
            elif n == kv:
                r = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                   enable_gqa=gqa)
            else:
                r = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n, kv),
                                                   scale=scale, enable_gqa=gqa)
            o[b:b + 1, :, :n] = r
        return o


#: ``sdpa-flash``: FLASH_ATTENTION, one dense call per request.
flash = SdpaBackend("flash")
#: ``sdpa-efficient``: EFFICIENT_ATTENTION, the padded batch with a boolean mask.
efficient = SdpaBackend("efficient")
#: ``sdpa-cudnn``: CUDNN_ATTENTION, the padded batch with a boolean mask.
cudnn = SdpaBackend("cudnn")
#: ``sdpa-math``: MATH, the padded batch with a boolean mask.
math = SdpaBackend("math")
