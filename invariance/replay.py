"""Replaying a case: pasteable reproducers and case files that replay in a fresh process.

A case (a workload and two schedules) is plain data: :func:`case_to_dict` / :func:`case_from_dict`
give a JSON form (``"schema": "invariance.case"``) that ``invariance replay CASE.json --backend
module:attr`` runs anywhere. :func:`replay` runs both schedules and raises with the bitwise diff.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from invariance.backends import Backend, capabilities, resolve
from invariance.compare import CaseComparison, compare_outputs
from invariance.features import Features
from invariance.perturb import Case
from invariance.schedule import Chunk, PageLayout, Schedule, Step, run_schedule
from invariance.workload import HeadConfig, Request, Workload, dtype_name, parse_dtype

__all__ = ["CASE_SCHEMA", "case_from_dict", "case_to_dict", "load_case", "replay", "reproducer"]

CASE_SCHEMA = "invariance.case"


def reproducer(case: Case, backend: str, device: str) -> str:
    """Python code that replays ``case`` and raises with the bitwise diff."""
    wl = case.workload
    return "\n".join([
        "import torch",
        "import invariance",
        "from invariance import (Chunk, Features, HeadConfig, PageLayout, Request, Schedule, "
        "Step,",
        "                        Workload)",
        "",
        f"workload = {wl!r}",
        f"a = {case.a!r}",
        f"b = {case.b!r}",
        f"invariance.replay({backend!r}, workload, a, b, device={device!r})",
    ])


def replay(backend: str | Backend, workload: Workload, a: Schedule, b: Schedule, *,
           device: str | torch.device = "cpu") -> CaseComparison:
    """Run two schedules and raise ``AssertionError`` with the diff if any shared token differs.

    Returns the comparison when they agree. A workload with attention features needs a backend
    that declares them (``ValueError`` otherwise, before anything runs).
    """
    fn = resolve(backend)
    why = capabilities(fn).lacks(workload.features.required)
    if why:
        raise ValueError(f"features: backend {fn.name} {why} (its capabilities say so), got a "
                         f"case with {workload.features.describe()}")
    dev = torch.device(device)
    cache: dict[tuple[int, str], torch.Tensor] = {}
    cmp = compare_outputs(run_schedule(fn, workload, a, dev, cache),
                          run_schedule(fn, workload, b, dev, cache))
    if not cmp.equal:
        raise AssertionError(
            f"schedules disagree on {len(cmp.differing_rows)} of {len(cmp.keys)} tokens\n"
            f"  a: {a.describe()}\n  b: {b.describe()}\n  {cmp.out.summary()}\n  "
            f"{cmp.lse.summary()}"
        )
    return cmp


# --------------------------------------------------------------------------------------------
# Case files
# --------------------------------------------------------------------------------------------

def _schedule_to_dict(s: Schedule) -> dict[str, Any]:
    lay = s.layout
    return {
        "label": s.label, "graph": s.graph, "poison": s.poison,
        "layout": {"page_size": lay.page_size, "placement": lay.placement,
                   "extra_pages": lay.extra_pages, "extra_columns": lay.extra_columns,
                   "fill": lay.fill, "seed": lay.seed, "share_prefix": lay.share_prefix},
        "steps": [[[c.request_id, c.start, c.stop] for c in st.chunks] for st in s.steps],
    }


def _schedule_from_dict(d: dict[str, Any]) -> Schedule:
    steps = tuple(Step(tuple(Chunk(int(r), int(a), int(b)) for r, a, b in st))
                  for st in d["steps"])
    return Schedule(steps, PageLayout(**d["layout"]), str(d.get("label", "")),
                    bool(d.get("graph", False)), bool(d.get("poison", False)))


def case_to_dict(case: Case, *, backend: str = "", device: str = "") -> dict[str, Any]:
    """The JSON form of ``case`` (with the backend and device it failed on, for the record)."""
    wl = case.workload
    return {
        "schema": CASE_SCHEMA, "version": 1, "perturbation": case.perturbation,
        "backend": backend, "device": device,
        "workload": {"heads": str(wl.heads), "dtype": dtype_name(wl.dtype), "seed": wl.seed,
                     "requests": [[r.id, r.length, r.padding, r.family,
                                   list(r.prefix) if r.prefix else None]
                                  for r in wl.requests],
                     "features": wl.features.to_dict()},
        "a": _schedule_to_dict(case.a), "b": _schedule_to_dict(case.b),
        "focus": list(case.focus),
    }


def _request(r: list[Any]) -> Request:
    rid, length, padding, *more = r
    family = str(more[0]) if more else "gaussian"
    prefix = (int(more[1][0]), int(more[1][1])) if len(more) > 1 and more[1] else None
    return Request(int(rid), int(length), bool(padding), family, prefix)


def case_from_dict(d: dict[str, Any], *, source: str = "case") -> Case:
    """Rebuild a case from :func:`case_to_dict`'s form; ``ValueError`` naming ``source`` and
    the field when it is malformed."""
    if not isinstance(d, dict) or d.get("schema") != CASE_SCHEMA:
        got = d.get("schema") if isinstance(d, dict) else type(d).__name__
        raise ValueError(f"{source}: expected a case file (schema {CASE_SCHEMA!r}), got {got!r}")
    try:
        w = d["workload"]
        workload = Workload(
            tuple(_request(r) for r in w["requests"]),
            HeadConfig.parse(w["heads"]), parse_dtype(w["dtype"]), int(w["seed"]),
            Features.from_dict(w.get("features", {})))
        return Case(str(d.get("perturbation", "")), workload, _schedule_from_dict(d["a"]),
                    _schedule_from_dict(d["b"]), tuple(int(x) for x in d.get("focus", ())))
    except (KeyError, TypeError, ValueError) as exc:
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{source}: malformed case: {what}") from None


def load_case(path: str | Path) -> Case:
    """Read a case file written by ``invariance check --cases DIR`` or :func:`case_to_dict`."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read a case file: {exc}") from None
    return case_from_dict(data, source=str(path))
