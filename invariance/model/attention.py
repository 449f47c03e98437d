"""Running a ``transformers`` model's attention through an invariance backend.

:func:`swap_attention` registers an attention function under a new name in transformers'
attention-function registry (``AttentionInterface.register``), with a mask function that always
builds the full boolean mask (``AttentionMaskInterface.register``; transformers' own SDPA mask
would drop it for unpadded causal batches), and points the model at it. The function turns each
call's ``query`` ``[B, Hq, Lq, D]``, ``key``/``value`` ``[B, Hkv, Lk, D]`` (the whole KV cache
after this step's update) and mask into an :class:`invariance.AttentionBatch`: per batch row, the
keys the mask lets any real query see (padding dropped, order kept) go into fresh KV pages, and
the real queries (those that see their own key) become that request's query rows, which the
batch contract places at the end of its keys. The backend's output rows are scattered back to
``[B, Lq, Hq, D]``; padded query rows get zeros (nothing reads them).

The batch contract is causal attention over each request's keys ``[0, pos]``. A mask of any
other pattern (a sliding window shorter than the sequence, bidirectional or chunked attention)
is refused with a ``ValueError`` naming the layer, as are a softcap or attention sinks: the swap
never computes something else than the model asks for.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from invariance.backends import ResolvedBackend, planner, resolve
from invariance.batch import AttentionBatch, as_result
from invariance.model.record import untraced

__all__ = ["PAGE_SIZE", "attention_function", "swap_attention"]

#: Tokens per KV page of the batches the swap builds.
PAGE_SIZE = 16
_UNSUPPORTED = ("softcap", "s_aux", "sinks", "position_bias")


def _allowed(mask: torch.Tensor | None, B: int, Lq: int, Lk: int, layer: str,
             device: torch.device) -> torch.Tensor:
    """The mask as booleans ``[B, Lq, Lk]`` (True: may attend)."""
    if mask is None:
        q_pos = torch.arange(Lq, device=device) + (Lk - Lq)
        causal = torch.arange(Lk, device=device)[None, :] <= q_pos[:, None]
        return causal.expand(B, Lq, Lk)
    if mask.dim() != 4 or mask.shape[0] not in (1, B) or tuple(mask.shape[2:]) != (Lq, Lk):
        raise ValueError(f"attention_mask of {layer}: expected [B, 1, {Lq}, {Lk}], got "
                         f"{list(mask.shape)}")
    if mask.shape[1] != 1 and not bool((mask == mask[:, :1]).all()):
        raise ValueError(f"attention_mask of {layer}: expected one mask for every head, got "
                         f"per-head masks")
    m = mask[:, 0].expand(B, Lq, Lk)
    if m.dtype == torch.bool:
        return m
    allowed = m == 0
    blocked = m <= torch.finfo(m.dtype).min / 2
    if not bool((allowed | blocked).all()):
        raise ValueError(f"attention_mask of {layer}: expected 0 or -inf entries (a mask, no "
                         f"bias), got other values")
    return allowed


def attention_function(backend: ResolvedBackend,
                       page_size: int = PAGE_SIZE) -> Callable[..., tuple[torch.Tensor, None]]:
    """A transformers attention function (``(module, query, key, value, attention_mask,
    scaling=..., ...) -> (out [B, Lq, Hq, D], None)``) computing through ``backend``."""
    plan = planner(backend)

    def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                  value: torch.Tensor, attention_mask: torch.Tensor | None,
                  dropout: float = 0.0, scaling: float | None = None,
                  **kwargs: Any) -> tuple[torch.Tensor, None]:
        with untraced():
            batch, rows, q_lens, out = _pack(module, query, key, value, attention_mask,
                                             scaling, kwargs, backend.name, page_size)
        if batch is None:
            return out, None
        if plan is not None:
            plan(batch, False)
        result = as_result(backend(batch), batch)
        with untraced():
            lo = 0
            for (b, qi_t), n in zip(rows, q_lens, strict=True):
                out[b].index_copy_(0, qi_t, result.out[lo:lo + n])
                lo += n
        return out, None

    return attention


def _real_rows(attention_mask: torch.Tensor | None, B: int, Lq: int, Lk: int, layer: str,
               dev: torch.device, name: str, kwargs: dict[str, Any]
               ) -> tuple[list[list[bool]], list[list[bool]]]:
    """Which queries ``[B][Lq]`` and keys ``[B][Lk]`` of each batch row are real (a query
    that sees its own key; a key some real query sees). The mask must be causal over each
    row's real keys, else the layer is refused."""
    allowed = _allowed(attention_mask, B, Lq, Lk, layer, dev)
    q_pos = torch.arange(Lq, device=dev) + (Lk - Lq)
    causal = torch.arange(Lk, device=dev)[None, :] <= q_pos[:, None]
    real_q = allowed[:, torch.arange(Lq, device=dev), q_pos]  # sees its own key
    real_k = (allowed & real_q[:, :, None]).any(1)  # [B, Lk]
    expected = real_k[:, None, :] & causal[None]
    if bool(((allowed != expected) & real_q[:, :, None]).any()):
        window = kwargs.get("sliding_window")
        why = f" (a sliding window of {window})" if window else ""
        raise ValueError(
            f"attention_mask of {layer}: backend {name} computes causal attention "
            f"over each request's keys [0, pos]; this layer's mask is another pattern{why}")
    return real_q.tolist(), real_k.tolist()


def _paged(ks: list[torch.Tensor], vs: list[torch.Tensor], page_size: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys and values ``[kv_len, Hkv, D]`` per request as caches ``[pages, page_size, Hkv,
    D]`` on consecutive pages, and the block table ``[requests, max pages]``."""
    Hkv, D = ks[0].shape[1], ks[0].shape[2]
    pages = [-(-k.shape[0] // page_size) for k in ks]
    k_cache = ks[0].new_zeros(sum(pages), page_size, Hkv, D)
    v_cache = torch.zeros_like(k_cache)
    table = torch.zeros(len(ks), max(pages), dtype=torch.int32)
    first = 0
    for r, p in enumerate(pages):
        n = ks[r].shape[0]
        k_cache.view(-1, Hkv, D)[first * page_size:first * page_size + n] = ks[r]
        v_cache.view(-1, Hkv, D)[first * page_size:first * page_size + n] = vs[r]
        table[r, :p] = torch.arange(first, first + p, dtype=torch.int32)
        first += p
    return k_cache, v_cache, table


def _pack(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
          value: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float | None,
          kwargs: dict[str, Any], name: str, page_size: int
          ) -> tuple[AttentionBatch | None, list[tuple[int, torch.Tensor]], list[int],
                     torch.Tensor]:
    """The call's real queries and keys as an :class:`AttentionBatch` (module docstring), the
    (batch row, query indices) of each of its requests, their query counts, and the zero output
    ``[B, Lq, Hq, D]`` to scatter the result into (``None`` for the batch when no query row is
    real)."""
    layer = f"layer {getattr(module, 'layer_idx', '?')} ({type(module).__name__})"
    for feature in _UNSUPPORTED:
        if kwargs.get(feature) is not None:
            raise ValueError(f"attention of {layer}: backend {name} computes plain "
                             f"softmax attention; the model asks for {feature}")
    B, Hq, Lq, D = query.shape
    Lk = key.shape[2]
    if value.shape[-1] != D:
        raise ValueError(f"value of {layer}: expected head dim {D} (the query's), got "
                         f"{value.shape[-1]}")
    dev = query.device
    rq, rk = _real_rows(attention_mask, B, Lq, Lk, layer, dev, name, kwargs)
    qs, ks, vs, q_lens, kv_lens, rows = [], [], [], [], [], []
    for b in range(B):
        qi = [i for i in range(Lq) if rq[b][i]]
        if not qi:
            continue
        kj = [j for j in range(Lk) if rk[b][j]]
        if kj[-len(qi):] != [Lk - Lq + i for i in qi]:
            raise ValueError(f"attention_mask of {layer}: row {b}'s real queries are not "
                             f"its last real keys; the batch contract cannot place them")
        qi_t = torch.tensor(qi, device=dev)
        kj_t = torch.tensor(kj, device=dev)
        qs.append(query[b].index_select(1, qi_t).transpose(0, 1))  # [n, Hq, D]
        ks.append(key[b].index_select(1, kj_t).transpose(0, 1))  # [kv, Hkv, D]
        vs.append(value[b].index_select(1, kj_t).transpose(0, 1))
        q_lens.append(len(qi))
        kv_lens.append(len(kj))
        rows.append((b, qi_t))
    out = query.new_zeros(B, Lq, Hq, D)
    if not rows:
        return None, rows, q_lens, out
    k_cache, v_cache, table = _paged(ks, vs, page_size)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    batch = AttentionBatch(
        q=torch.cat(qs).contiguous(), k_cache=k_cache, v_cache=v_cache,
        cu_seqlens_q=cu.to(dev), kv_lens=torch.tensor(kv_lens, dtype=torch.int32,
                                                      device=dev),
        block_table=table.to(dev),
        sm_scale=float(scaling) if scaling is not None else D ** -0.5).validate()
    return batch, rows, q_lens, out


def _full_mask(*args: Any, **kwargs: Any) -> Any:
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kwargs)


@contextmanager
def swap_attention(model: torch.nn.Module, backend: Any) -> Iterator[str]:
    """Run ``model``'s attention through ``backend`` (a name, ``module:attr`` or a callable
    taking an :class:`invariance.AttentionBatch`) inside the ``with`` block; yields the backend's
    name. ``ValueError`` naming ``attention`` when ``model`` is not a transformers model whose
    attention goes through the registry."""
    config = getattr(model, "config", None)
    setter = getattr(model, "set_attn_implementation", None)
    if config is None or not callable(setter) or not hasattr(config, "_attn_implementation"):
        raise ValueError(f"attention: expected a transformers model (the swap goes through its "
                         f"attention registry), got {type(model).__name__}")
    resolved = resolve(backend)
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    name = "invariance_" + re.sub(r"[^A-Za-z0-9_]+", "_", resolved.name)
    AttentionInterface.register(name, attention_function(resolved))
    AttentionMaskInterface.register(name, _full_mask)
    before = config._attn_implementation
    setter(name)
    if config._attn_implementation != name:
        raise ValueError(f"attention: {type(model).__name__} does not let its attention be "
                         f"swapped (it stays {config._attn_implementation!r})")
    try:
        yield resolved.name
    finally:
        setter(before)
