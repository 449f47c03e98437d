"""Argument checks of :func:`kernels.unified_attention` and :func:`kernels.plan_attention`.

Two kinds: structure (types, ranks, dtypes, devices, shapes, options: never a device-to-host
copy, so they run under CUDA-graph capture too) and values (``validate=True``: the index tensors
copied to the host once and every value the kernels use checked). Every failure is a
``ValueError`` naming the argument, the expected and the actual value.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels._device import _interpreting, _is_pow2
from kernels.config import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS

__all__: list[str] = []

_LOG2E = 1.4426950408889634
# sm_scale * log2(e) reaches the kernels as a float32 scalar: it must be a normal float32.
_FP32_MIN_NORMAL = 1.1754943508222875e-38
_FP32_MAX = 3.4028234663852886e38
PLANS: tuple[str, ...] = ("auto", "fused", "split")
#: The FP8 KV-cache dtype the kernels read (with float16 or bfloat16 queries).
FP8_DTYPE = torch.float8_e4m3fn
#: Soft-caps the kernels take: the formula's absolute error grows with the cap (a few float32
#: roundoffs of it), and a tiny cap overflows ``sm_scale / cap``.
_SOFT_CAP_RANGE = (1e-3, 1e4)


@dataclass(frozen=True)
class Features:
    """The optional attention features of one call, checked and normalized: ``window_left``
    (-1: none), ``sinks`` (``[Hq]`` float32 or None), ``soft_cap`` (0.0: none), and for an FP8
    cache per-KV-head ``k_scale`` / ``v_scale`` (``[Hkv]`` float32 on the device, or None)."""

    window_left: int = -1
    sinks: torch.Tensor | None = None
    soft_cap: float = 0.0
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @property
    def plain(self) -> bool:
        """No feature: the Gluon kernels may run the call."""
        return (self.window_left < 0 and self.sinks is None and self.soft_cap == 0.0
                and self.k_scale is None)


def _check_tensor(name: str, t: object, ndim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dims, got {t.ndim} (shape {tuple(t.shape)})")
    return t


def _check_types(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 index_tensors: dict[str, torch.Tensor]) -> None:
    """Dtypes and devices (no device-to-host copy)."""
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q: expected dtype in {SUPPORTED_DTYPES}, got {q.dtype}")
    fp8 = q.dtype in (torch.float16, torch.bfloat16) and k_cache.dtype == FP8_DTYPE
    if fp8 and q.device.type == "cuda" and not _interpreting():
        major, minor = torch.cuda.get_device_capability(q.device)
        if (major, minor) < (8, 9):
            raise ValueError(f"k_cache: expected a GPU of compute capability 8.9 or more for an "
                             f"FP8 cache (Triton's float8_e4m3 loads), got {major}.{minor} on "
                             f"{q.device}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != (FP8_DTYPE if fp8 else q.dtype):
            also = (f" or {FP8_DTYPE} for both caches" if q.dtype != torch.float32 else "")
            raise ValueError(f"{name}: expected dtype {q.dtype} (same as q){also}, got "
                             f"{t.dtype}")
    for name, t in index_tensors.items():
        if t.dtype != torch.int32:
            raise ValueError(f"{name}: expected dtype torch.int32, got {t.dtype}")
    if q.device.type not in ("cuda", "cpu"):
        raise ValueError(f"q: expected a CUDA tensor (or CPU under TRITON_INTERPRET=1), got "
                         f"device {q.device}")
    if q.device.type == "cpu" and not _interpreting():
        raise ValueError(
            "q: expected a CUDA tensor, or a CPU tensor with the Triton interpreter on (set "
            f"TRITON_INTERPRET=1 before triton is first imported), got device {q.device} with "
            "TRITON_INTERPRET unset")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), *index_tensors.items()):
        if t.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (same as q), got {t.device}")


def _check_shapes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  cu_seqlens_q: torch.Tensor, kv_lens: torch.Tensor,
                  block_table: torch.Tensor) -> None:
    """Shapes and strides (no device-to-host copy)."""
    T, Hq, D = q.shape
    if D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"q: expected head_dim in {SUPPORTED_HEAD_DIMS}, got {D}")
    num_pages, page_size, Hkv, Dk = k_cache.shape
    if Dk != D:
        raise ValueError(f"k_cache: expected head_dim {D} (same as q), got {Dk}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"v_cache: expected shape {tuple(k_cache.shape)} (same as k_cache), "
                         f"got {tuple(v_cache.shape)}")
    if Hq == 0:
        raise ValueError(f"q: expected num_q_heads >= 1, got shape {tuple(q.shape)}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"k_cache: expected num_kv_heads dividing num_q_heads={Hq}, got {Hkv}")
    if not _is_pow2(page_size):
        raise ValueError(f"k_cache: expected page_size a power of two >= 1, got {page_size}")
    B = kv_lens.shape[0]
    if cu_seqlens_q.shape[0] != B + 1:
        raise ValueError(f"cu_seqlens_q: expected shape ({B + 1},) (kv_lens has {B} requests), "
                         f"got {tuple(cu_seqlens_q.shape)}")
    if block_table.shape[0] != B:
        raise ValueError(
            f"block_table: expected {B} rows (one per request), got {block_table.shape[0]}")
    # Consequences of the shapes alone when there are query tokens: some request has q_len >= 1,
    # hence kv_len >= 1, a block-table column and a page.
    if T > 0 and B == 0:
        raise ValueError(f"kv_lens: expected at least one request for T={T} query tokens, got 0")
    if T > 0 and (num_pages == 0 or block_table.shape[1] == 0):
        raise ValueError(
            f"k_cache, block_table: expected at least one page and one block-table column for "
            f"T={T} query tokens, got {num_pages} pages and {block_table.shape[1]} columns")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("block_table", block_table)):
        if t.numel() > 0 and t.stride(-1) != 1:
            raise ValueError(
                f"{name}: expected a contiguous last dim (stride 1), got stride {t.stride(-1)}")


def _check_structure(q: object, k_cache: object, v_cache: object, cu_seqlens_q: object,
                     kv_lens: object, block_table: object) -> None:
    """Every check that needs no device-to-host copy: types, ranks, dtypes, devices, shapes."""
    q = _check_tensor("q", q, 3)
    k_cache = _check_tensor("k_cache", k_cache, 4)
    v_cache = _check_tensor("v_cache", v_cache, 4)
    index = {"cu_seqlens_q": _check_tensor("cu_seqlens_q", cu_seqlens_q, 1),
             "kv_lens": _check_tensor("kv_lens", kv_lens, 1),
             "block_table": _check_tensor("block_table", block_table, 2)}
    _check_types(q, k_cache, v_cache, index)
    _check_shapes(q, k_cache, v_cache, index["cu_seqlens_q"], index["kv_lens"],
                  index["block_table"])


def _check_sm_scale(sm_scale: object) -> float | None:
    """The softmax scale as a float (None stays None): a finite positive real (not bool) whose
    ``sm_scale * log2(e)`` is a normal float32, the scalar the kernels receive."""
    if sm_scale is None:
        return None
    expected = (f"a finite positive real with sm_scale * log2(e) in float32's normal range "
                f"[{_FP32_MIN_NORMAL:.3g}, {_FP32_MAX:.3g}], or None")
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
        raise ValueError(f"sm_scale: expected {expected}, got {sm_scale!r} "
                         f"({type(sm_scale).__name__})")
    value = float(sm_scale)
    if not (math.isfinite(value) and _FP32_MIN_NORMAL <= value * _LOG2E <= _FP32_MAX):
        raise ValueError(f"sm_scale: expected {expected}, got {sm_scale!r}")
    return value


def _check_options(split_size: object, lead_split_size: object, plan: object, validate: object,
                   block_n: int, q: torch.Tensor) -> None:
    tile = (f"BLOCK_N={block_n} KV tokens (dtype {q.dtype}, head_dim {q.shape[2]} on "
            f"{q.device}: kernels.tile_config)")
    if split_size is not None and not (
            isinstance(split_size, int) and not isinstance(split_size, bool)
            and split_size > 0 and split_size % block_n == 0):
        raise ValueError(
            f"split_size: expected a positive multiple of {tile} or None, got {split_size!r}")
    if lead_split_size is not None and not (
            isinstance(lead_split_size, int) and not isinstance(lead_split_size, bool)
            and lead_split_size > 0 and lead_split_size % block_n == 0):
        raise ValueError(
            f"lead_split_size: expected a positive multiple of {tile} or None, got "
            f"{lead_split_size!r}")
    if (isinstance(split_size, int) and lead_split_size is not None
            and lead_split_size < split_size and split_size % lead_split_size != 0):
        raise ValueError(
            f"lead_split_size: expected a divisor of split_size={split_size}, or at least it "
            f"(one split size), got {lead_split_size!r}")
    if not isinstance(plan, str) or plan not in PLANS:
        raise ValueError(f"plan: expected one of {PLANS}, got {plan!r}")
    if not isinstance(validate, bool):
        raise ValueError(f"validate: expected a bool, got {validate!r}")


def _check_lengths(cu: torch.Tensor, kv: torch.Tensor, T: int) -> None:
    """Values of cu_seqlens_q and kv_lens (host int64 copies)."""
    q_lens = cu[1:] - cu[:-1]
    if int(cu[0]) != 0:
        raise ValueError(f"cu_seqlens_q: expected cu_seqlens_q[0] == 0, got {int(cu[0])}")
    if bool((q_lens < 0).any()):
        b = int(torch.nonzero(q_lens < 0)[0])
        raise ValueError(
            f"cu_seqlens_q: expected non-decreasing values, got cu_seqlens_q[{b}]="
            f"{int(cu[b])} > cu_seqlens_q[{b + 1}]={int(cu[b + 1])}")
    if int(cu[-1]) != T:
        raise ValueError(f"cu_seqlens_q: expected cu_seqlens_q[-1] == T == {T}, got {int(cu[-1])}")
    if bool((kv < 0).any()):
        b = int(torch.nonzero(kv < 0)[0])
        raise ValueError(f"kv_lens: expected kv_lens >= 0, got kv_lens[{b}]={int(kv[b])}")
    if bool((kv < q_lens).any()):
        b = int(torch.nonzero(kv < q_lens)[0])
        raise ValueError(
            f"kv_lens: expected kv_lens[b] >= q_len[b], got kv_lens[{b}]={int(kv[b])} < "
            f"q_len[{b}]={int(q_lens[b])}")


def _check_pages(block_table: torch.Tensor, kv: torch.Tensor, num_pages: int,
                 page_size: int) -> None:
    """Block-table width and the page ids of every needed page (columns past
    ``ceil(kv_lens[b] / page_size)`` are never read, hence never checked)."""
    pages = (kv + page_size - 1) // page_size
    max_pages = block_table.shape[1]
    if bool((pages > max_pages).any()):
        b = int(torch.nonzero(pages > max_pages)[0])
        raise ValueError(
            f"block_table: expected at least ceil(kv_lens[{b}] / page_size) = {int(pages[b])}"
            f" columns, got {max_pages}")
    if kv.shape[0] == 0 or max_pages == 0:
        return
    bt = block_table.cpu().to(torch.int64)
    needed = torch.arange(max_pages)[None, :] < pages[:, None]
    bad = needed & ((bt < 0) | (bt >= num_pages))
    if bool(bad.any()):
        b, c = (int(x) for x in torch.nonzero(bad)[0])
        raise ValueError(
            f"block_table: expected page ids in [0, {num_pages}) for needed pages, got "
            f"block_table[{b}, {c}]={int(bt[b, c])}")



def _check_host_lens(host_lens: object, B: int, T: int) -> tuple[Sequence[int], Sequence[int]]:
    """The caller's host copies ``(q_lens, kv_lens)``, checked for shape and sign only: they only
    steer the plan (bit-neutral); memory sizes never come from them."""
    if not isinstance(host_lens, (tuple, list)) or len(host_lens) != 2:
        raise ValueError(f"host_lens: expected a pair (q_lens, kv_lens) of int sequences or "
                         f"None, got {type(host_lens).__name__}")
    q_lens, kv_lens = host_lens
    for name, xs in (("q_lens", q_lens), ("kv_lens", kv_lens)):
        if not isinstance(xs, Sequence) or isinstance(xs, str):
            raise ValueError(f"host_lens: expected {name} as a list or tuple of host ints (e.g. "
                             f"tensor.tolist()), got {type(xs).__name__}")
        if len(xs) != B:
            raise ValueError(f"host_lens: expected {B} {name} (one per request), got {len(xs)}")
        bad = [x for x in xs if isinstance(x, bool) or not isinstance(x, numbers.Integral)
               or not 0 <= int(x) < 2**31]
        if bad:
            raise ValueError(f"host_lens: expected ints in [0, 2**31) in {name}, got "
                             f"{bad[0]!r}")
    if sum(q_lens) != T:
        raise ValueError(f"host_lens: expected q_lens to sum to q.shape[0]={T}, got "
                         f"{sum(q_lens)}")
    return q_lens, kv_lens


def _read_and_check_values(q: torch.Tensor, k_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           kv_lens: torch.Tensor,
                           block_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``validate=True``: copy the index tensors to the host (one sync), check every value the
    kernels use; return the host int64 copies ``(cu_seqlens_q, kv_lens)``."""
    cu = cu_seqlens_q.cpu().to(torch.int64)
    kv = kv_lens.cpu().to(torch.int64)
    _check_lengths(cu, kv, q.shape[0])
    _check_pages(block_table, kv, k_cache.shape[0], k_cache.shape[1])
    return cu, kv


def _check_scale(name: str, value: object, fp8: bool, Hkv: int,
                 device: torch.device) -> torch.Tensor | None:
    """An FP8 cache's dequantization scale as a ``[Hkv]`` float32 tensor on ``device``: a
    positive finite real or a one-element float32 tensor (per tensor), or a float32 tensor of
    ``Hkv`` values (per KV head; tensor values are checked where ``validate`` reads back).
    Without an FP8 cache only ``None`` or 1.0 (no scale)."""
    if value is None:
        return torch.ones(Hkv, dtype=torch.float32, device=device) if fp8 else None
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.shape != (Hkv,) \
            and value.dtype == torch.float32 and value.device == device:
        value = value.reshape(1).expand(Hkv)  # one scale for every KV head, as a tensor
    if isinstance(value, torch.Tensor):
        if not fp8:
            raise ValueError(f"{name}: expected None for a {value.dtype} cache (scales dequantize "
                             f"an FP8 cache), got a tensor")
        if value.dtype != torch.float32 or value.shape != (Hkv,) or value.device != device:
            raise ValueError(f"{name}: expected a float32 tensor of shape ({Hkv},) (one per KV "
                             f"head) on {device}, got dtype {value.dtype}, shape "
                             f"{tuple(value.shape)}, device {value.device}")
        return value.contiguous()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not (math.isfinite(float(value)) and float(value) > 0):
        raise ValueError(f"{name}: expected a positive finite real, a float32 tensor of shape "
                         f"({Hkv},) or None, got {value!r}")
    if not fp8:
        if float(value) != 1.0:
            raise ValueError(f"{name}: expected None or 1.0 for a non-FP8 cache (scales "
                             f"dequantize an FP8 cache), got {value!r}")
        return None
    return torch.full((Hkv,), float(value), dtype=torch.float32, device=device)


def _check_features(q: torch.Tensor, k_cache: torch.Tensor, window_left: object, sinks: object,
                    logits_soft_cap: object, k_scale: object, v_scale: object) -> Features:
    """The features' types, shapes and ranges (no device-to-host copy; see
    :func:`_check_feature_values` for the values of tensors)."""
    Hq, Hkv = q.shape[1], k_cache.shape[2]
    if isinstance(window_left, bool) or not isinstance(window_left, numbers.Integral) \
            or not -1 <= int(window_left) < 2**31:
        raise ValueError(f"window_left: expected an int >= -1 (-1: no window; a query at "
                         f"position p sees keys [p - window_left, p]), got {window_left!r}")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor):
            raise ValueError(f"sinks: expected a float32 tensor of shape ({Hq},) or None, got "
                             f"{type(sinks).__name__}")
        if sinks.dtype != torch.float32 or sinks.shape != (Hq,) or sinks.device != q.device:
            raise ValueError(f"sinks: expected a float32 tensor of shape ({Hq},) (one logit per "
                             f"query head) on {q.device}, got dtype {sinks.dtype}, shape "
                             f"{tuple(sinks.shape)}, device {sinks.device}")
        sinks = sinks.contiguous()
    cap = 0.0 if logits_soft_cap is None else logits_soft_cap
    if isinstance(cap, bool) or not isinstance(cap, numbers.Real) \
            or not (math.isfinite(float(cap)) and float(cap) >= 0):
        raise ValueError(f"logits_soft_cap: expected a finite real >= 0 (0: none), got "
                         f"{logits_soft_cap!r}")
    if float(cap) > 0 and not _SOFT_CAP_RANGE[0] <= float(cap) <= _SOFT_CAP_RANGE[1]:
        raise ValueError(f"logits_soft_cap: expected 0 (none) or a cap in "
                         f"[{_SOFT_CAP_RANGE[0]:g}, {_SOFT_CAP_RANGE[1]:g}] (tanh's argument "
                         f"and the cap's rounding stay float32-exact enough there), got "
                         f"{logits_soft_cap!r}")
    fp8 = k_cache.dtype == FP8_DTYPE
    return Features(window_left=int(window_left), sinks=sinks, soft_cap=float(cap),
                    k_scale=_check_scale("k_scale", k_scale, fp8, Hkv, q.device),
                    v_scale=_check_scale("v_scale", v_scale, fp8, Hkv, q.device))


def _check_feature_values(features: Features) -> None:
    """``validate=True``: the values of the feature tensors (one sync each): finite sinks,
    positive finite scales."""
    if features.sinks is not None and not bool(torch.isfinite(features.sinks).all()):
        i = int(torch.nonzero(~torch.isfinite(features.sinks))[0])
        raise ValueError(f"sinks: expected finite values, got sinks[{i}]="
                         f"{float(features.sinks[i])}")
    for name, t in (("k_scale", features.k_scale), ("v_scale", features.v_scale)):
        if t is not None:
            bad = ~(torch.isfinite(t) & (t > 0))
            if bool(bad.any()):
                i = int(torch.nonzero(bad)[0])
                raise ValueError(f"{name}: expected positive finite values, got {name}[{i}]="
                                 f"{float(t[i])}")
