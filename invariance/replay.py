"""Replaying a case: pasteable reproducers and case files that replay in a fresh process.

A case (a workload and two schedules) is plain data: :func:`case_to_dict` / :func:`case_from_dict`
give a JSON form (``"schema": "invariance.case"``) that ``invariance replay CASE.json --backend
module:attr`` runs anywhere. :func:`replay` runs both schedules and raises
:class:`ScheduleMismatch` with the bitwise diff; an error of the backend is not a mismatch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn, cast

import torch

from invariance.backends import Backend, capabilities, resolve
from invariance.compare import CaseComparison, compare_outputs
from invariance.features import Features
from invariance.perturb import Case
from invariance.schedule import Chunk, PageLayout, Schedule, Step, run_schedule
from invariance.workload import (
    DTYPES,
    FAMILIES,
    HeadConfig,
    Request,
    Workload,
    dtype_name,
    parse_dtype,
)

__all__ = ["CASE_LIMITS", "CASE_SCHEMA", "ReplayError", "ScheduleMismatch", "case_from_dict",
           "case_to_dict", "load_case", "replay", "reproducer"]

PLACEMENTS = ("contiguous", "shuffled", "reversed", "interleaved")
FILLS = ("zeros", "nan")

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


class ScheduleMismatch(AssertionError):
    """Raised by :func:`replay`: the two schedules disagree on the bits of some shared token.
    An ``AssertionError`` (a failing reproducer fails a test); an error of the backend itself,
    its own ``AssertionError`` included, is never one of these."""


class ReplayError(ValueError):
    """A replay that cannot run as asked (a device that is not here) or would compare nothing
    (schedules sharing no token): raised by :func:`replay` itself, never by the backend."""


def _replay_device(device: str | torch.device) -> torch.device:
    if not isinstance(device, (str, torch.device)):
        raise ReplayError(f"device: expected 'cpu' or 'cuda', got {device!r}")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ReplayError(f"device: expected 'cpu' or 'cuda', got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ReplayError(f"device: expected 'cpu' or 'cuda', got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ReplayError("device: the case runs on cuda but torch sees no CUDA GPU here "
                         "(replay it on the CPU with device='cpu', CLI --device cpu)")
    return dev


def replay(backend: str | Backend, workload: Workload, a: Schedule, b: Schedule, *,
           device: str | torch.device = "cpu") -> CaseComparison:
    """Run two schedules and raise :class:`ScheduleMismatch` (an ``AssertionError``) with the
    diff if any shared token differs.

    Returns the comparison when they agree. :class:`ReplayError` (a ``ValueError``) when
    ``device`` is not usable here or the schedules share no (request, token): nothing would be
    compared, and "identical" would be a claim about nothing. A workload with attention
    features needs a backend that declares them (``ValueError`` otherwise, before anything
    runs). Whatever the backend raises propagates as it is.
    """
    fn = resolve(backend)
    why = capabilities(fn).lacks(workload.features.required)
    if why:
        raise ValueError(f"features: backend {fn.name} {why} (its capabilities say so), got a "
                         f"case with {workload.features.describe()}")
    dev = _replay_device(device)
    cache: dict[tuple[int, str], torch.Tensor] = {}
    cmp = compare_outputs(run_schedule(fn, workload, a, dev, cache),
                          run_schedule(fn, workload, b, dev, cache))
    if not cmp.keys:
        raise ReplayError(
            "schedules: expected schedules a and b to share at least one (request, token) to "
            f"compare, got none\n  a: {a.describe()}\n  b: {b.describe()}")
    if not cmp.equal:
        raise ScheduleMismatch(
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


#: Largest values a case file may hold, so that a corrupted or hand-edited file is a clear error
#: naming the field rather than an allocator failure: far beyond any shape a check generates.
CASE_LIMITS: dict[str, int] = {
    "tokens": 1 << 20,        # a request's length
    "heads": 1024,            # query or KV heads
    "head_dim": 1024,
    "page_size": 1 << 16,
    "extra_pages": 1 << 20,
    "extra_columns": 1 << 16,
    "steps": 1 << 16,         # steps of a schedule
    "chunks": 1 << 16,        # chunks of a step
    "requests": 1 << 16,
    "id": (1 << 31) - 1,
    "seed": (1 << 63) - 1,
}


class _CaseReader:
    """Reads a case file's data field by field; every problem is a ``ValueError`` naming the
    source, the field path, the expected and the actual value."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, expected: str, value: Any) -> NoReturn:
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        raise ValueError(f"{self.source}: {path}: expected {expected}, got {shown}")

    def get(self, d: Any, key: str, path: str) -> Any:
        if not isinstance(d, dict):
            self.fail(path or "(case)", "an object", d)
        if key not in d:
            self.fail(f"{path}.{key}" if path else key, "a value", "nothing (field missing)")
        return d[key]

    def integer(self, value: Any, path: str, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            self.fail(path, f"an int in {lo}..{hi}", value)
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, "true or false", value)
        return value

    def text(self, value: Any, path: str, choices: tuple[str, ...] = ()) -> str:
        if not isinstance(value, str) or (choices and value not in choices):
            self.fail(path, f"one of {', '.join(choices)}" if choices else "a string", value)
        return value

    def items(self, value: Any, path: str, hi: int, lo: int = 0) -> list[Any]:
        if not isinstance(value, list) or not lo <= len(value) <= hi:
            self.fail(path, f"a list of {lo}..{hi} items", value)
        return value

    def heads(self, value: Any, path: str) -> HeadConfig:
        text = self.text(value, path)
        try:
            heads = HeadConfig.parse(text)
        except ValueError:
            self.fail(path, "'Hq:Hkv:D' with positive integers, Hq a multiple of Hkv", text)
        limit = CASE_LIMITS["heads"]
        if max(heads.num_q_heads, heads.num_kv_heads) > limit or \
                heads.head_dim > CASE_LIMITS["head_dim"]:
            self.fail(path, f"at most {limit} heads and head dim {CASE_LIMITS['head_dim']}",
                      text)
        return heads

    def requests(self, value: Any, path: str) -> tuple[Request, ...]:
        items = self.items(value, path, CASE_LIMITS["requests"], lo=1)
        out: list[Request] = []
        for i, r in enumerate(items):
            where = f"{path}[{i}]"
            fields = self.items(r, where, 5, lo=3)
            rid = self.integer(fields[0], f"{where}.id", 0, CASE_LIMITS["id"])
            if any(q.id == rid for q in out):
                self.fail(f"{where}.id", "an id no other request has", rid)
            length = self.integer(fields[1], f"{where}.length", 0, CASE_LIMITS["tokens"])
            padding = self.boolean(fields[2], f"{where}.padding")
            family = self.text(fields[3], f"{where}.family", FAMILIES) if len(fields) > 3 \
                else "gaussian"
            prefix = None
            if len(fields) > 4 and fields[4] is not None:
                pair = self.items(fields[4], f"{where}.prefix", 2, lo=2)
                parent = self.integer(pair[0], f"{where}.prefix[0]", 0, CASE_LIMITS["id"])
                if parent == rid:
                    self.fail(f"{where}.prefix[0]", "another request's id", parent)
                prefix = (parent, self.integer(pair[1], f"{where}.prefix[1]", 0, length))
            out.append(Request(rid, length, padding, family, prefix))
        lengths = {r.id: r.length for r in out}
        for i, r in enumerate(out):
            if r.prefix is not None:
                parent, n = r.prefix
                if parent not in lengths:
                    self.fail(f"{path}[{i}].prefix[0]", "the id of a request of this workload",
                              parent)
                if n > lengths[parent]:
                    self.fail(f"{path}[{i}].prefix[1]",
                              f"at most request {parent}'s length {lengths[parent]}", n)
        return tuple(out)

    def schedule(self, d: Any, path: str, lengths: dict[int, int]) -> Schedule:
        lay = self.get(d, "layout", path)
        lp = f"{path}.layout"
        layout = PageLayout(
            page_size=self.integer(self.get(lay, "page_size", lp), f"{lp}.page_size", 1,
                               CASE_LIMITS["page_size"]),
            placement=cast(Any, self.text(self.get(lay, "placement", lp), f"{lp}.placement",
                                         PLACEMENTS)),
            extra_pages=self.integer(lay.get("extra_pages", 0), f"{lp}.extra_pages", 0,
                                 CASE_LIMITS["extra_pages"]),
            extra_columns=self.integer(lay.get("extra_columns", 0), f"{lp}.extra_columns", 0,
                                   CASE_LIMITS["extra_columns"]),
            fill=cast(Any, self.text(lay.get("fill", "zeros"), f"{lp}.fill", FILLS)),
            seed=self.integer(lay.get("seed", 0), f"{lp}.seed", 0, CASE_LIMITS["seed"]),
            share_prefix=self.boolean(lay.get("share_prefix", False), f"{lp}.share_prefix"))
        steps = []
        for i, st in enumerate(self.items(self.get(d, "steps", path), f"{path}.steps",
                                         CASE_LIMITS["steps"])):
            chunks = []
            for j, c in enumerate(self.items(st, f"{path}.steps[{i}]", CASE_LIMITS["chunks"])):
                where = f"{path}.steps[{i}][{j}]"
                rid, start, stop = self.items(c, where, 3, lo=3)
                rid = self.integer(rid, f"{where}[0]", 0, CASE_LIMITS["id"])
                if rid not in lengths:
                    self.fail(f"{where}[0]", "the id of a request of this workload", rid)
                stop = self.integer(stop, f"{where}[2]", 0, lengths[rid])
                start = self.integer(start, f"{where}[1]", 0, stop)
                chunks.append(Chunk(rid, start, stop))
            steps.append(Step(tuple(chunks)))
        return Schedule(tuple(steps), layout, self.text(d.get("label", ""), f"{path}.label"),
                        self.boolean(d.get("graph", False), f"{path}.graph"),
                        self.boolean(d.get("poison", False), f"{path}.poison"))

    def case(self, d: Any) -> Case:
        if not isinstance(d, dict) or d.get("schema") != CASE_SCHEMA:
            got = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"{self.source}: expected a case file (schema {CASE_SCHEMA!r}), "
                             f"got {got!r}")
        version = d.get("version", 1)
        if version != 1:
            self.fail("version", "1 (this invariance reads case files of version 1)", version)
        for key in ("perturbation", "backend", "device"):
            if key in d:
                self.text(d[key], key)
        w = self.get(d, "workload", "")
        requests = self.requests(self.get(w, "requests", "workload"), "workload.requests")
        try:
            dtype = parse_dtype(self.text(self.get(w, "dtype", "workload"), "workload.dtype"))
        except ValueError:
            self.fail("workload.dtype", f"one of {', '.join(DTYPES)}", w["dtype"])
        try:
            features = Features.from_dict(w.get("features", {}))
        except (TypeError, ValueError, AttributeError) as exc:
            text = str(exc)
            raise ValueError(f"{self.source}: workload."
                             f"{text if text.startswith('features') else 'features: ' + text}"
                             ) from None
        heads = self.heads(self.get(w, "heads", "workload"), "workload.heads")
        seed = self.integer(self.get(w, "seed", "workload"), "workload.seed", 0,
                            CASE_LIMITS["seed"])
        try:
            workload = Workload(requests, heads, dtype, seed, features)
        except ValueError as exc:
            raise ValueError(f"{self.source}: workload: {exc}") from None
        lengths = {r.id: r.length for r in requests}
        a = self.schedule(self.get(d, "a", ""), "a", lengths)
        b = self.schedule(self.get(d, "b", ""), "b", lengths)
        focus = tuple(self.integer(x, f"focus[{i}]", 0, CASE_LIMITS["id"])
                      for i, x in enumerate(self.items(d.get("focus", []), "focus",
                                                      CASE_LIMITS["requests"])))
        return Case(str(d.get("perturbation", "")), workload, a, b, focus)


def case_from_dict(d: dict[str, Any], *, source: str = "case") -> Case:
    """Rebuild a case from :func:`case_to_dict`'s form. Every field is checked like a CLI value
    (type, range: :data:`CASE_LIMITS`, references between fields); ``ValueError`` naming
    ``source``, the field path, the expected and the actual value when it is malformed."""
    reader = _CaseReader(source)
    try:
        return reader.case(d)
    except ValueError:
        raise
    except (TypeError, KeyError, AttributeError) as exc:  # pragma: no cover - a missed check
        raise ValueError(f"{source}: malformed case: {type(exc).__name__}: {exc}") from None


def load_case(path: str | Path) -> Case:
    """Read a case file written by ``invariance check --cases DIR`` or :func:`case_to_dict`."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read a case file: {exc}") from None
    return case_from_dict(data, source=str(path))
