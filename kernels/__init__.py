"""Batch-invariant Triton attention kernels (paged, varlen, prefill + decode in one call).

Public API: :func:`unified_attention` (with its launch :class:`Tuning` overrides),
:func:`plan_attention` (the :class:`LaunchPlan` a call would run, with its :class:`HostStats`),
:func:`merge_states`, :data:`DEFAULT_SPLIT_SIZE`, :data:`DEFAULT_LEAD_SPLIT_SIZE`, :data:`PLANS`,
:func:`tile_config` (with
:class:`TileConfig`). The plain-torch float64 reference is
:func:`kernels.reference.reference_attention`. kernels/README.md has the math and the contract.
This package never imports ``invariance``.
"""

from kernels.attention import unified_attention
from kernels.config import DEFAULT_LEAD_SPLIT_SIZE, DEFAULT_SPLIT_SIZE, TileConfig, tile_config
from kernels.merge import merge_states
from kernels.plan import PLANS, HostStats, LaunchPlan, Tuning, plan_attention

__all__ = [
    "DEFAULT_LEAD_SPLIT_SIZE",
    "DEFAULT_SPLIT_SIZE",
    "PLANS",
    "HostStats",
    "LaunchPlan",
    "TileConfig",
    "Tuning",
    "merge_states",
    "plan_attention",
    "tile_config",
    "unified_attention",
]
