"""Measured launch settings: a table, per GPU, of the bit-neutral settings that ran fastest on each
shape bucket, written by ``invariance tune`` on that GPU and read by the planner.

What a setting may change is fixed by the contract (kernels/README.md, "Bit-defining and
bit-neutral settings"): the table holds only :class:`~kernels.Tuning` fields other than
``block_n`` and the plan, never a split size or a tile width. The tuner admits a candidate only
when its output and LSE equal the rules' bit for bit (``invariance tune``), and the full check
with the table in place is the proof (reports/<gpu>/). Why a shipped table with the shape rules
of :mod:`kernels.config` as the fallback, not an autotuner at plan time: ARCHITECTURE.md,
"Tuning".

**Buckets.** A call's bucket is a pure function of what the planner already knows on the host
(:func:`bucket`): dtype, head dim, GQA group, page size, batch size, query tokens per request
and the longest KV length (the checked lengths, the caller's ``host_lens``, else the block
table's bound), and the call's features (:func:`feature_tag`: the window exactly, sinks, a
soft-cap, an FP8 cache), which change the kernels' code and so are tuned and proven apart. No
lookup reads the device, so it is safe under CUDA-graph capture.

**Which table.** ``KERNELS_TUNED_TABLE`` names a table file, or ``off`` (also ``0``, ``none``)
for none; unset: ``kernels/tuned/<gpu>.json`` for the running GPU (``nvidia-h200.json`` for an
"NVIDIA H200"), if the package ships one. Each file is read once per process. A table applies
only on the GPU it names, under the Triton release (major.minor) it was measured with, and only
to calls with the default split sizes, no ``Tuning`` of the caller's and ``plan="auto"``, and
to a call with features only through an entry of a bucket with the same window and kinds of
feature (one measured with them: ``invariance tune --feature``); everywhere else the rules
decide. An entry a call cannot take (the planner refuses its settings for that call) also
leaves it to the rules, with a ``RuntimeWarning`` once per bucket; so does a table named by
``KERNELS_TUNED_TABLE`` for another GPU or Triton release.
"""

from __future__ import annotations

import functools
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "SCHEMA",
    "TABLE_ENV",
    "TUNABLE",
    "TunedEntry",
    "TunedTable",
    "active_table",
    "bucket",
    "device_slug",
    "feature_tag",
    "load_table",
    "table_path",
]

SCHEMA = "kernels-tuned/1"
TABLE_ENV = "KERNELS_TUNED_TABLE"
_TABLE_DIR = Path(__file__).resolve().parent / "tuned"
_OFF = ("off", "0", "none")

#: The declared space of bit-neutral settings the tuner searches, in the order it tries them,
#: and the values it tries (``plan`` is the launch plan; the rest are :class:`~kernels.Tuning`
#: fields). A value a call cannot take (``plan_attention`` raises) is skipped for that call.
TUNABLE: dict[str, tuple[Any, ...]] = {
    "plan": ("fused", "split"),
    # First: the Gluon tile takes few of the Triton kernels' settings (block_m, warps, stages),
    # so it is tried from the plan's own launch, not after those are fixed.
    "gluon": (False, True),
    "block_m": (64, 128),
    "num_warps": (4, 8),
    "value_blocks": (1, 2, 4, 8),
    "tiles_per_step": (1, 2),
    "num_stages": (2, 3, 4, 5),
    "nested_loop": (False, True),
    "keys_rows": (False, True),
}

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
# Upper bounds of the size classes, and the label of each class (the last is open).
_BATCH = ((1, "b1"), (4, "b4"), (16, "b16"), (64, "b64"), (256, "b256"), (None, "bmax"))
_QPER = ((1, "q1"), (8, "q8"), (128, "q128"), (1024, "q1k"), (None, "qmax"))
_KV = ((1024, "kv1k"), (4096, "kv4k"), (16384, "kv16k"), (65536, "kv64k"), (None, "kvmax"))


def _size_class(value: float, classes: tuple[tuple[int | None, str], ...]) -> str:
    for upper, label in classes:
        if upper is None or value <= upper:
            return label
    raise AssertionError("the last class is open")  # pragma: no cover


def bucket(dtype: torch.dtype, head_dim: int, group: int, page_size: int, batch_size: int,
           num_tokens: int, max_kv_len: int, features: str = "") -> str:
    """The shape bucket of a call, e.g. ``bf16/d128/g4/p16/b16/q1/kv16k``: dtype, head dim,
    GQA group, page size, then the class of the batch size (at most 1, 4, 16, 64, 256, more),
    of the query tokens per request on average (1, 8, 128, 1024, more) and of the longest KV
    length (1k, 4k, 16k, 64k, more); then, for a call with features, their
    :func:`feature_tag` (``.../kv16k/w4095+cap``). Pure."""
    per_request = num_tokens / max(batch_size, 1)
    key = "/".join((
        _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch.")), f"d{head_dim}", f"g{group}",
        f"p{page_size}", _size_class(batch_size, _BATCH), _size_class(per_request, _QPER),
        _size_class(max_kv_len, _KV)))
    return f"{key}/{features}" if features else key


def feature_tag(window_left: int = -1, sinks: bool = False, soft_cap: bool = False,
                fp8: bool = False) -> str:
    """The features of a call as a bucket sees them ('' without any): the window exactly
    (``w`` and ``window_left``: a model's windows are constants, and an entry is proven at the
    window it was measured with), then ``sinks``, ``cap`` (a logit soft-cap), ``fp8`` (an FP8
    KV cache), joined by ``+`` in that order. A feature changes the kernels' code, so its calls
    are tuned (and proven bit-neutral) apart. Pure."""
    parts = [] if window_left < 0 else [f"w{window_left}"]
    parts += [name for name, on in (("sinks", sinks), ("cap", soft_cap), ("fp8", fp8)) if on]
    return "+".join(parts)


def _canonical_features(tag: str) -> bool:
    """Whether ``tag`` is a :func:`feature_tag` as that function writes it."""
    parts = tag.split("+")
    window = [p for p in parts if p.startswith("w")]
    rest = [p for p in parts if not p.startswith("w")]
    if len(window) > 1 or (window and (parts[0] != window[0]
                                       or not re.fullmatch(r"w(0|[1-9]\d*)", window[0]))):
        return False
    order = ("sinks", "cap", "fp8")
    return (bool(parts) and all(p in order for p in rest)
            and rest == sorted(set(rest), key=order.index))


def device_slug(name: str) -> str:
    """A GPU's name as a file name: ``"NVIDIA H200"`` -> ``nvidia-h200``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@dataclass(frozen=True)
class TunedEntry:
    """The settings of one bucket: the plan and the :class:`~kernels.Tuning` fields (only those
    that differ from the rules), with what the tuner measured (us, on its workloads)."""

    plan: str
    tuning: dict[str, Any]
    us: float | None = None
    rules_us: float | None = None
    workloads: tuple[str, ...] = ()
    #: The feature values the entry was measured and proven with (``{}``: none), a record: the
    #: bucket's :func:`feature_tag` is what the planner matches.
    features: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TunedTable:
    """One GPU's table: ``device`` (:func:`device_slug`), the Triton release it was measured
    with, and an entry per bucket (the file also lists, under ``rules``, the buckets searched
    where no candidate beat the rules)."""

    device: str
    triton: str
    entries: dict[str, TunedEntry]
    path: str = ""
    #: A contract experiment (``invariance tune --block-n``): measured at KV tiles of this many
    #: keys, never applied by the planner. None: the contract of ``tile_config``.
    block_n: int | None = None


_BUCKET = re.compile(r"(fp16|bf16|fp32)/d\d+/g\d+/p\d+/b(1|4|16|64|256|max)/"
                     r"q(1|8|128|1k|max)/kv(1k|4k|16k|64k|max)(/(?P<features>[a-z0-9+]+))?")


def _is_bucket(key: str) -> bool:
    """Whether ``key`` is a bucket as :func:`bucket` writes it."""
    m = _BUCKET.fullmatch(key)
    return m is not None and (m["features"] is None or _canonical_features(m["features"]))
_ENTRY_KEYS = frozenset({"plan", "tuning", "us", "rules_us", "workloads", "features"})
_TABLE_KEYS = frozenset({"schema", "device", "triton", "block_n", "command", "entries",
                         "rules"})


def _fail(path: str, what: str, expected: str, got: object) -> ValueError:
    return ValueError(f"tuned table {path}: {what}: expected {expected}, got {got!r}")


def _entry(path: str, key: str, raw: object) -> TunedEntry:
    from kernels.plan import Tuning  # the table's fields are Tuning's; it checks their values

    if not isinstance(raw, dict):
        raise _fail(path, f"entry {key!r}", "an object", raw)
    if not _is_bucket(key):
        raise _fail(path, "entry key", "a bucket like 'bf16/d128/g4/p16/b16/q1/kv16k' or, with "
                    "features, 'bf16/d64/g8/p16/b16/q1/kv16k/w127+sinks' (kernels.tuned.bucket)",
                    key)
    unknown = sorted(set(raw) - _ENTRY_KEYS)
    if unknown:
        raise _fail(path, f"entry {key!r}", f"keys among {sorted(_ENTRY_KEYS)}", unknown)
    plan = raw.get("plan")
    if plan not in ("fused", "split"):
        raise _fail(path, f"entry {key!r}: plan", "'fused' or 'split'", plan)
    tuning = raw.get("tuning", {})
    allowed = set(TUNABLE) - {"plan"}
    if not isinstance(tuning, dict) or not set(tuning) <= allowed:
        raise _fail(path, f"entry {key!r}: tuning", f"an object with keys among "
                    f"{sorted(allowed)}", tuning)
    try:
        Tuning(**tuning)
    except ValueError as exc:
        raise ValueError(f"tuned table {path}: entry {key!r}: {exc}") from None
    workloads = raw.get("workloads", [])
    if not isinstance(workloads, list) or not all(isinstance(w, str) for w in workloads):
        raise _fail(path, f"entry {key!r}: workloads", "a list of names", workloads)
    features = raw.get("features", {})
    if not isinstance(features, dict) or not all(isinstance(k, str) for k in features):
        raise _fail(path, f"entry {key!r}: features", "an object (the features it was "
                    "measured with)", features)
    us, rules_us = raw.get("us"), raw.get("rules_us")
    for name, value in (("us", us), ("rules_us", rules_us)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _fail(path, f"entry {key!r}: {name}", "a number or null", value)
    return TunedEntry(plan=plan, tuning=dict(tuning), us=us, rules_us=rules_us,
                      workloads=tuple(workloads), features=dict(features))


def load_table(path: str | os.PathLike[str]) -> TunedTable:
    """Read and check a table file (``ValueError`` naming the file and the field; unknown keys
    are errors, never ignored)."""
    p = str(path)
    try:
        raw = json.loads(Path(p).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, not JSON
        raise ValueError(f"tuned table {p}: cannot be read as JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        got = raw.get("schema") if isinstance(raw, dict) else raw
        raise _fail(p, "schema", repr(SCHEMA), got)
    unknown = sorted(set(raw) - _TABLE_KEYS)
    if unknown:
        raise _fail(p, "keys", f"keys among {sorted(_TABLE_KEYS)}", unknown)
    device, release = raw.get("device"), raw.get("triton")
    if not isinstance(device, str) or not device or device != device_slug(device):
        raise _fail(p, "device", "a GPU name as kernels.tuned.device_slug writes it "
                    "(e.g. 'nvidia-h200')", device)
    if not isinstance(release, str) or not re.fullmatch(r"\d+\.\d+(\.\S*)?", release):
        raise _fail(p, "triton", "a Triton version like '3.6.0'", release)
    block_n = raw.get("block_n")
    if block_n is not None and (isinstance(block_n, bool) or not isinstance(block_n, int)
                                or block_n < 16 or block_n & (block_n - 1)):
        raise _fail(p, "block_n", "a power of two >= 16 (a contract experiment), or absent",
                    block_n)
    entries = raw.get("entries")
    rules = raw.get("rules", [])
    if not isinstance(rules, list) or not all(isinstance(r, str) and _is_bucket(r)
                                              for r in rules):
        raise _fail(p, "rules", "a list of buckets", rules)
    if not isinstance(entries, dict):
        raise _fail(p, "entries", "an object keyed by bucket", entries)
    return TunedTable(device=raw["device"], triton=raw["triton"], path=p, block_n=block_n,
                      entries={str(k): _entry(p, str(k), v) for k, v in entries.items()})


def table_path(slug: str) -> Path | None:
    """The table in force for the GPU ``slug``: ``KERNELS_TUNED_TABLE`` (None when ``off``,
    ``0`` or ``none``), else the shipped ``kernels/tuned/<slug>.json`` if it exists."""
    chosen = os.environ.get(TABLE_ENV, "").strip()
    if chosen.lower() in _OFF:
        return None
    if chosen:
        return Path(chosen)
    return _shipped(slug)


@functools.cache
def _shipped(slug: str) -> Path | None:
    shipped = _TABLE_DIR / f"{slug}.json"
    return shipped if shipped.is_file() else None


def release(version: str) -> str:
    """A Triton version's release, ``major.minor``: what a table's bits were measured under."""
    return ".".join(version.split(".")[:2])


@functools.cache
def _triton_release() -> str:
    import triton

    return release(triton.__version__)


@functools.cache
def _cached_table(path: str) -> TunedTable:
    try:
        return load_table(path)
    except ValueError as exc:
        if os.environ.get(TABLE_ENV, "").strip():
            raise ValueError(f"{TABLE_ENV}: expected a readable table file, or 'off', got "
                             f"{path!r}: {exc}") from None
        raise


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def warn_unused_entry(table: TunedTable, key: str, reason: str) -> None:
    """Say once per (table, bucket) that an entry cannot run a call (the rules then decide)."""
    _warn_once(f"tuned table {table.path}: the entry of bucket {key} cannot run this call "
               f"({reason}); the shape rules decide it")


def active_table(slug: str) -> TunedTable | None:
    """The table that applies on GPU ``slug`` under this Triton release, or None. Host only:
    each file is read and checked once per process; a lookup is an environment read and dict
    lookups. A table named by ``KERNELS_TUNED_TABLE`` that does not apply here (another GPU or
    Triton release) is said once, as a ``RuntimeWarning``."""
    path = table_path(slug)
    if path is None:
        return None
    table = _cached_table(str(path))
    running = _triton_release()
    if table.block_n is not None:
        _warn_once(f"tuned table {path}: measured under another contract (KV tiles of "
                   f"{table.block_n} keys): a contract experiment, never applied")
        return None
    if table.device != slug or release(table.triton) != running:
        if os.environ.get(TABLE_ENV, "").strip():
            _warn_once(f"{TABLE_ENV}: {path} is a table of {table.device} under Triton "
                       f"{release(table.triton)}, not of {slug} under Triton {running}: the "
                       f"shape rules decide")
        return None
    return table
