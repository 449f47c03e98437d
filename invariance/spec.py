"""The one validated check request. :func:`invariance.check`, the CLI and the pytest plugin all
build a :class:`CheckSpec`; nothing downstream re-validates (ARCHITECTURE.md, "Layers").

Every type or range error is a ``ValueError`` naming the argument, the expected and the actual
value. Asking for something the backend or the device cannot do (a head dim, a dtype, a device,
CUDA graphs, an attention feature) is an error here, before anything runs; perturbations that
merely cannot run here under ``"all"`` (``cuda_graph`` on a CPU) become visible skips with the
reason. Features apply to every cell of a check, so a feature the backend lacks is always an
error, never a skip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from _invariance_options import DTYPE_NAMES, OptionError, check_int, dtype_names
from invariance.backends import Backend, Capabilities, ResolvedBackend, capabilities, resolve
from invariance.features import Features
from invariance.perturb import SCALES, Perturbation, Scale, resolve_perturbations
from invariance.workload import DTYPES, HeadConfig

__all__ = ["DEFAULT_HEADS", "CheckSpec"]

#: Default head configuration per scale: small for the CPU interpreter, production-like on GPU.
DEFAULT_HEADS: dict[str, HeadConfig] = {
    "small": HeadConfig(4, 2, 64),
    "large": HeadConfig(32, 8, 128),
}


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _device(device: object) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise ValueError(f"device: expected 'cpu' or 'cuda', got {_show(device)}")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device: expected 'cpu' or 'cuda', got {_show(device)}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or 'cuda', got {_show(device)}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: CUDA was requested but torch sees no CUDA GPU here")
    return dev


def _scale(scale: object, dev: torch.device) -> Scale:
    if scale is None:
        return SCALES["large" if dev.type == "cuda" else "small"]
    if isinstance(scale, Scale):
        return scale
    if isinstance(scale, str) and scale in SCALES:
        return SCALES[scale]
    raise ValueError(f"scale: expected one of {', '.join(SCALES)}, got {_show(scale)}")


def _heads(heads: object, scale: Scale) -> HeadConfig:
    if heads is None:
        return DEFAULT_HEADS.get(scale.name, HeadConfig())
    if isinstance(heads, HeadConfig):
        return heads
    if isinstance(heads, str):
        return HeadConfig.parse(heads)
    raise ValueError(f"heads: expected a HeadConfig or 'Hq:Hkv:D', got {_show(heads)}")


#: The query dtypes an FP8 KV cache goes with.
_FP8_Q = ("float16", "bfloat16")


def _dtypes(dtype: object, dev: torch.device, features: Features) -> tuple[torch.dtype, ...]:
    fp8 = features.kv_dtype is not None
    if dtype is None:
        names: Sequence[str] = DTYPE_NAMES if dev.type == "cuda" else ("float32",)
        if fp8:  # FP8 KV takes half-precision queries
            names = _FP8_Q if dev.type == "cuda" else ("bfloat16",)
    else:
        try:
            names = dtype_names(dtype)
        except OptionError as exc:
            raise ValueError(str(exc)) from None
        odd = [n for n in names if fp8 and n not in _FP8_Q]
        if odd:
            raise ValueError(f"dtype: expected {' or '.join(_FP8_Q)} with kv_dtype "
                             f"{features.kv_dtype} (an FP8 cache takes half-precision queries), "
                             f"got {odd[0]}")
    return tuple(DTYPES[n] for n in names)


def _features(features: object, kv_dtype: object) -> Features:
    if features is not None and not isinstance(features, (Features, dict, str, list, tuple)):
        raise ValueError(f"features: expected a dict, KEY[=VALUE] strings or an "
                         f"invariance.Features, got {_show(features)}")
    return Features.build(features, kv_dtype)


def _perturbations(perturbations: object) -> tuple[Perturbation, ...]:
    if perturbations is not None and not isinstance(perturbations, (str, list, tuple)):
        raise ValueError(f"perturbations: expected 'all', a name or a list of names, got "
                         f"{_show(perturbations)}")
    if isinstance(perturbations, (list, tuple)) and not all(
            isinstance(p, str) for p in perturbations):
        raise ValueError(f"perturbations: expected names (str), got {_show(perturbations)}")
    if isinstance(perturbations, str) and not perturbations.strip():
        raise ValueError("perturbations: expected 'all' or at least one name, got ''")
    return tuple(resolve_perturbations(perturbations))


def _negotiate(name: str, caps: Capabilities, dtypes: Sequence[torch.dtype], heads: HeadConfig,
               dev: torch.device, perts: Sequence[Perturbation], explicit: bool,
               features: Features) -> None:
    """Usage errors for what the backend cannot do, before anything runs."""
    why = caps.lacks(features.required)
    if why:
        raise ValueError(f"features: backend {name} {why} (its capabilities say so), got "
                         f"{features.describe()}")
    for dt in dtypes:
        dt_name = str(dt).removeprefix("torch.")
        if dt_name not in caps.dtypes:
            raise ValueError(f"dtype: backend {name} supports {', '.join(caps.dtypes)}, got "
                             f"{dt_name}")
    if caps.head_dims is not None and heads.head_dim not in caps.head_dims:
        raise ValueError(f"heads: backend {name} supports head dims "
                         f"{', '.join(map(str, caps.head_dims))}, got head_dim "
                         f"{heads.head_dim} ({heads})")
    if dev.type not in caps.devices:
        raise ValueError(f"device: backend {name} runs on {', '.join(caps.devices)}, got "
                         f"{dev.type}")
    if not explicit:
        return
    for p in perts:
        if p.requires_cuda and dev.type != "cuda":
            raise ValueError(f"perturbations: {p.name} needs a CUDA device, got device "
                             f"{dev.type}")
        if p.name == "cuda_graph" and not caps.cuda_graphs:
            raise ValueError(f"perturbations: backend {name} cannot be captured in a CUDA "
                             f"graph (its capabilities say so), got {p.name}")


@dataclass(frozen=True)
class CheckSpec:
    """Everything a check needs, validated. Build it with :meth:`build`."""

    backend: ResolvedBackend
    dtypes: tuple[torch.dtype, ...]
    heads: HeadConfig
    perturbations: tuple[Perturbation, ...]
    budget: int
    seed: int
    device: torch.device
    scale: Scale
    accuracy_rows: int
    max_violations: int
    shrink: bool
    isolate: bool = False
    features: Features = field(default_factory=Features)

    @classmethod
    def build(
        cls,
        backend: str | Backend,
        *,
        dtype: Any = None,
        heads: HeadConfig | str | None = None,
        perturbations: str | Sequence[str] | None = "all",
        budget: int = 1,
        seed: int = 0,
        device: str | torch.device | None = None,
        scale: str | Scale | None = None,
        accuracy_rows: int = 16,
        max_violations: int = 3,
        shrink: bool = True,
        isolate: bool = False,
        features: Features | dict[str, Any] | Sequence[str] | None = None,
        kv_dtype: str | None = None,
    ) -> CheckSpec:
        """Validate the arguments of :func:`invariance.check` (its docstring says what each
        means) and resolve names; ``ValueError`` naming the argument otherwise."""
        for name, flag in (("shrink", shrink), ("isolate", isolate)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name}: expected True or False, got {_show(flag)}")
        feats = _features(features, kv_dtype)
        dev = _device(device)
        scale_obj = _scale(scale, dev)
        head_cfg = _heads(heads, scale_obj)
        dtypes = _dtypes(dtype, dev, feats)
        perts = _perturbations(perturbations)
        explicit = perturbations is not None and perturbations != "all" and not (
            isinstance(perturbations, (list, tuple)) and "all" in perturbations)
        fn = resolve(backend)
        caps = capabilities(fn)
        _negotiate(fn.name, caps, dtypes, head_cfg, dev, perts, explicit, feats)
        scale_obj = scale_obj.for_split(caps.split_on(dev.type)).for_window(feats.window)
        spec = cls(
            backend=fn, dtypes=dtypes, heads=head_cfg, perturbations=perts,
            budget=check_int("budget", budget), seed=check_int("seed", seed), device=dev,
            scale=scale_obj, accuracy_rows=check_int("accuracy_rows", accuracy_rows),
            max_violations=check_int("max_violations", max_violations), shrink=shrink,
            isolate=isolate, features=feats,
        )
        if isolate:
            from invariance.isolate import check_sendable

            check_sendable(spec)  # what cannot reach a child process is refused now
        return spec

    def rebuild_arguments(self) -> dict[str, Any]:
        """Plain arguments of :meth:`build` that rebuild this spec in another process (the
        backend by its name: a callable must be importable as ``module:attr`` or
        ``file.py:attr``)."""
        return {"backend": self.backend.name, "dtype": [str(d).removeprefix("torch.")
                                                        for d in self.dtypes],
                "heads": str(self.heads), "perturbations": [p.name for p in self.perturbations],
                "budget": self.budget, "seed": self.seed, "device": str(self.device),
                "scale": self.scale.name, "accuracy_rows": self.accuracy_rows,
                "max_violations": self.max_violations, "shrink": self.shrink,
                "features": {k: v for k, v in self.features.to_dict().items()
                             if k != "kv_dtype"},
                "kv_dtype": self.features.kv_dtype}

    def skip_reason(self, p: Perturbation) -> str | None:
        """Why ``p`` cannot run here (it was asked for through ``"all"``), or ``None``."""
        if p.requires_cuda and self.device.type != "cuda":
            return "needs a CUDA device"
        if p.name == "cuda_graph" and not capabilities(self.backend).cuda_graphs:
            return f"backend {self.backend.name} cannot be captured in a CUDA graph"
        return None

    def total_cases(self) -> int:
        """Cases the check will run (for progress bars)."""
        return len(self.dtypes) * sum(self.budget * p.cases_per_budget
                                      for p in self.perturbations if not self.skip_reason(p))
