"""Backends: any callable ``backend(batch: AttentionBatch) -> AttentionResult | (out, lse)``.

Resolve one by name with :func:`resolve`: a built-in name (see :data:`BUILTIN`), a name
registered by another package under the ``invariance.backends`` entry-point group, or a
``"module:attr"`` string. A plain Python callable is used as it is. Built-ins that take options
(the FlashInfer and kernels adapters) are configured as ``"name:key=value,key=value"``; for any
other name before the ``':'`` the string keeps its ``"module:attr"`` meaning.

**Planning protocol (graph-safe backends).** A backend object may have a method
``plan(batch: AttentionBatch) -> None`` (optionally ``plan(batch, *, graph: bool)``). The harness
calls it before every call of the backend on that batch, outside any CUDA-graph capture, so it
may do host work and synchronise (read lengths, build index tensors, allocate workspace, run a
library's own planner). ``graph=True`` (passed only to a ``plan`` that accepts the keyword) says
that the call which follows is captured in a CUDA graph and then replayed on the same buffers;
the call itself must then do device work only. :func:`planner` finds the hook.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from _invariance_options import DTYPE_NAMES
from invariance.batch import AttentionBatch

__all__ = [
    "BUILTIN",
    "Backend",
    "BackendInfo",
    "Capabilities",
    "Planner",
    "ResolvedBackend",
    "available",
    "capabilities",
    "parse_options",
    "planner",
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
      no host-side planning inside the call: that belongs in ``plan``, see the module
      docstring).
    - ``split_tokens``: the backend's KV split size in tokens, when it splits rows: the check
      then makes its longest request span at least 2.5 splits, so rows on both sides of
      several split boundaries are compared.
    - ``features``: the attention features it takes, by the names of
      ``invariance.features.FEATURE_NAMES`` (``window``, ``sinks``, ``softcap``, ``fp8_kv``,
      ``fp8_kv_head``). None by default: a backend written without them would ignore the
      batch's feature fields, so it has to say it reads them.
    - ``feature_conflicts``: sets of features it takes one by one but not together (asking
      for all of one set is a usage error too).
    - ``cpu_split_tokens``: the split size it uses on CPU tensors, when that is another one
      (a backend run by an interpreter on CPU may split finer, so that rows across several
      splits are short); a check on the CPU sizes its rows from it.
    """

    dtypes: tuple[str, ...] = DTYPE_NAMES
    head_dims: tuple[int, ...] | None = None
    devices: tuple[str, ...] = ("cpu", "cuda")
    cuda_graphs: bool = True
    split_tokens: int | None = None
    features: frozenset[str] = frozenset()
    feature_conflicts: tuple[frozenset[str], ...] = ()
    cpu_split_tokens: int | None = None

    def lacks(self, required: frozenset[str]) -> str | None:
        """Why these capabilities cannot run the features ``required``, or ``None``."""
        missing = sorted(required - self.features)
        if missing:
            return (f"takes {', '.join(sorted(self.features)) or 'no features'}, not "
                    f"{', '.join(missing)}")
        for conflict in self.feature_conflicts:
            if conflict <= required:
                return f"cannot combine {' and '.join(sorted(conflict))}"
        return None

    def split_on(self, device: str) -> int | None:
        """The split size on ``device`` (a device type, ``"cpu"`` or ``"cuda"``)."""
        if device == "cpu" and self.cpu_split_tokens:
            return self.cpu_split_tokens
        return self.split_tokens


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
    #: Whether ``name:key=value,...`` configures it (the target has ``with_options(dict)``).
    options: bool = False


_KERNELS = ("kernels", "triton")
_FLASHINFER = ("flashinfer",)
_FI = "invariance.backends.flashinfer"
_SDPA = "invariance.backends.sdpa"
_SDPA_LSE = "; lse by a separate float64 logsumexp of q·kᵀ per request, in the same row blocks " \
            "(SDPA returns none)"

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
        "Triton paged attention, fixed split size (1024 tokens, 256 on CPU), plan chosen per "
        "batch (invariant); options: "
        "kernels:split_size=N|none,lead_split_size=N,plan=...,tuned=true|false,"
        "host_lens=true|false,gluon=auto|true|false,block_m=...,num_warps=...,num_stages=...,"
        "block_n=...",
        _KERNELS, True),
    "kernels-fused": _Builtin(
        "invariance.backends.kernels:fused",
        "Triton paged attention, fixed split size (1024 tokens, 256 on CPU), fused plan "
        "(invariant)", _KERNELS, True),
    "kernels-split": _Builtin(
        "invariance.backends.kernels:split",
        "Triton paged attention, fixed split size (1024 tokens, 256 on CPU), split-parallel "
        "plan + merge (invariant)",
        _KERNELS, True),
    "kernels-heuristic": _Builtin(
        "invariance.backends.kernels:heuristic",
        "CONTROL: Triton paged attention with FA2-style split count from the batch "
        "(deliberately not invariant)", _KERNELS, True),
    "flashinfer": _Builtin(
        f"{_FI}:flashinfer",
        "FlashInfer, engine-style: q_len == 1 rows through BatchDecodeWithPagedKVCacheWrapper, "
        "the others through BatchPrefillWithPagedKVCacheWrapper (causal), FlashInfer's default "
        "split heuristic and backend; options: flashinfer:key=value,...", _FLASHINFER, True),
    "flashinfer-prefill": _Builtin(
        f"{_FI}:prefill",
        "FlashInfer, every row through BatchPrefillWithPagedKVCacheWrapper (causal), default "
        "split heuristic", _FLASHINFER, True),
    "flashinfer-fa3": _Builtin(
        f"{_FI}:fa3",
        "FlashInfer's FA3 prefill kernels for every row, decodes included (Hopper)",
        _FLASHINFER, True),
    "flashinfer-fixed-split": _Builtin(
        f"{_FI}:fixed_split",
        "FlashInfer engine-style with fixed_split_size=2048 (FlashInfer's unit: pages; fa2 "
        "kernels, tensor-core decode)", _FLASHINFER, True),
    "sdpa-flash": _Builtin(
        f"{_SDPA}:flash",
        "torch SDPA forced to FLASH_ATTENTION, one call per request on its K/V gathered from "
        "the pages (lower-right causal, enable_gqa)" + _SDPA_LSE),
    "sdpa-efficient": _Builtin(
        f"{_SDPA}:efficient",
        "torch SDPA forced to EFFICIENT_ATTENTION, one request at a time with a boolean "
        "lower-right causal mask, in row blocks under a 1 GiB memory budget" + _SDPA_LSE),
    "sdpa-cudnn": _Builtin(
        f"{_SDPA}:cudnn",
        "torch SDPA forced to CUDNN_ATTENTION, one request at a time with a boolean "
        "lower-right causal mask, in row blocks under a 1 GiB memory budget" + _SDPA_LSE),
    "sdpa-math": _Builtin(
        f"{_SDPA}:math",
        "torch SDPA forced to MATH, one request at a time with a boolean lower-right causal "
        "mask, in row blocks under a 1 GiB memory budget" + _SDPA_LSE),
}


@dataclass(frozen=True)
class ResolvedBackend:
    """A backend and the name it is reported under. ``source`` is the string it was resolved
    from (``None`` for a callable given as an object): it is pickled as that string and resolved
    again on the other side (a child process of ``isolate`` builds a named backend as the
    parent did, fresh), while a callable object is pickled by value."""

    name: str
    fn: Backend
    source: str | None = field(default=None, compare=False, repr=False)

    def __call__(self, batch: AttentionBatch) -> object:
        return self.fn(batch)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.source is not None:
            return (resolve, (self.source,))
        return (ResolvedBackend, (self.name, self.fn))


#: A backend's planning step as the harness calls it: ``plan(batch, graph)``.
Planner = Callable[[AttentionBatch, bool], None]


def planner(backend: object) -> Planner | None:
    """The backend's planning step (module docstring, "Planning protocol"), or ``None`` when it
    has none. The result takes ``(batch, graph)``; ``graph`` reaches the backend's ``plan`` only
    when that accepts a ``graph`` keyword."""
    fn = backend.fn if isinstance(backend, ResolvedBackend) else backend
    plan = getattr(fn, "plan", None)
    if plan is None or not callable(plan):
        return None
    try:
        params = inspect.signature(plan).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    takes_graph = "graph" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    def run(batch: AttentionBatch, graph: bool) -> None:
        if takes_graph:
            plan(batch, graph=graph)
        else:
            plan(batch)

    return run


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
    script or a test file, so that its reproducer replays in another process). Whatever the
    import raises (a missing module, a syntax error, an exception or ``sys.exit`` in the module's
    own code) is a ``ValueError`` naming the target, the module or file, and the cause."""
    try:
        if module_name.endswith(".py"):
            return _import_file(Path(module_name))
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"backend {target!r}: cannot import module {module_name!r}: {exc}"
        ) from exc
    except (Exception, SystemExit) as exc:
        what = f"file {module_name}" if module_name.endswith(".py") else \
            f"module {module_name!r}"
        raise ValueError(f"backend {target!r}: importing {what} raised "
                         f"{type(exc).__name__}: {exc}") from exc


def _import_file(path: Path) -> object:
    if not path.is_file():
        raise ImportError(f"no file {path}")
    spec = importlib.util.spec_from_file_location(f"_invariance_backend_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(spec.name, None)
        raise
    return module


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


def _global_name(fn: object, module: str) -> str | None:
    """The dotted name under which ``fn`` itself (an instance, a bound method of one) is a
    global of ``module``, or ``None``: ``inst`` for ``inst = MyBackend()``, ``inst.run`` for
    its bound method."""
    mod = sys.modules.get(module)
    if mod is None:
        return None
    owner = getattr(fn, "__self__", None)
    for attr, value in list(vars(mod).items()):
        if value is fn:
            return attr
        if owner is not None and value is owner and not inspect.ismodule(owner):
            method = getattr(fn, "__name__", None)
            if method and getattr(owner, method, None) == fn:
                return f"{attr}.{method}"
    return None


def _callable_name(fn: object) -> str:
    """``module:qualname`` of a callable; ``path/file.py:qualname`` when its module cannot be
    imported by name elsewhere (``__main__``, a test file), so that reproducers replay.

    A callable instance (or a bound method, a ``functools.partial``) is named by the global that
    holds it (``module:inst``), never by its class or function, which are other callables:
    replaying ``module:Class`` would call the class. One no global holds is named
    ``module:<Class instance>``, which does not resolve: a reproducer that cannot name it says so
    instead of calling something else."""
    plain = inspect.isfunction(fn) or inspect.isclass(fn) or inspect.isbuiltin(fn)
    module = getattr(fn, "__module__", None) or getattr(type(fn), "__module__", None)
    inner = getattr(fn, "func", None) if isinstance(fn, functools.partial) else None
    if inner is not None:  # a partial lives where its function does
        module = getattr(inner, "__module__", None) or module
    if plain:
        name = getattr(fn, "__qualname__", None) or type(fn).__name__
    else:
        found = _global_name(fn, module) if module else None
        kind = (f"partial of {getattr(inner, '__qualname__', type(inner).__name__)}"
                if inner is not None else f"{type(fn).__qualname__} instance")
        name = found or f"<{kind}>"
    if not module:
        return name
    importable = module != "__main__" and not module.startswith("_invariance_backend_")
    if importable:
        try:
            importable = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            importable = False
    if not importable:
        target = sys.modules.get(module) if module in sys.modules else (
            fn if inspect.isfunction(fn) or inspect.isclass(fn) else type(fn))
        try:
            source = inspect.getsourcefile(target)  # type: ignore[arg-type]
        except TypeError:
            source = None
        if source:
            return f"{source}:{name}"
    return f"{module}:{name}"


def parse_options(spec: str, text: str) -> dict[str, str]:
    """``"key=value,key=value"`` (the part after ``name:``) as a dict of strings; ``ValueError``
    naming ``spec`` otherwise. Types are the adapter's to check."""
    options: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key or not value:
            raise ValueError(f"backend {spec!r}: expected options as key=value[,key=value...], "
                             f"got {item.strip()!r}")
        if key in options:
            raise ValueError(f"backend {spec!r}: option {key!r} given twice")
        options[key] = value
    return options


def _with_options(spec: str, name: str, text: str) -> ResolvedBackend:
    base = _load(BUILTIN[name].target)
    configure = getattr(base, "with_options", None)
    if not callable(configure):  # pragma: no cover - a BUILTIN entry out of step with its target
        raise ValueError(f"backend {spec!r}: {name} takes no options")
    return ResolvedBackend(spec, configure(parse_options(spec, text)), spec)


def resolve(spec: str | Backend) -> ResolvedBackend:
    """Turn a backend name, ``"module:attr"`` string or callable into a :class:`ResolvedBackend`.

    ``"name:key=value,..."`` configures a built-in that takes options (``BUILTIN[name].options``).
    Raises ``ValueError`` with the known names when ``spec`` is unknown.
    """
    if isinstance(spec, ResolvedBackend):
        return spec
    if callable(spec):
        return ResolvedBackend(_callable_name(spec), spec)
    if not isinstance(spec, str):
        raise ValueError(f"backend: expected a name, 'module:attr' or a callable, got {spec!r}")
    if spec in BUILTIN:
        return ResolvedBackend(spec, _load(BUILTIN[spec].target), spec)
    eps = _entry_points()
    if spec in eps:
        return ResolvedBackend(spec, _load(eps[spec]), spec)
    name, sep, text = spec.partition(":")
    if sep and name in BUILTIN and BUILTIN[name].options:
        return _with_options(spec, name, text)
    if ":" in spec:
        return ResolvedBackend(spec, _load(spec), spec)
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
