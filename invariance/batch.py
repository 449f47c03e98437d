"""The tensors one attention call receives and returns (ARCHITECTURE.md, "Layers"; the
contract is in the class docstring).

``AttentionBatch`` is what a backend is called with; ``AttentionResult`` is what it returns.
Both validate themselves and raise ``ValueError`` naming the field, the expected and the actual
value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from invariance.workload import DTYPES

__all__ = ["AttentionBatch", "AttentionResult", "as_result", "dequantize", "require_features"]

_FLOAT_DTYPES = tuple(DTYPES.values())
#: Cache dtypes other than q's and the q dtypes they may go with.
_FP8_DTYPES = (torch.float8_e4m3fn,)
_FP8_Q_DTYPES = (torch.float16, torch.bfloat16)


def _fail(field: str, expected: str, actual: object) -> ValueError:
    return ValueError(f"{field}: expected {expected}, got {actual}")


def _describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


@dataclass
class AttentionBatch:
    """One attention call over a paged KV cache: mixed prefill and decode requests.

    Shapes (``B`` requests, ``T`` query tokens in total, requests concatenated in order):

    - ``q``: ``[T, Hq, D]``, float16 / bfloat16 / float32.
    - ``k_cache``, ``v_cache``: ``[num_pages, page_size, Hkv, D]``, same dtype as ``q``.
    - ``cu_seqlens_q``: ``[B + 1]`` int32, ``cu_seqlens_q[0] == 0``, non-decreasing, ``[B] == T``.
    - ``kv_lens``: ``[B]`` int32, ``kv_lens[b] >= q_len[b]``. Query token ``i`` of request ``b``
      sits at absolute position ``kv_lens[b] - q_len[b] + i`` and attends to ``[0, pos]``.
    - ``block_table``: ``[B, max_pages]`` int32, logical page -> physical page; only the first
      ``ceil(kv_lens[b] / page_size)`` entries of row ``b`` are meaningful.
    - ``sm_scale``: softmax scale applied to ``q · k``.

    ``request_ids`` (optional, length ``B``) names the requests for diagnostics.

    Optional features (defaults: off; the float64 reference, ``backends/reference.py``,
    implements each exactly as written here; a backend that does not take one must refuse a
    batch that uses it, see :func:`require_features`):

    - ``window_left``: an int, ``-1`` (no window) or ``>= 0``: the query at position ``p`` sees
      keys ``[max(0, p - window_left), p]`` (``0``: only itself; its own key is always
      visible, so no row is fully masked).
    - ``sinks``: ``[Hq]`` float32 finite logits, one per query head, in the units of the
      scores: ``out = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sink - m))`` with
      ``m`` the max of the row's scores and the sink. The LSE includes the sink: ``lse =
      log(sum_j exp(s_j) + exp(sink))``, the log of the normalizer actually used (so ``out =
      sum_j exp(s_j - lse) v_j``).
    - ``logits_soft_cap``: ``0.0`` (off) or a finite float ``> 0``: scores become ``cap *
      tanh(s / cap)``, ``s = sm_scale * q · k``, before the softmax.
    - FP8 KV: ``k_cache`` / ``v_cache`` of dtype ``float8_e4m3fn`` (q float16 or bfloat16; the
      output in q's dtype) with ``k_scale`` / ``v_scale``: a float (per tensor) or a float32
      tensor ``[Hkv]`` (per KV head), finite and ``> 0``; ``None`` means 1.0. The attention
      uses ``float(k_fp8) * k_scale`` (and the same for V). With a cache in q's dtype a scale
      other than ``None`` / ``1.0`` is an error.
    """

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cu_seqlens_q: torch.Tensor
    kv_lens: torch.Tensor
    block_table: torch.Tensor
    sm_scale: float
    request_ids: tuple[int, ...] | None = None
    window_left: int = -1
    sinks: torch.Tensor | None = None
    logits_soft_cap: float = 0.0
    k_scale: float | torch.Tensor | None = None
    v_scale: float | torch.Tensor | None = None

    def __post_init__(self) -> None:
        # Cheap type checks at construction; values are checked by validate().
        for name in ("q", "k_cache", "v_cache", "cu_seqlens_q", "kv_lens", "block_table"):
            value = getattr(self, name)
            if not isinstance(value, torch.Tensor):
                raise _fail(name, "a torch.Tensor", type(value).__name__)

    # --- features --------------------------------------------------------------------------
    @property
    def kv_fp8(self) -> bool:
        """Whether the K/V cache is FP8 (``float8_e4m3fn``)."""
        return self.k_cache.dtype in _FP8_DTYPES

    def features_used(self) -> frozenset[str]:
        """The features this batch uses, by their capability names
        (``invariance.features.FEATURE_NAMES``): ``window``, ``sinks``, ``softcap``, ``fp8_kv``
        (per-tensor scales) or ``fp8_kv_head`` (a scale tensor)."""
        used = set()
        if isinstance(self.window_left, int) and self.window_left >= 0:
            used.add("window")
        if self.sinks is not None:
            used.add("sinks")
        if self.logits_soft_cap:
            used.add("softcap")
        if self.kv_fp8:
            per_head = any(isinstance(s, torch.Tensor) for s in (self.k_scale, self.v_scale))
            used.add("fp8_kv_head" if per_head else "fp8_kv")
        return frozenset(used)

    # --- derived sizes -------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """``B``, the number of requests."""
        return int(self.kv_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        """``T``, the number of query tokens."""
        return int(self.q.shape[0])

    @property
    def num_q_heads(self) -> int:
        return int(self.q.shape[1])

    @property
    def num_kv_heads(self) -> int:
        return int(self.k_cache.shape[2])

    @property
    def head_dim(self) -> int:
        return int(self.q.shape[2])

    @property
    def page_size(self) -> int:
        return int(self.k_cache.shape[1])

    @property
    def dtype(self) -> torch.dtype:
        return self.q.dtype

    @property
    def device(self) -> torch.device:
        return self.q.device

    def q_lens(self) -> list[int]:
        """Query tokens per request (a host copy of ``diff(cu_seqlens_q)``)."""
        cu = self.cu_seqlens_q.tolist()
        return [cu[i + 1] - cu[i] for i in range(len(cu) - 1)]

    # --- validation ----------------------------------------------------------------------
    def validate(self) -> AttentionBatch:
        """Check every field against the contract; return ``self`` or raise ``ValueError``.
        In order: the tensors, their dtypes, shapes and devices, the scalars and features,
        then the values of the small index tensors (host copies)."""
        self._validate_tensors()
        T, Hq, _ = self.q.shape
        Hkv, page_size = self.k_cache.shape[2], self.k_cache.shape[1]
        self._validate_index_tensors()
        if (isinstance(self.sm_scale, bool) or not isinstance(self.sm_scale, (int, float))
                or not math.isfinite(self.sm_scale) or not self.sm_scale > 0):
            raise _fail("sm_scale", "a finite positive float", repr(self.sm_scale))
        self._validate_features(Hq, Hkv)
        self._validate_request_ids()
        self._validate_values(T, page_size)
        return self

    _TENSORS = ("q", "k_cache", "v_cache", "cu_seqlens_q", "kv_lens", "block_table")

    def _validate_tensors(self) -> None:
        """q, k_cache and v_cache: tensors holding data, ranks, dtypes, devices, shapes."""
        for name in self._TENSORS:
            t = getattr(self, name)
            if isinstance(t, torch.Tensor) and t.device.type == "meta":
                raise _fail(f"{name}.device", "a device holding data (cpu or cuda)", t.device)
        for name in self._TENSORS:
            if not isinstance(getattr(self, name), torch.Tensor):
                raise _fail(name, "a torch.Tensor", type(getattr(self, name)).__name__)
        q, k, v = self.q, self.k_cache, self.v_cache
        if q.dim() != 3:
            raise _fail("q", "3 dims [T, Hq, D]", _describe(q))
        if q.dtype not in _FLOAT_DTYPES:
            raise _fail("q.dtype", "float16, bfloat16 or float32", q.dtype)
        for name, t in (("k_cache", k), ("v_cache", v)):
            if t.dim() != 4:
                raise _fail(name, "4 dims [num_pages, page_size, Hkv, D]", _describe(t))
            if t.dtype != q.dtype and not (t.dtype in _FP8_DTYPES and q.dtype in _FP8_Q_DTYPES):
                expected = (f"{q.dtype} (q's dtype) or torch.float8_e4m3fn"
                            if q.dtype in _FP8_Q_DTYPES else f"{q.dtype} (q's dtype; an FP8 "
                            "cache needs q in float16 or bfloat16)")
                raise _fail(f"{name}.dtype", expected, t.dtype)
            if t.device != q.device:
                raise _fail(f"{name}.device", f"{q.device} (q's device)", t.device)
        if v.dtype != k.dtype:
            raise _fail("v_cache.dtype", f"{k.dtype} (k_cache's dtype)", v.dtype)
        if k.shape != v.shape:
            raise _fail("v_cache", f"shape {tuple(k.shape)} (k_cache's shape)", tuple(v.shape))
        _, Hq, D = q.shape
        if Hq == 0 or D == 0:
            raise _fail("q.shape", "[T, Hq >= 1, D >= 1]", list(q.shape))
        _, page_size, Hkv, Dk = k.shape
        if Dk != D:
            raise _fail("k_cache.shape[3]", f"head_dim {D} (q.shape[2])", Dk)
        if Hkv == 0 or Hq % Hkv:
            raise _fail("q.shape[1]", f"a multiple of Hkv={Hkv} (GQA)", Hq)
        if page_size < 1:
            raise _fail("k_cache.shape[1] (page_size)", ">= 1", page_size)

    def _validate_index_tensors(self) -> None:
        """cu_seqlens_q, kv_lens, block_table: ranks, int32, q's device, B consistent."""
        for name, t, ndim in (("cu_seqlens_q", self.cu_seqlens_q, 1), ("kv_lens",
                              self.kv_lens, 1), ("block_table", self.block_table, 2)):
            if t.dim() != ndim:
                raise _fail(name, f"{ndim} dim(s)", _describe(t))
            if t.dtype != torch.int32:
                raise _fail(f"{name}.dtype", "torch.int32", t.dtype)
            if t.device != self.q.device:
                raise _fail(f"{name}.device", f"{self.q.device} (q's device)", t.device)
        B = self.kv_lens.shape[0]
        if self.cu_seqlens_q.shape[0] != B + 1:
            raise _fail("cu_seqlens_q.shape", f"[{B + 1}] (len(kv_lens) + 1)",
                        list(self.cu_seqlens_q.shape))
        if self.block_table.shape[0] != B:
            raise _fail("block_table.shape[0]", f"{B} (len(kv_lens))", self.block_table.shape[0])

    def _validate_request_ids(self) -> None:
        B = self.kv_lens.shape[0]
        if self.request_ids is not None:
            if not isinstance(self.request_ids, (tuple, list)) or len(self.request_ids) != B:
                raise _fail("request_ids", f"{B} ids (one per request)", repr(self.request_ids))
            odd = [r for r in self.request_ids if isinstance(r, bool) or not isinstance(r, int)]
            if odd:
                raise _fail("request_ids", "ints", repr(odd[0]))

    def _validate_values(self, T: int, page_size: int) -> None:
        """Offsets, lengths and every needed page id (host copies of the index tensors)."""
        B = self.kv_lens.shape[0]
        cu = self.cu_seqlens_q.tolist()
        if cu[0] != 0:
            raise _fail("cu_seqlens_q[0]", "0", cu[0])
        if cu[-1] != T:
            raise _fail("cu_seqlens_q[-1]", f"{T} (q.shape[0])", cu[-1])
        for b in range(B):
            if cu[b + 1] < cu[b]:
                raise _fail(f"cu_seqlens_q[{b + 1}]", f">= cu_seqlens_q[{b}]={cu[b]}", cu[b + 1])
        kv_lens = self.kv_lens.tolist()
        max_pages = self.block_table.shape[1]
        num_pages = self.k_cache.shape[0]
        for b in range(B):
            q_len = cu[b + 1] - cu[b]
            if kv_lens[b] < q_len:
                raise _fail(f"kv_lens[{b}]", f">= q_len={q_len}", kv_lens[b])
            needed = -(-kv_lens[b] // page_size)
            if needed > max_pages:
                raise _fail(f"kv_lens[{b}]", f"<= max_pages * page_size = "
                            f"{max_pages * page_size}", kv_lens[b])
            if needed:
                row = self.block_table[b, :needed]
                lo, hi = int(row.min()), int(row.max())
                if lo < 0 or hi >= num_pages:
                    bad = lo if lo < 0 else hi
                    raise _fail(f"block_table[{b}, :{needed}]",
                                f"page ids in [0, {num_pages})", bad)

    def _validate_features(self, Hq: int, Hkv: int) -> None:
        w = self.window_left
        if isinstance(w, bool) or not isinstance(w, int) or w < -1:
            raise _fail("window_left", "an int >= 0, or -1 (no window)", repr(w))
        cap = self.logits_soft_cap
        if (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap)
                or cap < 0):
            raise _fail("logits_soft_cap", "0.0 (off) or a finite float > 0", repr(cap))
        if self.sinks is not None:
            t = self.sinks
            if not isinstance(t, torch.Tensor):
                raise _fail("sinks", "None or a float32 tensor [Hq]", type(t).__name__)
            if tuple(t.shape) != (Hq,) or t.dtype != torch.float32 or t.device != self.q.device:
                raise _fail("sinks", f"a float32 tensor of shape [{Hq}] (Hq) on {self.q.device}",
                            _describe(t))
            if not bool(torch.isfinite(t).all()):
                raise _fail("sinks", "finite logits", t.tolist())
        for name in ("k_scale", "v_scale"):
            scale = getattr(self, name)
            if scale is None:
                continue
            if not self.kv_fp8:
                if isinstance(scale, (int, float)) and not isinstance(scale, bool) and \
                        scale == 1.0:
                    continue
                raise _fail(name, f"None or 1.0 for a {self.k_cache.dtype} cache (scales "
                            "dequantize an FP8 cache)", scale if not isinstance(
                                scale, torch.Tensor) else _describe(scale))
            if isinstance(scale, torch.Tensor):
                if (tuple(scale.shape) != (Hkv,) or scale.dtype != torch.float32
                        or scale.device != self.q.device):
                    raise _fail(name, f"a float, or a float32 tensor of shape [{Hkv}] (Hkv) on "
                                f"{self.q.device}", _describe(scale))
                if not bool((torch.isfinite(scale) & (scale > 0)).all()):
                    raise _fail(name, "finite scales > 0", scale.tolist())
            elif (isinstance(scale, bool) or not isinstance(scale, (int, float))
                  or not math.isfinite(scale) or not scale > 0):
                raise _fail(name, "None, a finite float > 0 or a float32 tensor [Hkv]",
                            repr(scale))


def dequantize(x: torch.Tensor, scale: float | torch.Tensor | None) -> torch.Tensor:
    """K or V ``[..., Hkv, D]`` as the attention sees it, in float64: ``float(x) * scale``
    (``scale`` a float, a ``[Hkv]`` tensor or ``None`` = 1.0; exact in float64 for FP8 values
    and float32 scales)."""
    x64 = x.to(torch.float64)
    if scale is None:
        return x64
    if isinstance(scale, torch.Tensor):
        return x64 * scale.to(device=x.device, dtype=torch.float64)[:, None]
    return x64 * float(scale)


def require_features(batch: AttentionBatch, supported: frozenset[str] | set[str],
                     backend: str, conflicts: Sequence[frozenset[str]] = ()) -> None:
    """Raise ``ValueError`` when ``batch`` uses a feature outside ``supported``, or all of one
    of the sets ``conflicts``: a backend that does not take a feature (or a combination) must
    refuse it rather than compute something else."""
    used = batch.features_used()
    missing = sorted(used - set(supported))
    if missing:
        raise ValueError(f"backend {backend}: expected a batch without {', '.join(missing)} "
                         f"(it takes {', '.join(sorted(supported)) or 'no features'}), got "
                         f"one using {', '.join(missing)}")
    for conflict in conflicts:
        if conflict <= used:
            raise ValueError(f"backend {backend}: expected a batch without "
                             f"{' and '.join(sorted(conflict))} together, got one using both")


def _check_result(out: torch.Tensor, lse: torch.Tensor, batch: AttentionBatch) -> None:
    T, Hq, D = batch.num_tokens, batch.num_q_heads, batch.head_dim
    if not isinstance(out, torch.Tensor) or not isinstance(lse, torch.Tensor):
        raise TypeError(
            f"backend result: expected (out, lse) tensors, got ({type(out).__name__}, "
            f"{type(lse).__name__})"
        )
    if tuple(out.shape) != (T, Hq, D):
        raise _fail("result.out.shape", f"[{T}, {Hq}, {D}]", list(out.shape))
    if out.dtype != batch.dtype:
        raise _fail("result.out.dtype", f"{batch.dtype} (q's dtype)", out.dtype)
    if tuple(lse.shape) != (T, Hq):
        raise _fail("result.lse.shape", f"[{T}, {Hq}]", list(lse.shape))
    if lse.dtype != torch.float32:
        raise _fail("result.lse.dtype", "torch.float32", lse.dtype)
    if out.device != batch.device or lse.device != batch.device:
        raise _fail("result device", f"{batch.device}", f"out on {out.device}, lse on {lse.device}")


@dataclass
class AttentionResult:
    """What a backend returns: ``out`` ``[T, Hq, D]`` in q's dtype and ``lse`` ``[T, Hq]``
    float32 (natural log of the softmax denominator; ``-inf`` for a row attending to nothing)."""

    out: torch.Tensor
    lse: torch.Tensor

    def validate(self, batch: AttentionBatch) -> AttentionResult:
        """Check shapes, dtypes and devices against ``batch``; return ``self``."""
        _check_result(self.out, self.lse, batch)
        return self


def as_result(value: object, batch: AttentionBatch) -> AttentionResult:
    """Normalise a backend's return value (``AttentionResult`` or ``(out, lse)``); validate it."""
    if isinstance(value, AttentionResult):
        result = value
    elif isinstance(value, Sequence) and len(value) == 2:
        result = AttentionResult(value[0], value[1])
    else:
        raise TypeError(
            "backend result: expected an AttentionResult or an (out, lse) pair, got "
            f"{type(value).__name__}"
        )
    return result.validate(batch)
