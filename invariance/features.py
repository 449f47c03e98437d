"""Attention features a check can turn on: a sliding window, attention sinks, logit
soft-capping and an FP8 KV cache (the numerics are in :class:`invariance.AttentionBatch`'s
docstring; the float64 reference implements them in ``backends/reference.py``).

A :class:`Features` is part of a :class:`~invariance.Workload`: it decides the feature fields of
every batch materialised from it (``window_left``, ``sinks``, ``logits_soft_cap``, the cache dtype
and ``k_scale`` / ``v_scale``) and shapes the token content so that each feature bites:

- **window**: nothing in the content; :meth:`invariance.Scale.for_window` makes requests longer
  than the window, so rows on both sides of the window edge are compared in every perturbation;
- **sinks**: one logit per query head, :func:`sink_values`, a function of the seed and the head
  count alone: some heads' sinks dominate every row's scores, some are negligible, some sit in
  between (:data:`SINK_LADDER`);
- **softcap**: the ``large`` content family's q and k grow by :meth:`Features.large_scale`, so
  its scores reach several times the cap (tanh saturates);
- **FP8 KV**: K and V are stored as ``float8_e4m3fn`` values spanning the format (zeros and
  subnormals to its top binade, :func:`invariance.workload.token_content`) and dequantized
  with fixed scales,
  :meth:`Features.kv_scale_values`: constants per KV head, a function of the settings alone,
  never of a batch.

Backends declare the features they take in :class:`~invariance.Capabilities` (``features``, by
the names of :data:`FEATURE_NAMES`); asking a backend for one it lacks is a usage error before
anything runs.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from _invariance_options import (
    FEATURE_KEYS,
    OptionError,
    canonical_kv_dtype,
    feature_settings,
)

__all__ = [
    "FEATURE_NAMES",
    "FP8_MAX",
    "KV_DTYPES",
    "SINK_LADDER",
    "Features",
    "f32",
    "sink_values",
]

#: Capability names (``Capabilities.features``): ``window`` (``window_left >= 0``), ``sinks``,
#: ``softcap``, ``fp8_kv`` (an ``float8_e4m3fn`` cache with per-tensor float scales),
#: ``fp8_kv_head`` (the same with per-KV-head scale tensors).
FEATURE_NAMES: tuple[str, ...] = ("window", "sinks", "softcap", "fp8_kv", "fp8_kv_head")

#: KV cache dtypes by public name (``--kv-dtype``).
KV_DTYPES: dict[str, torch.dtype] = {"fp8_e4m3": torch.float8_e4m3fn}

#: The largest finite ``float8_e4m3fn`` value.
FP8_MAX = 448.0

#: Sink logits (natural-log units, like the scores ``sm_scale * q·k``) the heads cycle through:
#: far below any row's scores (negligible), comparable to short rows' log-sum-exp, above the
#: log-sum-exp of every ``gaussian`` row (dominant: the row's max is the sink) and far above
#: (the sink takes nearly all the mass). :func:`sink_values` rotates and jitters them.
SINK_LADDER: tuple[float, ...] = (-12.0, 1.5, 9.0, 24.0, 4.0)

#: Base dequantization scales of the FP8 cache (rounded to float32). Not powers of two, so the
#: product ``fp8 * scale`` rounds in float32 and where a kernel applies the scale shows; chosen
#: so that the dequantized K has a root-mean-square near 1 (V near 2; the stored values' is
#: about 26, ``invariance.workload.token_content``).
_K_SCALE, _V_SCALE = 0.0391, 0.0713


def f32(x: float) -> float:
    """``x`` rounded to the nearest float32 (as a Python float)."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _mix(x: int) -> int:
    """A 32-bit integer hash (xorshift-multiply rounds), as in :mod:`invariance.workload`."""
    x &= 0xFFFFFFFF
    for shift, mult in ((16, 0x7FEB352D), (15, 0x2C1B3C6D), (16, 0x297A2D39)):
        x = ((x ^ (x >> shift)) * mult) & 0xFFFFFFFF
    return x ^ (x >> 15)


def sink_values(seed: int, num_q_heads: int) -> list[float]:
    """The attention-sink logit of each query head (float32 values): :data:`SINK_LADDER`
    rotated by the seed, each entry moved by a jitter in ``[-0.5, 0.5)``, both from a hash of
    ``(seed, head)``. A function of the seed and the head count alone, never of a batch."""
    rotation = _mix(seed ^ 0x5117) % len(SINK_LADDER)
    out = []
    for h in range(num_q_heads):
        jitter = (_mix(_mix(seed) ^ (h * 0x9E3779B1 + 0x51)) >> 8) / float(1 << 24) - 0.5
        out.append(f32(SINK_LADDER[(h + rotation) % len(SINK_LADDER)] + jitter))
    return out


def _check(field: str, ok: bool, expected: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{field}: expected {expected}, got {value!r}")


@dataclass(frozen=True)
class Features:
    """The attention features of a check (all off by default).

    - ``window``: ``window_left`` (an int >= 0): a query at absolute position ``p`` sees keys
      ``[max(0, p - window), p]``; ``None``: no window.
    - ``sinks``: every query head has an attention-sink logit (:func:`sink_values`).
    - ``softcap``: scores become ``softcap * tanh(s / softcap)`` (``s = sm_scale * q·k``)
      before the softmax; ``None``: off.
    - ``kv_dtype``: ``"fp8_e4m3"`` stores K and V as ``float8_e4m3fn`` (queries float16 or
      bfloat16); ``None``: the query dtype.
    - ``kv_scale``: the FP8 dequantization scales, ``"tensor"`` (one float per cache) or
      ``"head"`` (a float32 tensor, one per KV head). Only with ``kv_dtype``.
    """

    window: int | None = None
    sinks: bool = False
    softcap: float | None = None
    kv_dtype: str | None = None
    kv_scale: Literal["tensor", "head"] = "tensor"

    def __post_init__(self) -> None:
        w = self.window
        _check("features.window", w is None or (isinstance(w, int) and not isinstance(w, bool)
                                                and w >= 0), "None or an int >= 0", w)
        _check("features.sinks", isinstance(self.sinks, bool), "True or False", self.sinks)
        c = self.softcap
        _check("features.softcap", c is None or (
            isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c)
            and c > 0), "None or a finite float > 0", c)
        _check("kv_dtype", self.kv_dtype is None or self.kv_dtype in KV_DTYPES,
               f"None or one of {', '.join(KV_DTYPES)}", self.kv_dtype)
        _check("features.kv_scale", self.kv_scale in ("tensor", "head"), "'tensor' or 'head'",
               self.kv_scale)
        if self.kv_scale == "head" and self.kv_dtype is None:
            raise ValueError("features.kv_scale: expected 'tensor' (the default) without an "
                             "FP8 KV cache (kv_dtype), got 'head'")

    # --- building -------------------------------------------------------------------------
    @classmethod
    def build(cls, features: object = None, kv_dtype: object = None) -> Features:
        """Features from the forms :func:`invariance.check` takes: ``features`` a
        :class:`Features`, a dict (``{"window": 128, "sinks": True, "softcap": 50.0,
        "kv_scale": "head"}``), ``KEY[=VALUE]`` strings (``["window=128", "sinks"]``) or
        ``None``; ``kv_dtype`` ``"fp8_e4m3"`` (or an alias) or ``None``. ``ValueError`` naming
        the setting, the expected and the actual value otherwise."""
        try:
            kv = None if kv_dtype is None else canonical_kv_dtype(kv_dtype)
            if isinstance(features, Features):
                if kv is not None and features.kv_dtype not in (None, kv):
                    raise ValueError(f"kv_dtype: expected {features.kv_dtype!r} (the "
                                     f"Features' own), got {kv!r}")
                return features if kv is None else cls(**{**features.to_dict(), "kv_dtype": kv})
            values: dict[str, Any] = {} if features is None else dict(feature_settings(features))
        except OptionError as exc:
            raise ValueError(str(exc)) from None
        return cls(kv_dtype=kv, **values)

    def to_dict(self) -> dict[str, Any]:
        """The features as plain JSON data, only those that are on (``{}``: none): the form
        reports and case files hold and :meth:`from_dict` reads."""
        out: dict[str, Any] = {}
        if self.window is not None:
            out["window"] = self.window
        if self.sinks:
            out["sinks"] = True
        if self.softcap is not None:
            out["softcap"] = self.softcap
        if self.kv_dtype is not None:
            out["kv_dtype"] = self.kv_dtype
            out["kv_scale"] = self.kv_scale
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Features:
        """The inverse of :meth:`to_dict`; ``ValueError`` on unknown keys or bad values."""
        if not isinstance(data, Mapping):
            raise ValueError(f"features: expected an object, got {type(data).__name__}")
        known = {*FEATURE_KEYS, "kv_dtype"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"features: expected keys among {', '.join(sorted(known))}, got "
                             f"{', '.join(map(repr, unknown))}")
        return cls(**dict(data))

    # --- what they ask of a backend -------------------------------------------------------
    @property
    def required(self) -> frozenset[str]:
        """The capability names (:data:`FEATURE_NAMES`) a backend needs for these features."""
        names = set()
        if self.window is not None:
            names.add("window")
        if self.sinks:
            names.add("sinks")
        if self.softcap is not None:
            names.add("softcap")
        if self.kv_dtype is not None:
            names.add("fp8_kv_head" if self.kv_scale == "head" else "fp8_kv")
        return frozenset(names)

    def __bool__(self) -> bool:
        return bool(self.required)

    def describe(self) -> str:
        """The features in words (``"none"`` when all are off)."""
        words = []
        if self.window is not None:
            words.append(f"window {self.window}")
        if self.sinks:
            words.append("sinks")
        if self.softcap is not None:
            words.append(f"softcap {self.softcap:g}")
        if self.kv_dtype is not None:
            scales = "per-head" if self.kv_scale == "head" else "per-tensor"
            words.append(f"{self.kv_dtype} KV ({scales} scales)")
        return ", ".join(words) or "none"

    # --- numerics ---------------------------------------------------------------------------
    @property
    def window_left(self) -> int:
        """The batch's ``window_left``: the window, or -1 without one."""
        return -1 if self.window is None else self.window

    @property
    def logits_soft_cap(self) -> float:
        """The batch's ``logits_soft_cap``: the cap, or 0.0 (off)."""
        return 0.0 if self.softcap is None else float(self.softcap)

    @property
    def large_scale(self) -> float:
        """The factor of the ``large`` content family's q and k: 8, or with a soft-cap enough
        that scores (standard deviation ``factor**2``) reach about four times the cap."""
        if self.softcap is None:
            return 8.0
        return max(8.0, math.sqrt(4.0 * self.softcap))

    def cache_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The K/V cache dtype next to queries of ``dtype``."""
        return dtype if self.kv_dtype is None else KV_DTYPES[self.kv_dtype]

    def kv_scale_values(self, kind: Literal["k", "v"], num_kv_heads: int) -> list[float]:
        """The dequantization scale of each KV head (float32 values): a fixed base per kind
        times ``1 + (h mod 4) / 4`` per head with ``kv_scale="head"``, the base alone with
        ``"tensor"`` (all heads equal). A function of the settings alone."""
        base = _K_SCALE if kind == "k" else _V_SCALE
        if self.kv_scale == "tensor":
            return [f32(base)] * num_kv_heads
        return [f32(base * (1.0 + (h % 4) / 4.0)) for h in range(num_kv_heads)]
