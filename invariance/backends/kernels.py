"""Adapters for this project's Triton kernels (``kernels.unified_attention``).

``kernels`` is imported lazily, inside the call, so the harness works where Triton is absent.
On a CPU tensor the kernels run under the Triton interpreter, which must be switched on with
``TRITON_INTERPRET=1`` before Triton is first imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from invariance.batch import AttentionBatch, AttentionResult

__all__ = ["KernelsBackend", "fused", "heuristic", "invariant", "split"]

_DEFAULT: Literal["default"] = "default"


@dataclass(frozen=True)
class KernelsBackend:
    """``kernels.unified_attention`` with a fixed ``split_size`` (``"default"`` =
    ``kernels.DEFAULT_SPLIT_SIZE``; ``None`` = the batch-variant control heuristic) and ``plan``.
    """

    split_size: int | Literal["default"] | None = _DEFAULT
    plan: Literal["auto", "fused", "split"] = "auto"

    def __call__(self, batch: AttentionBatch) -> AttentionResult:
        import kernels

        split: int | None = (
            kernels.DEFAULT_SPLIT_SIZE if self.split_size == _DEFAULT else self.split_size  # type: ignore[assignment]
        )
        out, lse = kernels.unified_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
            batch.block_table, sm_scale=batch.sm_scale, split_size=split, plan=self.plan,
        )
        return AttentionResult(out, lse)


#: ``kernels``: invariant, default split size, plan chosen per batch.
invariant = KernelsBackend()
#: ``kernels-fused``: invariant, one program per query block walks all splits.
fused = KernelsBackend(plan="fused")
#: ``kernels-split``: invariant, split-parallel partials + fixed-order merge kernel.
split = KernelsBackend(plan="split")
#: ``kernels-heuristic``: CONTROL, split count chosen from the batch (FA2-style); NOT invariant.
heuristic = KernelsBackend(split_size=None)
