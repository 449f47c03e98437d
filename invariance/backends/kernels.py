"""Adapters for this project's Triton kernels (``kernels.unified_attention``).

``kernels`` is imported lazily, inside the call, so the harness works where Triton is absent.
On a CPU tensor the kernels run under the Triton interpreter, which must be switched on with
``TRITON_INTERPRET=1`` before Triton is first imported; the adapter does so when it can.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from invariance.backends import Capabilities
from invariance.batch import AttentionBatch, AttentionResult

__all__ = ["KernelsBackend", "fused", "heuristic", "invariant", "split"]

_DEFAULT: Literal["default"] = "default"
# kernels.DEFAULT_SPLIT_SIZE, not imported here: importing kernels imports triton, which must
# wait until the interpreter is switched on (see above). tests/test_bad_inputs.py checks they agree.
_DEFAULT_SPLIT_TOKENS = 1024


def _enable_interpreter_on_cpu(batch: AttentionBatch) -> None:
    """CPU tensors need the Triton interpreter, which must be on before triton is imported."""
    if batch.device.type == "cpu" and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")


@dataclass(frozen=True)
class KernelsBackend:
    """``kernels.unified_attention`` with a fixed ``split_size`` (``"default"`` =
    ``kernels.DEFAULT_SPLIT_SIZE``; ``None`` = the batch-variant control heuristic) and ``plan``.

    ``block_m`` / ``num_warps`` / ``num_stages`` become a ``kernels.Tuning`` (launch overrides of
    the tile configuration ``kernels.tile_config`` fixes per (dtype, head_dim); its docstring says
    which are bit-neutral). They are for experiments that measure whether they change bits; a
    callable ``block_m`` picks it per batch, as a non-invariant library would.
    """

    split_size: int | Literal["default"] | None = _DEFAULT
    plan: Literal["auto", "fused", "split"] = "auto"
    block_m: int | Callable[[AttentionBatch], int] | None = None
    num_warps: int | None = None
    num_stages: int | None = None

    @property
    def capabilities(self) -> Capabilities:
        """Every dtype and device; head dims 64, 128, 256; CUDA graphs (no host sync during
        capture); the split size, so the check compares rows across several splits."""
        split = _DEFAULT_SPLIT_TOKENS if self.split_size == _DEFAULT else self.split_size
        return Capabilities(head_dims=(64, 128, 256), split_tokens=split)

    def __call__(self, batch: AttentionBatch) -> AttentionResult:
        _enable_interpreter_on_cpu(batch)
        import kernels

        split = kernels.DEFAULT_SPLIT_SIZE if self.split_size == _DEFAULT else self.split_size
        tuning = kernels.Tuning(
            block_m=self.block_m(batch) if callable(self.block_m) else self.block_m,
            num_warps=self.num_warps, num_stages=self.num_stages)
        out, lse = kernels.unified_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
            batch.block_table, sm_scale=batch.sm_scale, split_size=split, plan=self.plan,
            tuning=tuning,
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
