"""The result of :func:`invariance.check`: a ``Report`` and its versioned JSON form.

JSON schema (``"schema": "invariance.report"``, ``"version": 1``)::

    {schema, version, backend, device, dtypes[], heads, scale, budget, seed, perturbations[],
     started_at, seconds, command, passed, environment{...},
     results[ {backend, perturbation, dtype, description, status, cases, compared_tokens,
               num_violations, max_ulp, seconds, error, points[{...}], violations[{...}]} ],
     accuracy[ {backend, dtype, rows, max_abs_err_out, rel_err_out, max_abs_err_lse,
                atol, rtol, lse_atol, nan_rows, passed} ]}

``status`` is one of ``passed``, ``failed``, ``error`` (the backend raised) or ``skipped`` (the
perturbation needs something absent here, e.g. CUDA; never counted as passed).
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from invariance.compare import TensorDiff

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "AccuracyResult",
    "Environment",
    "PerturbationResult",
    "Report",
    "Violation",
]

SCHEMA = "invariance.report"
SCHEMA_VERSION = 1

Status = Literal["passed", "failed", "error", "skipped"]


@dataclass
class Environment:
    """Where a report was produced: what a bug report needs."""

    device: str
    device_name: str
    gpu_count: int
    driver: str | None
    cuda: str | None
    torch: str
    triton: str | None
    python: str
    platform: str

    @classmethod
    def capture(cls, device: str = "cpu") -> Environment:
        import torch

        # NOTE: the version from the package metadata, not ``import triton``: importing triton
        # here would fix its interpreter mode (TRITON_INTERPRET) before a backend can set it.
        try:
            triton_version: str | None = importlib.metadata.version("triton")
        except importlib.metadata.PackageNotFoundError:
            triton_version = None
        gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        name = platform.processor() or platform.machine()
        driver = None
        if device.startswith("cuda") and gpu_count:
            name = torch.cuda.get_device_name(torch.device(device))
            driver = _driver_version()
        elif gpu_count:
            driver = _driver_version()
        return cls(
            device=device,
            device_name=name,
            gpu_count=gpu_count,
            driver=driver,
            cuda=torch.version.cuda,
            torch=torch.__version__,
            triton=triton_version,
            python=sys.version.split()[0],
            platform=platform.platform(),
        )


def _driver_version() -> str | None:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


@dataclass
class Violation:
    """Two schedules that disagree on the bits of some (request, token)."""

    perturbation: str
    dtype: str
    case: int
    schedule_a: str
    schedule_b: str
    request_id: int
    differing_tokens: int
    compared_tokens: int
    diffs: list[TensorDiff]
    reproducer: str
    shrunk: bool = False

    @property
    def max_ulp(self) -> int:
        return max((d.max_ulp for d in self.diffs), default=0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["diffs"] = [x.to_dict() for x in self.diffs]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Violation:
        d = dict(d)
        d["diffs"] = [TensorDiff.from_dict(x) for x in d["diffs"]]
        return cls(**d)


@dataclass
class PerturbationResult:
    """One cell of the report: a perturbation run at one dtype."""

    backend: str
    perturbation: str
    dtype: str
    description: str
    status: Status
    cases: int = 0
    compared_tokens: int = 0
    num_violations: int = 0
    max_ulp: int = 0
    seconds: float = 0.0
    error: str | None = None
    #: One point per case, for plots: features (e.g. batch_size, neighbor_len) + mismatch_rate
    #: + max_ulp.
    points: list[dict[str, float]] = field(default_factory=list)
    #: The first violations found (at most ``max_violations``); ``num_violations`` counts all.
    violations: list[Violation] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["violations"] = [v.to_dict() for v in self.violations]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PerturbationResult:
        d = dict(d)
        d["violations"] = [Violation.from_dict(v) for v in d.get("violations", [])]
        return cls(**d)


@dataclass
class AccuracyResult:
    """Accuracy of a backend against the float64 reference at one dtype.

    Passes when every compared element satisfies ``|out - ref| <= atol + rtol * |ref|``, every
    LSE ``|lse - ref| <= lse_atol``, and no row holds NaN.
    """

    backend: str
    dtype: str
    rows: int = 0
    max_abs_err_out: float = 0.0
    rel_err_out: float = 0.0
    max_abs_err_lse: float = 0.0
    worst_ratio: float = 0.0  # max over elements of |err| / (atol + rtol*|ref|); <= 1 passes
    atol: float = 0.0
    rtol: float = 0.0
    lse_atol: float = 0.0
    nan_rows: int = 0
    passed: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {k: (_json_float(v) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AccuracyResult:
        fields: dict[str, Any] = {
            k: (float(v) if isinstance(v, str) and k not in ("backend", "dtype") else v)
            for k, v in d.items()
        }
        return cls(**fields)


def _json_float(x: float) -> float | str:
    return x if x == x and abs(x) != float("inf") else str(x)


@dataclass
class Report:
    """Everything one :func:`invariance.check` run found."""

    backend: str
    device: str
    dtypes: list[str]
    heads: str
    scale: str
    budget: int
    seed: int
    perturbations: list[str]
    environment: Environment
    results: list[PerturbationResult] = field(default_factory=list)
    accuracy: list[AccuracyResult] = field(default_factory=list)
    started_at: str = ""
    seconds: float = 0.0
    #: The command line that produced the report, when a face (CLI, pytest) knows it.
    command: str = ""

    # --- verdicts ------------------------------------------------------------------------
    @property
    def invariant(self) -> bool:
        """No cell failed or errored (skipped cells do not count either way)."""
        return all(r.status in ("passed", "skipped") for r in self.results)

    @property
    def accurate(self) -> bool:
        return all(a.passed for a in self.accuracy)

    @property
    def passed(self) -> bool:
        """Invariant, accurate, and at least one cell actually ran."""
        ran = any(r.status != "skipped" for r in self.results)
        return ran and self.invariant and self.accurate

    @property
    def violations(self) -> list[Violation]:
        return [v for r in self.results for v in r.violations]

    def failed_cells(self) -> list[PerturbationResult]:
        return [r for r in self.results if r.status in ("failed", "error")]

    def counts(self) -> dict[str, int]:
        out = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        for r in self.results:
            out[r.status] += 1
        return out

    def cell(self, perturbation: str, dtype: str) -> PerturbationResult:
        for r in self.results:
            if r.perturbation == perturbation and r.dtype == dtype:
                return r
        raise KeyError(f"no result for perturbation {perturbation!r} at dtype {dtype!r}")

    def summary(self) -> str:
        c = self.counts()
        verdict = "PASSED" if self.passed else "FAILED"
        acc = "accurate" if self.accurate else "INACCURATE"
        return (f"{verdict}: backend {self.backend} on {self.device} "
                f"({', '.join(self.dtypes)}): {c['passed']} passed, {c['failed']} failed, "
                f"{c['error']} errors, {c['skipped']} skipped; {acc}; {self.seconds:.1f}s")

    # --- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "backend": self.backend,
            "device": self.device,
            "dtypes": self.dtypes,
            "heads": self.heads,
            "scale": self.scale,
            "budget": self.budget,
            "seed": self.seed,
            "perturbations": self.perturbations,
            "started_at": self.started_at,
            "seconds": self.seconds,
            "command": self.command,
            "passed": self.passed,
            "environment": asdict(self.environment),
            "results": [r.to_dict() for r in self.results],
            "accuracy": [a.to_dict() for a in self.accuracy],
        }

    def to_json(self, path: str | Path | None = None, *, indent: int = 2) -> str:
        """The report as JSON text; also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=indent, allow_nan=False)
        if path is not None:
            Path(path).write_text(text + "\n", encoding="utf-8")
        return text

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        if d.get("schema") != SCHEMA:
            raise ValueError(f"report: expected schema {SCHEMA!r}, got {d.get('schema')!r}")
        if d.get("version") != SCHEMA_VERSION:
            raise ValueError(
                f"report: expected schema version {SCHEMA_VERSION}, got {d.get('version')!r}"
            )
        return cls(
            backend=d["backend"],
            device=d["device"],
            dtypes=list(d["dtypes"]),
            heads=d["heads"],
            scale=d["scale"],
            budget=d["budget"],
            seed=d["seed"],
            perturbations=list(d["perturbations"]),
            environment=Environment(**d["environment"]),
            results=[PerturbationResult.from_dict(r) for r in d["results"]],
            accuracy=[AccuracyResult.from_dict(a) for a in d["accuracy"]],
            started_at=d.get("started_at", ""),
            seconds=d.get("seconds", 0.0),
            command=d.get("command", ""),
        )

    @classmethod
    def from_json(cls, source: str | Path) -> Report:
        """Read a report from JSON text or from a path to a JSON file."""
        text = str(source)
        if isinstance(source, Path) or not text.lstrip().startswith("{"):
            try:
                text = Path(source).read_text(encoding="utf-8")
            except OSError as exc:
                raise ValueError(f"report: cannot read {source}: {exc}") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"report: not valid JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise ValueError("report: expected a JSON object")
        return cls.from_dict(data)

    @classmethod
    def combine(cls, reports: list[Report]) -> Report:
        """One report holding the cells of several (e.g. a pytest session's checks)."""
        if not reports:
            raise ValueError("combine: expected at least one report")
        first = reports[0]

        def union(values: list[str]) -> list[str]:
            return list(dict.fromkeys(values))

        return cls(
            backend=", ".join(union([r.backend for r in reports])),
            device=", ".join(union([r.device for r in reports])),
            dtypes=union([d for r in reports for d in r.dtypes]),
            heads=", ".join(union([r.heads for r in reports])),
            scale=", ".join(union([r.scale for r in reports])),
            budget=max(r.budget for r in reports),
            seed=first.seed,
            perturbations=union([p for r in reports for p in r.perturbations]),
            environment=first.environment,
            results=[c for r in reports for c in r.results],
            accuracy=[a for r in reports for a in r.accuracy],
            started_at=first.started_at,
            seconds=sum(r.seconds for r in reports),
        )
