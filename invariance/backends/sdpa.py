"""torch ``scaled_dot_product_attention`` forced to one backend each: ``sdpa-flash``,
``sdpa-efficient``, ``sdpa-cudnn``, ``sdpa-math``.

Every kernel runs **one request at a time**, never on a padded batch: request ``b``'s K/V are
gathered straight from the paged cache (its first ``ceil(kv_len / page_size)`` pages of
``block_table``), and its query rows go through SDPA under
``torch.nn.attention.sdpa_kernel(SDPBackend.X)``, so that torch cannot fall back to another
kernel (it raises instead). Causal alignment is bottom-right: query row ``i`` of a request with
``q_len = n`` and ``kv_len = L`` sits at position ``L - n + i`` and sees keys ``0 .. L - n + i``.

- **flash**: FlashAttention takes no mask: one call per request, plain ``is_causal`` when
  ``n == L``, no mask for one query row (it sees every key),
  ``torch.nn.attention.bias.causal_lower_right`` otherwise, ``enable_gqa``;
- **efficient / cudnn / math**: an explicit boolean mask ``[1, 1, rows, keys]`` per call, K/V
  heads repeated to the query heads (GQA without ``enable_gqa``, which not every kernel takes);
  cuDNN, which refuses a single key, gets a request of ``kv_len == 1`` with one masked-out zero
  key appended.

**Row blocks (a memory bound of the adapter).** A request's query rows are split into
contiguous row blocks when one call on all of them would need more than ``max_bytes``
(:data:`MAX_BYTES`, 1 GiB, unless the constructor's ``max_bytes`` says otherwise) of transient
memory: per row, the boolean mask row plus the additive bias torch derives from it (``L × (1 +
2 × itemsize)`` bytes) for efficient / cudnn; the float32 score rows, a few copies
(``Hq × L × 4 × 4`` bytes) for math; nothing for flash, which is never split. Every block holds
``max(1, max_bytes // bytes_per_row)`` rows, the last one fewer; the block of rows ``[a, b)`` is
called over all ``L`` keys of the request with those rows of its mask. Rows are independent in
attention, so the blocking changes nothing but the number of query rows the kernel is called
with; it is deterministic and a function of the request alone (its ``q_len``, ``kv_len``, the
head count and dtype), never of the batch around it. Besides the blocks, a call holds only
copies of one request's Q/K/V at a time (K/V repeated to the query heads: ``O(Hq × L × D)``).

SDPA returns no LSE: ``lse`` is a separate ``logsumexp`` of ``q·kᵀ`` under the same causal
mask (:func:`invariance.backends.torch_backends.causal_lse`), per request, in row blocks under
the same budget (it never holds ``Hq × q_len × kv_len`` at once beyond it), computed in float64
and rounded to float32, so that the adapter's own rounding does not make a kernel look
batch-variant; only ``out`` comes from the kernel. That LSE is part of every call, so
``invariance bench`` times of ``sdpa-*`` are the adapter's (gathers, SDPA and the float64 LSE),
not SDPA's alone.

CUDA graphs: :meth:`SdpaBackend.plan` (the planning protocol of :mod:`invariance.backends`)
takes the batch's lengths on the host, so the call itself does no host sync.

**Features** (``Capabilities.features``). SDPA has no score modification and no FP8 inputs, so
only what a mask can express is taken, by the kernels that take a mask (efficient, cudnn,
math): a sliding window (``window_left``: the band of the boolean mask) and attention sinks
(one zero key and value appended to the request, its column of an additive float mask holding
each query head's sink, so its score is the sink and it adds ``exp(sink)`` to the denominator
alone). That mask is in q's dtype (SDPA's rule), so the sink is rounded to it: float32 exactly,
float16/bfloat16 to their precision. The LSE adds the sink exactly (float64). ``flash`` takes
no mask and no feature; no kernel takes soft-capping or an FP8 cache; a batch using a feature
its kernel does not take is refused.
"""

from __future__ import annotations

import weakref
from typing import Literal

import torch
import torch.nn.functional as F

from invariance.backends import Capabilities
from invariance.backends.reference import gather_kv
from invariance.backends.torch_backends import (
    ROW_BLOCK_BYTES,
    batch_lengths,
    causal_lse,
    row_blocks,
)
from invariance.batch import AttentionBatch, AttentionResult, require_features

__all__ = ["KERNELS", "MAX_BYTES", "SdpaBackend", "cudnn", "efficient", "flash", "math"]

Kernel = Literal["flash", "efficient", "cudnn", "math"]
#: Our kernel names -> ``torch.nn.attention.SDPBackend`` member names.
KERNELS: dict[str, str] = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                           "cudnn": "CUDNN_ATTENTION", "math": "MATH"}

#: Default budget, in bytes, of one call's transient memory (module docstring, "Row blocks").
MAX_BYTES: int = ROW_BLOCK_BYTES

#: The fewest keys a kernel takes (cuDNN refuses a key/value sequence length of 1): a shorter
#: request gets zero keys appended, masked out (they sit after its last query position).
_MIN_KEYS: dict[str, int] = {"cudnn": 2}

#: Float32 ``[Hq, rows, L]`` buffers the math kernel is counted for per call (the scores, the
#: additive mask, the softmax and its temporaries).
_MATH_COPIES = 4

#: The features a mask expresses (module docstring, "Features").
_MASK_FEATURES = frozenset({"window", "sinks"})

_CAPABILITIES: dict[str, Capabilities] = {
    "flash": Capabilities(dtypes=("float16", "bfloat16"), devices=("cuda",)),
    "efficient": Capabilities(devices=("cuda",), features=_MASK_FEATURES),
    "cudnn": Capabilities(dtypes=("float16", "bfloat16"), devices=("cuda",),
                          features=_MASK_FEATURES),
    "math": Capabilities(features=_MASK_FEATURES),
}


class SdpaBackend:
    """SDPA forced to ``kernel``, one request at a time in row blocks of at most ``max_bytes``
    transient bytes (default :data:`MAX_BYTES`; module docstring)."""

    def __init__(self, kernel: Kernel, *, max_bytes: int | None = None) -> None:
        if kernel not in KERNELS:
            raise ValueError(f"SdpaBackend kernel: expected one of {', '.join(KERNELS)}, got "
                             f"{kernel!r}")
        budget = MAX_BYTES if max_bytes is None else max_bytes
        if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
            raise ValueError(f"SdpaBackend max_bytes: expected a positive int, got {budget!r}")
        self.kernel: Kernel = kernel
        self.max_bytes: int = budget
        self._planned: tuple[weakref.ref[AttentionBatch],
                             tuple[list[int], list[int], list[int]]] | None = None

    @property
    def capabilities(self) -> Capabilities:
        return _CAPABILITIES[self.kernel]

    def __repr__(self) -> str:
        return f"SdpaBackend({self.kernel!r}, max_bytes={self.max_bytes})"

    def bytes_per_row(self, kv_len: int, num_q_heads: int, dtype: torch.dtype,
                      sinks: bool = False) -> int:
        """Transient bytes one query row over ``kv_len`` keys costs this kernel (0 for flash);
        with ``sinks`` the mask is a float mask per query head over one more key."""
        if self.kernel == "flash":
            return 0
        if self.kernel == "math":
            return num_q_heads * (kv_len + sinks) * 4 * _MATH_COPIES
        if sinks:
            return num_q_heads * (kv_len + 1) * 3 * dtype.itemsize
        return kv_len * (1 + 2 * dtype.itemsize)

    def blocks(self, q_len: int, kv_len: int, num_q_heads: int,
               dtype: torch.dtype, sinks: bool = False) -> list[tuple[int, int]]:
        """The row blocks ``[(start, stop), ...]`` of a request: a function of these alone."""
        return row_blocks(q_len, self.bytes_per_row(kv_len, num_q_heads, dtype, sinks),
                          self.max_bytes)

    def plan(self, batch: AttentionBatch) -> None:
        """Take the batch's lengths on the host (the only sync of a call)."""
        self._planned = (weakref.ref(batch), batch_lengths(batch))

    def _lengths(self, batch: AttentionBatch) -> tuple[list[int], list[int], list[int]]:
        if self._planned is not None and self._planned[0]() is batch:
            return self._planned[1]
        return batch_lengths(batch)

    def __call__(self, batch: AttentionBatch) -> AttentionResult:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        require_features(batch, self.capabilities.features, f"sdpa-{self.kernel}")
        out = torch.zeros_like(batch.q)
        lse = torch.full((batch.num_tokens, batch.num_q_heads), float("-inf"),
                         dtype=torch.float32, device=batch.device)
        if batch.num_tokens == 0:
            return AttentionResult(out, lse)
        q_lens, kv_lens, cu = self._lengths(batch)
        scale, window, sinks = batch.sm_scale, batch.window_left, batch.sinks
        with sdpa_kernel(getattr(SDPBackend, KERNELS[self.kernel])):
            for b, (n, L) in enumerate(zip(q_lens, kv_lens, strict=True)):
                if n == 0:
                    continue
                q = batch.q[cu[b]:cu[b] + n]  # [n, Hq, D]
                k, v = gather_kv(batch, b, L)  # [L, Hkv, D], host length: no sync
                if self.kernel == "flash":
                    out[cu[b]:cu[b] + n] = self._flash(q, k, v, scale)
                else:
                    out[cu[b]:cu[b] + n] = self._masked(q, k, v, scale, window, sinks)
                lse[cu[b]:cu[b] + n] = causal_lse(q, k, scale, self.max_bytes,
                                                  window_left=window, sinks=sinks)
        return AttentionResult(out, lse)

    @staticmethod
    def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> torch.Tensor:
        from torch.nn.attention.bias import causal_lower_right

        n, L = q.shape[0], k.shape[0]
        gqa = q.shape[1] != k.shape[1]
        qd, kd, vd = (_bhsd(t) for t in (q, k, v))
        if n == 1:  # the last position sees every key
            r = F.scaled_dot_product_attention(qd, kd, vd, scale=scale, enable_gqa=gqa)
        elif n == L:
            r = F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scale,
                                               enable_gqa=gqa)
        else:
            r = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=causal_lower_right(n, L),
                                               scale=scale, enable_gqa=gqa)
        return r[0].transpose(0, 1)

    def _masked(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                window_left: int = -1, sinks: torch.Tensor | None = None) -> torch.Tensor:
        n, Hq, _ = q.shape
        L, Hkv = k.shape[0], k.shape[1]
        G = Hq // Hkv
        qd, kd, vd = (_bhsd(t) for t in (q, k, v))
        if G > 1:
            kd, vd = kd.repeat_interleave(G, dim=1), vd.repeat_interleave(G, dim=1)
        keys = max(L, _MIN_KEYS.get(self.kernel, 1))
        extra = keys - L + (sinks is not None)
        if extra:  # zero keys after the last position: masked out below (or the sink's)
            kd, vd = (F.pad(t, (0, 0, 0, extra)) for t in (kd, vd))
        o = torch.empty_like(q)
        for a, b in self.blocks(n, L, Hq, q.dtype, sinks is not None):
            # Rows a..b-1 of the request over all its keys: row a + i sits at L - n + a + i
            # and sees keys from L - n + a + i - window_left on (with a window).
            mask = torch.ones(1, 1, b - a, keys, dtype=torch.bool, device=q.device)
            mask.tril_(L - n + a)
            if window_left >= 0:
                mask.triu_(L - n + a - window_left)
            attn_mask: torch.Tensor = mask
            if sinks is not None:  # an additive mask: 0 / -inf, then the sink's column
                bias = torch.zeros(1, Hq, b - a, keys + 1, dtype=q.dtype, device=q.device)
                bias[..., :keys].masked_fill_(~mask, float("-inf"))
                bias[..., keys] = sinks.to(q.dtype)[None, :, None]
                attn_mask = bias
            res = F.scaled_dot_product_attention(qd[:, :, a:b], kd, vd, attn_mask=attn_mask,
                                                 scale=scale)
            o[a:b] = res[0].transpose(0, 1)
        return o


def _bhsd(t: torch.Tensor) -> torch.Tensor:
    """``[S, H, D]`` -> a contiguous ``[1, H, S, D]`` (SDPA's layout)."""
    return t.transpose(0, 1).unsqueeze(0).contiguous()


#: ``sdpa-flash``: FLASH_ATTENTION, one call per request.
flash = SdpaBackend("flash")
#: ``sdpa-efficient``: EFFICIENT_ATTENTION, per request in row blocks, boolean mask.
efficient = SdpaBackend("efficient")
#: ``sdpa-cudnn``: CUDNN_ATTENTION, per request in row blocks, boolean mask.
cudnn = SdpaBackend("cudnn")
#: ``sdpa-math``: MATH, per request in row blocks, boolean mask.
math = SdpaBackend("math")
