"""Tiny models for the tests of ``invariance model``, with planted batch-variant ops.

Plain torch only (the transformers-based ones build on ``invariance.model.loading``). The
invariant building blocks compute every row on its own, with shapes that depend on that row
alone, so no batch property reaches their arithmetic:

- :class:`RowwiseLinear`: ``(x.unsqueeze(-2) * W).sum(-1)``, a reduction along each row's own K
  elements. ``torch.nn.functional.linear`` is not used: on a CPU, MKL's GEMM gives a row other
  bits at other M (measured here: float32 and float64 rows differ between M = 1, 2 and >= 3).
- :class:`TinyLM`: attention one query row at a time over exactly the keys it sees.

The planted defects (each one op, at a known module path):

- :class:`BatchVariantLinear`: splits its K reduction in two once the call has more rows than
  ``alone_rows`` (split-K chosen from M, as a GEMM library does);
- :class:`BatchStatNorm`: subtracts the mean over the whole batch (batch statistics);
- ``TinyLM(planted_decode=layer)``: that layer's attention sums over the keys in two halves when
  it decodes (cached keys) in a batch of more than one request: only a KV-cache path has it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

VOCAB, HIDDEN, HEADS = 64, 32, 2


class RowwiseLinear(nn.Linear):
    """A Linear whose every output row is reduced over its own K in a fixed order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (x.unsqueeze(-2) * self.weight).sum(-1)
        return y + self.bias if self.bias is not None else y


class BatchVariantLinear(RowwiseLinear):
    """PLANTED: split-K once the call has more than ``alone_rows`` rows."""

    def __init__(self, *args: object, alone_rows: int = 8, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.alone_rows = alone_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows <= self.alone_rows:
            return super().forward(x)
        h = x.shape[-1] // 2
        prod = x.unsqueeze(-2) * self.weight
        y = prod[..., :h].sum(-1) + prod[..., h:].sum(-1)
        return y + self.bias if self.bias is not None else y


class BatchStatNorm(nn.Module):
    """PLANTED: centres every row on the mean of all rows of the batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        return x - flat.mean(0, keepdim=True).reshape(*[1] * (x.dim() - 1), x.shape[-1])


class RMSNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class KVCache:
    """Per layer: keys and values ``[B, Lk, H, D]`` so far (not a tensor: never compared)."""

    def __init__(self) -> None:
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


@dataclass
class LMOutput:
    logits: torch.Tensor
    past_key_values: KVCache | None = None


class Attention(nn.Module):
    def __init__(self, index: int, causal: bool, planted_decode: bool) -> None:
        super().__init__()
        self.index, self.causal, self.planted_decode = index, causal, planted_decode
        self.q, self.k, self.v, self.o = (RowwiseLinear(HIDDEN, HIDDEN) for _ in range(4))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        B, L, _ = x.shape
        d = HIDDEN // HEADS
        q, k, v = (f(x).view(B, L, HEADS, d) for f in (self.q, self.k, self.v))
        cached = 0
        if cache is not None:
            if self.index in cache.layers:
                pk, pv = cache.layers[self.index]
                cached = pk.shape[1]
                k, v = torch.cat([pk, k], 1), torch.cat([pv, v], 1)
            cache.layers[self.index] = (k, v)
        Lk = k.shape[1]
        out = torch.zeros(B, L, HEADS, d, dtype=x.dtype, device=x.device)
        valid = mask.bool().tolist()
        for b in range(B):
            for i in range(L):
                pos = Lk - L + i
                if not valid[b][pos]:
                    continue
                keys = [j for j in range(Lk) if valid[b][j] and (j <= pos or not self.causal)]
                idx = torch.tensor(keys, device=x.device)
                kk, vv = k[b].index_select(0, idx), v[b].index_select(0, idx)
                p = torch.softmax((q[b, i] * kk).sum(-1) * d ** -0.5, dim=0)  # [kv, H]
                terms = p.unsqueeze(-1) * vv  # [kv, H, d]
                if self.planted_decode and cached > 0 and B > 1 and len(keys) > 1:
                    half = len(keys) // 2
                    out[b, i] = terms[:half].sum(0) + terms[half:].sum(0)
                else:
                    out[b, i] = terms.sum(0)
        return self.o(out.reshape(B, L, HIDDEN))


class Block(nn.Module):
    def __init__(self, index: int, causal: bool, planted_decode: bool) -> None:
        super().__init__()
        self.norm1 = RMSNorm(HIDDEN)
        self.attn = Attention(index, causal, planted_decode)
        self.norm2 = RMSNorm(HIDDEN)
        self.mlp = nn.Sequential(RowwiseLinear(HIDDEN, 2 * HIDDEN), nn.SiLU(),
                                 RowwiseLinear(2 * HIDDEN, HIDDEN))

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), mask, cache)
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """A tiny decoder (or encoder, ``causal=False``) with a KV cache, invariant by
    construction; ``planted_decode`` names the layer whose attention carries the decode defect."""

    def __init__(self, layers: int = 3, causal: bool = True,
                 planted_decode: int | None = None) -> None:
        super().__init__()
        self.causal = causal
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.positions = nn.Embedding(64, HIDDEN)
        self.layers = nn.ModuleList(Block(i, causal, i == planted_decode) for i in range(layers))
        self.norm = RMSNorm(HIDDEN)
        self.head = RowwiseLinear(HIDDEN, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                past_key_values: KVCache | None = None, use_cache: bool = False) -> LMOutput:
        B, L = input_ids.shape
        cache = past_key_values if past_key_values is not None else (
            KVCache() if use_cache and self.causal else None)
        cached = cache.layers[0][0].shape[1] if cache is not None and cache.layers else 0
        if attention_mask is None:
            attention_mask = torch.ones(B, cached + L, dtype=torch.long)
        if position_ids is None:
            position_ids = torch.arange(cached, cached + L).expand(B, L)
        x = self.embed(input_ids) + self.positions(position_ids)
        for layer in self.layers:
            x = layer(x, attention_mask, cache)
        return LMOutput(self.head(self.norm(x)), cache if use_cache else None)


# --- builders (module:attr targets of the tests and the CLI) ---------------------------------

def invariant_lm() -> TinyLM:
    """The control: every scenario must pass."""
    return TinyLM()


def planted_linear_lm() -> TinyLM:
    """PLANTED at ``layers.1.mlp.0``: split-K once a call has more rows than the request alone
    (8 tokens)."""
    model = TinyLM()
    old = model.layers[1].mlp[0]
    new = BatchVariantLinear(HIDDEN, 2 * HIDDEN, alone_rows=8)
    new.load_state_dict(old.state_dict())
    model.layers[1].mlp[0] = new
    return model


def planted_norm_lm() -> TinyLM:
    """PLANTED at ``layers.2.norm2``: batch statistics."""
    model = TinyLM()
    model.layers[2].norm2 = BatchStatNorm()  # type: ignore[assignment]
    return model


def planted_decode_lm() -> TinyLM:
    """PLANTED in ``layers.1.attn``: another key summation when decoding in a batch."""
    return TinyLM(planted_decode=1)


def invariant_encoder() -> TinyLM:
    """A bidirectional encoder without a KV cache (decode scenarios are skipped)."""
    return TinyLM(causal=False)


def rows_model(planted: bool = False) -> nn.Sequential:
    """A plain ``nn.Sequential`` over one feature row per request; ``planted``: a batch-statistic
    norm at index 2."""
    return nn.Sequential(RowwiseLinear(16, 32), nn.ReLU(),
                         BatchStatNorm() if planted else nn.Identity(), RowwiseLinear(32, 8))


def planted_rows_model() -> nn.Sequential:
    return rows_model(planted=True)


# --- transformers-based (need transformers) --------------------------------------------------

def rowwise(model: nn.Module) -> nn.Module:
    """``model`` with every ``nn.Linear`` replaced by a :class:`RowwiseLinear` of the same
    weights (the CPU GEMM's M-dependence removed)."""
    for _, module in list(model.named_modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                new = RowwiseLinear(child.in_features, child.out_features,
                                    bias=child.bias is not None)
                new.load_state_dict(child.state_dict())
                setattr(module, name, new)
    return model


def hf_invariant_llama() -> nn.Module:
    """The shipped tiny Llama with row-wise Linears: invariant once its attention is too
    (``attention="reference"`` or ``"kernels"``)."""
    from invariance.model.loading import load_model

    return rowwise(load_model("llama").module)


def hf_planted_llama() -> nn.Module:
    """:func:`hf_invariant_llama` with the planted split-K Linear at
    ``model.layers.1.mlp.down_proj``."""
    model = hf_invariant_llama()
    mlp = model.model.layers[1].mlp  # type: ignore[union-attr, index]
    old = mlp.down_proj
    new = BatchVariantLinear(old.in_features, old.out_features, bias=False, alone_rows=8)
    new.load_state_dict(old.state_dict())
    mlp.down_proj = new
    return model
