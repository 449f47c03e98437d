"""The launch plan of one :func:`kernels.unified_attention` call: which kernels, tiles, splits and
schedule it runs (kernels/README.md, "Layers").

:func:`plan_attention` is a sequence of named steps, each a small function below:

1. :func:`_facts`: the call's shapes and device (no device read);
2. :func:`_read_lengths`: host copies of the lengths (read back and checked with
   ``validate=True``, the caller's ``host_lens``, or none), and :func:`_tuned`: the measured
   table's settings for the call's bucket (:mod:`kernels.tuned`), if any; then, once with
   those settings (and again with the rules' if the call cannot take them):
3. :func:`_tiles`: the contract's tile width and the launch's tile (rows, warps, stages);
4. :func:`_splits`: split and lead-split sizes and the workspace depth (bit-defining sizes are
   fixed; only the control mode takes them from the batch);
5. :func:`_choose_plan`: fused or split (bit-neutral);
6. :func:`_schedule`: the bit-neutral schedule of that plan (V column blocks, tiles per step,
   loop structure, stages, the Gluon kernels, the keys-as-rows tile, slot order).

Units: ``split_tokens`` and ``lead_tokens`` count KV tokens, ``split_tiles`` and ``lead_tiles``
count KV tiles of ``block_n`` tokens. Nothing here reads the device under CUDA-graph capture.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from kernels._checks import (
    PLANS,
    Features,
    _check_feature_values,
    _check_features,
    _check_host_lens,
    _check_options,
    _check_structure,
    _read_and_check_values,
)
from kernels._device import _capturing, _cdiv, _device_slug, _is_pow2, _num_sms, _sm_major
from kernels._triton.attention_kernels import HAS_GDC
from kernels.config import (
    DEFAULT_LEAD_SPLIT_SIZE,
    DEFAULT_SPLIT_SIZE,
    WIDE_BLOCK_N,
    TileConfig,
    batch_tuning,
    choose_plan,
    control_num_splits,
    count_splits,
    decode_stages,
    fused_loop,
    gluon_prefill,
    gluon_tile,
    gluon_value_blocks,
    kt_scores_ahead,
    kt_tile,
    kt_value_blocks,
    kt_walk_lead,
    kt_walk_splits,
    prefill_like,
    rows_per_block,
    slot_order,
    tile_config,
    tiles_per_step,
    value_blocks,
    wide_tile,
)
from kernels.tuned import (
    TunedEntry,
    TunedTable,
    active_table,
    bucket,
    feature_tag,
    warn_unused_entry,
)

__all__ = ["PLANS", "HostStats", "LaunchPlan", "Tuning", "plan_attention"]

_NUM_WARPS = (1, 2, 4, 8, 16)
# Fewest V columns a value block may have: tl.dot needs N >= 16.
_MIN_DOT_COLUMNS = 16
# Fewest V columns a value block of the 128-key Gluon split kernel has (tests/triton_kernels/
# test_gluon.py covers 32, 64 and 128).
_GLUON_MIN_V_COLUMNS = 32
# V column blocks of this many columns with an FP8 cache compute wrong values on an H200 under
# Triton 3.6 (the tuner's admission rejected them; against the float64 reference their output is
# off by up to 0.24 where 16 and 64 columns are within 7e-4: reports/h200/tune-features,
# ARCHITECTURE.md "Tuning"): refused.
_FP8_REFUSED_V_COLUMNS = 32
#: Why the Gluon tiles refuse a call with features (they take none: the Triton kernels run it).
_FEATURE_MISFIT = "a call without window, sinks, soft-cap or FP8 cache, got one with a feature"


# ------------------------------------------------------------------------------------------------
# Public data: tuning overrides, host statistics, the launch plan
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tuning:
    """Overrides of the launch settings :func:`plan_attention` would choose. ``None`` keeps the
    plan's choice. Every field but ``block_n`` is bit-neutral within one MMA instruction family
    (kernels/README.md, "Bit-defining and bit-neutral settings"; the evidence per GPU is in
    reports/): they change how work is scheduled, never a row's reduction order.

    - ``block_m`` (tile rows, a power of two; raised to the GQA group size), ``num_warps``: the
      tile's rows and warps. On a GPU they pick the tensor-core layout of ``tl.dot``: values of
      one instruction family (``wgmma`` on Hopper) agree bit for bit, ``mma.sync`` and FMA tiles
      of other row counts may not; vary them only where the harness has shown, on the target
      GPU, that the values used agree. A ``block_m`` without warps or stages takes those from
      :func:`~kernels.tile_config`.
    - ``num_stages``: software-pipelining depth (the Gluon kernels' TMA ring has its own).
    - ``value_blocks`` (1, 2, 4 or 8; at least 16 V columns each, 32 on the Gluon tile, never
      32 with an FP8 cache: ARCHITECTURE.md, "Tuning"): V column blocks per (slot, KV head,
      split) of the split plan, each its own program.
    - ``tiles_per_step`` (1 or 2): fully visible KV tiles per loop step of the split kernel and
      the fused plan's nested loop.
    - ``dependent_merge`` (bool): the split plan's merge as a programmatic dependent launch
      (``griddepcontrol``, compute capability 9+, Triton 3.4+); ``False``: never.
    - ``slot_order`` (bool): fused programs take their query-block slots with the requests of
      most KV first (sorted on the device), instead of the last slots first.
    - ``nested_loop`` (bool): fused programs walk each split in an inner loop and fold after
      it, instead of one flat loop with a fold at each split boundary.
    - ``gluon`` (bool): the Gluon kernels (Hopper, Triton 3.6) instead of the Triton ones, with
      the same bits: by default at head dim 128; at head dim 64 (128-key tiles too) only when
      asked; at head dim 256 the keys-as-rows decode tile only. ``True`` requires them: a
      ``ValueError`` names every unmet condition; ``False`` never.
    - ``keys_rows`` (bool): the split plan's keys-as-rows decode tile (Gluon, Hopper, Triton
      3.6; the contract's tile: 128 keys at head dims 64 and 128, asking for the Gluon kernels
      at 64; 64 keys at head dim 256). By default decode batches take it at head dims 128 and
      256; ``True`` requires it, ``False`` never.
    - ``scores_ahead`` (bool): that tile issues each next tile's scores before this ``p @ v``.
    - ``walk_lead`` (bool): that tile walks a whole split and folds its lead splits, instead of
      one program per lead split.
    - ``block_n`` (KV tokens per tile, a power of two >= 16): BIT-DEFINING, another contract
      (for experiments; ``split_size`` must be a multiple of it).
    """

    block_m: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    block_n: int | None = None
    value_blocks: int | None = None
    tiles_per_step: int | None = None
    dependent_merge: bool | None = None
    slot_order: bool | None = None
    nested_loop: bool | None = None
    gluon: bool | None = None
    keys_rows: bool | None = None
    scores_ahead: bool | None = None
    walk_lead: bool | None = None

    def __post_init__(self) -> None:
        checks = (
            ("block_m", self.block_m, lambda v: _is_pow2(v), "a power of two"),
            ("num_warps", self.num_warps, lambda v: v in _NUM_WARPS, f"one of {_NUM_WARPS}"),
            ("num_stages", self.num_stages, lambda v: 1 <= v <= 8, "an int in [1, 8]"),
            ("block_n", self.block_n, lambda v: _is_pow2(v) and v >= 16,
             "a power of two >= 16"),
            ("value_blocks", self.value_blocks, lambda v: v in (1, 2, 4, 8), "1, 2, 4 or 8"),
            ("tiles_per_step", self.tiles_per_step, lambda v: v in (1, 2), "1 or 2"),
        )
        for name, value, ok, expected in checks:
            if value is not None and not (isinstance(value, int) and not isinstance(value, bool)
                                          and ok(value)):
                raise ValueError(f"Tuning.{name}: expected {expected} or None, got {value!r}")
        for name in ("dependent_merge", "slot_order", "nested_loop", "gluon", "keys_rows",
                     "scores_ahead", "walk_lead"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"Tuning.{name}: expected a bool or None, got {value!r}")


@dataclass(frozen=True)
class HostStats:
    """Batch statistics on the host: read back from the device (one sync, ``validate=True``) or
    computed from the caller's ``host_lens`` (no sync; used for speed decisions only)."""

    max_kv_len: int  # longest KV length of the batch
    num_q_blocks: int  # sum over requests of ceil(q_len / block_q)
    longest_tiles: int  # KV tiles of the longest request
    total_tiles: int  # sum over query blocks of the KV tiles they walk (one KV head)


@dataclass(frozen=True)
class LaunchPlan:
    """How one :func:`~kernels.unified_attention` call runs. Computed by :func:`plan_attention`.

    Bit-defining (fixed per dtype, head_dim and deployment, kernels/README.md): ``block_n``,
    ``split_tokens``, ``lead_tokens``. Everything else only changes speed, except in the control
    mode (``is_control``), where ``split_tokens`` comes from the batch (and ``lead_tokens``
    equals it).
    """

    plan: str  # "fused" or "split"
    block_m: int  # tile rows: (query token, query head) pairs
    block_q: int  # query tokens per tile: block_m // G
    block_n: int  # KV tokens per tile
    num_warps: int
    num_stages: int  # pipeline stages; on the Gluon kernels their TMA ring's K/V slots
    split_tokens: int  # KV tokens per split (a multiple of block_n)
    split_tiles: int  # KV tiles per split: split_tokens // block_n
    lead_tokens: int  # KV tokens per lead split (the first split_tokens of every row), divides it
    lead_tiles: int  # KV tiles per lead split: lead_tokens // block_n
    num_splits: int  # splits of the longest KV length (or its bound): the workspace depth
    num_slots: int  # query-block slots, grid dim 0: T // block_q + B (an upper bound)
    value_blocks: int  # split plan: V column blocks per (slot, KV head, split); fused: 1
    tiles_per_step: int  # fully visible KV tiles per loop step (1 or 2); flat fused loop: 1
    dependent_merge: bool  # split plan's merge as a programmatic dependent launch (sm_90+)
    slot_order: bool  # fused plan: requests with the most KV first (sorted on the device)
    nested_loop: bool  # fused plan: an inner loop per split, its fold after it (else one loop)
    gluon: bool  # the Gluon kernels (kernels/_gluon) instead of Triton's
    keys_rows: bool  # split plan: the keys-as-rows decode tile (block_m: its rows, <= 32)
    scores_ahead: bool  # keys-as-rows tile: next tile's scores issued before this p @ v
    # keys-as-rows tile: a program per split of split_tokens, lead splits folded in it (the
    # workspace and the merge then count splits of split_tokens), not one per lead split
    walk_lead: bool
    walk_splits: int  # walk_lead: splits of split_tokens per program (each stored); else 1
    max_kv_len: int  # longest KV length (host statistics) or the block table's bound
    is_control: bool  # split_size=None: split count chosen from the batch (not invariant)
    # From the lengths read back (validate=True) or from host_lens; counted in blocks of the
    # 128-row tile's block_q (the plan is chosen from them) even where keys_rows gives block_q.
    stats: HostStats | None
    #: The bucket of the measured table (:mod:`kernels.tuned`) whose settings this call runs;
    #: None: the shape rules of :mod:`kernels.config` (or the caller's ``Tuning``) decided.
    tuned: str | None = None


# ------------------------------------------------------------------------------------------------
# The steps
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Facts:
    """Shapes and device of one call (no device read)."""

    T: int
    Hq: int
    D: int
    Hkv: int
    G: int
    B: int
    page_size: int
    dtype: torch.dtype
    sm_major: int | None
    num_sms: int
    bound: int  # KV tokens the block table covers: every checked length is at most this
    plain: bool  # no window, sinks, soft-cap or FP8 cache: the Gluon kernels may run it
    fp8: bool = False  # an FP8 cache


def _facts(q: torch.Tensor, k_cache: torch.Tensor, kv_lens: torch.Tensor,
           block_table: torch.Tensor, features: Features | None = None) -> _Facts:
    T, Hq, D = q.shape
    _, page_size, Hkv, _ = k_cache.shape
    return _Facts(T=T, Hq=Hq, D=D, Hkv=Hkv, G=Hq // Hkv, B=kv_lens.shape[0],
                  page_size=page_size, dtype=q.dtype, sm_major=_sm_major(q.device),
                  num_sms=_num_sms(q.device), bound=block_table.shape[1] * page_size,
                  plain=features is None or features.plain,
                  fp8=features is not None and features.k_scale is not None)


@dataclass(frozen=True)
class _Tiles:
    """The tile of one call: the contract's width and the launch's rows, warps and stages."""

    block_n: int
    block_m: int
    block_q: int
    launch: TileConfig  # warps and stages before the per-plan schedule
    wide: bool  # the 128-key contract (half precision, head dim 128, Hopper)
    wide_gluon: bool  # ... on the Gluon tile
    # The keys-as-rows tile at a contract the 128-key Gluon kernels do not take (64 keys at head
    # dim 256): able to run (unless keys_rows=False); else why not (None: not asked).
    kt_narrow: bool = False
    kt_narrow_misfit: str | None = None


def _contract_block_n(f: _Facts, tuning: Tuning) -> tuple[int, TileConfig]:
    """The contract's tile width (128 keys where the Gluon kernels can be built: Hopper, half
    precision, head dim 128, Triton 3.6; else :func:`~kernels.tile_config`'s; a ``Tuning`` may
    name another) and the per-batch tile configuration at that width."""
    contract = tile_config(f.dtype, f.D, f.sm_major, _gluon_installed(f.dtype, f.D, f.sm_major))
    cfg = batch_tuning(f.dtype, f.D, f.G, f.T, f.B, f.sm_major, tuning.block_n or contract.block_n)
    return cfg.block_n, cfg


def _tiles(f: _Facts, cfg: TileConfig, tuning: Tuning, q: torch.Tensor,
           k_cache: torch.Tensor, v_cache: torch.Tensor) -> _Tiles:
    """Under the 128-key contract at head dim 128 the Gluon tile runs both plans where it can
    (128 rows on 8 warps, its own ring), at head dim 64 where a ``Tuning`` (or table entry)
    asks; else the Triton kernels with :func:`~kernels.tile_config`'s fixed launch; an explicit
    ``block_m`` elsewhere also takes ``tile_config``'s warps and stages."""
    block_n = cfg.block_n
    wide = wide_tile(f.dtype, f.D, block_n, f.sm_major)
    # The 128-key Gluon tile: by default under the 128-key contract at head dim 128 (the rules);
    # at head dim 64 (also 128 keys) only where a table entry or the caller asks for it.
    asked = tuning.gluon is not False and (wide or bool(tuning.gluon or tuning.keys_rows))
    wide_gluon = asked and block_n == WIDE_BLOCK_N and _gluon_ready(
        q, k_cache, v_cache, _wide_gluon_misfit(f, block_n, tuning), required=bool(tuning.gluon))
    if wide_gluon:  # its shape: 128 rows on two warpgroups (8 warps), its own ring
        launch = replace(cfg, block_m=128, num_warps=8, num_stages=3)
    elif tuning.block_m is None and not wide:
        launch = cfg
    else:
        launch = replace(tile_config(f.dtype, f.D, f.sm_major, wide), block_n=block_n)
    kt_narrow, kt_narrow_misfit = False, None
    if tuning.keys_rows is not False and not wide_gluon and block_n != WIDE_BLOCK_N:
        kt_narrow_misfit = _kt_narrow_misfit(f, block_n, tuning, q, k_cache, v_cache)
        kt_narrow = kt_narrow_misfit is None
    block_m, block_q = rows_per_block(tuning.block_m or launch.block_m, f.G)
    if (f.fp8 and tuning.value_blocks is not None
            and f.D // tuning.value_blocks == _FP8_REFUSED_V_COLUMNS):
        raise ValueError(
            f"tuning: expected value_blocks other than {f.D // _FP8_REFUSED_V_COLUMNS} with an "
            f"FP8 cache at head_dim {f.D} ({_FP8_REFUSED_V_COLUMNS}-column V blocks with an FP8 "
            f"cache compute wrong values on an H200: reports/h200/tune-features), got "
            f"value_blocks={tuning.value_blocks}")
    if tuning.value_blocks is not None and f.D // tuning.value_blocks < _MIN_DOT_COLUMNS:
        raise ValueError(
            f"tuning: expected value_blocks <= head_dim / {_MIN_DOT_COLUMNS} = "
            f"{f.D // _MIN_DOT_COLUMNS} (each block keeps at least {_MIN_DOT_COLUMNS} V "
            f"columns), got value_blocks={tuning.value_blocks} at head_dim {f.D}")
    return _Tiles(block_n=block_n, block_m=block_m, block_q=block_q, launch=launch, wide=wide,
                  wide_gluon=wide_gluon, kt_narrow=kt_narrow, kt_narrow_misfit=kt_narrow_misfit)


def _host_stats(cu: torch.Tensor, kv: torch.Tensor, block_q: int, block_n: int) -> HostStats:
    """Statistics of host lengths (int64 copies of ``cu_seqlens_q`` and ``kv_lens``)."""
    B = kv.shape[0]
    q_lens = cu[1:] - cu[:-1]
    n_blocks = (q_lens + block_q - 1) // block_q
    max_kv = int(kv.max()) if B > 0 else 0
    # KV tiles walked by each query block: up to the block's last position.
    total_tiles = 0
    if B > 0 and int(n_blocks.sum()) > 0:
        req = torch.repeat_interleave(torch.arange(B), n_blocks)
        first = torch.repeat_interleave(torch.cumsum(n_blocks, 0) - n_blocks, n_blocks)
        i_blk = torch.arange(req.shape[0]) - first
        end = torch.minimum((i_blk + 1) * block_q, q_lens[req])
        max_pos = kv[req] - q_lens[req] + end - 1
        total_tiles = int((max_pos // block_n + 1).sum())
    return HostStats(max_kv_len=max_kv, num_q_blocks=int(n_blocks.sum()),
                     longest_tiles=_cdiv(max_kv, block_n), total_tiles=total_tiles)


def _read_lengths(f: _Facts, inputs: tuple[torch.Tensor, ...], validate: bool,
                  host_lens: object) -> _Lengths | None:
    """Host copies of the lengths: with ``validate=True`` outside a capture they are read back
    and checked (trusted: they may size the workspace); else the caller's ``host_lens`` (they
    steer the plan only); else None (shapes alone)."""
    q, k_cache, _, cu_seqlens_q, kv_lens, block_table = inputs
    hint = None if host_lens is None else _check_host_lens(host_lens, f.B, f.T)
    if validate and not _capturing(q.device):
        cu, kv = _read_and_check_values(q, k_cache, cu_seqlens_q, kv_lens, block_table)
        return _Lengths(cu, kv, trusted=True)
    if hint is not None:
        cu = torch.tensor([0, *hint[0]], dtype=torch.int64).cumsum(0)
        kv = torch.tensor(list(hint[1]), dtype=torch.int64)
        return _Lengths(cu, kv, trusted=False)
    return None


@dataclass(frozen=True)
class _Lengths:
    """Host int64 copies of ``cu_seqlens_q`` and ``kv_lens``; ``trusted``: read back and checked
    (not the caller's ``host_lens``)."""

    cu: torch.Tensor
    kv: torch.Tensor
    trusted: bool

    @property
    def max_kv(self) -> int:
        return int(self.kv.max()) if self.kv.shape[0] > 0 else 0


@dataclass(frozen=True)
class _Splits:
    split_tokens: int
    lead_tokens: int
    num_splits: int  # the workspace depth: from trusted lengths or the table's bound
    max_kv: int  # longest length known (checked or host_lens), else the table's bound
    sizing_kv: int  # the length that sizes memory: checked, else the table's bound
    num_q_blocks: int


def _split_tokens(split_size: int | None, block_n: int, max_kv: int, num_programs: int,
                  num_sms: int) -> int:
    """``split_size`` itself, or in the control mode (None) FA2's batch-dependent choice."""
    if split_size is not None:
        return int(split_size)
    n_tiles = max(1, _cdiv(max_kv, block_n))
    n_splits = control_num_splits(num_programs, num_sms, n_tiles)
    return _cdiv(_cdiv(max(max_kv, 1), n_splits), block_n) * block_n


def _lead_tokens(split_size: int | None, lead_split_size: int | None, split_tokens: int,
                 block_n: int) -> int:
    """KV tokens per lead split: ``lead_split_size`` where it is below the split size, else the
    split size (one size). ``None``: :data:`~kernels.DEFAULT_LEAD_SPLIT_SIZE` with the default
    split size (where the tile divides it), else one size, so that ``split_size=N`` alone (N
    other than the default) means splits of N. The control mode has one size."""
    if split_size is None:
        return split_tokens
    if lead_split_size is None:
        lead = DEFAULT_LEAD_SPLIT_SIZE
        usable = split_tokens == DEFAULT_SPLIT_SIZE and lead % block_n == 0
        return lead if usable else split_tokens
    return min(int(lead_split_size), split_tokens)


def _splits(f: _Facts, t: _Tiles, split_size: int | None, lead_split_size: int | None,
            stats: HostStats | None, trusted: bool) -> _Splits:
    """The split sizes and the workspace depth: from checked statistics or shapes, never from
    ``host_lens`` (which may be wrong)."""
    shape_blocks = f.T // t.block_q + f.B
    sizing_kv = stats.max_kv_len if trusted and stats is not None else f.bound
    sizing_blocks = stats.num_q_blocks if trusted and stats is not None else shape_blocks
    split_tokens = _split_tokens(split_size, t.block_n, sizing_kv, sizing_blocks * f.Hkv,
                                 f.num_sms)
    lead_tokens = _lead_tokens(split_size, lead_split_size, split_tokens, t.block_n)
    return _Splits(
        split_tokens=split_tokens, lead_tokens=lead_tokens,
        num_splits=max(1, count_splits(sizing_kv, split_tokens, lead_tokens)),
        max_kv=stats.max_kv_len if stats is not None else f.bound, sizing_kv=sizing_kv,
        num_q_blocks=stats.num_q_blocks if stats is not None else shape_blocks)


def _choose_plan(f: _Facts, t: _Tiles, s: _Splits, stats: HostStats | None,
                 keys_rows_possible: bool) -> str:
    """``plan="auto"``: :func:`~kernels.config.choose_plan` (bit-neutral: the plans give
    identical bits). Where the split plan would run the keys-as-rows tile at a contract the
    Gluon fused kernel does not serve (head dim 256), the split plan: the fused plan's Triton
    tile pads one token's group to 64 rows, and the split plan was faster on every decode
    bucket measured there (reports/h200/tune/tune-d256.md: 64 decodes of 8k, 1830 us fused
    against 1002 us split)."""
    if t.kt_narrow and keys_rows_possible:
        return "split"
    return choose_plan(
        s.num_q_blocks * f.Hkv, f.num_sms, s.max_kv, s.split_tokens,
        longest_tiles=stats.longest_tiles if stats is not None else None,
        total_tiles=stats.total_tiles * f.Hkv if stats is not None else None,
        decode=not prefill_like(f.T, f.G, f.B), gluon=t.wide_gluon,
        keys_rows=keys_rows_possible, num_splits=s.num_splits, lead_tokens=s.lead_tokens)


@dataclass
class _Schedule:
    """The bit-neutral schedule of one plan, filled in step by step."""

    plan: str
    block_m: int
    block_q: int
    num_warps: int
    num_stages: int
    num_splits: int
    value_blocks: int = 1
    tiles_per_step: int = 1
    dependent_merge: bool = False
    slot_order: bool = False
    nested_loop: bool = False
    gluon: bool = False
    keys_rows: bool = False
    scores_ahead: bool = False
    walk_lead: bool = False
    walk_splits: int = 1
    live: int = 0  # split plan: working programs per KV head at one V block
    split_programs: int = 0  # ... counted in splits of split_tokens, over every KV head


def _split_programs(f: _Facts, t: _Tiles, s: _Splits,
                    stats: HostStats | None) -> tuple[int, int, int]:
    """(live, split_programs, row_splits) of the split plan: programs that do work, by the
    longest length known (or the table's bound), at most each block's own splits with
    statistics. ``split_programs`` counts splits of ``split_tokens`` (the keys-as-rows tile's
    chains), over every KV head. Speed only."""
    row_splits = count_splits(s.max_kv, s.split_tokens, s.lead_tokens)
    live = s.num_q_blocks * row_splits
    live_one = s.num_q_blocks * _cdiv(s.max_kv, s.split_tokens)
    if stats is not None:
        total = _cdiv(stats.total_tiles * t.block_n, s.split_tokens)
        live = min(live, total + s.num_q_blocks * (s.split_tokens // s.lead_tokens))
        live_one = min(live_one, total + s.num_q_blocks)
    return live, live_one * f.Hkv, row_splits


def _split_schedule(f: _Facts, t: _Tiles, s: _Splits, stats: HostStats | None, tuning: Tuning,
                    sch: _Schedule) -> None:
    """V column blocks and tiles per step of the split plan."""
    sch.live, sch.split_programs, row_splits = _split_programs(f, t, s, stats)
    grid = sch.live * f.Hkv
    if t.wide_gluon:
        sch.value_blocks = tuning.value_blocks or gluon_value_blocks(grid, f.num_sms, f.D)
    elif t.wide:  # the Triton kernels at 128 keys: a fixed launch
        sch.value_blocks = tuning.value_blocks or 1
        sch.tiles_per_step = tuning.tiles_per_step or 1
    else:
        # With an FP8 cache 4 V blocks at head dim 128 (32 columns) compute wrong values on an
        # H200 (reports/h200/tune-features): V blocks are not shown bit-neutral there, so the
        # rules keep one (a Tuning may ask for other than 32-column blocks, which _tiles
        # refuses).
        sch.value_blocks = tuning.value_blocks or (1 if f.fp8 else value_blocks(
            f.dtype, f.D, grid, f.num_sms, f.sm_major))
        sch.tiles_per_step = tuning.tiles_per_step or tiles_per_step(
            f.dtype, f.D, grid, f.num_sms, f.sm_major, sch.block_m, sch.num_warps,
            sch.value_blocks, several_splits=row_splits > 1)


def _loop_schedule(f: _Facts, t: _Tiles, tuning: Tuning, sch: _Schedule) -> None:
    """The merge's launch, pipeline stages and the fused plan's loop structure."""
    has_pdl = HAS_GDC and f.sm_major is not None and f.sm_major >= 9
    sch.dependent_merge = (sch.plan == "split" and sch.num_splits > 1 and has_pdl
                           and tuning.dependent_merge is not False)
    if tuning.block_m is None and not t.wide:  # an explicit block_m keeps tile_config's stages
        sch.num_stages = decode_stages(f.dtype, f.D, sch.block_m, sch.num_warps, sch.num_stages,
                                       f.sm_major)
    if sch.plan == "fused" and (t.wide or t.wide_gluon):
        # The Gluon kernel walks each split in its own inner loop; Triton's flat loop otherwise.
        sch.nested_loop = t.wide_gluon if tuning.nested_loop is None else tuning.nested_loop
        sch.tiles_per_step = (tuning.tiles_per_step or 1) if sch.nested_loop else 1
    elif sch.plan == "fused":
        nested, rule_step = fused_loop(f.dtype, f.D, sch.block_m, sch.num_warps, f.sm_major)
        sch.nested_loop = nested if tuning.nested_loop is None else tuning.nested_loop
        sch.tiles_per_step = (tuning.tiles_per_step or rule_step) if sch.nested_loop else 1


def _gluon_schedule(f: _Facts, t: _Tiles, tuning: Tuning, sch: _Schedule, auto: bool,
                    inputs: tuple[torch.Tensor, ...]) -> None:
    """Whether the Gluon kernels run the call (the same bits as the Triton kernels)."""
    q, k_cache, v_cache = inputs[:3]
    if t.wide or t.wide_gluon:
        sch.gluon = t.wide_gluon
    elif sch.plan == "fused" and tuning.gluon is not False:
        shape_misfit = None if f.plain and gluon_prefill(
            f.dtype, f.D, sch.block_m, t.block_n, sch.num_warps, f.page_size, sch.nested_loop,
            f.sm_major) else (
            f"the prefill tile on Hopper (fp16/bf16, head_dim 128, block_m 128 on 8 warps, "
            f"block_n 64, nested loop, page_size >= 16, no window, sinks, soft-cap or FP8 "
            f"cache), got {f.dtype}, head_dim {f.D}, block_m {sch.block_m} on "
            f"{sch.num_warps} warps, block_n {t.block_n}, nested {sch.nested_loop}, page_size "
            f"{f.page_size}, compute capability major {f.sm_major}"
            f"{'' if f.plain else ', with a feature'}")
        sch.gluon = _gluon_ready(q, k_cache, v_cache, shape_misfit, required=bool(tuning.gluon))
    elif tuning.gluon and not (t.kt_narrow and sch.plan == "split"):
        chosen = " (plan='auto' chose it for this batch; pass plan='fused')" if auto else ""
        raise ValueError(
            f"tuning: gluon=True needs the 128-key contract for the split plan (Hopper, "
            f"fp16/bf16, head_dim 64 or 128, Triton 3.6; at head_dim 256 the keys-as-rows "
            f"tile) or the fused plan, got plan {sch.plan!r}"
            f"{chosen} at block_n {t.block_n}, {f.dtype}, head_dim {f.D}, compute capability "
            f"major {f.sm_major}")
    sch.num_stages = tuning.num_stages or sch.num_stages
    if sch.gluon:  # the Gluon kernels pipeline through their TMA ring
        from kernels import _gluon  # light: imports no Triton

        sch.num_stages = _gluon.ring_slots(t.block_n, sch.value_blocks)


def _keys_rows_schedule(f: _Facts, s: _Splits, tuning: Tuning, sch: _Schedule,
                        misfit: str | None, auto: bool) -> None:
    """The keys-as-rows decode tile of the split plan, where it can run (``misfit`` None), and
    its schedule: lead splits walked or one program each, V blocks, issue order."""
    if tuning.keys_rows is not False and misfit is None:
        from kernels import _gluon  # light: imports no Triton

        sch.keys_rows = sch.gluon = True  # a Gluon kernel
        sch.tiles_per_step = 1  # one tile per step (the Triton rules' value is not its)
        sch.block_m = _gluon.kt_rows(f.G)
        sch.block_q = sch.block_m // f.G
        sch.walk_lead = s.split_tokens // s.lead_tokens > 1 and (
            kt_walk_lead(sch.live * f.Hkv, s.max_kv <= s.split_tokens, f.num_sms)
            if tuning.walk_lead is None else tuning.walk_lead)
        if sch.walk_lead:  # the workspace and the merge count splits of split_tokens
            sch.num_splits = max(1, _cdiv(s.sizing_kv, s.split_tokens))
            sch.dependent_merge = sch.dependent_merge and sch.num_splits > 1
            sch.walk_splits = kt_walk_splits(sch.split_programs, f.num_sms)
        programs = (_cdiv(sch.split_programs, sch.walk_splits) if sch.walk_lead
                    else sch.live * f.Hkv)
        sch.value_blocks = tuning.value_blocks or kt_value_blocks(programs, f.num_sms, f.D)
        sch.scores_ahead = (sch.value_blocks == 2 and kt_scores_ahead(programs, f.num_sms)
                            if tuning.scores_ahead is None else tuning.scores_ahead)
        sch.num_warps, sch.num_stages = 4, _gluon.kt_ring_slots(sch.value_blocks, sch.block_m,
                                                                f.D)
        kt_misfit = _gluon.kt_schedule_misfit(sch.block_m, f.D, sch.value_blocks,
                                              sch.num_stages, sch.scores_ahead)
        if kt_misfit is not None:  # reachable: scores_ahead=True on one V block at 32 rows
            raise ValueError(f"tuning: the keys-as-rows tile (GQA group {f.G}) needs "
                             f"{kt_misfit}")
    elif tuning.keys_rows:
        chosen = (" (plan='auto' chose another plan; pass plan='split')"
                  if auto and sch.plan != "split" else "")
        raise ValueError(f"tuning: keys_rows=True needs {misfit}{chosen}")
    for name in ("walk_lead", "scores_ahead"):
        if getattr(tuning, name) and not sch.keys_rows:
            raise ValueError(f"tuning: {name}=True needs the keys-as-rows tile "
                             "(LaunchPlan.keys_rows; Tuning(keys_rows=True) names why it is off)")


def _schedule(f: _Facts, t: _Tiles, s: _Splits, stats: HostStats | None, tuning: Tuning,
              plan: str, auto: bool, kt_misfit: str | None,
              inputs: tuple[torch.Tensor, ...]) -> _Schedule:
    """Every bit-neutral setting of the chosen plan, in the order they depend on each other."""
    sch = _Schedule(plan=plan, block_m=t.block_m, block_q=t.block_q,
                    num_warps=tuning.num_warps or t.launch.num_warps,
                    num_stages=t.launch.num_stages, num_splits=s.num_splits)
    if plan == "split":
        _split_schedule(f, t, s, stats, tuning, sch)
    _loop_schedule(f, t, tuning, sch)
    _gluon_schedule(f, t, tuning, sch, auto, inputs)
    misfit = kt_misfit if plan == "split" else _keys_rows_misfit(plan, sch.gluon, f, tuning, t)
    _keys_rows_schedule(f, s, tuning, sch, misfit, auto)
    if tuning.gluon and not sch.gluon:  # head dim 256: only the keys-as-rows tile is Gluon
        raise ValueError(f"tuning: gluon=True needs the keys-as-rows tile at {t.block_n}-key "
                         f"tiles, which this call does not take: {misfit}")
    sch.slot_order = plan == "fused" and (
        slot_order(s.num_q_blocks * f.Hkv, f.num_sms, f.T, f.G, f.B)
        if tuning.slot_order is None else tuning.slot_order)
    return sch


# ------------------------------------------------------------------------------------------------
# plan_attention
# ------------------------------------------------------------------------------------------------

def plan_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    kv_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    split_size: int | None = DEFAULT_SPLIT_SIZE,
    lead_split_size: int | None = None,
    plan: str = "auto",
    validate: bool = True,
    tuning: Tuning | None = None,
    host_lens: tuple[Sequence[int], Sequence[int]] | None = None,
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    logits_soft_cap: float = 0.0,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
) -> LaunchPlan:
    """The :class:`LaunchPlan` :func:`~kernels.unified_attention` would run for these arguments.

    Same arguments, shapes and checks as :func:`~kernels.unified_attention` (without
    ``sm_scale``). With ``validate=True`` (outside CUDA-graph capture) the lengths and page ids
    are read back and checked, and ``plan="auto"`` uses their statistics; otherwise it uses
    ``host_lens`` when given, else shapes alone. Workspace sizes never depend on ``host_lens``.
    A call with a window, sinks, a soft-cap or an FP8 cache runs the Triton kernels.
    """
    return _plan_call(q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table,
                      split_size=split_size, lead_split_size=lead_split_size, plan=plan,
                      validate=validate, tuning=tuning, host_lens=host_lens,
                      window_left=window_left, sinks=sinks, logits_soft_cap=logits_soft_cap,
                      k_scale=k_scale, v_scale=v_scale)[0]


def _plan_call(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
    kv_lens: torch.Tensor, block_table: torch.Tensor, *, split_size: int | None,
    lead_split_size: int | None, plan: str, validate: bool, tuning: Tuning | None,
    host_lens: tuple[Sequence[int], Sequence[int]] | None, window_left: object, sinks: object,
    logits_soft_cap: object, k_scale: object, v_scale: object,
) -> tuple[LaunchPlan, Features]:
    """:func:`plan_attention` and the checked features, for :func:`~kernels.unified_attention`."""
    _check_structure(q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table)
    features = _check_features(q, k_cache, window_left, sinks, logits_soft_cap, k_scale,
                               v_scale)
    if tuning is not None and not isinstance(tuning, Tuning):
        raise ValueError(f"tuning: expected a kernels.Tuning or None, got {tuning!r}")
    given = tuning
    tuning = tuning or Tuning()
    if not features.plain and tuning.gluon:
        raise ValueError("tuning: gluon=True needs a call without window, sinks, soft-cap or "
                         "FP8 cache (the Gluon kernels take none of them), got one with a "
                         "feature")
    inputs = (q, k_cache, v_cache, cu_seqlens_q, kv_lens, block_table)
    f = _facts(q, k_cache, kv_lens, block_table, features)
    block_n, cfg = _contract_block_n(f, tuning)
    _check_options(split_size, lead_split_size, plan, validate, block_n, q)
    if not features.plain:
        tuning = replace(tuning, gluon=False)
    lengths = _read_lengths(f, inputs, validate, host_lens)
    if lengths is not None and lengths.trusted:
        _check_feature_values(features)
    key, entry, table = _tuned(f, q, lengths, split_size, lead_split_size, plan, given,
                               features)
    if entry is not None and key is not None and table is not None:
        try:
            return _plan_steps(f, cfg, Tuning(**entry.tuning), entry.plan, inputs, lengths,
                               split_size, lead_split_size, tuned=key), features
        except ValueError as exc:  # a setting this call cannot take: the rules decide
            warn_unused_entry(table, key, str(exc).splitlines()[0])
    return _plan_steps(f, cfg, tuning, plan, inputs, lengths, split_size,
                       lead_split_size), features


def _tuned(f: _Facts, q: torch.Tensor, lengths: _Lengths | None, split_size: int | None,
           lead_split_size: int | None, plan: str, given: Tuning | None,
           features: Features,
           ) -> tuple[str | None, TunedEntry | None, TunedTable | None]:
    """(bucket, entry, table) of the measured table (:mod:`kernels.tuned`) for this call, or
    Nones: only calls with no ``Tuning``, ``plan="auto"`` and the default split sizes, on a GPU
    (or the interpreter) whose table is in force; a call with features finds only an entry
    measured with them (their :func:`~kernels.tuned.feature_tag` ends its bucket). Host
    only."""
    if (given is not None or plan != "auto" or split_size != DEFAULT_SPLIT_SIZE
            or lead_split_size not in (None, DEFAULT_LEAD_SPLIT_SIZE)):
        return None, None, None
    table = active_table(_device_slug(q.device))
    if table is None:
        return None, None, None
    max_kv = lengths.max_kv if lengths is not None else f.bound
    tag = feature_tag(features.window_left, features.sinks is not None,
                      features.soft_cap != 0.0, features.k_scale is not None)
    key = bucket(f.dtype, f.D, f.G, f.page_size, f.B, f.T, max_kv, tag)
    return key, table.entries.get(key), table


def _plan_steps(f: _Facts, cfg: TileConfig, tuning: Tuning, plan: str,
                inputs: tuple[torch.Tensor, ...], lengths: _Lengths | None,
                split_size: int | None, lead_split_size: int | None,
                tuned: str | None = None) -> LaunchPlan:
    """Steps 3-6 of :func:`plan_attention` for one ``tuning`` and ``plan``."""
    q, k_cache, v_cache = inputs[:3]
    t = _tiles(f, cfg, tuning, q, k_cache, v_cache)
    stats = None if lengths is None else _host_stats(lengths.cu, lengths.kv, t.block_q,
                                                     t.block_n)
    trusted = lengths is not None and lengths.trusted
    s = _splits(f, t, split_size, lead_split_size, stats, trusted)
    # Why the split plan could not run the keys-as-rows tile (None: it could), asked once.
    kt_misfit = (None if tuning.keys_rows is False
                 else _keys_rows_misfit("split", t.wide_gluon or t.kt_narrow, f, tuning, t))
    auto = plan == "auto"
    if auto:
        plan = _choose_plan(f, t, s, stats,
                            keys_rows_possible=tuning.keys_rows is not False and kt_misfit is None)
    sch = _schedule(f, t, s, stats, tuning, plan, auto, kt_misfit, inputs)
    return LaunchPlan(
        plan=sch.plan, block_m=sch.block_m, block_q=sch.block_q, block_n=t.block_n,
        num_warps=sch.num_warps, num_stages=sch.num_stages,
        split_tokens=s.split_tokens, split_tiles=s.split_tokens // t.block_n,
        lead_tokens=s.lead_tokens, lead_tiles=s.lead_tokens // t.block_n,
        num_splits=sch.num_splits, num_slots=f.T // sch.block_q + f.B,
        value_blocks=sch.value_blocks, tiles_per_step=sch.tiles_per_step,
        dependent_merge=sch.dependent_merge, slot_order=sch.slot_order,
        nested_loop=sch.nested_loop, gluon=sch.gluon, keys_rows=sch.keys_rows,
        scores_ahead=sch.scores_ahead, walk_lead=sch.walk_lead, walk_splits=sch.walk_splits,
        max_kv_len=s.max_kv, is_control=split_size is None,
        stats=stats, tuned=tuned)


# ------------------------------------------------------------------------------------------------
# Which kernels can run a call
# ------------------------------------------------------------------------------------------------

def _keys_rows_misfit(plan: str, use_gluon: bool, f: _Facts, tuning: Tuning,
                      t: _Tiles) -> str | None:
    """Why the keys-as-rows decode tile cannot serve this call (None: it can). It needs the
    split plan on the 128-key Gluon kernels (or the 64-key tile at head dim 256:
    :func:`_kt_narrow_misfit`), a GQA group of at most 32 heads, and none of the
    launch overrides it does not take (``block_m``, ``num_warps``, ``value_blocks`` other than
    1, 2 or 4, ``tiles_per_step`` other than 1). With ``tuning.keys_rows`` True any such batch
    qualifies (prompts too: correct, not fast); by default only batches of at most
    ``kt_rows(G) // G`` query tokens per request on average (decode), GQA groups of at most 16
    and no launch override."""
    if plan != "split" or not use_gluon:
        narrow = ("" if t.kt_narrow_misfit is None else
                  f"; at {t.block_n}-key tiles it needs {t.kt_narrow_misfit}")
        return (f"the split plan on the 128-key Gluon kernels or, at head dim 256, its 64-key "
                f"tile, got plan {plan!r}, gluon {use_gluon} (LaunchPlan.gluon; Tuning(gluon="
                f"True) names why it is off){narrow}")
    if f.G > 32:
        return f"a GQA group of at most 32 query heads, got {f.G}"
    given = [f"{name}={getattr(tuning, name)}" for name, free in (
        ("block_m", None), ("num_warps", None), ("tiles_per_step", 1))
        if getattr(tuning, name) not in (None, free)]
    if tuning.value_blocks not in (None, 1, 2, 4):
        given.append(f"value_blocks={tuning.value_blocks}")
    if given:
        return (f"no block_m, num_warps or tiles_per_step override and value_blocks 1, 2 or 4, "
                f"got {given}")
    if tuning.keys_rows:
        return None
    from kernels import _gluon  # light: imports no Triton

    per_request = _gluon.kt_rows(f.G) // f.G
    if f.G > 16 or per_request * f.B < f.T or tuning.num_stages is not None \
            or tuning.value_blocks is not None or tuning.tiles_per_step is not None:
        return (f"(for the default) a GQA group of at most 16, at most {per_request} query "
                f"tokens per request and no launch override")
    return None


def _kt_narrow_misfit(f: _Facts, block_n: int, tuning: Tuning, q: torch.Tensor,
                      k_cache: torch.Tensor, v_cache: torch.Tensor) -> str | None:
    """Why the keys-as-rows tile cannot run a call at a contract the 128-key Gluon kernels do
    not take (None: it can): no feature, the Gluon kernels not refused (``gluon=False``),
    :func:`~kernels.config.kt_tile`'s shapes (64-key tiles at head dim 256), caches TMA can
    read and Triton 3.6's Gluon."""
    from kernels import _gluon  # light: imports no Triton

    if not f.plain:
        return _FEATURE_MISFIT
    if tuning.gluon is False:
        return "the Gluon kernels, got gluon=False"
    if not kt_tile(f.dtype, f.D, block_n, f.page_size, f.sm_major):
        return (f"the keys-as-rows tile's shapes (fp16/bf16, (head_dim, block_n) in "
                f"{_gluon.KT_TILES}, page_size >= 16, compute capability 9), got {f.dtype}, "
                f"({f.D}, {block_n}), page_size {f.page_size}, compute capability major "
                f"{f.sm_major}")
    reasons = [r for r in (_gluon.cache_misfit(k_cache, v_cache), _gluon.unavailable_reason())
               if r is not None]
    return "; ".join(reasons) if reasons else None


def _gluon_installed(dtype: torch.dtype, head_dim: int, sm_major: int | None) -> bool:
    """Whether the Gluon kernels can be built for this (dtype, head_dim, GPU), where that picks
    the contract's tile width (:func:`~kernels.tile_config`): half precision at head dim 128 on
    Hopper (asked, importing them, only there; head dim 64's contract does not depend on it).
    Fixed per deployment."""
    if not wide_tile(dtype, head_dim, WIDE_BLOCK_N, sm_major):
        return False
    from kernels import _gluon  # light: imports no Triton until asked

    return _gluon.available()


def _wide_gluon_misfit(f: _Facts, block_n: int, tuning: Tuning) -> str | None:
    """Why a 128-key launch cannot run the Gluon tile by its shapes and ``Tuning`` (None: it
    can): :func:`~kernels.config.gluon_tile`, no feature, and no override the tile cannot take
    (it runs 128 rows on two warpgroups, one inner loop per split, one tile per step, all V
    columns or 2 or 4 V column blocks in the split plan)."""
    if not f.plain:
        return _FEATURE_MISFIT
    if not gluon_tile(f.dtype, f.D, block_n, f.page_size, f.sm_major):
        return (f"the 128-key Gluon tile's shapes (fp16/bf16, head_dim 64 or 128, 128-key "
                f"tiles, page_size >= 16, compute capability 9), got {f.dtype}, head_dim {f.D}, "
                f"block_n {block_n}, page_size {f.page_size}, compute capability major "
                f"{f.sm_major}")
    if rows_per_block(128, f.G)[0] != 128:
        return (f"a GQA group of at most 128 query heads per KV head for the 128-key Gluon tile "
                f"(128 rows), got {f.G}")
    fixed = {"block_m": (128,), "num_warps": (8,), "num_stages": (3,), "nested_loop": (True,),
             "value_blocks": (1, 2, 4), "tiles_per_step": (1,)}
    bad = [f"{k}={getattr(tuning, k)!r}" for k, v in fixed.items()
           if getattr(tuning, k) not in (None, *v)]
    if bad:
        return ("no Tuning override the 128-key Gluon tile cannot take (block_m 128, num_warps "
                f"8, num_stages 3 (its ring slots with one V block), nested_loop True, "
                f"value_blocks 1, 2 or 4, tiles_per_step 1), got {', '.join(bad)}")
    if tuning.value_blocks is not None and f.D // tuning.value_blocks < _GLUON_MIN_V_COLUMNS:
        return (f"V column blocks of at least {_GLUON_MIN_V_COLUMNS} columns on the 128-key "
                f"Gluon tile (the widths its bit tests cover), got value_blocks="
                f"{tuning.value_blocks} at head_dim {f.D}")
    return None


def _gluon_ready(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 shape_misfit: str | None, required: bool) -> bool:
    """Whether this launch runs the Gluon kernels: the shape rule (``shape_misfit`` None),
    caches TMA can read and Triton 3.6's Gluon. With ``required`` (``Tuning(gluon=True)``) a
    launch that is not eligible raises, naming every reason."""
    from kernels import _gluon  # light: the kernels are imported by _gluon_installed, if at all

    reasons = [] if shape_misfit is None else [shape_misfit]
    misfit = _gluon.cache_misfit(k_cache, v_cache)
    if misfit is not None:
        reasons.append(misfit)
    # Only where the rest allows it (cached after the first import).
    if not reasons or required:
        missing = _gluon.unavailable_reason()
        if missing is not None:
            reasons.append(missing)
    if reasons and required:
        raise ValueError("tuning: gluon=True needs " + "; ".join(reasons))
    return not reasons
