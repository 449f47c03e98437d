"""Requests and their token content.

A request's q/k/v content is a pure function of ``(seed, request id, token index, head config,
dtype)`` and the workload's :class:`~invariance.features.Features`: it is computed from a
counter-based hash of those values, never from a stateful random generator, so a token has the
same bits whichever batch, step, position or page it lands in. (The
float32 Box-Muller transform runs on the device the content is made on; CPU and GPU may differ in
its last bit, so compare schedules on one device.)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

import torch

from _invariance_options import DTYPE_NAMES, canonical_dtype
from invariance.features import FP8_MAX, KV_DTYPES, Features, sink_values

__all__ = [
    "DTYPES",
    "FAMILIES",
    "HeadConfig",
    "Request",
    "Workload",
    "parse_dtype",
    "token_content",
]

#: The dtypes the toolkit knows, by their public names.
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}

Kind = Literal["q", "k", "v"]
_KIND_CODE = {"q": 1, "k": 2, "v": 3}
_MASK32 = 0xFFFFFFFF


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """Return the torch dtype for ``dtype``: a torch dtype, a public name or an alias (the one
    table of names and aliases is ``_invariance_options.DTYPE_ALIASES``)."""
    if isinstance(dtype, torch.dtype) and dtype not in DTYPES.values():
        raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype}")
    if not isinstance(dtype, (torch.dtype, str)):
        raise ValueError(f"dtype: expected a torch.dtype or one of {', '.join(DTYPES)}, got "
                         f"{dtype!r}")
    return DTYPES[canonical_dtype(dtype)]


def dtype_name(dtype: torch.dtype) -> str:
    """The public name of ``dtype`` (``"float16"``, ``"bfloat16"``, ``"float32"``)."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class HeadConfig:
    """Attention head configuration: ``num_q_heads`` query heads sharing ``num_kv_heads`` KV heads
    (GQA when they differ), each of size ``head_dim``."""

    num_q_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64

    def __post_init__(self) -> None:
        for name in ("num_q_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"HeadConfig.{name}: expected a positive int, got {value!r}")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(
                "HeadConfig: expected num_q_heads to be a multiple of num_kv_heads, got "
                f"num_q_heads={self.num_q_heads}, num_kv_heads={self.num_kv_heads}"
            )

    @classmethod
    def parse(cls, text: str) -> HeadConfig:
        """Parse ``"Hq:Hkv:D"`` (e.g. ``"32:8:128"``)."""
        parts = text.split(":") if isinstance(text, str) else []
        if len(parts) != 3 or not all(re.fullmatch(r"\s*[0-9]+\s*", p) for p in parts):
            raise ValueError(f"heads: expected 'Hq:Hkv:D' with positive integers, got {text!r}")
        hq, hkv, d = (int(p) for p in parts)
        return cls(hq, hkv, d)

    def __str__(self) -> str:
        return f"{self.num_q_heads}:{self.num_kv_heads}:{self.head_dim}"


#: Token-content families. ``gaussian``: standard normal. ``zeros``: V exactly zero (outputs are
#: exact zeros, so a sign-of-zero flip shows) and every third query zero (uniform attention).
#: ``ties``: keys repeat in groups of four tokens (ties in the row max). ``large``: q and k scaled
#: by 8 (scores of magnitude ~100, stressing the rescale). ``alternating``: signs alternate with
#: (token + head + dim).
FAMILIES: tuple[str, ...] = ("gaussian", "zeros", "ties", "large", "alternating")


@dataclass(frozen=True)
class Request:
    """One request: ``length`` tokens whose content is derived from the workload seed and ``id``.

    Padding requests (dummy requests a server adds to fill a batch or a CUDA graph) are requests
    too; their outputs are never compared. ``family`` picks the content family
    (:data:`FAMILIES`). ``prefix = (parent_id, n)`` makes tokens ``[0, n)`` the parent's tokens
    (a shared prompt prefix, as a prefix cache serves it).
    """

    id: int
    length: int
    padding: bool = False
    family: str = "gaussian"
    prefix: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.id, bool) or not isinstance(self.id, int) or self.id < 0:
            raise ValueError(f"Request.id: expected a non-negative int, got {self.id!r}")
        if isinstance(self.length, bool) or not isinstance(self.length, int) or self.length < 0:
            raise ValueError(
                f"Request.length: expected a non-negative int, got {self.length!r}"
            )
        if self.family not in FAMILIES:
            raise ValueError(f"Request.family: expected one of {', '.join(FAMILIES)}, got "
                             f"{self.family!r}")
        if self.prefix is not None:
            parent, n = self.prefix
            if parent == self.id or not 0 <= n <= self.length:
                raise ValueError(f"Request.prefix: expected (another request's id, n <= "
                                 f"length={self.length}), got {self.prefix!r}")


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply rounds) on int64 tensors holding uint32 values.

    Multipliers are below 2**31 so products stay below 2**63: exact in int64 on every device.
    """
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x297A2D39) & _MASK32
    return x ^ (x >> 15)


def _scalar_mix(x: int) -> int:
    """:func:`_mix` of one value, in Python integers (same result, no tensor round trip)."""
    x &= _MASK32
    for shift, mult in ((16, 0x7FEB352D), (15, 0x2C1B3C6D), (16, 0x297A2D39)):
        x = ((x ^ (x >> shift)) * mult) & _MASK32
    return x ^ (x >> 15)


def token_content(
    seed: int,
    request_id: int,
    kind: Kind,
    start: int,
    stop: int,
    num_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    family: str = "gaussian",
    *,
    large: float = 8.0,
    fp8: bool = False,
) -> torch.Tensor:
    """Content of tokens ``[start, stop)`` of a request, ``[stop - start, num_heads, head_dim]``.

    Values are standard normal (Box-Muller over two hashed uniforms) computed in float32, shaped
    by the content ``family`` (:data:`FAMILIES`; ``large`` is the ``large`` family's factor of q
    and k) and rounded to ``dtype``. Element ``(t, h, d)`` depends only on ``(seed, request_id,
    kind, t, h, d, num_heads, head_dim, dtype, family, large, fp8)``.

    ``fp8`` (K and V of an FP8 cache): each element is multiplied by ``2**e``, ``e`` uniform in
    ``[-10, 7)`` from the low byte of its first hash, clamped to ``±448`` and rounded to
    ``float8_e4m3fn`` (round to nearest even): the stored values span the format, zeros (about
    7%) and subnormals (``< 2**-6``, about 23%) to its top binade (``[256, 448]``, about one
    element in 2000; saturation about one in 10^6), so the largest value of a page or a batch
    varies with the tokens in it. The result is a ``float8_e4m3fn`` tensor whatever ``dtype``
    is.
    """
    raw = _raw_content(seed, request_id, kind, start, stop, num_heads, head_dim, device, family,
                       large, fp8 and kind in ("k", "v"))
    if fp8 and kind in ("k", "v"):
        return raw.clamp(-FP8_MAX, FP8_MAX).to(KV_DTYPES["fp8_e4m3"])
    return raw.to(dtype)


def _raw_content(seed: int, request_id: int, kind: Kind, start: int, stop: int, num_heads: int,
                 head_dim: int, device: torch.device | str, family: str, large: float,
                 spread: bool) -> torch.Tensor:
    """:func:`token_content` in float32 before its final rounding (``spread``: the FP8
    exponents applied)."""
    if stop < start:
        raise ValueError(f"token range: expected start <= stop, got [{start}, {stop})")
    n = (stop - start) * num_heads * head_dim
    key = _scalar_mix(
        _scalar_mix(seed) ^ _scalar_mix(request_id * 4 + _KIND_CODE[kind])
        ^ _scalar_mix(num_heads * 4096 + head_dim)
    )
    if family == "ties" and kind == "k":  # groups of four identical keys
        first = (start // 4) * 4
        grouped = _raw_content(seed, request_id, kind, first // 4, (stop + 3) // 4, num_heads,
                               head_dim, device, "gaussian", large, spread)
        return grouped.repeat_interleave(4, dim=0)[start - first:stop - first]
    idx = torch.arange(n, dtype=torch.int64, device=device) + start * num_heads * head_dim
    # Two independent 32-bit hashes per element -> two uniforms in (0, 1).
    h1 = _mix((idx * 2 + key) & _MASK32 ^ (idx >> 31))
    h2 = _mix((idx * 2 + 1 + key) & _MASK32 ^ (idx >> 31))
    u1 = ((h1 >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    u2 = ((h2 >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    normal = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos((2.0 * math.pi) * u2)
    if spread:  # FP8: magnitudes spread over the format's range (the low byte of h1 is unused)
        normal = normal * torch.exp2((h1 & 0xFF).to(torch.float32) * (17.0 / 256.0) - 10.0)
    x = normal.view(stop - start, num_heads, head_dim)
    return _shape(x, family, kind, start, large)


def _shape(x: torch.Tensor, family: str, kind: Kind, start: int,
           large: float = 8.0) -> torch.Tensor:
    """Apply a content family to standard-normal content ``x`` of tokens from ``start``."""
    if family == "zeros":
        if kind == "v":
            return torch.zeros_like(x)
        if kind == "q":
            t = torch.arange(start, start + x.shape[0], device=x.device)
            return torch.where((t % 3 == 0)[:, None, None], torch.zeros_like(x), x)
    elif family == "large" and kind in ("q", "k"):
        return x * large
    elif family == "alternating":
        t = torch.arange(start, start + x.shape[0], device=x.device)[:, None, None]
        h = torch.arange(x.shape[1], device=x.device)[None, :, None]
        d = torch.arange(x.shape[2], device=x.device)[None, None, :]
        sign = 1.0 - 2.0 * ((t + h + d) % 2).to(x.dtype)
        return x.abs() * sign
    return x


@dataclass(frozen=True)
class Workload:
    """The requests of one experiment and what their tokens contain.

    ``requests`` lists every request a schedule may touch (padding requests included). The content
    of request ``r``'s token ``t`` is :func:`token_content` of ``(seed, r.id, kind, t)``.
    ``features`` (:class:`~invariance.features.Features`) sets the attention features of every
    batch of the workload and shapes its content (the ``large`` family's factor, FP8 K/V).
    """

    requests: tuple[Request, ...]
    heads: HeadConfig = field(default_factory=HeadConfig)
    dtype: torch.dtype = torch.float32
    seed: int = 0
    features: Features = field(default_factory=Features)

    _by_id: dict[int, Request] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ids = [r.id for r in self.requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"Workload.requests: expected unique ids, got {ids}")
        parse_dtype(self.dtype)
        if not isinstance(self.features, Features):
            raise ValueError(f"Workload.features: expected an invariance.Features, got "
                             f"{type(self.features).__name__}")
        if self.features.kv_dtype is not None and self.dtype not in (torch.float16,
                                                                     torch.bfloat16):
            raise ValueError(f"Workload.dtype: expected float16 or bfloat16 with an FP8 KV "
                             f"cache (kv_dtype {self.features.kv_dtype}), got "
                             f"{dtype_name(self.dtype)}")
        object.__setattr__(self, "_by_id", {r.id: r for r in self.requests})

    def request(self, request_id: int) -> Request:
        """The request with id ``request_id``."""
        try:
            return self._by_id[request_id]
        except KeyError:
            raise KeyError(f"request {request_id} is not in this workload") from None

    def content(
        self, request_id: int, kind: Kind, start: int, stop: int, device: torch.device | str
    ) -> torch.Tensor:
        """Tokens ``[start, stop)`` of request ``request_id``: ``[n, H, D]`` in the workload dtype
        (``H`` = query heads for ``"q"``, KV heads for ``"k"``/``"v"``)."""
        req = self.request(request_id)
        if stop > req.length:
            raise ValueError(
                f"request {request_id}: token range [{start}, {stop}) exceeds its length "
                f"{req.length}"
            )
        if req.prefix is not None and start < req.prefix[1]:
            parent, n = req.prefix  # tokens [0, n) are the parent's
            head = self.content(parent, kind, start, min(stop, n), device)
            if stop <= n:
                return head
            return torch.cat([head, self.content(request_id, kind, n, stop, device)])
        heads = self.heads.num_q_heads if kind == "q" else self.heads.num_kv_heads
        return token_content(
            self.seed, request_id, kind, start, stop, heads, self.heads.head_dim, self.dtype,
            device, req.family, large=self.features.large_scale,
            fp8=self.features.kv_dtype is not None,
        )

    def origin(self, request_id: int, token: int) -> tuple[int, int]:
        """The ``(request, token)`` whose row ``(request_id, token)`` is: itself, or for a token
        inside a shared prompt prefix (``Request.prefix``) the prompt's owner's, followed to the
        first request that owns it. Two rows of the same origin read the same query and the
        same keys and values at the same positions: an invariant backend gives them the same
        bits, in any call."""
        rid = request_id
        for _ in range(len(self.requests)):
            prefix = self.request(rid).prefix
            if prefix is None or token >= prefix[1]:
                break
            rid = prefix[0]
        return rid, token

    @property
    def kv_dtype(self) -> torch.dtype:
        """The dtype of the K/V cache: ``float8_e4m3fn`` with an FP8 cache, else ``dtype``."""
        return self.features.cache_dtype(self.dtype)

    def sinks(self, device: torch.device | str) -> torch.Tensor | None:
        """The batch's ``sinks``: ``[Hq]`` float32 (:func:`~invariance.features.sink_values`
        of the workload seed), or ``None`` without sinks."""
        if not self.features.sinks:
            return None
        return torch.tensor(sink_values(self.seed, self.heads.num_q_heads),
                            dtype=torch.float32, device=device)

    def kv_scale(self, kind: Literal["k", "v"],
                 device: torch.device | str) -> float | torch.Tensor | None:
        """The batch's ``k_scale`` / ``v_scale``: ``None`` without an FP8 cache; a float with
        per-tensor scales; ``[Hkv]`` float32 with per-head ones
        (:meth:`~invariance.features.Features.kv_scale_values`)."""
        if self.features.kv_dtype is None:
            return None
        values = self.features.kv_scale_values(kind, self.heads.num_kv_heads)
        if self.features.kv_scale == "tensor":
            return values[0]
        return torch.tensor(values, dtype=torch.float32, device=device)

    def dequantized(self, request_id: int, kind: Literal["k", "v"], start: int, stop: int,
                    device: torch.device | str) -> torch.Tensor:
        """K or V of tokens ``[start, stop)`` as the attention sees them, in float64: the
        content dequantized with its scales (exact in float64) for an FP8 cache, else the
        content itself."""
        x = self.content(request_id, kind, start, stop, device).to(torch.float64)
        if self.features.kv_dtype is None:
            return x
        scales = self.features.kv_scale_values(kind, self.heads.num_kv_heads)
        return x * torch.tensor(scales, dtype=torch.float64, device=x.device)[None, :, None]

    @property
    def sm_scale(self) -> float:
        """The softmax scale, ``1 / sqrt(head_dim)``."""
        return 1.0 / math.sqrt(self.heads.head_dim)
