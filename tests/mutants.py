"""Planted defects: attention backends with the batch-variance bugs real kernels have.

:class:`Planted` is a float32 split-KV attention over a paged cache, invariant by construction:
keys are cut into splits of ``split`` tokens at absolute positions, each split is an online
softmax state, and states fold left to right. Each defect changes one thing, the way kernels in
the field do (a split size taken from the batch, a separate decode path, a read past ``kv_len``,
...). ``tests/test_mutations.py`` checks that the default check catches every defect and passes
the fixed variants.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from invariance import AttentionBatch, AttentionResult, Capabilities

# Batch facts a defect may look at.
Facts = dict[str, int]


def _facts(batch: AttentionBatch) -> Facts:
    q_lens = batch.q_lens()
    kv = batch.kv_lens.tolist()
    first_pages = {int(batch.block_table[b, 0]) for b in range(batch.batch_size) if kv[b]}
    return {"B": batch.batch_size, "T": batch.num_tokens, "max_kv": max(kv, default=0),
            "prefills": sum(1 for n in q_lens if n > 1), "decodes": sum(1 for n in q_lens
                                                                         if n == 1),
            "kv_total": sum(kv), "long_rows": sum(1 for n in kv if n > 512),
            # Every request reads the same first page: one shared prefix (a cascade path).
            "shared_prefix": int(batch.batch_size >= 2 and len(first_pages) == 1
                                 and all(kv)),
            # Every request has the same query and KV lengths (lock-step).
            "uniform": int(batch.batch_size >= 2
                           and len(set(zip(q_lens, kv, strict=True))) == 1)}


def _gather(batch: AttentionBatch, b: int, extra: int = 0,
            row: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V ``[kv_len + extra, Hkv, D]`` of request ``b`` in float32, through block-table row
    ``row`` (its own by default)."""
    P = batch.page_size
    n = int(batch.kv_lens[b]) + extra
    pages = batch.block_table[b if row is None else row, : -(-n // P)].long()
    pages = pages.clamp(0, batch.k_cache.shape[0] - 1)
    k = batch.k_cache[pages].reshape(-1, batch.num_kv_heads, batch.head_dim)[:n]
    v = batch.v_cache[pages].reshape(-1, batch.num_kv_heads, batch.head_dim)[:n]
    return k.float(), v.float()


def _attend(q: torch.Tensor, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            split: int, reverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``q`` ``[n, Hq, D]`` at positions ``pos`` over ``k, v`` ``[L, Hkv, D]``: splits of
    ``split`` keys at absolute positions, folded in order (``reverse``: last split first)."""
    n, Hq, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    qg = q.float().view(n, Hkv, G, D)
    m = torch.full((n, Hkv, G), float("-inf"))
    l = torch.zeros(n, Hkv, G)
    acc = torch.zeros(n, Hkv, G, D)
    starts = list(range(0, int(pos.max()) + 1, split))
    for s0 in reversed(starts) if reverse else starts:
        kc, vc = k[s0:s0 + split], v[s0:s0 + split]  # [S, Hkv, D]
        s = (qg[:, None] * kc[None, :, :, None, :]).sum(-1) * scale  # [n, S, Hkv, G]
        visible = (torch.arange(s0, s0 + kc.shape[0])[None, :] <= pos[:, None])
        s = s.masked_fill(~visible[:, :, None, None], float("-inf"))
        mc = s.amax(1)
        m_new = torch.maximum(m, mc)
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - safe)
        p = torch.exp(s - safe[:, None])
        l = alpha * l + p.sum(1)
        acc = alpha[..., None] * acc + (p[..., None] * vc[None, :, :, None, :]).sum(1)
        m = m_new
    out = torch.where(l[..., None] > 0, acc / l[..., None], torch.zeros_like(acc))
    lse = torch.where(l > 0, m + torch.log(l), torch.full_like(l, float("-inf")))
    return out.reshape(n, Hq, D), lse.reshape(n, Hq)


@dataclass
class Planted:
    """Split-KV float32 attention; ``defect`` names the planted bug ("" = none).

    ``split``: tokens per split (fixed: invariant); ``reverse``: fold the splits last to first
    (a different but fixed order: still invariant); ``row_split``: rows before position 64
    use half the split (chosen per row from its own position: still invariant); ``dedup``:
    a row whose query, keys and values repeat an earlier row's of the same call is copied,
    not computed (still invariant: the same inputs give the same bits)."""

    defect: str = ""
    split: int = 32
    reverse: bool = False
    row_split: bool = False
    dedup: bool = False
    calls: int = field(default=0, repr=False)
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def split_for(self, f: Facts, q_len: int, kv_len: int, b: int) -> int:
        d, s = self.defect, self.split
        changed = {
            "decode_path": q_len == 1,
            "qlen_split": q_len > 8,
            "kvlen_split": f["max_kv"] > 512,
            "mixed_only": q_len == 1 and f["prefills"] > 0,
            "long_batch_trigger": f["max_kv"] > 1024 and f["B"] >= 3,
            "token_threshold": f["T"] >= 33,
            "batch16": f["B"] >= 16,
            "long_row_split": kv_len > 256 and f["B"] >= 4,
            "spec_path": 2 <= q_len <= 8,
            "graph_bucket": f["B"] % 8 == 0,
            "slot_parity": b % 2 == 1,
            "batch7": f["B"] == 7,
            "batch_over_40": f["B"] > 40,
            "batch_13_to_16": 13 <= f["B"] <= 16,
            "bucket_48": 40 < f["B"] <= 48,
            "decodes_over_24": f["decodes"] > 24,
            "cascade": bool(f["shared_prefix"]),
            "lockstep": bool(f["uniform"]),
            "two_long_rows": f["long_rows"] >= 2,
            "three_long_rows": f["long_rows"] >= 3,
            "kv_total_2048": f["kv_total"] >= 2048,
            "kv_total_window": 1024 <= f["kv_total"] < 2048,
            "query_tokens_128": f["T"] >= 128,
            "tokens_parity": f["T"] % 2 == 0,
            "decode_tokens_parity": q_len == 1 and f["T"] % 2 == 0,
        }.get(d, False)
        return s // 2 if changed else s

    def __call__(self, batch: AttentionBatch) -> AttentionResult:
        self.calls += 1
        f = _facts(batch)
        out = torch.zeros_like(batch.q)
        lse = torch.full((batch.num_tokens, batch.num_q_heads), float("-inf"))
        cu = batch.cu_seqlens_q.tolist()
        kv_lens = batch.kv_lens.tolist()
        seen_pages: set[int] = set()
        done: dict[object, tuple[torch.Tensor, torch.Tensor]] = {}
        running_max = float("-inf")
        scale = batch.sm_scale * (1.01 if self.defect == "accuracy_scale" else 1.0)
        owner = list(range(batch.batch_size))
        if self.defect == "request_index":  # an empty request shifts later block-table rows
            empties = 0
            for b in range(batch.batch_size):
                owner[b] = b - empties
                empties += cu[b + 1] == cu[b]
        for b in range(batch.batch_size):
            lo, hi = cu[b], cu[b + 1]
            if hi == lo:
                continue
            kvb = b
            extra = 0
            if self.defect == "reads_past_kv_len":  # to the end of the last page
                extra = -(-kv_lens[kvb] // batch.page_size) * batch.page_size - kv_lens[kvb]
            k, v = _gather(batch, kvb, extra, row=owner[b])
            if self.defect == "page_contiguous":  # assumes pages are consecutive
                first = int(batch.block_table[kvb, 0]) * batch.page_size
                flat_k = batch.k_cache.reshape(-1, batch.num_kv_heads, batch.head_dim)
                flat_v = batch.v_cache.reshape(-1, batch.num_kv_heads, batch.head_dim)
                idx = (first + torch.arange(kv_lens[kvb])) % flat_k.shape[0]
                k, v = flat_k[idx].float(), flat_v[idx].float()
            if self.defect == "shared_page_zeros":  # a page read twice in a batch reads zeros
                P = batch.page_size
                pages = batch.block_table[kvb, : -(-kv_lens[kvb] // P)].tolist()
                for j, page in enumerate(pages):
                    if page in seen_pages:
                        k[j * P:(j + 1) * P] = 0
                        v[j * P:(j + 1) * P] = 0
                seen_pages.update(pages)
            if self.defect == "accuracy_gqa":  # query head h reads KV head h % Hkv
                G = batch.num_q_heads // batch.num_kv_heads
                k = k[:, torch.arange(batch.num_q_heads) % batch.num_kv_heads][:, ::G]
                v = v[:, torch.arange(batch.num_q_heads) % batch.num_kv_heads][:, ::G]
            first = kv_lens[b] - (hi - lo)
            pos = torch.arange(first, kv_lens[b])
            if self.defect == "off_by_one":  # sees one key past its position
                pos = torch.clamp(pos + 1, max=k.shape[0] - 1)
            split = self.split_for(f, hi - lo, kv_lens[b], b)
            key = (batch.q[lo:hi].numpy().tobytes(), k.numpy().tobytes(), v.numpy().tobytes(),
                   tuple(pos.tolist())) if self.dedup else None
            if key is not None and key in done:
                o, s = done[key]
            elif self.row_split:
                near = pos < 64
                o = torch.empty(hi - lo, batch.num_q_heads, batch.head_dim)
                s = torch.empty(hi - lo, batch.num_q_heads)
                for rows, size in ((near, split // 2), (~near, split)):
                    if bool(rows.any()):
                        o[rows], s[rows] = _attend(batch.q[lo:hi][rows], pos[rows], k, v,
                                                   scale, size, self.reverse)
            else:
                o, s = _attend(batch.q[lo:hi], pos, k, v, scale, split, self.reverse)
            if key is not None:
                done[key] = (o, s)
            if self.defect == "lse_only":
                s2 = _attend(batch.q[lo:hi], pos, k, v, scale,
                             self.split // 2 if f["B"] >= 3 else self.split)[1]
                s = s2
            if self.defect == "order_dependent":  # rescaled by a running max over the batch
                running_max = max(running_max, float(s.max()))
                s = (s - running_max) + running_max
            if self.defect == "accuracy_long_rows":
                o = o + 0.5 * (pos >= 200)[:, None, None]
            if self.defect == "signed_zero" and f["B"] >= 3:
                o = torch.where(o == 0, -o, o)
            if self.defect == "intermittent_noise" and self.rng.random() < 0.2:
                s = torch.nextafter(s, torch.full_like(s, float("inf")))
            out[lo:hi] = o.to(batch.dtype)
            lse[lo:hi] = s
        if self.defect == "zeros":
            out.zero_()
        return AttentionResult(out, lse)


#: Planted defect -> one line on the class of bug it stands for.
DEFECTS: dict[str, str] = {
    "page_contiguous": "page ids: assumes a request's pages are physically consecutive",
    "reads_past_kv_len": "reads the tail of the last page past kv_len",
    "off_by_one": "causal mask off by one (sees the next key)",
    "request_index": "request index: an empty request shifts later requests' block-table rows",
    "decode_path": "decode rows (q_len 1) take another path with another split",
    "qlen_split": "split size chosen from the request's q_len",
    "kvlen_split": "split size chosen from the batch's longest kv_len (FA2-style)",
    "mixed_only": "decode rows change split only in batches that also hold prefills",
    "lse_only": "the LSE (not the output) depends on the batch size",
    "long_batch_trigger": "rare: longest request > 1024 AND batch >= 3",
    "token_threshold": "kernel switch at >= 33 tokens in the batch",
    "signed_zero": "exact-zero outputs flip to -0.0 in batches of 3 or more",
    "order_dependent": "rescales by a running max over the requests before it",
    "intermittent_noise": "1 call in 5 perturbs the LSE by 1 ULP (nondeterminism)",
    "batch16": "split changes for batches of 16 or more",
    "long_row_split": "rows longer than 256 split by a batch-dependent count",
    "spec_path": "2..8-token chunks take a speculative-verify path",
    "graph_bucket": "split changes for batch sizes that are multiples of 8",
    "slot_parity": "odd batch slots take another split",
    "shared_page_zeros": "a physical page read by two requests reads zeros the second time",
    "batch7": "split changes in batches of exactly 7 (off the old ladder)",
    "batch_over_40": "split changes in batches of more than 40",
    "batch_13_to_16": "split changes for batch sizes 13 to 16 (a window)",
    "bucket_48": "split changes for batch sizes 41 to 48 (one CUDA-graph bucket)",
    "decodes_over_24": "split changes when more than 24 decode rows share a call",
    "cascade": "a cascade path when every request of the call reads the same first page",
    "lockstep": "a dense path when every request has the same query and KV lengths",
    "two_long_rows": "split changes when two or more rows of the call exceed 512 keys",
    "three_long_rows": "split changes when three or more rows of the call exceed 512 keys",
    "kv_total_2048": "split changes when the call holds 2048 KV tokens or more",
    "kv_total_window": "split changes when the call holds 1024-2047 KV tokens",
    "query_tokens_128": "split changes when the call holds 128 query tokens or more",
    "tokens_parity": "split follows the parity of the call's query tokens (deterministic; a "
                     "neighbour repeated in every step of a chunked prefill changes)",
    "decode_tokens_parity": "decode rows' split follows the parity of the call's query tokens "
                            "(only the repeated neighbour of a chunked prefill sees it there)",
    "accuracy_scale": "softmax scale 1% off (invariant, inaccurate)",
    "accuracy_gqa": "wrong GQA head mapping (invariant, inaccurate)",
    "accuracy_long_rows": "+0.5 on every row at position >= 200 (invariant, inaccurate)",
    "zeros": "returns zeros (invariant, inaccurate)",
}

#: Different but fixed variants: invariant and accurate, they must pass.
FIXED: dict[str, Callable[[], Planted]] = {
    "split32": lambda: Planted(),
    "split16": lambda: Planted(split=16),
    "split1000": lambda: Planted(split=1000),
    "reverse_fold": lambda: Planted(reverse=True),
    "row_split": lambda: Planted(row_split=True),
    "dedup_identical_rows": lambda: Planted(dedup=True),
}


# --------------------------------------------------------------------------------------------
# Features: sliding window, attention sinks, soft-cap, FP8 dequantization
# --------------------------------------------------------------------------------------------

def _dequant(x: torch.Tensor, scale: float | torch.Tensor | None,
             slot: int | None = None) -> torch.Tensor:
    """``x`` ``[L, Hkv, D]`` in float32 times its scale (a float or per KV head; ``slot``:
    the per-head scales indexed by that batch slot instead, a defect)."""
    xf = x.float()
    if scale is None:
        return xf
    if isinstance(scale, torch.Tensor):
        if slot is not None:
            return xf * scale[slot % scale.shape[0]]
        return xf * scale[None, :, None]
    return xf * scale


def _fast_tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh as ``1 - 2 / (exp(2x) + 1)``: accurate, other bits than ``torch.tanh``."""
    return 1.0 - 2.0 / (torch.exp(2.0 * x) + 1.0)


@dataclass
class _Plan:
    """How :func:`_attend_features` treats one request's rows (the defects set some)."""

    split: int
    window: int = -1
    sinks: torch.Tensor | None = None
    softcap: float = 0.0
    sink_first: bool = False
    window_aligned: bool = False
    reverse: bool = False
    sink_per_split: bool = False
    cap_after_max: bool = False
    tanh: Callable[[torch.Tensor], torch.Tensor] = torch.tanh
    edge: int | None = None  # every row's window edge (a defect), else its own
    first_split: int | None = None  # splits before this one skipped (a defect)


def _attend_features(q: torch.Tensor, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     scale: float, plan: _Plan) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``q`` ``[n, Hq, D]`` at positions ``pos`` over float32 ``k, v`` ``[L, Hkv, D]``:
    splits of ``plan.split`` keys at absolute positions (``window_aligned``: from each row's
    window start instead: still a function of the row's position), online softmax per split,
    folded in order; the soft-cap on each score; the sink folded once per row, after the
    splits (``sink_first``: before them)."""
    n, Hq, D = q.shape
    L, Hkv = k.shape[0], k.shape[1]
    G = Hq // Hkv
    S = plan.split
    qg = q.float().view(n, Hkv, G, D)
    lo = (pos - plan.window).clamp(min=0) if plan.window >= 0 else torch.zeros_like(pos)
    if plan.edge is not None:
        lo = torch.minimum(torch.full_like(pos, plan.edge), pos)
    off = lo % S if plan.window_aligned else torch.zeros_like(pos)
    m = torch.full((n, Hkv, G), float("-inf"))
    l = torch.zeros(n, Hkv, G)
    acc = torch.zeros(n, Hkv, G, D)
    sink = None if plan.sinks is None else plan.sinks.float().view(1, Hkv, G).expand(n, Hkv, G)

    def fold_sink(m: torch.Tensor, l: torch.Tensor,
                  acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        assert sink is not None
        m_new = torch.maximum(m, sink)
        alpha = torch.exp(m - m_new)
        return m_new, alpha * l + torch.exp(sink - m_new), alpha[..., None] * acc

    if sink is not None and plan.sink_first:
        m, l, acc = fold_sink(m, l, acc)
    firsts, lasts = (lo - off) // S, (pos - off) // S  # each row's splits  [n]
    if plan.first_split is not None:
        firsts = firsts.clamp(min=plan.first_split)
    chunks = list(range(int(firsts.min()), int(lasts.max()) + 1))
    for c in reversed(chunks) if plan.reverse else chunks:
        # Only the rows whose keys this split holds: for the others it would be an exact
        # no-op (a masked split leaves (m, l, acc) bit for bit).
        rows = torch.nonzero((firsts <= c) & (c <= lasts)).flatten()
        if rows.numel() == 0:
            continue
        idx = off[rows, None] + c * S + torch.arange(S)[None, :]  # [r, S]
        visible = (idx >= lo[rows, None]) & (idx <= pos[rows, None])
        if plan.window_aligned:
            safe_idx = idx.clamp(0, L - 1)
            kc, vc = k[safe_idx], v[safe_idx]  # [r, S, Hkv, D]
        else:  # absolute splits: the same keys for every row
            kc, vc = k[c * S:(c + 1) * S][None], v[c * S:(c + 1) * S][None]
            visible = visible[:, : kc.shape[1]]
        s = (qg[rows, None] * kc[:, :, :, None, :]).sum(-1) * scale  # [r, S, Hkv, G]
        raw = s.masked_fill(~visible[:, :, None, None], float("-inf"))
        if plan.softcap > 0:
            s = plan.softcap * plan.tanh(s / plan.softcap)
        s = s.masked_fill(~visible[:, :, None, None], float("-inf"))
        mc = (raw if plan.cap_after_max else s).amax(1)
        mr, lr = m[rows], l[rows]
        m_new = torch.maximum(mr, mc)
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(mr - safe)
        p = torch.exp(s - safe[:, None])
        lr = alpha * lr + p.sum(1)
        if plan.sink_per_split and sink is not None:  # one sink per split
            lr = lr + torch.exp(sink[rows] - safe)
        acc[rows] = alpha[..., None] * acc[rows] + (p[..., None] * vc[:, :, :, None, :]).sum(1)
        m[rows], l[rows] = m_new, lr
    if sink is not None and not plan.sink_first and not plan.sink_per_split:
        m, l, acc = fold_sink(m, l, acc)
    out = torch.where(l[..., None] > 0, acc / l[..., None], torch.zeros_like(acc))
    lse = torch.where(l > 0, m + torch.log(l), torch.full_like(l, float("-inf")))
    return out.reshape(n, Hq, D), lse.reshape(n, Hq)


#: Every feature (the planted backends take them all).
ALL_FEATURES = frozenset({"window", "sinks", "softcap", "fp8_kv", "fp8_kv_head"})


@dataclass
class FeaturePlanted:
    """Split-KV float32 attention with the features (window, sinks, soft-cap, FP8
    dequantization), invariant by construction; ``defect`` names a planted bug ("" = none).

    ``split``: tokens per split; ``sink_first``: the sink folded before the splits;
    ``window_aligned``: splits start at each row's window start; ``reverse``: splits folded
    last to first. Each is a different fixed arithmetic: still invariant."""

    defect: str = ""
    split: int = 32
    sink_first: bool = False
    window_aligned: bool = False
    reverse: bool = False
    capabilities: Capabilities = field(
        default_factory=lambda: Capabilities(features=ALL_FEATURES), repr=False)

    def __call__(self, batch: AttentionBatch) -> AttentionResult:
        d = self.defect
        f = _facts(batch)
        out = torch.zeros_like(batch.q)
        lse = torch.full((batch.num_tokens, batch.num_q_heads), float("-inf"))
        cu = batch.cu_seqlens_q.tolist()
        kv_lens = batch.kv_lens.tolist()
        w = batch.window_left
        P = batch.page_size
        k_scale, v_scale = batch.k_scale, batch.v_scale
        if d == "fp8_scale_from_batch" and batch.kv_fp8:  # "calibrated" on the batch's pages
            pages = torch.cat([batch.block_table[b, : -(-n // P)] for b, n in enumerate(kv_lens)
                               if n]).long()
            amax = float(batch.k_cache[pages].float().abs().nan_to_num(0.0).max())
            k_scale = _dequant(torch.ones(1, batch.num_kv_heads, 1), k_scale)[0, :, 0] * (
                amax / 448.0)
        for b in range(batch.batch_size):
            lo, hi = cu[b], cu[b + 1]
            if hi == lo:
                continue
            kq, vq = _gather_raw(batch, b)
            slot = b if d == "fp8_scale_slot" else None
            k = _dequant(kq, k_scale, slot)
            v = _dequant(vq, v_scale, slot)
            pos = torch.arange(kv_lens[b] - (hi - lo), kv_lens[b])
            plan = _Plan(self.split, w, batch.sinks, float(batch.logits_soft_cap),
                         self.sink_first, self.window_aligned, self.reverse)
            if d == "window_edge_batch" and w >= 0:  # the longest row's edge for every row
                plan.edge = max(0, f["max_kv"] - 1 - w)
            if d == "window_skip_from_batch" and w >= 0:  # splits before the longest row's
                plan.first_split = max(0, f["max_kv"] - 1 - w) // self.split
            if d == "window_drops_fixed_split" and w >= 0:  # the heuristic split with a window
                plan.split = self.split // 2 if f["B"] >= 3 else self.split
            if d == "sink_per_split":
                plan.sink_per_split = True
            if d == "sink_decode_only" and f["prefills"] == 0:  # decode path without sinks
                plan.sinks = None
            if d == "softcap_after_max":
                plan.cap_after_max = True
            if d == "softcap_fast_tanh" and f["B"] >= 3:
                plan.tanh = _fast_tanh
            o, s = _attend_features(batch.q[lo:hi], pos, k, v, batch.sm_scale, plan)
            out[lo:hi] = o.to(batch.dtype)
            lse[lo:hi] = s
        return AttentionResult(out, lse)


def _gather_raw(batch: AttentionBatch, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V ``[kv_len, Hkv, D]`` of request ``b`` in the cache's dtype."""
    P = batch.page_size
    n = int(batch.kv_lens[b])
    pages = batch.block_table[b, : -(-n // P)].long()
    k = batch.k_cache[pages].reshape(-1, batch.num_kv_heads, batch.head_dim)[:n]
    v = batch.v_cache[pages].reshape(-1, batch.num_kv_heads, batch.head_dim)[:n]
    return k, v


#: The check settings each feature defect runs under.
WINDOW = {"features": {"window": 48}}
SINKS = {"features": {"sinks": True}}
SOFTCAP = {"features": {"softcap": 30.0}}
FP8 = {"kv_dtype": "fp8_e4m3"}
FP8_HEAD = {"kv_dtype": "fp8_e4m3", "features": {"kv_scale": "head"}}
#: Every feature at once (the fixed variants): the issue's window 128 at the small scale.
ALL = {"features": {"window": 128, "sinks": True, "softcap": 50.0, "kv_scale": "head"},
       "kv_dtype": "fp8_e4m3"}

#: Planted feature defect -> (one line on the class of bug, the check settings it runs under).
FEATURE_DEFECTS: dict[str, tuple[str, dict[str, object]]] = {
    "window_edge_batch": ("the window edge computed from the batch's longest row", WINDOW),
    "window_skip_from_batch": ("whole splits skipped before the batch's longest row's window "
                               "(its split index, not the row's)", WINDOW),
    "window_drops_fixed_split": ("with a window the split size comes from the batch (the "
                                 "sliding-window path dropped its fixed split)", WINDOW),
    "sink_per_split": ("the sink added once per split instead of once per row", SINKS),
    "sink_decode_only": ("sinks ignored in decode-only batches (a decode path without them)",
                         SINKS),
    "softcap_after_max": ("the soft-cap applied after the max: rows rescale by the uncapped "
                          "max", SOFTCAP),
    "softcap_fast_tanh": ("batches of 3 or more compute the soft-cap's tanh another way",
                          SOFTCAP),
    "fp8_scale_from_batch": ("the FP8 K scale recalibrated from the batch's pages (max |k| "
                             "mapped to 448)", FP8),
    "fp8_scale_slot": ("per-head FP8 scales indexed by batch slot instead of KV head",
                       FP8_HEAD),
}

#: Different but fixed variants with every feature: invariant and accurate, they must pass.
FEATURE_FIXED: dict[str, tuple[Callable[[], FeaturePlanted], dict[str, object]]] = {
    "features_split32": (lambda: FeaturePlanted(), ALL),
    "features_window_aligned_splits": (lambda: FeaturePlanted(window_aligned=True), ALL),
    "features_sink_first_split16": (lambda: FeaturePlanted(split=16, sink_first=True),
                                    {"features": {"window": 64, "sinks": True, "softcap": 20.0},
                                     "kv_dtype": "fp8_e4m3"}),
    "features_reverse_window0": (lambda: FeaturePlanted(reverse=True),
                                 {"features": {"window": 0, "sinks": True, "softcap": 5.0}}),
}
