"""Batch-invariant Triton attention kernels (paged, varlen, prefill + decode in one call).

Public API: :func:`unified_attention`, :func:`merge_states`, :data:`DEFAULT_SPLIT_SIZE`,
:func:`tile_config` (with :class:`TileConfig`). The plain-torch reference is
:func:`kernels.reference.reference_attention`. This package never imports ``invariance``.
"""

from kernels.attention import PLANS, unified_attention
from kernels.config import DEFAULT_SPLIT_SIZE, TileConfig, tile_config
from kernels.merge import merge_states

__all__ = [
    "DEFAULT_SPLIT_SIZE",
    "PLANS",
    "TileConfig",
    "merge_states",
    "tile_config",
    "unified_attention",
]
