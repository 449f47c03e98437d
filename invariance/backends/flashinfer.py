"""FlashInfer adapters (``flashinfer-python`` >= 0.6, imported inside the call).

:class:`FlashInferBackend` runs a batch the way a serving engine drives FlashInfer's paged
wrappers (``kv_layout="NHD"``, which is our cache layout ``[num_pages, page_size, Hkv, D]``):

- **Rows.** Engine-style (``decode=True``, the default): a request with exactly one query token
  (``q_len == 1``, whatever its KV length; vLLM's rule with its decode threshold of 1) is a
  *decode* row and goes through ``BatchDecodeWithPagedKVCacheWrapper``; every request with
  ``q_len > 1`` (a prompt or a chunk of one) goes through ``BatchPrefillWithPagedKVCacheWrapper``
  with ``causal=True`` (FlashInfer's causal mask is aligned bottom-right: query ``i`` of a chunk
  sees ``[0, kv_len - q_len + i]``, our contract). ``decode=False`` (``flashinfer-prefill``) sends
  every request through the prefill wrapper. Requests with no query token are left out of both
  calls (they have no row). Each wrapper sees its requests in batch order; its outputs are
  scattered back to the batch's rows. When one wrapper serves every row in batch order (a pure
  decode or pure prefill batch), its output is returned as it comes, with no gather or scatter:
  the call is then FlashInfer's own kernels plus one LSE scaling, so ``invariance bench`` times
  FlashInfer without the adapter's copies.
- **Metadata.** :func:`paged_metadata` converts our block table to FlashInfer's CSR form
  (``qo_indptr``, ``kv_indptr``, ``kv_indices``, ``kv_last_page_len``); a pure function.
- **LSE.** FlashInfer returns the log-sum-exp in base 2; it is multiplied by ``ln 2`` (float32)
  to give our natural-log LSE. A row attending to nothing cannot occur here: the contract has
  ``kv_len >= q_len`` and causal rows, so every row sees at least its own key (and requests
  without rows never reach FlashInfer); our ``out = 0, lse = -inf`` convention for such rows is
  kept by the initial values of the result for rows no wrapper writes.
- **Variants.** ``backend`` (prefill wrapper: ``auto`` = FlashInfer's choice, fa3 on Hopper;
  ``fa2``; ``fa3``), ``fixed_split_size`` (plan() argument, in *pages* as FlashInfer counts it;
  fa2 kernels only, so with ``backend="auto"`` it selects fa2, and the decode wrapper needs
  tensor cores for it), ``disable_split_kv``, ``use_tensor_cores`` (decode wrapper).
- **Workspace.** The float workspace is sized per batch from a bound on the split partials
  FlashInfer may allocate (:func:`workspace_bound`), at least 128 MiB (FlashInfer's
  recommendation), or ``workspace_mb``; a plan that still runs out raises ``ValueError``.
- **CUDA graphs** (the planning protocol of :mod:`invariance.backends`): :meth:`plan` does every
  host step (lengths, index tensors, the wrappers' ``plan()``); the call itself is device work
  only. ``plan(batch, graph=True)`` plans fresh ``use_cuda_graph=True`` wrappers whose fixed-size
  index buffers are sized for that batch; eager plans reuse one pair of ordinary wrappers.

- **Features** (``Capabilities.features``; FlashInfer 0.6's Python API, read in the
  ``flashinfer-ai/flashinfer`` sources: ``prefill.py``, ``decode.py``, ``attention.py`` and
  ``jit/attention/variants.py``). A sliding window is the wrappers' ``plan(window_left=)``
  (FlashInfer's mask keeps key ``j`` of query ``i`` when ``j + qo_len + window_left >= kv_len +
  i``: keys ``[pos - window_left, pos]``, our contract); soft-capping is ``plan(
  logits_soft_cap=)`` (``cap * tanh(sm_scale * q·k / cap)``, ours). An FP8 cache is
  ``plan(kv_data_type=torch.float8_e4m3fn)`` and ``run(k_scale=, v_scale=)``, per-tensor floats
  (FlashInfer folds ``k_scale`` into the softmax scale and multiplies the output by
  ``v_scale``); per-head scale tensors are not taken, and FA3 takes FP8 K/V only with FP8
  queries, so ``flashinfer-fa3`` takes no FP8 cache. Attention sinks go through FlashInfer's
  dedicated ``BatchAttentionWithAttentionSinkWrapper`` (a prefill wrapper whose attention
  variant adds ``exp(sink)`` to the denominator; the window is a constructor argument, a JIT
  specialisation, and ``run(q, kv, sinks, sm_scale)`` takes the sinks and the softmax scale
  as the variant's extra arguments): with sinks every row goes through it, decode rows
  included, as engines serving gpt-oss do. That variant has no soft-cap and no FP8 scales,
  so sinks do not combine with either (``Capabilities.feature_conflicts``).

From the CLI: ``--backend flashinfer:fixed_split_size=2048,backend=fa2,use_tensor_cores=true,
workspace_mb=256`` (see :meth:`FlashInferBackend.with_options`).
"""

from __future__ import annotations

import importlib
import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from invariance.backends import Capabilities
from invariance.batch import AttentionBatch, AttentionResult, require_features

__all__ = [
    "FlashInferBackend",
    "FlashInferOptions",
    "PagedMetadata",
    "fa3",
    "fixed_split",
    "flashinfer",
    "paged_metadata",
    "prefill",
    "split_requests",
    "workspace_bound",
]

LN2 = math.log(2.0)
MIB = 1 << 20
#: FlashInfer's recommended float workspace, the floor of the bound.
MIN_WORKSPACE = 128 * MIB
_PREFILL_BACKENDS = ("auto", "fa2", "fa3")
#: Largest query tile of FlashInfer's prefill kernels (rows of a tile, GQA-packed).
_MAX_CTA_TILE_Q = 128


# --------------------------------------------------------------------------------------------
# Pure conversions (tested without FlashInfer)
# --------------------------------------------------------------------------------------------

def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_requests(q_lens: Sequence[int], decode: bool = True) -> tuple[list[int], list[int]]:
    """``(decode, prefill)``: batch indices of the requests each wrapper runs, in batch order.

    With ``decode`` a request with ``q_len == 1`` is a decode row; ``q_len > 1`` is prefill;
    ``q_len == 0`` is in neither (it has no row)."""
    dec = [b for b, n in enumerate(q_lens) if n == 1] if decode else []
    pre = [b for b, n in enumerate(q_lens) if n > 1 or (n == 1 and not decode)]
    return dec, pre


@dataclass(frozen=True)
class PagedMetadata:
    """Some requests of a batch in FlashInfer's paged-KV form (all int32 on the batch's device,
    except ``rows``, int64).

    - ``requests``: their batch indices, in order;
    - ``qo_indptr`` ``[n + 1]``: query rows of request ``i`` are ``[qo_indptr[i],
      qo_indptr[i + 1])`` of the wrapper's q;
    - ``kv_indptr`` ``[n + 1]``, ``kv_indices`` ``[kv_indptr[-1]]``: request ``i``'s physical
      pages, in logical order;
    - ``kv_last_page_len`` ``[n]``: tokens in its last page, in ``[1, page_size]``;
    - ``rows`` ``[qo_indptr[-1]]``: the batch row (of q and of the result) of each query row.
    """

    requests: tuple[int, ...]
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    rows: torch.Tensor
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]

    @property
    def num_rows(self) -> int:
        return sum(self.q_lens)

    @property
    def num_pages(self) -> int:
        return int(self.kv_indices.shape[0])


def paged_metadata(block_table: torch.Tensor, kv_lens: Sequence[int],
                   cu_seqlens_q: Sequence[int], page_size: int,
                   requests: Sequence[int]) -> PagedMetadata:
    """Convert our contract (``block_table`` ``[B, max_pages]`` int32, host ``kv_lens`` ``[B]``
    and ``cu_seqlens_q`` ``[B + 1]``, ``page_size``) for the batch indices ``requests`` into
    FlashInfer's :class:`PagedMetadata`. Every listed request must have ``kv_len >= 1``."""
    dev = block_table.device
    q_lens = [cu_seqlens_q[b + 1] - cu_seqlens_q[b] for b in requests]
    kvs = [int(kv_lens[b]) for b in requests]
    for b, kv in zip(requests, kvs, strict=True):
        if kv < 1:
            raise ValueError(f"kv_lens[{b}]: expected >= 1 for a request FlashInfer runs, got "
                             f"{kv}")
    pages = [_cdiv(kv, page_size) for kv in kvs]
    qo_indptr = [0]
    kv_indptr = [0]
    for q, n in zip(q_lens, pages, strict=True):
        qo_indptr.append(qo_indptr[-1] + q)
        kv_indptr.append(kv_indptr[-1] + n)
    last = [kv - (n - 1) * page_size for kv, n in zip(kvs, pages, strict=True)]
    index = torch.tensor(list(requests), dtype=torch.long, device=dev)
    if requests:
        width = max(pages)
        table = block_table.index_select(0, index)[:, :width]
        keep = (torch.arange(width, device=dev)[None, :]
                < torch.tensor(pages, device=dev)[:, None])
        kv_indices = table[keep].to(torch.int32)  # row-major: request by request, in order
    else:
        kv_indices = torch.zeros(0, dtype=torch.int32, device=dev)
    rows = [r for b in requests for r in range(cu_seqlens_q[b], cu_seqlens_q[b + 1])]

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=dev)

    return PagedMetadata(
        requests=tuple(requests), qo_indptr=i32(qo_indptr), kv_indptr=i32(kv_indptr),
        kv_indices=kv_indices, kv_last_page_len=i32(last),
        rows=torch.tensor(rows, dtype=torch.long, device=dev), q_lens=tuple(q_lens),
        kv_lens=tuple(kvs))


def workspace_bound(q_lens: Sequence[int], kv_lens: Sequence[int], num_q_heads: int,
                    num_kv_heads: int, head_dim: int, page_size: int, *,
                    fixed_split_size: int | None = None, disable_split_kv: bool = False,
                    num_sms: int = 132) -> int:
    """Bytes of float workspace enough for one FlashInfer plan of these requests.

    FlashInfer's split-KV plans allocate ``Hq * padded_tiles * cta_tile_q * (D + 1) * 4`` bytes
    of partial outputs and LSEs, where ``padded_tiles * cta_tile_q`` counts the GQA-packed query
    rows (``q_len * Hq / Hkv``, each request padded to a tile of at most 128) times the KV
    chunks. With ``fixed_split_size`` a request has ``ceil(pages / fixed_split_size)`` chunks and
    nothing caps their number; FlashInfer's own heuristic splits only to fill the GPU (about
    ``blocks_per_sm * num_sms / Hkv`` tiles, bounded here with 4 blocks per SM). The result is at
    least :data:`MIN_WORKSPACE` and leaves 16 MiB of slack."""
    G = num_q_heads // num_kv_heads
    packed = [q * G + _MAX_CTA_TILE_Q for q in q_lens]
    if disable_split_kv:
        rows = 0
    elif fixed_split_size:
        rows = sum(p * _cdiv(_cdiv(kv, page_size), fixed_split_size)
                   for p, kv in zip(packed, kv_lens, strict=True))
    else:
        rows = _MAX_CTA_TILE_Q * _cdiv(4 * num_sms, num_kv_heads) + sum(packed)
    need = num_q_heads * rows * (head_dim + 1) * 4 + 16 * MIB
    return max(MIN_WORKSPACE, _cdiv(need, MIB) * MIB)


# --------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------

def _bool(key: str, text: str) -> bool:
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"flashinfer option {key}: expected true or false, got {text!r}")


def _int(key: str, text: str, *, none: bool = False) -> int | None:
    if none and text.strip().lower() in ("none", "default"):
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"flashinfer option {key}: expected an int >= 1"
                         f"{' or none' if none else ''}, got {text!r}")
    return value


@dataclass(frozen=True)
class FlashInferOptions:
    """Settings of a :class:`FlashInferBackend` (its docstring says what each does)."""

    decode: bool = True
    backend: str = "auto"
    fixed_split_size: int | None = None
    disable_split_kv: bool = False
    use_tensor_cores: bool | None = None
    workspace_mb: int | None = None

    def __post_init__(self) -> None:
        if self.backend not in _PREFILL_BACKENDS:
            raise ValueError(f"flashinfer option backend: expected one of "
                             f"{', '.join(_PREFILL_BACKENDS)}, got {self.backend!r}")
        if self.fixed_split_size is not None and (
                isinstance(self.fixed_split_size, bool) or self.fixed_split_size < 1):
            raise ValueError(f"flashinfer option fixed_split_size: expected an int >= 1 "
                             f"(pages) or None, got {self.fixed_split_size!r}")
        if self.workspace_mb is not None and self.workspace_mb < 1:
            raise ValueError(f"flashinfer option workspace_mb: expected an int >= 1, got "
                             f"{self.workspace_mb!r}")
        split = self.fixed_split_size is not None or self.disable_split_kv
        if split and self.backend == "fa3":
            raise ValueError("flashinfer option backend: fixed_split_size and disable_split_kv "
                             "act on FlashInfer's fa2 kernels only; got backend='fa3'")
        if self.fixed_split_size is not None and self.decode and self.use_tensor_cores is False:
            raise ValueError("flashinfer option use_tensor_cores: FlashInfer's decode wrapper "
                             "takes fixed_split_size only with tensor cores; got false")

    @property
    def prefill_backend(self) -> str:
        """The prefill wrapper's ``backend``: fa2 when a split option needs it under auto."""
        if self.backend == "auto" and (self.fixed_split_size is not None
                                       or self.disable_split_kv):
            return "fa2"
        return self.backend

    @property
    def decode_tensor_cores(self) -> bool:
        if self.use_tensor_cores is not None:
            return self.use_tensor_cores
        return self.fixed_split_size is not None

    def split_kwargs(self) -> dict[str, Any]:
        """The split arguments of both wrappers' ``plan()`` (only those set)."""
        kw: dict[str, Any] = {}
        if self.fixed_split_size is not None:
            kw["fixed_split_size"] = self.fixed_split_size
        if self.disable_split_kv:
            kw["disable_split_kv"] = True
        return kw

    def describe(self) -> str:
        words = ["engine-style" if self.decode else "prefill wrapper only",
                 f"backend={self.prefill_backend}"]
        if self.fixed_split_size is not None:
            words.append(f"fixed_split_size={self.fixed_split_size} pages")
        if self.disable_split_kv:
            words.append("disable_split_kv")
        if self.decode:
            words.append(f"use_tensor_cores={str(self.decode_tensor_cores).lower()}")
        if self.workspace_mb is not None:
            words.append(f"workspace_mb={self.workspace_mb}")
        return ", ".join(words)

    @classmethod
    def parse(cls, base: FlashInferOptions, options: Mapping[str, str]) -> FlashInferOptions:
        """``base`` with string ``options`` (from ``name:key=value,...``) applied."""
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = asdict(base)
        for key, text in options.items():
            if key not in known:
                raise ValueError(f"flashinfer option {key!r}: unknown; expected one of "
                                 f"{', '.join(sorted(known))}")
            if key in ("decode", "disable_split_kv"):
                values[key] = _bool(key, text)
            elif key == "use_tensor_cores":
                values[key] = (None if text.strip().lower() in ("auto", "default")
                               else _bool(key, text))
            elif key == "fixed_split_size":
                values[key] = _int(key, text, none=True)
            elif key == "workspace_mb":
                values[key] = _int(key, text)
            else:
                values[key] = text.strip()
        return cls(**values)


# --------------------------------------------------------------------------------------------
# The backend
# --------------------------------------------------------------------------------------------

@dataclass
class _Part:
    kind: str  # "decode", "prefill" or "sinks"
    wrapper: Any
    meta: PagedMetadata
    #: Extra positional and keyword arguments of the wrapper's ``run`` (sinks, FP8 scales).
    run_args: tuple[Any, ...] = ()
    run_kwargs: dict[str, Any] | None = None


@dataclass
class _Plan:
    batch: weakref.ref[AttentionBatch]
    graph: bool
    parts: list[_Part]


def _sink_wrapper_class(fi: Any) -> Any:
    """FlashInfer's ``BatchAttentionWithAttentionSinkWrapper`` (exported at the top level and
    by ``flashinfer.attention``); ``ValueError`` when this FlashInfer has none."""
    name = "BatchAttentionWithAttentionSinkWrapper"
    cls = getattr(fi, name, None)
    if cls is None:
        try:
            cls = getattr(importlib.import_module("flashinfer.attention"), name, None)
        except ImportError:
            cls = None
    if cls is None:
        raise ValueError(f"features: expected a FlashInfer with {name} for attention sinks "
                         "(flashinfer-python >= 0.6), got one without it")
    return cls


def _plan_wrapper(options: FlashInferOptions, workspace: torch.Tensor, kind: str, wrapper: Any,
                  *args: Any, **kwargs: Any) -> None:
    try:
        wrapper.plan(*args, **kwargs)
    except RuntimeError as exc:
        text = str(exc)
        if "workspace" in text.lower() or "overflow" in text.lower():
            have = workspace.numel() // MIB
            raise ValueError(
                f"workspace_mb: FlashInfer's {kind} plan needs more float workspace than the "
                f"{have} MiB given ({text.splitlines()[0] if text else 'out of workspace'}); "
                f"pass a larger workspace_mb= than {have}") from exc
        raise


class FlashInferBackend:
    """FlashInfer paged attention as an engine calls it (module docstring).

    - ``decode``: route ``q_len == 1`` requests through the decode wrapper (engine-style);
      ``False`` runs every request through the prefill wrapper;
    - ``backend``: the prefill wrapper's ``"auto"`` / ``"fa2"`` / ``"fa3"``;
    - ``fixed_split_size``: FlashInfer's plan() argument, in pages (``None``: its heuristic);
    - ``disable_split_kv``: one KV chunk per request;
    - ``use_tensor_cores``: the decode wrapper's (``None``: true with ``fixed_split_size``, else
      FlashInfer's default false);
    - ``workspace_mb``: fixed float workspace (default: :func:`workspace_bound` per batch).
    """

    def __init__(self, *, decode: bool = True, backend: str = "auto",
                 fixed_split_size: int | None = None, disable_split_kv: bool = False,
                 use_tensor_cores: bool | None = None, workspace_mb: int | None = None) -> None:
        self.options = FlashInferOptions(decode, backend, fixed_split_size, disable_split_kv,
                                         use_tensor_cores, workspace_mb)
        self._workspace: torch.Tensor | None = None
        self._eager: dict[str, Any] = {}
        self._plan: _Plan | None = None

    def __repr__(self) -> str:
        return f"FlashInferBackend({self.options.describe()})"

    @property
    def capabilities(self) -> Capabilities:
        """Half precision, head dims 64/128/256, CUDA, CUDA graphs; the features of the module
        docstring ("Features"): window, soft-cap, sinks, and an FP8 cache with per-tensor
        scales except on FA3; sinks combine with neither soft-cap nor FP8."""
        features = {"window", "softcap", "sinks"}
        if self.options.prefill_backend != "fa3":
            features.add("fp8_kv")
        return Capabilities(dtypes=("float16", "bfloat16"), head_dims=(64, 128, 256),
                            devices=("cuda",), cuda_graphs=True,
                            features=frozenset(features),
                            feature_conflicts=(frozenset({"sinks", "softcap"}),
                                               frozenset({"sinks", "fp8_kv"})))

    def with_options(self, options: Mapping[str, str]) -> FlashInferBackend:
        """A new backend: this one's settings with ``options`` (strings, from the CLI's
        ``name:key=value,...``) applied. Keys: ``decode``, ``backend``, ``fixed_split_size``,
        ``disable_split_kv``, ``use_tensor_cores``, ``workspace_mb``."""
        o = FlashInferOptions.parse(self.options, options)
        return FlashInferBackend(decode=o.decode, backend=o.backend,
                                 fixed_split_size=o.fixed_split_size,
                                 disable_split_kv=o.disable_split_kv,
                                 use_tensor_cores=o.use_tensor_cores,
                                 workspace_mb=o.workspace_mb)

    # -- workspace and wrappers ---------------------------------------------------------------
    def _workspace_for(self, batch: AttentionBatch, q_lens: Sequence[int],
                       kv_lens: Sequence[int]) -> torch.Tensor:
        o = self.options
        if o.workspace_mb is not None:
            need = o.workspace_mb * MIB
        else:
            sms = (torch.cuda.get_device_properties(batch.device).multi_processor_count
                   if batch.device.type == "cuda" else 1)
            live = [(q, kv) for q, kv in zip(q_lens, kv_lens, strict=True) if q]
            need = workspace_bound([q for q, _ in live], [kv for _, kv in live],
                                   batch.num_q_heads, batch.num_kv_heads, batch.head_dim,
                                   batch.page_size, fixed_split_size=o.fixed_split_size,
                                   disable_split_kv=o.disable_split_kv, num_sms=sms)
        ws = self._workspace
        if ws is None or ws.device != batch.device or ws.numel() < need or (
                o.workspace_mb is not None and ws.numel() != need):
            # FlashInfer asks for a zeroed float workspace on first use.
            ws = torch.zeros(need, dtype=torch.uint8, device=batch.device)
            self._workspace = ws
            self._eager = {}  # the wrappers hold the old buffer
        return ws

    def _wrapper(self, fi: Any, kind: str, ws: torch.Tensor, meta: PagedMetadata,
                 graph: bool, batch: AttentionBatch | None = None) -> Any:
        o = self.options
        key: Any = kind
        if kind == "sinks" and batch is not None:  # a JIT specialisation per these
            key = (kind, batch.dtype, batch.k_cache.dtype, batch.head_dim, batch.window_left)
        if not graph and key in self._eager:
            return self._eager[key]
        kwargs: dict[str, Any] = {}
        if graph:
            dev, n = ws.device, len(meta.requests)

            def buf(size: int) -> torch.Tensor:
                return torch.zeros(max(size, 1), dtype=torch.int32, device=dev)

            indptr, indices, last = buf(n + 1), buf(meta.num_pages), buf(n)
        if kind == "decode":
            if graph:
                kwargs.update(paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
                              paged_kv_last_page_len_buffer=last)
            if o.decode_tensor_cores:  # its prefill kernels: fa2, fa3 or FlashInfer's choice
                kwargs["backend"] = o.prefill_backend
            wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
                ws, "NHD", use_cuda_graph=graph, use_tensor_cores=o.decode_tensor_cores,
                **kwargs)
        else:
            if graph:
                kwargs.update(qo_indptr_buf=buf(n + 1), paged_kv_indptr_buf=indptr,
                              paged_kv_indices_buf=indices, paged_kv_last_page_len_buf=last)
            if kind == "sinks":
                assert batch is not None
                wrapper = _sink_wrapper_class(fi)(
                    ws, "NHD", use_cuda_graph=graph, backend=o.prefill_backend,
                    q_data_type=batch.dtype, kv_data_type=batch.k_cache.dtype,
                    head_dim_qk=batch.head_dim, head_dim_vo=batch.head_dim,
                    window_left=batch.window_left, **kwargs)
            else:
                wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(
                    ws, "NHD", use_cuda_graph=graph, backend=o.prefill_backend, **kwargs)
        if not graph:
            self._eager[key] = wrapper
        else:
            # NOTE: a CUDA-graph plan may launch padded CTAs that read scheduler entries the plan
            # never wrote when it does not split KV (FlashInfer issue #4002, PR #5176), and
            # FlashInfer allocates this int workspace uninitialised: zeroing it is that issue's
            # workaround. It did NOT stop the illegal memory access seen with fixed_split_size
            # under `cuda_graph` on an H100, whose cause is open.
            int_ws = getattr(wrapper, "_int_workspace_buffer", None)
            if isinstance(int_ws, torch.Tensor):
                int_ws.zero_()
        return wrapper

    # -- the planning protocol ----------------------------------------------------------------
    def plan(self, batch: AttentionBatch, *, graph: bool = False) -> None:
        """Every host step of a call on ``batch`` (module docstring, "CUDA graphs")."""
        import flashinfer as fi

        o = self.options
        caps = self.capabilities
        require_features(batch, caps.features, "flashinfer", caps.feature_conflicts)
        used = batch.features_used()
        q_lens = batch.q_lens()
        kv_lens = [int(x) for x in batch.kv_lens.tolist()]
        cu = [int(x) for x in batch.cu_seqlens_q.tolist()]
        sinks = batch.sinks is not None
        dec, pre = split_requests(q_lens, o.decode and not sinks)
        ws = self._workspace_for(batch, q_lens, kv_lens)
        Hq, Hkv, D, P = batch.num_q_heads, batch.num_kv_heads, batch.head_dim, batch.page_size
        common: dict[str, Any] = dict(q_data_type=batch.dtype, kv_data_type=batch.k_cache.dtype,
                                      sm_scale=float(batch.sm_scale), **o.split_kwargs())
        if "window" in used:
            common["window_left"] = batch.window_left
        if "softcap" in used:
            common["logits_soft_cap"] = float(batch.logits_soft_cap)
        run_kwargs: dict[str, Any] = {}
        if batch.kv_fp8:  # per-tensor floats (fp8_kv_head is refused above)
            run_kwargs = {"k_scale": float(batch.k_scale if batch.k_scale is not None else 1.0),
                          "v_scale": float(batch.v_scale if batch.v_scale is not None else 1.0)}
        parts: list[_Part] = []
        if dec:
            meta = paged_metadata(batch.block_table, kv_lens, cu, P, dec)
            w = self._wrapper(fi, "decode", ws, meta, graph)
            _plan_wrapper(o, ws, "decode", w, meta.kv_indptr, meta.kv_indices,
                          meta.kv_last_page_len, Hq, Hkv, D, P, **common)
            parts.append(_Part("decode", w, meta, run_kwargs=run_kwargs))
        if pre:
            kind = "sinks" if sinks else "prefill"
            meta = paged_metadata(batch.block_table, kv_lens, cu, P, pre)
            w = self._wrapper(fi, kind, ws, meta, graph, batch)
            _plan_wrapper(o, ws, kind, w, meta.qo_indptr, meta.kv_indptr,
                          meta.kv_indices, meta.kv_last_page_len, Hq, Hkv, D, P, causal=True,
                          **common)
            args = (batch.sinks, float(batch.sm_scale)) if sinks else ()
            parts.append(_Part(kind, w, meta, args, run_kwargs))
        self._plan = _Plan(weakref.ref(batch), graph, parts)

    def __call__(self, batch: AttentionBatch) -> AttentionResult:
        plan = self._plan
        if plan is None or plan.batch() is not batch:
            if batch.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("FlashInferBackend: call plan(batch, graph=True) before "
                                   "capturing a call on that batch in a CUDA graph")
            self.plan(batch)
            plan = self._plan
            assert plan is not None
        if len(plan.parts) == 1:  # its rows are the batch's rows, in order (split_requests)
            part = plan.parts[0]
            o, lse2 = part.wrapper.run(batch.q.contiguous(), (batch.k_cache, batch.v_cache),
                                       *part.run_args, return_lse=True,
                                       **(part.run_kwargs or {}))
            return AttentionResult(o.to(batch.dtype), lse2.float() * LN2)
        out = torch.zeros_like(batch.q)
        lse = torch.full((batch.num_tokens, batch.num_q_heads), float("-inf"),
                         dtype=torch.float32, device=batch.device)
        for part in plan.parts:
            q = batch.q.index_select(0, part.meta.rows)
            o, lse2 = part.wrapper.run(q, (batch.k_cache, batch.v_cache), *part.run_args,
                                       return_lse=True, **(part.run_kwargs or {}))
            out.index_copy_(0, part.meta.rows, o.to(batch.dtype))
            lse.index_copy_(0, part.meta.rows, lse2.float() * LN2)  # base 2 -> natural log
        return AttentionResult(out, lse)


#: ``flashinfer``: engine-style, FlashInfer's default split heuristic and backend choice.
flashinfer = FlashInferBackend()
#: ``flashinfer-prefill``: every row through the prefill wrapper.
prefill = FlashInferBackend(decode=False)
#: ``flashinfer-fa3``: every row through the prefill wrapper on FA3 kernels (FA3 has no
#: batch-dependent KV split; the decode wrapper does, so engine-style FA3 fails batch_size).
fa3 = FlashInferBackend(decode=False, backend="fa3")
#: ``flashinfer-fixed-split``: engine-style, ``fixed_split_size=2048`` pages (fa2 kernels).
fixed_split = FlashInferBackend(fixed_split_size=2048)
