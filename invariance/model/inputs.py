"""What a model takes, the requests fed to it, and running a batch of them through it.

A :class:`ModelInterface` says how to call the model: token ids (``tokens:VOCAB``), one feature
row per request (``rows:FEATURES``, ``[B, F]``) or a sequence of feature rows
(``sequence:FEATURES``, ``[B, L, F]``), and which of ``attention_mask``, ``position_ids`` and a KV
cache (``cache`` / ``past_key_values`` with ``use_cache``, Hugging Face's convention) its forward
takes. :func:`detect_interface` reads it from the forward's signature and the first layer.

A request's content is a pure function of ``(seed, request id, token index)``, so the same
request has the same bits alone or in any batch, and a longer request extends a shorter one.

A :class:`Plan` is one run: a batch of requests (the focus request has id 0), the padding side,
and how many of each request's last tokens are fed one per forward (decode steps, through the
model's KV cache) after a prefill of the others. :func:`run_plan` runs it under a
:class:`~invariance.model.record.Recorder`, telling it where the focus request sits in each
forward.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from invariance.model.record import Layout, Recorder

__all__ = [
    "FOCUS",
    "KINDS",
    "Member",
    "ModelInterface",
    "NoCache",
    "Plan",
    "detect_interface",
    "run_plan",
]

Kind = Literal["tokens", "rows", "sequence"]
KINDS: tuple[str, ...] = ("tokens", "rows", "sequence")
#: The id of the request every comparison is about.
FOCUS = 0
_CACHE_KEYWORDS = ("cache", "past_key_values")


@dataclass(frozen=True)
class ModelInterface:
    """How to call a model (module docstring)."""

    kind: Kind
    width: int
    mask: bool = False
    positions: bool = False
    #: The forward's KV-cache keyword when it can decode (``cache`` or ``past_key_values``).
    cache: str | None = None
    #: The keyword of the main input (``input_ids``); ``None``: passed positionally.
    input_name: str | None = None
    use_cache: bool = False

    @property
    def spec(self) -> str:
        """``kind:width``, as :meth:`parse` reads it."""
        return f"{self.kind}:{self.width}"

    def describe(self) -> str:
        takes = [name for name, on in (("attention_mask", self.mask),
                                       ("position_ids", self.positions),
                                       (f"a KV cache ({self.cache})", self.cache is not None))
                 if on]
        what = {"tokens": f"token ids < {self.width}", "rows": f"one row of {self.width} "
                "features per request", "sequence": f"sequences of {self.width}-feature rows"}
        return what[self.kind] + (f"; takes {', '.join(takes)}" if takes else "")

    @staticmethod
    def parse(text: str) -> tuple[Kind, int]:
        """``"tokens:128"`` -> ``("tokens", 128)``; ``ValueError`` naming ``inputs``."""
        kind, sep, width = str(text).partition(":")
        if kind not in KINDS or not sep or not width.strip().isdigit() or int(width) < 1:
            raise ValueError(f"inputs: expected tokens:VOCAB, rows:FEATURES or "
                             f"sequence:FEATURES (a positive int), got {text!r}")
        return kind, int(width)  # type: ignore[return-value]


def _parameters(model: torch.nn.Module) -> Mapping[str, inspect.Parameter]:
    try:
        return inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}


def _first_layer(model: torch.nn.Module) -> tuple[Kind, int] | None:
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding):
            return "tokens", m.num_embeddings
        if isinstance(m, torch.nn.Linear):
            return "rows", m.in_features
        if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm)) and m.normalized_shape:
            return "rows", int(m.normalized_shape[-1])
    return None


def _sequence_model(model: torch.nn.Module, params: Mapping[str, inspect.Parameter]) -> bool:
    """Whether a float-input model mixes positions (takes a mask, or has attention layers)."""
    return "attention_mask" in params or any(
        isinstance(m, torch.nn.MultiheadAttention) or type(m).__name__.endswith("Attention")
        for m in model.modules())


def detect_interface(model: torch.nn.Module, inputs: str | None = None) -> ModelInterface:
    """The model's :class:`ModelInterface`: ``inputs`` (``kind:width``) or the model's
    ``invariance_inputs`` attribute when given, else a Hugging Face config's ``vocab_size`` or
    the first layer (an ``Embedding``: tokens; a ``Linear`` or a norm: rows, or sequences
    ``[B, L, F]`` when the model takes an ``attention_mask`` or has attention layers); the
    keywords from the forward's signature."""
    params = _parameters(model)
    declared = inputs if inputs is not None else getattr(model, "invariance_inputs", None)
    if declared is not None:
        kind, width = ModelInterface.parse(declared)
    else:
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        if "input_ids" in params and isinstance(vocab, int) and vocab > 0:
            kind, width = "tokens", vocab
        else:
            found = _first_layer(model)
            if found is None:
                raise ValueError(
                    f"inputs: cannot tell what {type(model).__name__} takes (no Embedding, "
                    f"Linear or norm layer); expected tokens:VOCAB, rows:FEATURES or "
                    f"sequence:FEATURES, got nothing")
            kind, width = found
            if kind == "rows" and _sequence_model(model, params):
                kind = "sequence"
    cache = next((k for k in _CACHE_KEYWORDS if k in params), None)
    input_name = "input_ids" if kind == "tokens" and "input_ids" in params else None
    return ModelInterface(
        kind=kind, width=width,
        mask=kind != "rows" and "attention_mask" in params,
        positions=kind != "rows" and "position_ids" in params,
        cache=cache if kind == "tokens" else None, input_name=input_name,
        use_cache="use_cache" in params)


# --------------------------------------------------------------------------------------------
# Requests and plans
# --------------------------------------------------------------------------------------------

def _generator(seed: int, rid: int, token: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(
        (seed * 1_000_003 + rid * 7_919 + token * 104_729 + 17) % (2**63))


def request_tokens(seed: int, rid: int, length: int, vocab: int) -> torch.Tensor:
    """Token ids of request ``rid`` (a prefix of any longer length's)."""
    return torch.tensor([int(torch.randint(vocab, (1,), generator=_generator(seed, rid, t)))
                         for t in range(length)], dtype=torch.long)


def request_rows(seed: int, rid: int, length: int, width: int) -> torch.Tensor:
    """Feature rows ``[length, width]`` (float32) of request ``rid``, token by token."""
    return torch.stack([torch.randn(width, generator=_generator(seed, rid, t))
                        for t in range(length)])


@dataclass(frozen=True)
class Member:
    """One request of a batch: its id and length in tokens (1 for ``rows`` models)."""

    rid: int
    length: int


@dataclass(frozen=True)
class Plan:
    """One run: the batch in row order, the padding side, and the decode steps (each request's
    last ``decode`` tokens fed one per forward through the KV cache after a prefill of the
    rest)."""

    members: tuple[Member, ...]
    padding: Literal["left", "right"] = "right"
    decode: int = 0

    @property
    def batch_size(self) -> int:
        return len(self.members)

    @property
    def focus_row(self) -> int:
        return next(i for i, m in enumerate(self.members) if m.rid == FOCUS)

    def describe(self) -> str:
        """E.g. ``batch of 16 [*8, 8 x15]``: the lengths in row order, the focus request
        starred, runs of equal lengths counted."""
        parts: list[list[object]] = []
        for m in self.members:
            label = f"*{m.length}" if m.rid == FOCUS else str(m.length)
            if parts and parts[-1][0] == label and m.rid != FOCUS:
                parts[-1][1] = int(str(parts[-1][1])) + 1
            else:
                parts.append([label, 1])
        lengths = ", ".join(f"{label} x{n}" if n != 1 else str(label) for label, n in parts)
        text = f"batch of {self.batch_size} [{lengths}]"
        if len({m.length for m in self.members}) > 1:
            text += f", {self.padding}-padded"
        if self.decode:
            text += f", prefill then {self.decode} decode step{'s' if self.decode > 1 else ''}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"members": [[m.rid, m.length] for m in self.members],
                "padding": self.padding, "decode": self.decode}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        members = tuple(Member(int(r), int(n)) for r, n in d["members"])
        padding = str(d.get("padding", "right"))
        if padding not in ("left", "right"):
            raise ValueError(f"padding: expected 'left' or 'right', got {padding!r}")
        plan = cls(members, padding, int(d.get("decode", 0)))  # type: ignore[arg-type]
        if not any(m.rid == FOCUS for m in members):
            raise ValueError(f"members: expected one with request id {FOCUS} (the focus), got "
                             f"{[m.rid for m in members]}")
        return plan


class NoCache(ValueError):
    """The model was asked to decode but its output carries no KV cache (an encoder that takes
    the keyword, or ``use_cache`` ignored): decode scenarios cannot run on it."""


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _get_cache(output: Any) -> Any:
    for name in _CACHE_KEYWORDS:
        value = getattr(output, name, None)
        if value is None and isinstance(output, Mapping):
            value = output.get(name)
        if value is not None:
            return value
    return None


def run_plan(model: torch.nn.Module, iface: ModelInterface, plan: Plan, recorder: Recorder,
             *, seed: int, device: torch.device, nsteps_equal: bool = True) -> None:
    """Run ``plan`` through ``model`` (in ``torch.no_grad``), one forward per step, telling
    ``recorder`` where the focus request sits in each."""
    B = plan.batch_size
    row = plan.focus_row
    with torch.no_grad():
        if iface.kind == "rows":
            x = torch.stack([request_rows(seed, m.rid, 1, iface.width)[0]
                             for m in plan.members])
            recorder.step(Layout(B, None, row), nsteps_equal)
            model(x.to(device=device, dtype=_model_dtype(model)))
            return
        decode = plan.decode
        prompts = [m.length - decode for m in plan.members]
        L = max(prompts)
        pads = [L - p for p in prompts]
        starts = [pad if plan.padding == "left" else 0 for pad in pads]
        if iface.kind == "tokens":
            full = [request_tokens(seed, m.rid, m.length, iface.width) for m in plan.members]
            x = torch.zeros(B, L, dtype=torch.long)
        else:
            full = [request_rows(seed, m.rid, m.length, iface.width) for m in plan.members]
            x = torch.zeros(B, L, iface.width)
        mask = torch.zeros(B, L, dtype=torch.long)
        positions = torch.zeros(B, L, dtype=torch.long)
        for b, (p, s) in enumerate(zip(prompts, starts, strict=True)):
            x[b, s:s + p] = full[b][:p]
            mask[b, s:s + p] = 1
            positions[b, s:s + p] = torch.arange(p)
        focus_p, focus_s = prompts[row], starts[row]
        recorder.step(Layout(B, L, row, tuple(range(focus_s, focus_s + focus_p)),
                             tuple(range(focus_p))), nsteps_equal)
        dtype = _model_dtype(model)
        args, kwargs = _call(iface, x, mask, positions, None, decode > 0, device, dtype)
        output = model(*args, **kwargs)
        for j in range(decode):
            cache = _get_cache(output)
            if cache is None:
                raise NoCache(f"its output ({type(output).__name__}) carries no KV cache "
                              f"({' or '.join(_CACHE_KEYWORDS)}) to decode with")
            step_x = torch.stack([full[b][prompts[b] + j:prompts[b] + j + 1]
                                  for b in range(B)])
            mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.long)], dim=1)
            step_pos = torch.tensor([[prompts[b] + j] for b in range(B)])
            recorder.step(Layout(B, 1, row, (0,), (prompts[row] + j,)), nsteps_equal)
            args, kwargs = _call(iface, step_x, mask, step_pos, cache, True, device, dtype)
            output = model(*args, **kwargs)


def _call(iface: ModelInterface, x: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
          cache: Any, use_cache: bool, device: torch.device,
          dtype: torch.dtype) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments of one forward."""
    x = x.to(device) if iface.kind == "tokens" else x.to(device=device, dtype=dtype)
    kwargs: dict[str, Any] = {}
    if iface.mask:
        kwargs["attention_mask"] = mask.to(device)
    if iface.positions:
        kwargs["position_ids"] = positions.to(device)
    if iface.cache is not None:
        if cache is not None:
            kwargs[iface.cache] = cache
        if iface.use_cache:
            kwargs["use_cache"] = use_cache
    if iface.input_name is not None:
        kwargs[iface.input_name] = x
        return (), kwargs
    return (x,), kwargs
