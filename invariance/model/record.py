"""Recording a model's module calls, cut to one request, and comparing two recordings.

A forward pass runs a batch; the check is about one request of it (the *focus*). A
:class:`Layout` says where that request sits in one forward call: its batch row ``b`` of ``B``
rows and, along the sequence dimension of length ``L``, the indices of its tokens (with their
absolute positions in the request). :func:`cut` maps any tensor a module takes or returns to the
request's part of it:

- a dim 0 of size ``B`` is the batch: row ``b`` (size 1 while ``B > 1``: a tensor shared by the
  whole batch, e.g. a batch statistic, compared as it is);
- inside it, the first dim of size ``L`` holds the tokens: the request's indices, moved to the
  front, one row per token;
- a dim 0 of size ``B * L`` is the tokens flattened (``[B * L, ...]``, e.g. router logits;
  in a decode step, ``L = 1``, a row without a token dim is that token's);
- anything else (a scalar, a weight, a cache object, a tensor over another request count) cannot
  be mapped and is listed by name, never compared by guess.

:class:`Recorder` puts forward hooks on every module and records, for every call, the cut of
every tensor leaf of its inputs and outputs (tuples, lists, dicts, ``ModelOutput``\\s and
dataclasses are walked). Calls are keyed by ``(module path, call index within the forward)``, so a
module called several times (a shared rotary embedding, a reused block) is compared call by
call. Tokens computed in several forwards (prefill, then decode steps) are compared by absolute
position, so a decode step lines up with the same token of a prefill.

The recorder can also *force* (:attr:`Recorder.reference`): a call whose inputs match the
reference's bit for bit but whose output does not is flagged as an independent origin, and the
reference's rows are written into its output in place, so that everything downstream sees
identical inputs again and the next independent origin can be found in the same pass. And it can
*trace* one call's torch ops (:class:`OpTrace`, a ``TorchDispatchMode``) to name the first op
inside it whose output differs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from invariance.compare import TensorDiff, compare_bits

__all__ = [
    "Call",
    "CallKey",
    "Layout",
    "OpRecord",
    "OpTrace",
    "Piece",
    "Recorder",
    "Recording",
    "Step",
    "cut",
    "diff_pieces",
    "leaves",
    "untraced",
]

#: ``(module path, call index of that module within one forward)``; the root module is ``""``.
CallKey = tuple[str, int]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: Leaves walked per call at most (a module returning hundreds of tensors is cut short, saying so).
MAX_LEAVES = 64
_MAX_DEPTH = 6
#: Ops whose output is uninitialised memory: its bits mean nothing (a kernel outside torch's
#: dispatcher, e.g. Triton, fills it later).
_UNINITIALISED = frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided",
                            "aten::new_empty", "aten::new_empty_strided"})


@dataclass(frozen=True)
class Layout:
    """Where the focus request sits in the tensors of one forward call.

    ``batch`` rows (``B``), sequence length ``length`` (``L``; ``None`` when the inputs have no
    token dimension, e.g. one feature row per request), the request's ``row`` and, along ``L``,
    the ``index`` of each of its compared tokens and that token's absolute position in the request
    (``tokens``)."""

    batch: int
    length: int | None
    row: int
    index: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()


@dataclass
class Piece:
    """The request's part of one tensor leaf: ``tensor`` holds one row per token of ``tokens``
    (token dim first) or, when ``tokens`` is ``None``, the request's whole slice. ``how`` says
    how it was cut (``batch``, ``flat``, ``shared``, ``request``); ``dim`` is the token dim inside
    the batch row (for writing back)."""

    tensor: torch.Tensor
    tokens: tuple[int, ...] | None
    how: str
    dim: int | None = None


def leaves(obj: Any, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` for every leaf of a module's inputs or outputs: tensors and other
    objects (a cache, a string) as leaves; tuples, lists, dicts (``ModelOutput``) and dataclasses
    walked. Names read like Python: ``[0]``, ``.logits``, ``['mask']``."""
    if isinstance(obj, torch.Tensor) or depth > _MAX_DEPTH:
        yield prefix or "(value)", obj
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from leaves(v, f"{prefix}[{i}]", depth + 1)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if v is not None:
                name = f"{prefix}.{k}" if isinstance(k, str) and k.isidentifier() else \
                    f"{prefix}[{k!r}]"
                yield from leaves(v, name, depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name, None)
            if v is not None:
                yield from leaves(v, f"{prefix}.{f.name}", depth + 1)
    elif obj is not None and not isinstance(obj, (bool, int, float, str)):
        yield prefix or "(value)", obj


@functools.lru_cache(maxsize=256)
def _index(index: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The layout's token indices as a tensor on ``device`` (made once, not per leaf)."""
    return torch.tensor(index, dtype=torch.long, device=device)


def cut(t: Any, lay: Layout) -> Piece | str:
    """The request's part of ``t`` under ``lay`` (module docstring), or why it cannot be cut."""
    if not isinstance(t, torch.Tensor):
        return f"a {type(t).__name__}, not a tensor"
    if t.dim() == 0:
        return "a scalar"
    if t.is_sparse or t.layout != torch.strided:
        return f"a {t.layout} tensor"
    B, L = lay.batch, lay.length
    t = t.detach()
    if t.shape[0] == B or (t.shape[0] == 1 and B > 1):
        shared = t.shape[0] != B
        part = t[0] if shared else t[lay.row]
        if L is not None:
            for d in range(part.dim()):
                if part.shape[d] == L:
                    idx = _index(lay.index, t.device)
                    rows = part.index_select(d, idx).movedim(d, 0).contiguous()
                    return Piece(rows, lay.tokens, "shared" if shared else "batch", d)
            if L == 1:  # one token per row (a decode step): [B, ...] is [B * L, ...]
                return Piece(part.unsqueeze(0).contiguous(), lay.tokens,
                             "shared" if shared else "flat", 0)
        return Piece(part.clone(memory_format=torch.contiguous_format), None,
                     "shared" if shared else "request")
    if L is not None and L > 1 and t.shape[0] == B * L:
        idx = _index(lay.index, t.device)
        rows = t.reshape(B, L, *t.shape[1:])[lay.row].index_select(0, idx).contiguous()
        return Piece(rows, lay.tokens, "flat", 0)
    what = f"{B} (batch)" + (f" or {B * L} (batch x tokens)" if L is not None and L > 1 else "")
    return f"shape {list(t.shape)}: no leading dim of size {what}"


def write_back(t: torch.Tensor, piece: Piece, rows: torch.Tensor, lay: Layout) -> bool:
    """Write ``rows`` (the request's part, shaped like ``piece.tensor``) into ``t`` in place, where
    ``piece`` was cut from; ``False`` when that cannot be done (a shared tensor, a read-only or
    expanded one)."""
    try:
        with torch.no_grad():
            if piece.how == "batch":
                part = t[lay.row]
                if piece.tokens is None or piece.dim is None:
                    part.copy_(rows)
                else:
                    idx = _index(lay.index, t.device)
                    part.index_copy_(piece.dim, idx, rows.movedim(0, piece.dim).to(t.dtype))
                return True
            if piece.how == "request":
                t[lay.row].copy_(rows)
                return True
            if piece.how == "flat" and lay.length is not None:
                idx = _index(lay.index, t.device)
                view = t.view(lay.batch, lay.length, *t.shape[1:])
                view[lay.row].index_copy_(0, idx, rows.to(t.dtype))
                return True
    except RuntimeError:
        return False
    return False


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two same-shape, same-dtype tensors hold the same bits."""
    return bool(torch.equal(_bytes(a), _bytes(b.to(a.device))))


def diff_pieces(actual: torch.Tensor, expected: torch.Tensor, name: str,
                tokens: Sequence[int] | None) -> TensorDiff:
    """:func:`invariance.compare.compare_bits` of two cut pieces (the first index labelled by
    token position when the piece has tokens); for non-float tensors the element count only."""
    if actual.dtype in _FLOATS:
        if tokens is not None and actual.dim() >= 1:
            dims = ("token", *[f"dim{i}" for i in range(1, actual.dim())])
            return compare_bits(actual, expected, name=name, dims=dims,
                                row_labels=[(t,) for t in tokens])
        return compare_bits(actual, expected, name=name)
    differ = actual.reshape(-1) != expected.to(actual.device).reshape(-1)
    count = int(differ.sum())
    return TensorDiff(name=name, shape=tuple(actual.shape),
                      dtype=str(actual.dtype).removeprefix("torch."),
                      num_elements=actual.numel(), num_different=count, nan_mismatches=0,
                      max_abs_diff=0.0, max_ulp=0, first_index=None, first_values=None)


# --------------------------------------------------------------------------------------------
# Recordings
# --------------------------------------------------------------------------------------------

@dataclass
class Call:
    """One module call of one forward: its key, type, completion order, enclosing call, and the
    request's pieces of its input and output leaves (``unmapped``: leaf -> why not cut)."""

    key: CallKey
    type: str
    order: int
    parent: CallKey | None
    inputs: dict[str, Piece] = field(default_factory=dict)
    outputs: dict[str, Piece] = field(default_factory=dict)
    unmapped: dict[str, str] = field(default_factory=dict)
    #: Whether the inputs matched the reference's (forcing runs only; ``None`` otherwise), and
    #: how many input leaves were compared.
    inputs_equal: bool | None = None
    inputs_compared: int = 0


@dataclass
class Step:
    """One forward of a run: the focus request's layout and its module calls in completion
    order."""

    layout: Layout
    calls: list[Call] = field(default_factory=list)


@dataclass
class Recording:
    """Every forward of one run, in order."""

    steps: list[Step] = field(default_factory=list)
    _index: dict[CallKey, list[tuple[int, Call]]] | None = field(default=None, repr=False)

    def _calls(self) -> dict[CallKey, list[tuple[int, Call]]]:
        if self._index is None:
            self._index = {}
            for i, step in enumerate(self.steps):
                for c in step.calls:
                    self._index.setdefault(c.key, []).append((i, c))
        return self._index

    def calls(self, key: CallKey) -> list[Call]:
        """The calls with ``key``, one per forward that made it, in step order."""
        return [c for _, c in self._calls().get(key, [])]

    def call_at(self, step: int, key: CallKey) -> Call | None:
        """The call ``key`` of forward ``step``, if that forward made it."""
        return next((c for i, c in self._calls().get(key, []) if i == step), None)

    def step_of(self, key: CallKey, token: int) -> int | None:
        """The forward in which call ``key`` computed absolute token ``token``."""
        for i, c in self._calls().get(key, []):
            if any(p.tokens is not None and token in p.tokens for p in c.outputs.values()):
                return i
        return None

    def rows(self, key: CallKey, leaf: str, where: str,
             tokens: Sequence[int]) -> torch.Tensor | None:
        """The request's rows of ``leaf`` (``where``: ``inputs`` or ``outputs``) of call ``key``
        at absolute token positions ``tokens``, gathered over every forward; ``None`` when one
        of them was not computed with that leaf."""
        found: dict[int, torch.Tensor] = {}
        for c in self.calls(key):
            piece = getattr(c, where).get(leaf)
            if piece is None or piece.tokens is None:
                continue
            for i, tok in enumerate(piece.tokens):
                found.setdefault(tok, piece.tensor[i])
        if not tokens or any(t not in found for t in tokens):
            return None
        return torch.stack([found[t] for t in tokens])

    def whole(self, step: int, key: CallKey, leaf: str, where: str) -> torch.Tensor | None:
        """The whole-request piece ``leaf`` of call ``key`` in forward ``step``, if any."""
        call = self.call_at(step, key)
        piece = getattr(call, where).get(leaf) if call is not None else None
        return piece.tensor if piece is not None and piece.tokens is None else None


@dataclass
class LeafComparison:
    """How one call compares with the reference: the differing leaves' diffs, the leaves that
    were compared, and those that could not be (leaf -> why)."""

    diffs: list[TensorDiff] = field(default_factory=list)
    compared: int = 0
    #: Elements of the compared leaves.
    elements: int = 0
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def equal(self) -> bool:
        return not self.diffs


def reference_piece(call: Call, step: int, name: str, piece: Piece, ref: Recording,
                    nsteps_equal: bool, where: str) -> torch.Tensor | str:
    """The reference's counterpart of ``call``'s piece ``name`` (module docstring), or why there
    is none: token rows by absolute position; a whole-request piece from the reference's forward
    of the same index, only when both runs made the same forwards."""
    if piece.tokens is not None:
        rows = ref.rows(call.key, name, where, piece.tokens)
        return rows if rows is not None else "the reference computed no such rows"
    if not nsteps_equal:
        return ("a whole-request tensor (no token dim) of a run whose forwards differ from the "
                "reference's")
    other = ref.whole(step, call.key, name, where)
    return other if other is not None else "absent from the reference"


def compare_call(call: Call, step: int, ref: Recording, nsteps_equal: bool,
                 where: str = "outputs") -> LeafComparison:
    """Compare ``call``'s pieces (``where``: ``inputs`` or ``outputs``) with the reference's
    (:func:`reference_piece`)."""
    result = LeafComparison()
    mine: dict[str, Piece] = getattr(call, where)
    for name, piece in mine.items():
        other = reference_piece(call, step, name, piece, ref, nsteps_equal, where)
        if isinstance(other, str):
            result.skipped[name] = other
            continue
        if other.shape != piece.tensor.shape or other.dtype != piece.tensor.dtype:
            result.skipped[name] = (f"shape {list(piece.tensor.shape)} {piece.tensor.dtype} "
                                    f"vs the reference's {list(other.shape)} {other.dtype}")
            continue
        result.compared += 1
        result.elements += piece.tensor.numel()
        if not same_bits(piece.tensor, other):
            result.diffs.append(diff_pieces(piece.tensor, other, name, piece.tokens))
    return result


# --------------------------------------------------------------------------------------------
# Op tracing
# --------------------------------------------------------------------------------------------

_UNTRACED: list[bool] = []


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """Ops run inside this block are not recorded by an active :class:`OpTrace`: for glue code
    that only moves bits (the attention swap's packing into an ``AttentionBatch``), whose
    per-request loops would otherwise make every batch look like another code path."""
    _UNTRACED.append(True)
    try:
        yield
    finally:
        _UNTRACED.pop()


@dataclass
class OpRecord:
    """One torch op run inside a traced call: its name (``aten::mm``), the innermost module call
    it ran in, the shapes of its tensor arguments, and the request's pieces of its outputs."""

    index: int
    name: str
    #: The module calls it ran inside, outermost first.
    stack: tuple[CallKey, ...]
    arg_shapes: list[list[int]]
    outputs: dict[str, Piece] = field(default_factory=dict)
    unmapped: dict[str, str] = field(default_factory=dict)


class OpTrace(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """A ``TorchDispatchMode`` that records every op dispatched while it is active, with the
    request's pieces of its outputs (under the recorder's current layout)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # NOTE: torch wraps a mode's __torch_dispatch__ in torch._disable_dynamo when the class
        # is defined, which imports torch._dynamo (seconds); this mode never runs under
        # torch.compile, so it opts out.
        return False

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.recorder = recorder
        self.ops: list[OpRecord] = []
        self.paused = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.paused or _UNTRACED:
            return out
        name = str(func._schema.name)
        shapes = [list(a.shape) for _, a in leaves(args) if isinstance(a, torch.Tensor)]
        rec = OpRecord(len(self.ops), name, self.recorder.stack(), shapes)
        lay = self.recorder.layout
        for leaf, value in leaves(out):
            if not isinstance(value, torch.Tensor):
                continue
            if name in _UNINITIALISED:
                rec.unmapped[leaf] = "uninitialised memory"
                continue
            piece = cut(value, lay)
            if isinstance(piece, Piece):
                rec.outputs[leaf] = piece
            else:
                rec.unmapped[leaf] = piece
        self.ops.append(rec)
        return out


# --------------------------------------------------------------------------------------------
# The recorder
# --------------------------------------------------------------------------------------------

@dataclass
class Flag:
    """A call whose inputs matched the reference's and whose output did not (forcing runs)."""

    step: int
    call: Call
    diff: TensorDiff
    #: Output leaves that differ.
    differing: int
    forced: bool


class Recorder:
    """Forward hooks on every module of ``model`` that record each call, cut to the request.

    Use as a context manager around the run; call :meth:`step` with each forward's layout
    before it. With ``reference`` set it forces (module docstring) and collects :attr:`flags`;
    with ``trace`` set to ``(step, key)`` it records that call's ops in :attr:`ops`.
    """

    def __init__(self, model: torch.nn.Module, *, reference: Recording | None = None,
                 trace: tuple[int, CallKey] | None = None) -> None:
        self.model = model
        self.reference = reference
        self.trace_at = trace
        self.recording = Recording()
        self.flags: list[Flag] = []
        self.ops: list[OpRecord] = []
        self._handles: list[Any] = []
        self._stack: list[Call] = []
        self._counts: dict[str, int] = {}
        self._order = 0
        self._trace: OpTrace | None = None
        self._trace_depth = 0
        self._nsteps_equal = False

    # --- life cycle -----------------------------------------------------------------------
    def __enter__(self) -> Recorder:
        for path, module in self.model.named_modules():
            self._handles.append(module.register_forward_pre_hook(
                self._pre(path), with_kwargs=True))
            self._handles.append(module.register_forward_hook(
                self._post(path), with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._stop_trace()

    def step(self, layout: Layout, nsteps_equal: bool = True) -> None:
        """Start recording a new forward whose focus request sits at ``layout``."""
        self.recording.steps.append(Step(layout))
        self.recording._index = None
        self._counts.clear()
        self._stack.clear()
        self._order = 0
        self._nsteps_equal = nsteps_equal
        self._stop_trace()

    @property
    def layout(self) -> Layout:
        return self.recording.steps[-1].layout

    def stack(self) -> tuple[CallKey, ...]:
        """The module calls running now, outermost first."""
        return tuple(c.key for c in self._stack)

    # --- hooks ----------------------------------------------------------------------------
    def _pause(self, paused: bool) -> None:
        if self._trace is not None:
            self._trace.paused = paused

    def _pre(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
            self._pause(True)
            try:
                n = self._counts.get(path, 0)
                self._counts[path] = n + 1
                parent = self._stack[-1].key if self._stack else None
                call = Call((path, n), type(module).__name__, -1, parent)
                self._cut_into(call, "inputs", ("args", args), ("kwargs", kwargs))
                if self.reference is not None:
                    cmp = compare_call(call, len(self.recording.steps) - 1, self.reference,
                                       self._nsteps_equal, "inputs")
                    call.inputs_equal = cmp.equal
                    call.inputs_compared = cmp.compared
                self._stack.append(call)
                if self.trace_at == (len(self.recording.steps) - 1, call.key):
                    self._start_trace()
            finally:
                self._pause(False)
        return hook

    def _post(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 output: Any) -> None:
            self._pause(True)
            try:
                if not self._stack or self._stack[-1].key[0] != path:
                    return  # a call whose pre-hook did not run (hooks added mid-forward)
                call = self._stack.pop()
                call.order = self._order
                self._order += 1
                self._cut_into(call, "outputs", ("", output))
                self.recording.steps[-1].calls.append(call)
                if self.reference is not None:
                    self._force(call, output)
                if self._trace is not None and self.trace_at == (
                        len(self.recording.steps) - 1, call.key):
                    self._stop_trace()
            finally:
                self._pause(False)
        return hook

    def _cut_into(self, call: Call, where: str, *named: tuple[str, Any]) -> None:
        pieces: dict[str, Piece] = getattr(call, where)
        lay = self.layout
        count = 0
        for prefix, obj in named:
            for name, value in leaves(obj, prefix):
                label = f"{where[:-1]} {name}" if name else where[:-1]
                if count >= MAX_LEAVES:
                    call.unmapped[f"{where}..."] = f"more than {MAX_LEAVES} leaves: not walked"
                    return
                count += 1
                piece = cut(value, lay)
                if isinstance(piece, Piece):
                    pieces[name] = piece
                else:
                    call.unmapped[label] = piece

    def _force(self, call: Call, output: Any) -> None:
        ref = self.reference
        if ref is None:
            return
        step = len(self.recording.steps) - 1
        cmp = compare_call(call, step, ref, self._nsteps_equal, "outputs")
        if cmp.equal or not call.inputs_equal:
            return  # equal, or the difference came in through its inputs: not this call's own
        forced = True
        values = dict(leaves(output))
        for d in cmp.diffs:
            piece = call.outputs[d.name]
            rows = reference_piece(call, step, d.name, piece, ref, self._nsteps_equal, "outputs")
            tensor = values.get(d.name)
            if (isinstance(rows, str) or not isinstance(tensor, torch.Tensor)
                    or not write_back(tensor, piece, rows, self.layout)):
                forced = False
            else:
                piece.tensor = rows.clone()
        self.flags.append(Flag(step, call, cmp.diffs[0], len(cmp.diffs), forced))

    def _start_trace(self) -> None:
        self._trace = OpTrace(self)
        self._trace.paused = True
        self._trace.__enter__()  # type: ignore[no-untyped-call]

    def _stop_trace(self) -> None:
        if self._trace is not None:
            trace, self._trace = self._trace, None
            trace.__exit__(None, None, None)  # type: ignore[no-untyped-call]
            self.ops = trace.ops
