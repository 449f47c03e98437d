"""Backends: any callable ``backend(batch: AttentionBatch) -> AttentionResult | (out, lse)``.

Resolve one by name with :func:`resolve`: a built-in name (see :data:`BUILTIN`), a name
registered by another package under the ``invariance.backends`` entry-point group, or a
``"module:attr"`` string. A plain Python callable is used as it is.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from _invariance_options import DTYPE_NAMES
from invariance.batch import AttentionBatch

__all__ = [
    "BUILTIN",
    "Backend",
    "BackendInfo",
    "Capabilities",
    "ResolvedBackend",
    "available",
    "capabilities",
    "resolve",
]

Backend = Callable[[AttentionBatch], object]

ENTRY_POINT_GROUP = "invariance.backends"


@dataclass(frozen=True)
class Capabilities:
    """What a backend can run. A backend declares it as its ``capabilities`` attribute; asking
    a check for anything outside it is a usage error before anything runs.

    - ``dtypes``: public dtype names; ``head_dims``: supported head dims (``None``: any);
    - ``devices``: device types (``"cpu"``, ``"cuda"``);
    - ``cuda_graphs``: whether the backend can be captured in a CUDA graph (no host syncs,
      no host-side planning inside the call).
    """

    dtypes: tuple[str, ...] = DTYPE_NAMES
    head_dims: tuple[int, ...] | None = None
    devices: tuple[str, ...] = ("cpu", "cuda")
    cuda_graphs: bool = True


def capabilities(backend: object) -> Capabilities:
    """The backend's declared :class:`Capabilities` (everything, when it declares none)."""
    fn = backend.fn if isinstance(backend, ResolvedBackend) else backend
    caps = getattr(fn, "capabilities", None)
    if caps is None:
        return Capabilities()
    if not isinstance(caps, Capabilities):
        raise ValueError(f"backend: expected its 'capabilities' attribute to be an "
                         f"invariance.Capabilities, got {type(caps).__name__}")
    return caps


@dataclass(frozen=True)
class _Builtin:
    target: str
    description: str
    #: Modules the adapter needs, found without importing them (see _importable).
    needs: tuple[str, ...] = ()


_KERNELS = ("kernels", "triton")

#: Built-in backends: name -> (target, description, modules it needs).
BUILTIN: dict[str, _Builtin] = {
    "reference": _Builtin(
        "invariance.backends.reference:reference_backend",
        "float64 torch, one query row at a time: invariant by construction; the accuracy oracle"),
    "sdpa": _Builtin(
        "invariance.backends.torch_backends:sdpa_backend",
        "torch scaled_dot_product_attention on the batch padded to dense (lse by logsumexp)"),
    "torch-batch-variant": _Builtin(
        "invariance.backends.torch_backends:batch_variant_backend",
        "CONTROL: float32 torch attention whose KV chunk size follows the batch size "
        "(deliberately not invariant)"),
    "kernels": _Builtin(
        "invariance.backends.kernels:invariant",
        "Triton paged attention, fixed split size, plan chosen per batch (invariant)", _KERNELS),
    "kernels-fused": _Builtin(
        "invariance.backends.kernels:fused",
        "Triton paged attention, fixed split size, fused plan (invariant)", _KERNELS),
    "kernels-split": _Builtin(
        "invariance.backends.kernels:split",
        "Triton paged attention, fixed split size, split-parallel plan + merge (invariant)",
        _KERNELS),
    "kernels-heuristic": _Builtin(
        "invariance.backends.kernels:heuristic",
        "CONTROL: Triton paged attention with FA2-style split count from the batch "
        "(deliberately not invariant)", _KERNELS),
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


def _import(module_name: str, target: str) -> object:
    """Import ``module_name``; a name ending in ``.py`` is a file path (a backend defined in a
    script or a test file, so that its reproducer replays in another process)."""
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise ImportError(f"no file {module_name}")
            spec = importlib.util.spec_from_file_location(f"_invariance_backend_{path.stem}",
                                                          path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {module_name}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            return module
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"backend {target!r}: cannot import module {module_name!r}: {exc}"
        ) from exc


def _load(target: str) -> Backend:
    # A file path may itself hold ':' (Windows drives): split at the last one after '.py'.
    split = target.rpartition if ".py:" in target else target.partition
    module_name, sep, attr = split(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"backend: expected 'module:attr' or 'path/file.py:attr', got "
                         f"{target!r}")
    module = _import(module_name, target)
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


def _callable_name(fn: object) -> str:
    """``module:qualname`` of a callable; ``path/file.py:qualname`` when its module cannot be
    imported by name elsewhere (``__main__``, a test file), so that reproducers replay."""
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    module = getattr(fn, "__module__", None) or getattr(type(fn), "__module__", None)
    if not module:
        return name
    importable = module != "__main__" and not module.startswith("_invariance_backend_")
    if importable:
        try:
            importable = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            importable = False
    if not importable:
        target = fn if inspect.isfunction(fn) else type(fn)
        try:
            source = inspect.getsourcefile(target)  # type: ignore[arg-type]
        except TypeError:
            source = None
        if source:
            return f"{source}:{name}"
    return f"{module}:{name}"


def resolve(spec: str | Backend) -> ResolvedBackend:
    """Turn a backend name, ``"module:attr"`` string or callable into a :class:`ResolvedBackend`.

    Raises ``ValueError`` with the known names when ``spec`` is unknown.
    """
    if isinstance(spec, ResolvedBackend):
        return spec
    if callable(spec):
        return ResolvedBackend(_callable_name(spec), spec)
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


def _importable(target: str, needs: tuple[str, ...] = ()) -> tuple[bool, str]:
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
        ok, why = _importable(b.target, b.needs)
        infos.append(BackendInfo(name, b.target, b.description, "builtin", ok, why))
    for name, target in sorted(_entry_points().items()):
        ok, why = _importable(target)
        infos.append(BackendInfo(name, target, "registered by an installed package",
                                 "entry point", ok, why))
    return infos
