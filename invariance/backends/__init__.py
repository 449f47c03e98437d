"""Backends: any callable ``backend(batch: AttentionBatch) -> AttentionResult | (out, lse)``.

Resolve one by name with :func:`resolve`: a built-in name (see :data:`BUILTIN`), a name
registered by another package under the ``invariance.backends`` entry-point group, or a
``"module:attr"`` string. A plain Python callable is used as it is.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points

from invariance.batch import AttentionBatch

__all__ = ["BUILTIN", "Backend", "BackendInfo", "ResolvedBackend", "available", "resolve"]

Backend = Callable[[AttentionBatch], object]

ENTRY_POINT_GROUP = "invariance.backends"


@dataclass(frozen=True)
class _Builtin:
    target: str
    description: str
    invariant: bool  # what the backend is expected to be; False marks a control


#: Built-in backends: name -> (target, description).
BUILTIN: dict[str, _Builtin] = {
    "reference": _Builtin(
        "invariance.backends.reference:reference_backend",
        "float64 torch, one query row at a time: invariant by construction; the accuracy oracle",
        True),
    "sdpa": _Builtin(
        "invariance.backends.torch_backends:sdpa_backend",
        "torch scaled_dot_product_attention on the batch padded to dense (lse by logsumexp)",
        False),
    "torch-batch-variant": _Builtin(
        "invariance.backends.torch_backends:batch_variant_backend",
        "CONTROL: float32 torch attention whose KV chunk size follows the batch size "
        "(deliberately not invariant)",
        False),
    "kernels": _Builtin(
        "invariance.backends.kernels:invariant",
        "Triton paged attention, fixed split size, plan chosen per batch (invariant)", True),
    "kernels-fused": _Builtin(
        "invariance.backends.kernels:fused",
        "Triton paged attention, fixed split size, fused plan (invariant)", True),
    "kernels-split": _Builtin(
        "invariance.backends.kernels:split",
        "Triton paged attention, fixed split size, split-parallel plan + merge (invariant)", True),
    "kernels-heuristic": _Builtin(
        "invariance.backends.kernels:heuristic",
        "CONTROL: Triton paged attention with FA2-style split count from the batch "
        "(deliberately not invariant)", False),
}


@dataclass(frozen=True)
class ResolvedBackend:
    """A backend and the name it is reported under."""

    name: str
    fn: Backend

    def __call__(self, batch: AttentionBatch) -> object:
        return self.fn(batch)


@dataclass(frozen=True)
class BackendInfo:
    """One backend as listed by :func:`available`."""

    name: str
    target: str
    description: str
    source: str  # "builtin" or "entry point"
    importable: bool
    reason: str  # why not importable ("" when it is)


def _load(target: str) -> Backend:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"backend: expected 'module:attr', got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"backend {target!r}: cannot import module {module_name!r}: {exc}"
        ) from exc
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(
                f"backend {target!r}: module {module_name!r} has no attribute {attr!r}"
            ) from None
    if not callable(obj):
        raise ValueError(f"backend {target!r}: expected a callable, got {type(obj).__name__}")
    return obj  # type: ignore[no-any-return]


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def resolve(spec: str | Backend) -> ResolvedBackend:
    """Turn a backend name, ``"module:attr"`` string or callable into a :class:`ResolvedBackend`.

    Raises ``ValueError`` with the known names when ``spec`` is unknown.
    """
    if isinstance(spec, ResolvedBackend):
        return spec
    if callable(spec):
        name = getattr(spec, "__qualname__", None) or type(spec).__name__
        module = getattr(spec, "__module__", None)
        return ResolvedBackend(f"{module}:{name}" if module else name, spec)
    if not isinstance(spec, str):
        raise ValueError(f"backend: expected a name, 'module:attr' or a callable, got {spec!r}")
    if spec in BUILTIN:
        return ResolvedBackend(spec, _load(BUILTIN[spec].target))
    eps = _entry_points()
    if spec in eps:
        return ResolvedBackend(spec, _load(eps[spec]))
    if ":" in spec:
        return ResolvedBackend(spec, _load(spec))
    known = sorted(set(BUILTIN) | set(eps))
    raise ValueError(
        f"backend: unknown name {spec!r}; expected one of {known} or 'module:attr'"
    )


def _importable(target: str) -> tuple[bool, str]:
    module_name = target.partition(":")[0]
    needs = {"invariance.backends.kernels": ("kernels", "triton")}.get(module_name, ())
    try:
        # NOTE: find the dependencies without importing them: importing triton here would fix
        # its interpreter mode before the kernels adapter can switch it on for CPU tensors.
        for dep in needs:
            if importlib.util.find_spec(dep) is None:
                raise ImportError(f"No module named {dep!r}")
        _load(target)
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


def available() -> list[BackendInfo]:
    """Every known backend (built-in and entry points) with whether it imports here, and why
    not."""
    infos = []
    for name, b in BUILTIN.items():
        ok, why = _importable(b.target)
        infos.append(BackendInfo(name, b.target, b.description, "builtin", ok, why))
    for name, target in sorted(_entry_points().items()):
        ok, why = _importable(target)
        infos.append(BackendInfo(name, target, "registered by an installed package",
                                 "entry point", ok, why))
    return infos
