"""Adapters for this project's Triton kernels (``kernels.unified_attention``).

``kernels`` is imported lazily, inside the call, so the harness works where Triton is absent.
On a CPU tensor the kernels run under the Triton interpreter, which must be switched on with
``TRITON_INTERPRET=1`` before Triton is first imported; the adapter does so when it can.

From the CLI the four built-ins take options (:meth:`KernelsBackend.with_options`), e.g.
``--backend kernels:split_size=2048``, ``--backend kernels-fused:block_m=128,num_warps=8`` or
``--backend kernels:gluon=false`` (the Triton kernels where the Gluon kernels would run) or
``--backend kernels:plan=split,keys_rows=true`` (the keys-as-rows decode tile wherever it can
run, prompts too, where the rules take it for decode batches only) or
``--backend kernels:block_n=64`` (the 64-key contract where Hopper's default is 128 keys) or
``--backend kernels:lead_split_size=1024`` (one split size: the contract before lead splits).

**Features.** The adapters declare every feature (``window``, ``sinks``, ``softcap``,
``fp8_kv``, ``fp8_kv_head``) and pass a batch's to ``kernels.unified_attention`` as
``window_left=``, ``sinks=``, ``logits_soft_cap=``, ``k_scale=`` and ``v_scale=`` (the FP8
cache itself is ``k_cache`` / ``v_cache``), only those the batch uses, so a batch without
features calls the kernel exactly as before. A kernel whose signature lacks one of them (an
older ``kernels``) makes the call raise ``ValueError`` naming the parameter: never a silent
result without the feature.

On CPU tensors the default split size is 256 tokens (:data:`CPU_SPLIT_TOKENS`), declared in the
capabilities: the interpreter walks every KV tile in Python, and a check compares rows across
several splits, which at 1024 tokens per split took minutes. The kernels, their contract (a
split size fixed per deployment, lead splits of 128 tokens inside the first split) and every
code path are the same; ``kernels:split_size=1024`` checks the GPU's split size on the CPU.
"""

from __future__ import annotations

import inspect
import os
import sys
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from invariance.backends import Capabilities
from invariance.batch import AttentionBatch, AttentionResult

__all__ = ["KernelsBackend", "fused", "heuristic", "invariant", "split"]

_DEFAULT: Literal["default"] = "default"
# kernels.DEFAULT_SPLIT_SIZE, not imported here: importing kernels imports triton, which must
# wait until the interpreter is switched on (see above). tests/test_bad_inputs.py checks they agree.
_DEFAULT_SPLIT_TOKENS = 1024
#: The default split size on CPU tensors (the Triton interpreter; module docstring).
CPU_SPLIT_TOKENS = 256
_PLANS = ("auto", "fused", "split")
# kernels.Tuning's checks, repeated so that options fail when parsed, before anything runs (and
# without importing triton; tests/test_bench.py checks they agree with kernels.Tuning).
_NUM_WARPS = (1, 2, 4, 8, 16)
_TUNING_RULES: dict[str, tuple[Callable[[int], bool], str]] = {
    "block_m": (lambda v: v >= 1 and v & (v - 1) == 0, "a power of two"),
    "num_warps": (lambda v: v in _NUM_WARPS, f"one of {', '.join(map(str, _NUM_WARPS))}"),
    "num_stages": (lambda v: 1 <= v <= 8, "an int in [1, 8]"),
    "block_n": (lambda v: v >= 16 and v & (v - 1) == 0, "a power of two >= 16"),
}
_OPTION_KEYS = ("split_size", "lead_split_size", "plan", "gluon", "keys_rows", "host_lens",
                "tuned", *_TUNING_RULES)
_GLUON_VALUES = {"auto": None, "true": True, "false": False}
_BOOL_VALUES = {"true": True, "false": False}


def _enable_interpreter_on_cpu(batch: AttentionBatch) -> None:
    """CPU tensors need the Triton interpreter, which must be on before triton is imported."""
    if batch.device.type == "cpu" and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")


@dataclass(frozen=True)
class KernelsBackend:
    """``kernels.unified_attention`` with a fixed ``split_size`` (``"default"`` =
    ``kernels.DEFAULT_SPLIT_SIZE``, :data:`CPU_SPLIT_TOKENS` on CPU tensors; ``None`` = the
    batch-variant control heuristic) and ``plan``.

    ``block_m`` / ``num_warps`` / ``num_stages`` / ``block_n`` become a ``kernels.Tuning`` (launch
    overrides of the tile configuration ``kernels.tile_config`` fixes per (dtype, head_dim, GPU);
    its docstring says which are bit-neutral; ``block_n`` is bit-defining, another contract).
    They are for experiments that measure whether they change bits; a callable ``block_m`` picks
    it per batch, as a non-invariant library would. ``gluon`` (``kernels.Tuning.gluon``):
    ``None`` runs the Gluon kernels wherever they are allowed, ``False`` never, ``True``
    requires them; ``keys_rows`` (``kernels.Tuning.keys_rows``) likewise for the split plan's
    keys-as-rows decode tile.

    :meth:`plan` (the planning protocol of :mod:`invariance.backends`) takes the batch's lengths
    on the host before a CUDA-graph capture, so that the captured call picks its plan from them
    (``kernels.unified_attention(host_lens=...)``), as an engine that knows its lengths would.
    """

    split_size: int | Literal["default"] | None = _DEFAULT
    #: ``kernels.unified_attention``'s ``lead_split_size`` (None: its default).
    lead_split_size: int | None = None
    #: The launch plan (``kernels.unified_attention``'s ``plan``; the option key is ``plan``).
    kernel_plan: Literal["auto", "fused", "split"] = "auto"
    block_m: int | Callable[[AttentionBatch], int] | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    block_n: int | None = None
    gluon: bool | None = None
    keys_rows: bool | None = None
    #: Whether :meth:`plan`'s host lengths steer the captured call (``host_lens=false``: the
    #: plan from shapes alone, as an engine that does not pass them gets).
    use_host_lens: bool = True
    #: Whether the measured launch table in force (``kernels.tuned``) may pick the bit-neutral
    #: settings (``tuned=false``: the shape rules of ``kernels.config``).
    use_table: bool = True
    #: The last planned batch (a weak reference) and its host lengths.
    _planned: dict[str, Any] = field(default_factory=dict, init=False, compare=False,
                                     repr=False)

    def plan(self, batch: AttentionBatch) -> None:
        """Host copies of the batch's lengths for its next call (one sync, outside capture)."""
        self._planned.clear()
        self._planned.update(batch=weakref.ref(batch),
                             lens=(batch.q_lens(), batch.kv_lens.tolist()))

    def _host_lens(self, batch: AttentionBatch) -> tuple[list[int], list[int]] | None:
        ref = self._planned.get("batch")
        if not self.use_host_lens or ref is None or ref() is not batch:
            return None
        return self._planned["lens"]  # type: ignore[no-any-return]

    @property
    def capabilities(self) -> Capabilities:
        """Every dtype and device; head dims 64, 128, 256; CUDA graphs (no host sync during
        capture); the split size (on CPU tensors too), so the check compares rows across
        several splits; every feature (module docstring, "Features")."""
        features = frozenset(_FEATURE_PARAMS)
        if self.split_size == _DEFAULT:
            return Capabilities(head_dims=(64, 128, 256), split_tokens=_DEFAULT_SPLIT_TOKENS,
                                cpu_split_tokens=self._cpu_split(), features=features)
        return Capabilities(head_dims=(64, 128, 256), split_tokens=self.split_size,
                            features=features)

    def _cpu_split(self) -> int:
        """The default split size on CPU tensors: :data:`CPU_SPLIT_TOKENS`, or the lead split
        or tile size asked for when that is larger (the split size must be a multiple of
        both)."""
        return max(CPU_SPLIT_TOKENS, self.lead_split_size or 0, self.block_n or 0)

    def __call__(self, batch: AttentionBatch) -> AttentionResult:
        _enable_interpreter_on_cpu(batch)
        import kernels

        split, lead = self.split_size, self.lead_split_size
        if split == _DEFAULT:
            split = self._cpu_split() if batch.device.type == "cpu" else kernels.DEFAULT_SPLIT_SIZE
            if (lead is None and split != kernels.DEFAULT_SPLIT_SIZE
                    and split > kernels.DEFAULT_LEAD_SPLIT_SIZE
                    and kernels.DEFAULT_LEAD_SPLIT_SIZE % (self.block_n or 1) == 0):
                # The contract's shape on CPU too: the first split cut into lead splits.
                lead = kernels.DEFAULT_LEAD_SPLIT_SIZE
        fields: dict[str, Any] = dict(
            block_m=self.block_m(batch) if callable(self.block_m) else self.block_m,
            num_warps=self.num_warps, num_stages=self.num_stages, block_n=self.block_n,
            gluon=self.gluon, keys_rows=self.keys_rows)
        # No override and the table allowed: None, so that the measured table in force
        # (kernels.tuned) may pick the launch; an explicit Tuning() means the shape rules.
        tuning = (None if self.use_table and all(v is None for v in fields.values())
                  else kernels.Tuning(**fields))
        out, lse = kernels.unified_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.kv_lens,
            batch.block_table, sm_scale=batch.sm_scale, split_size=split,
            lead_split_size=lead, plan=self.kernel_plan, tuning=tuning,
            host_lens=self._host_lens(batch), **feature_kwargs(batch, kernels.unified_attention),
        )
        return AttentionResult(out, lse)

    def with_options(self, options: Mapping[str, str]) -> KernelsBackend:
        """A new backend: this one's settings with ``options`` (strings, from the CLI's
        ``name:key=value,...``) applied. Keys: ``split_size`` (KV tokens per split, an int >= 1;
        ``none`` = the batch-variant control heuristic; ``default`` =
        ``kernels.DEFAULT_SPLIT_SIZE``), ``lead_split_size`` (KV tokens per lead split, an int
        >= 1, ``kernels.unified_attention``'s; ``default`` = its default), ``plan`` (``auto`` /
        ``fused`` / ``split``), ``block_m`` (a power of two), ``num_warps`` (1, 2, 4, 8 or 16),
        ``num_stages`` (1..8),
        ``block_n`` (KV tokens per tile, a power of two >= 16: bit-defining, for comparing
        contracts; the split size must be a multiple of it), ``gluon`` (``auto``, ``true`` or
        ``false``: ``kernels.Tuning.gluon``; at 64 keys ``true`` raises on a batch whose plan is
        the split plan, which ``plan=auto`` picks for decode batches: use
        ``kernels-fused:gluon=true`` there), ``keys_rows`` (``auto``, ``true`` or ``false``:
        ``kernels.Tuning.keys_rows``, the split plan's keys-as-rows decode tile; ``true`` with
        ``plan=split``), ``host_lens`` (``true`` / ``false``: whether the
        lengths :meth:`plan` reads steer a captured call), ``tuned`` (``true`` / ``false``:
        whether the measured launch table in force, ``kernels.tuned``, may pick the bit-neutral
        settings; ``false``: the shape rules). ``ValueError`` naming the key, what it expects
        and what it got."""
        values: dict[str, Any] = {}
        for key, text in options.items():
            value = text.strip()
            if key == "split_size":
                low = value.lower()
                values[key] = (None if low == "none" else _DEFAULT if low == _DEFAULT
                               else _int_option(key, value, lambda v: v >= 1, "an int >= 1",
                                                " or none or default"))
            elif key == "lead_split_size":
                values[key] = (None if value.lower() == _DEFAULT
                               else _int_option(key, value, lambda v: v >= 1, "an int >= 1",
                                                " or default"))
            elif key == "plan":
                if value not in _PLANS:
                    raise ValueError(f"kernels option plan: expected one of "
                                     f"{', '.join(_PLANS)}, got {text!r}")
                values["kernel_plan"] = value
            elif key in ("gluon", "keys_rows"):
                if value.lower() not in _GLUON_VALUES:
                    raise ValueError(f"kernels option {key}: expected one of "
                                     f"{', '.join(_GLUON_VALUES)}, got {text!r}")
                values[key] = _GLUON_VALUES[value.lower()]
            elif key in ("host_lens", "tuned"):
                if value.lower() not in _BOOL_VALUES:
                    raise ValueError(f"kernels option {key}: expected one of "
                                     f"{', '.join(_BOOL_VALUES)}, got {text!r}")
                values["use_host_lens" if key == "host_lens" else "use_table"] = (
                    _BOOL_VALUES[value.lower()])
            elif key in _TUNING_RULES:
                values[key] = _int_option(key, value, *_TUNING_RULES[key])
            else:
                raise ValueError(f"kernels option {key!r}: unknown; expected one of "
                                 f"{', '.join(_OPTION_KEYS)}, got {key!r}")
        return replace(self, **values)


#: Each feature (``invariance.features.FEATURE_NAMES``) -> the parameters of
#: ``kernels.unified_attention`` that carry it.
_FEATURE_PARAMS: dict[str, tuple[str, ...]] = {
    "window": ("window_left",), "sinks": ("sinks",), "softcap": ("logits_soft_cap",),
    "fp8_kv": ("k_scale", "v_scale"), "fp8_kv_head": ("k_scale", "v_scale"),
}


def kernel_parameters(fn: Callable[..., Any]) -> frozenset[str]:
    """The keyword parameters ``fn`` (``kernels.unified_attention``) takes."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return frozenset()
    return frozenset(params)


def feature_kwargs(batch: AttentionBatch, fn: Callable[..., Any]) -> dict[str, Any]:
    """The feature arguments of ``fn`` (``kernels.unified_attention``) for ``batch``: only
    those the batch uses (module docstring, "Features"). ``ValueError`` naming the parameter
    when ``fn`` does not take it."""
    used = batch.features_used()
    if not used:
        return {}
    values: dict[str, Any] = {"window_left": batch.window_left, "sinks": batch.sinks,
                              "logits_soft_cap": float(batch.logits_soft_cap),
                              "k_scale": batch.k_scale, "v_scale": batch.v_scale}
    takes = kernel_parameters(fn)
    kwargs: dict[str, Any] = {}
    for feature in sorted(used):
        for name in _FEATURE_PARAMS[feature]:
            if name not in takes:
                raise ValueError(f"kernels.unified_attention: expected a parameter {name!r} "
                                 f"for the batch's {feature} (this kernels predates the "
                                 f"feature), got a signature without it")
            kwargs[name] = values[name]
    return kwargs


def _int_option(key: str, text: str, ok: Callable[[int], bool], expected: str,
                alternatives: str = "") -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise ValueError(f"kernels option {key}: expected {expected}{alternatives}, got {text!r}")
    return value


#: ``kernels``: invariant, default split size, plan chosen per batch.
invariant = KernelsBackend()
#: ``kernels-fused``: invariant, one program per query block walks all splits.
fused = KernelsBackend(kernel_plan="fused")
#: ``kernels-split``: invariant, split-parallel partials + fixed-order merge kernel.
split = KernelsBackend(kernel_plan="split")
#: ``kernels-heuristic``: CONTROL, split count chosen from the batch (FA2-style); NOT invariant.
heuristic = KernelsBackend(split_size=None)
