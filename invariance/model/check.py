"""``check_model``: find the first op that breaks batch invariance in a whole model.

For every scenario (:mod:`invariance.model.scenarios`) the focus request runs in the reference
plan and the variant plan under a :class:`~invariance.model.record.Recorder`, and every module
call's output is compared for the request, bit for bit, in execution order. When they differ:

1. both runs are repeated: a run that disagrees with itself makes the scenario
   ``nondeterministic``, else ``batch-variant``;
2. a *forcing* run of the variant flags every call whose inputs match the reference's and whose
   output does not, resetting its output to the reference's so the next one can be found: the
   first flagged call is the **origin** (everything after it merely inherits the difference),
   the rest are the other independent origins, grouped by module type;
3. a ``TorchDispatchMode`` trace of the origin call in both runs (forcing on, ops inside flagged
   sub-modules left out) names the first torch op whose output differs, with the shapes of its
   arguments in both runs, from which the cause is worded (a GEMM whose M is the batch's token
   count, an attention kernel, a reduction across the batch);
4. the variant is shrunk to the smallest batch that still diverges, which becomes the case of a
   reproducer that :func:`replay_model` runs in another process.

The report also carries the clean prefix (calls that agreed before the first difference), the
per-layer curve of the worst ULP distance up to the output, and the tokens whose greedy choice
flipped.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import math
import pprint
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from invariance.compare import TensorDiff
from invariance.model.inputs import (
    FOCUS,
    ModelInterface,
    NoCache,
    Plan,
    detect_interface,
    run_plan,
)
from invariance.model.loading import LoadedModel, ModelSpec, load_model
from invariance.model.record import (
    Call,
    CallKey,
    Flag,
    LeafComparison,
    OpRecord,
    Piece,
    Recorder,
    Recording,
    compare_call,
    diff_pieces,
    same_bits,
)
from invariance.model.report import (
    LayerPoint,
    ModelReport,
    OpFinding,
    Origin,
    OriginGroup,
    Reproducer,
    ScenarioResult,
    TokenFlip,
)
from invariance.model.scenarios import FAMILIES, Scenario, Skip, build_scenarios

__all__ = ["CASE_SCHEMA", "DEFAULT_BATCH_SIZES", "check_model", "replay_model"]

CASE_SCHEMA = "invariance.model-case"
DEFAULT_BATCH_SIZES: tuple[int, ...] = (2, 3, 4, 8, 16)
DEFAULT_LENGTH = 8
DEFAULT_DECODE_STEPS = 3
#: Independent-origin groups whose first op is traced (each costs two more runs).
MAX_TRACED_GROUPS = 4
#: Runs the shrinker may spend on one scenario.
SHRINK_BUDGET = 16
_UNMAPPED_EXAMPLES = 8
_MODEL_DTYPES = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
                 "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                 "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
                 "float64": torch.float64, "fp64": torch.float64, "double": torch.float64}

Progress = Callable[[int, int, str], None]


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------

def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {_show(value)}")
    return value


def parse_model_dtype(dtype: object) -> torch.dtype | None:
    """``None`` (the model's own), a torch floating dtype or a name (``bf16``, ``float64``...)."""
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype) and dtype in _MODEL_DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.strip().lower() in _MODEL_DTYPES:
        return _MODEL_DTYPES[dtype.strip().lower()]
    raise ValueError(f"dtype: expected one of float16, bfloat16, float32, float64 (or bf16, "
                     f"fp16, fp32, fp64), got {_show(dtype)}")


def _device(device: object) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev: torch.device | None
    try:
        dev = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or 'cuda', got {_show(device)}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: CUDA was requested but torch sees no CUDA GPU here")
    return dev


def _families(scenarios: object) -> list[str]:
    if scenarios is None or scenarios == "all":
        return list(FAMILIES)
    items = [s.strip() for s in scenarios.split(",")] if isinstance(scenarios, str) else (
        list(scenarios) if isinstance(scenarios, (list, tuple)) else None)
    if not items or any(not isinstance(s, str) or s not in FAMILIES for s in items):
        raise ValueError(f"scenarios: expected some of {', '.join(FAMILIES)} (or 'all'), got "
                         f"{_show(scenarios)}")
    return list(dict.fromkeys(items))


def _batch_sizes(sizes: object) -> list[int]:
    if sizes is None:
        return list(DEFAULT_BATCH_SIZES)
    if isinstance(sizes, str):
        try:
            sizes = [int(s) for s in sizes.split(",") if s.strip()]
        except ValueError:
            raise ValueError(f"batch_sizes: expected ints >= 2 (e.g. 2,4,8), got "
                             f"{_show(sizes)}") from None
    if (not isinstance(sizes, (list, tuple)) or not sizes
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 2 for s in sizes)):
        raise ValueError(f"batch_sizes: expected ints >= 2 (e.g. 2,4,8), got {_show(sizes)}")
    return sorted(set(sizes))


# --------------------------------------------------------------------------------------------
# Comparing two runs
# --------------------------------------------------------------------------------------------

@dataclass
class RunComparison:
    """Two recordings compared call by call in the variant's execution order."""

    first: tuple[int, Call, LeafComparison] | None = None
    clean_prefix: int = 0
    calls_compared: int = 0
    #: Per call key: (worst ULP, differing elements, compared elements), over all forwards.
    per_call: dict[CallKey, tuple[int, int, int]] = field(default_factory=dict)
    unmapped: dict[str, str] = field(default_factory=dict)

    @property
    def equal(self) -> bool:
        return self.first is None


def compare_runs(ref: Recording, var: Recording, nsteps_equal: bool) -> RunComparison:
    """Compare every call of ``var`` with ``ref``'s (module docstring)."""
    out = RunComparison()
    for s, step in enumerate(var.steps):
        for call in step.calls:
            label = f"{call.key[0] or '(model)'}#{call.key[1]}"
            for leaf, why in call.unmapped.items():
                out.unmapped.setdefault(f"{label} {leaf}", why)
            if not ref.calls(call.key):
                out.unmapped.setdefault(f"{label}", "no such call in the reference run")
                continue
            cmp = compare_call(call, s, ref, nsteps_equal)
            for leaf, why in cmp.skipped.items():
                out.unmapped.setdefault(f"{label} output {leaf}", why)
            if not cmp.compared:
                continue
            out.calls_compared += 1
            worst = max((d.max_ulp for d in cmp.diffs), default=0)
            differing = sum(d.num_different for d in cmp.diffs)
            old = out.per_call.get(call.key, (0, 0, 0))
            out.per_call[call.key] = (max(old[0], worst), old[1] + differing,
                                      old[2] + cmp.elements)
            if cmp.equal and out.first is None:
                out.clean_prefix += 1
            elif not cmp.equal and out.first is None:
                out.first = (s, call, cmp)
    return out


def layer_paths(model: torch.nn.Module) -> list[str]:
    """The model's layers: the children of its shallowest ``ModuleList``/``Sequential`` with
    the most children (``model.layers`` of a transformer, the stages of a ``Sequential``), else
    the root's children."""
    best: tuple[int, int, str, torch.nn.Module] | None = None
    for path, m in model.named_modules():
        if isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential)) and len(m) >= 2:
            rank = (path.count(".") + (1 if path else 0), -len(m))
            if best is None or rank < (best[0], best[1]):
                best = (rank[0], rank[1], path, m)
    if best is None:
        return [name for name, _ in model.named_children()]
    prefix = f"{best[2]}." if best[2] else ""
    return [prefix + name for name, _ in best[3].named_children()]


def _curve(model: torch.nn.Module, var: Recording, cmp: RunComparison) -> list[LayerPoint]:
    layers = set(layer_paths(model))
    points = []
    seen: set[CallKey] = set()
    for step in var.steps:
        for call in step.calls:
            if call.key in seen or call.key not in cmp.per_call:
                continue
            if call.key[0] in layers:
                seen.add(call.key)
                ulp, differing, elements = cmp.per_call[call.key]
                label = call.key[0] + (f"#{call.key[1]}" if call.key[1] else "")
                points.append(LayerPoint(label, call.key[0], ulp, differing, elements))
    root = cmp.per_call.get(("", 0))
    if root is not None:
        points.append(LayerPoint("output", "", *root))
    return points


def _flips(ref: Recording, var: Recording) -> list[TokenFlip]:
    """Token positions whose argmax over the model output's last dim differs."""
    flips: list[TokenFlip] = []
    for step in var.steps:
        root = next((c for c in step.calls if c.key == ("", 0)), None)
        if root is None:
            continue
        name = ".logits" if ".logits" in root.outputs else next(
            (n for n, p in root.outputs.items()
             if p.tokens is not None and p.tensor.is_floating_point()), None)
        piece = root.outputs.get(name) if name is not None else None
        if piece is None or piece.tokens is None or piece.tensor.dim() < 2:
            continue
        other = ref.rows(("", 0), name or "", "outputs", piece.tokens)
        if other is None or other.shape != piece.tensor.shape:
            continue
        a = piece.tensor.reshape(len(piece.tokens), -1, piece.tensor.shape[-1])[:, -1]
        b = other.reshape(len(piece.tokens), -1, other.shape[-1])[:, -1]
        for tok, x, y in zip(piece.tokens, b.argmax(-1).tolist(), a.argmax(-1).tolist(),
                             strict=True):
            if x != y:
                flips.append(TokenFlip(tok, int(x), int(y)))
    return flips


# --------------------------------------------------------------------------------------------
# Op tracing and causes
# --------------------------------------------------------------------------------------------

_GEMMS = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul",
    "aten::linear", "aten::mv", "aten::addmv", "aten::dot", "aten::vdot", "aten::_scaled_mm",
    "aten::_int_mm", "aten::_grouped_mm", "aten::_scaled_grouped_mm",
    "aten::_weight_int4pack_mm", "aten::_weight_int8pack_mm", "aten::_addmm_activation"})
_INPUT_ARG = {"aten::addmm": 1, "aten::baddbmm": 1, "aten::addbmm": 1, "aten::addmv": 1,
              "aten::_addmm_activation": 1}
_REDUCTIONS = ("sum", "mean", "var", "std", "norm", "softmax", "cumsum", "prod", "amax",
               "logsumexp", "batch_norm", "layer_norm", "rms_norm", "group_norm")


def _gemm_rows(name: str, shapes: Sequence[Sequence[int]]) -> int | None:
    i = _INPUT_ARG.get(name, 0)
    if len(shapes) <= i or not shapes[i]:
        return None
    return math.prod(shapes[i][:-1]) if len(shapes[i]) > 1 else 1


def cause_of(name: str, shapes: Sequence[Sequence[int]], ref_shapes: Sequence[Sequence[int]],
             shared: bool) -> str:
    """The likely reason why op ``name`` gives the request other bits in the batch, in words."""
    if name in _GEMMS:
        m, m_ref = _gemm_rows(name, shapes), _gemm_rows(name, ref_shapes)
        if m is not None and m_ref is not None and m != m_ref:
            return (f"a GEMM whose M (rows) is {m} in this run and {m_ref} in the reference: "
                    f"M is the batch's token count, and the BLAS library (cuBLAS on a GPU, "
                    f"MKL/oneDNN on a CPU) picks its kernel, tiling and split-K reduction order "
                    f"from it")
        return ("a GEMM of the same shape in both runs that still gives other bits (the data "
                "layout or a nondeterministic reduction)")
    if "attention" in name:
        return (f"an attention kernel whose reduction over the keys depends on the batch (its "
                f"arguments {shapes} vs {ref_shapes} in the reference: batch size, key length "
                f"and padding choose its blocks and splits)")
    if shared:
        return ("an op that reduces across the batch: its output has no row of its own per "
                "request (batch statistics)")
    if any(r in name for r in _REDUCTIONS):
        return (f"a reduction whose order depends on the shape of the batch (arguments "
                f"{shapes} vs {ref_shapes})")
    return (f"its result for this request depends on the rest of the batch (arguments "
            f"{shapes} vs {ref_shapes})")


def _inside(op: OpRecord, key: CallKey) -> tuple[CallKey, ...]:
    """The module calls ``op`` ran in below ``key`` (the traced call)."""
    return op.stack[op.stack.index(key) + 1:] if key in op.stack else op.stack


def _op_diff(a: OpRecord, b: OpRecord, shared: bool) -> tuple[TensorDiff, bool] | None:
    """How op ``a`` (variant) differs from op ``b`` (reference) for the request, and whether
    the differing output is shared by the batch; ``None`` when they agree. Outputs shared by
    the batch (leading dim 1) are compared only when ``shared``: when both runs took the same
    code path, so that the two ops are the same computation (a batch statistic); in a module
    that loops over the batch rows in Python a leading 1 is just another request's row."""
    for leaf, pa in a.outputs.items():
        pb = b.outputs.get(leaf)
        if pb is None or (pa.how == "shared" and not shared):
            continue
        x, y, tokens = _align(pa, pb)
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
            continue
        if not same_bits(x, y):
            return diff_pieces(x, y, f"{a.name} output{leaf}", tokens), pa.how == "shared"
    return None


def _align(pa: Piece, pb: Piece) -> tuple[torch.Tensor | None, torch.Tensor | None,
                                          list[int] | None]:
    if pa.tokens is None or pb.tokens is None:
        if pa.tokens is None and pb.tokens is None:
            return pa.tensor, pb.tensor, None
        return None, None, None
    common = [t for t in pa.tokens if t in pb.tokens]
    if not common:
        return None, None, None
    ia = torch.tensor([pa.tokens.index(t) for t in common], device=pa.tensor.device)
    ib = torch.tensor([pb.tokens.index(t) for t in common], device=pb.tensor.device)
    return pa.tensor.index_select(0, ia), pb.tensor.index_select(0, ib), common


#: An op that differs at most this many ops after the two runs' op sequences part is reported
#: as the origin op; farther away (a loop over the batch rows), the parting op itself is.
NEAR_PARTING = 8


def first_differing_op(var_ops: list[OpRecord], ref_ops: list[OpRecord], key: CallKey,
                       skip: set[CallKey]) -> OpFinding | None:
    """The first op (in the variant's order) of the traced call ``key`` whose output differs
    from its counterpart in the reference; ops inside the sub-module calls of ``skip`` (other
    independent origins, and calls whose outputs agreed) are left out. When the two runs ran
    other ops (another code path), ops are matched by name and the op where the sequences part
    is named in ``note``."""
    va = [op for op in var_ops if not set(_inside(op, key)) & skip]
    ra = [op for op in ref_ops if not set(_inside(op, key)) & skip]
    names_v, names_r = [op.name for op in va], [op.name for op in ra]
    if names_v == names_r:
        for v, r in zip(va, ra, strict=True):
            found = _op_diff(v, r, shared=True)
            if found is not None:
                return _finding(v, r, found, len(var_ops), "", va, ra)
        return None
    k = next((i for i, (x, y) in enumerate(zip(names_v, names_r, strict=False)) if x != y),
             min(len(names_v), len(names_r)))
    at_v = names_v[k] if k < len(names_v) else "(end)"
    at_r = names_r[k] if k < len(names_r) else "(end)"
    note = (f"the module runs other ops in this run ({len(names_v)} ops) than in the reference "
            f"({len(names_r)}): another code path, parting at op #{k}: {at_v} here, {at_r} in "
            f"the reference")
    matcher = difflib.SequenceMatcher(None, names_v, names_r, autojunk=False)
    for blk in matcher.get_matching_blocks():
        for i in range(blk.size):
            v, r = va[blk.a + i], ra[blk.b + i]
            if blk.a + i > k + NEAR_PARTING:
                break
            found = _op_diff(v, r, shared=False)
            if found is not None:
                return _finding(v, r, found, len(var_ops), note, va, ra)
    if k < len(va):
        op = va[k]
        return OpFinding(op.name, op.index, len(var_ops), op.arg_shapes, [],
                         f"the module takes another code path for this batch: {op.name} where "
                         f"the reference runs {at_r}", None, note)
    return None


def _gathered_gemm(va: list[OpRecord], ra: list[OpRecord],
                   before: OpRecord) -> tuple[OpRecord, OpRecord] | None:
    """The first GEMM before op ``before`` whose output could not be mapped to the request (its
    rows were gathered from the whole batch, e.g. the tokens routed to one expert) and whose M
    differs from its counterpart in the reference (the same GEMM's n-th call)."""
    seen: dict[str, int] = {}
    for op in va:
        if op is before:
            return None
        if op.name not in _GEMMS:
            continue
        n = seen.get(op.name, 0)
        seen[op.name] = n + 1
        if op.outputs:
            continue
        same = [r for r in ra if r.name == op.name]
        if n < len(same):
            m, m_ref = _gemm_rows(op.name, op.arg_shapes), _gemm_rows(op.name, same[n].arg_shapes)
            if m is not None and m_ref is not None and m != m_ref:
                return op, same[n]
    return None


def _finding(v: OpRecord, r: OpRecord, found: tuple[TensorDiff, bool], traced: int,
             note: str, va: list[OpRecord] | None = None,
             ra: list[OpRecord] | None = None) -> OpFinding:
    diff, shared = found
    gemm = _gathered_gemm(va, ra, v) if va is not None and ra is not None else None
    if gemm is not None:
        g, g_ref = gemm
        m, m_ref = _gemm_rows(g.name, g.arg_shapes), _gemm_rows(g.name, g_ref.arg_shapes)
        cause = (f"a GEMM over rows gathered from the whole batch (e.g. the tokens routed to "
                 f"one expert): M is {m} in this run and {m_ref} in the reference, and the BLAS "
                 f"library picks its kernel and reduction order from M; its output has no row "
                 f"per request, so the difference is first seen at op #{v.index} ({v.name})")
        return OpFinding(g.name, g.index, traced, g.arg_shapes, g_ref.arg_shapes, cause, diff,
                         note)
    return OpFinding(v.name, v.index, traced, v.arg_shapes, r.arg_shapes,
                     cause_of(v.name, v.arg_shapes, r.arg_shapes, shared), diff, note)


# --------------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------------

@dataclass
class _Context:
    model: torch.nn.Module
    iface: ModelInterface
    seed: int
    device: torch.device
    references: dict[Plan, Recording] = field(default_factory=dict)

    def record(self, plan: Plan, nsteps_equal: bool = True, **kwargs: Any) -> Recorder:
        rec = Recorder(self.model, **kwargs)
        with rec:
            run_plan(self.model, self.iface, plan, rec, seed=self.seed, device=self.device,
                     nsteps_equal=nsteps_equal)
        return rec

    def reference(self, plan: Plan) -> Recording:
        if plan not in self.references:
            self.references[plan] = self.record(plan).recording
        return self.references[plan]


def _origin(flag: Flag, layout_tokens: Sequence[int], op: OpFinding | None,
            differing: int) -> Origin:
    call = flag.call
    return Origin(call.key[0], call.type, call.key[1], flag.step, list(layout_tokens),
                  flag.diff, differing, call.inputs_compared, flag.forced, op)


def _trace(ctx: _Context, sc: Scenario, ref: Recording, target: Flag) -> OpFinding | None:
    nsteq = sc.reference.decode == sc.variant.decode
    key = target.call.key
    var = ctx.record(sc.variant, nsteq, reference=ref, trace=(target.step, key))
    tokens = var.recording.steps[target.step].layout.tokens
    ref_step = ref.step_of(key, tokens[0]) if tokens else (target.step if nsteq else 0)
    if ref_step is None:
        return None
    rref = ctx.record(sc.reference, True, trace=(ref_step, key))
    # Sub-module calls that settled their own case: flagged (other independent origins, reset)
    # or compared and bit-identical. Their ops took whatever path they took and changed nothing;
    # ops inside sub-modules whose outputs could not be compared (rows gathered across the
    # batch) stay in.
    settled = {f.call.key for f in var.flags if f.step == target.step}
    for c in var.recording.steps[target.step].calls:
        if c.key != key and c.key not in settled:
            cmp = compare_call(c, target.step, ref, nsteq)
            if cmp.compared and cmp.equal:
                settled.add(c.key)
    return first_differing_op(var.ops, rref.ops, key, settled - {key})


def _groups(flags: list[Flag]) -> list[tuple[str, list[Flag]]]:
    groups: dict[str, list[Flag]] = {}
    for f in flags:
        groups.setdefault(f.call.type, []).append(f)
    return list(groups.items())


def _shrink(ctx: _Context, sc: Scenario, ref: Recording) -> tuple[Plan, int]:
    """The smallest batch (fewest other requests, in their order) that still diverges."""
    plan = sc.variant
    nsteq = sc.reference.decode == sc.variant.decode
    attempts = 0

    def diverges(members: tuple[Any, ...]) -> bool:
        nonlocal attempts
        attempts += 1
        rec = ctx.record(replace(plan, members=members), nsteq)
        return not compare_runs(ref, rec.recording, nsteq).equal

    members = plan.members
    chunk = max(1, (len(members) - 1) // 2)
    while chunk >= 1 and attempts < SHRINK_BUDGET:
        others = [i for i, m in enumerate(members) if m.rid != FOCUS]
        if len(others) <= 1:
            break
        progressed = False
        for start in range(0, len(others), chunk):
            drop = set(others[start:start + chunk])
            if len(drop) >= len(others):
                continue
            candidate = tuple(m for i, m in enumerate(members) if i not in drop)
            if attempts >= SHRINK_BUDGET:
                break
            if diverges(candidate):
                members, progressed = candidate, True
                break
        if not progressed:
            chunk //= 2
    return replace(plan, members=members), attempts


def case_dict(name: str | None, loaded: LoadedModel, ctx: _Context, attention: str,
              dtype: str, sc: Scenario, plan: Plan) -> dict[str, Any]:
    """A scenario's case as JSON data (``"schema": "invariance.model-case"``)."""
    return {"schema": CASE_SCHEMA, "version": 1, "model": name or "", "dtype": dtype,
            "device": str(ctx.device), "attention": attention, "inputs": ctx.iface.spec,
            "seed": ctx.seed, "scenario": sc.name, "reference": sc.reference.to_dict(),
            "variant": plan.to_dict()}


def reproducer_code(case: dict[str, Any]) -> str:
    """Python that replays ``case`` and raises while it still diverges."""
    call = ("invariance.replay_model(case)" if case.get("model") else
            "invariance.replay_model(case, model=MODEL)  # MODEL: the module the check ran on")
    return "\n".join(["import invariance", "", "case = " + pprint.pformat(case, width=96,
                                                                           sort_dicts=False),
                      call])


def _scenario(ctx: _Context, sc: Scenario, loaded: LoadedModel, attention: str, dtype: str,
              shrink: bool) -> ScenarioResult:
    nsteq = sc.reference.decode == sc.variant.decode
    result = ScenarioResult(sc.name, sc.family, sc.description, "identical",
                            reference=sc.reference.describe(), variant=sc.variant.describe(),
                            batch_size=sc.variant.batch_size)
    ref = ctx.reference(sc.reference)
    var = ctx.record(sc.variant, nsteq).recording
    cmp = compare_runs(ref, var, nsteq)
    result.calls_compared = cmp.calls_compared
    result.clean_prefix = cmp.clean_prefix
    result.unmapped = len(cmp.unmapped)
    result.unmapped_examples = [f"{k}: {v}" for k, v in
                                list(cmp.unmapped.items())[:_UNMAPPED_EXAMPLES]]
    result.curve = _curve(ctx.model, var, cmp)
    if cmp.first is None:
        if not cmp.calls_compared:
            result.status, result.reason = "error", "no module output could be compared"
        return result
    result.status = "diverged"
    _, call, _ = cmp.first
    result.first_divergence = call.key[0] or "(model)"
    result.flips = _flips(ref, var)
    again = ctx.record(sc.variant, nsteq).recording
    ref_again = ctx.record(sc.reference).recording
    steady = (compare_runs(var, again, True).equal and compare_runs(ref, ref_again, True).equal)
    result.classification = "batch-variant" if steady else "nondeterministic"
    forced = ctx.record(sc.variant, nsteq, reference=ref)
    flags = forced.flags
    groups = _groups(flags)
    ops: dict[str, OpFinding | None] = {}
    for i, (kind, members) in enumerate(groups):
        ops[kind] = _trace(ctx, sc, ref, members[0]) if i < MAX_TRACED_GROUPS else None
    if flags:
        first = flags[0]
        tokens = forced.recording.steps[first.step].layout.tokens
        result.origin = _origin(first, tokens, ops.get(first.call.type), first.differing)
    result.origins = [
        OriginGroup(kind, len(members), list(dict.fromkeys(f.call.key[0] for f in members)),
                    max(f.diff.max_ulp for f in members),
                    ops[kind].name if ops.get(kind) is not None else "",  # type: ignore[union-attr]
                    ops[kind].cause if ops.get(kind) is not None else "")  # type: ignore[union-attr]
        for kind, members in groups]
    if shrink and steady:
        plan, attempts = _shrink(ctx, sc, ref)
    else:
        plan, attempts = sc.variant, 0
    case = case_dict(loaded.name, loaded, ctx, attention, dtype, sc, plan)
    result.reproducer = Reproducer(plan.to_dict(), plan.batch_size,
                                   plan != sc.variant, attempts, reproducer_code(case), case)
    return result


@contextmanager
def _attention(model: torch.nn.Module, attention: object) -> Iterator[str]:
    if attention is None or attention == "default":
        impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
        yield f"default ({impl})" if isinstance(impl, str) else "default"
        return
    from invariance.model.attention import swap_attention

    with swap_attention(model, attention) as name:
        yield name


def _enable_interpreter(device: torch.device, attention: object) -> None:
    """Kernels on CPU tensors run in the Triton interpreter, which must be switched on before
    triton is first imported (transformers may import it)."""
    import os
    import sys

    if device.type == "cpu" and attention not in (None, "default") and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")


def check_model(
    model: ModelSpec,
    *,
    dtype: object = None,
    device: object = None,
    attention: object = None,
    scenarios: object = None,
    batch_sizes: object = None,
    length: int = DEFAULT_LENGTH,
    decode_steps: int = DEFAULT_DECODE_STEPS,
    seed: int = 0,
    inputs: str | None = None,
    shrink: bool = True,
    progress: Progress | None = None,
    on_scenario: Callable[[ModelReport], None] | None = None,
) -> ModelReport:
    """Run one request through ``model`` alone and inside batches and find where its bits first
    change (module docstring).

    ``model``: a shipped config name (``llama``, ``qwen2-sliding``, ``mixtral``, with
    ``:key=value`` overrides), ``module:attr``, ``path/file.py:attr``, a local Hugging Face
    directory, or a ``torch.nn.Module`` / callable / transformers config object
    (:mod:`invariance.model.loading`). ``dtype`` casts the model (default: its own); ``device``
    defaults to CUDA when available. ``attention`` runs a transformers model's attention through
    a backend (a name of :func:`invariance.available_backends`, ``module:attr`` or a callable
    taking an :class:`invariance.AttentionBatch`). ``scenarios`` (default all:
    :data:`~invariance.model.scenarios.FAMILIES`), ``batch_sizes`` (default 2, 3, 4, 8, 16),
    ``length`` (the focus request's tokens), ``decode_steps`` (of the decode scenarios), ``seed``
    (weights of random-init models and request content), ``inputs`` (``tokens:VOCAB``,
    ``rows:FEATURES`` or ``sequence:FEATURES`` when the model's first layer does not tell),
    ``shrink`` (look for the smallest diverging batch). ``progress(done, total, label)`` is
    called before each scenario, ``on_scenario(report)`` after each. A module object is used
    as it is: put in eval mode, and moved or cast in place when ``device``/``dtype`` say so;
    its attention implementation is restored after a swap.

    Raises ``ValueError`` naming the argument on bad input, before anything runs."""
    torch_dtype = parse_model_dtype(dtype)
    dev = _device(device)
    families = _families(scenarios)
    sizes = _batch_sizes(batch_sizes)
    n = _int("length", length, 1)
    k = _int("decode_steps", decode_steps, 0)
    seed = _int("seed", seed, 0)
    if not isinstance(shrink, bool):
        raise ValueError(f"shrink: expected a bool, got {_show(shrink)}")
    if attention is not None and attention != "default":
        from invariance.backends import resolve

        try:
            attention = resolve(attention)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ValueError(f"attention: {exc}") from None
    _enable_interpreter(dev, attention)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    loaded = load_model(model, seed=seed, device=dev, dtype=torch_dtype)
    iface = detect_interface(loaded.module, inputs)
    if iface.kind == "tokens" and n < 2:
        raise ValueError(f"length: expected an int >= 2 for a token model, got {n}")
    plans = build_scenarios(iface, families, sizes, n, k)
    with _attention(loaded.module, attention) as attention_name:
        report = _new_report(loaded, iface, dev, attention_name, seed, n, k, sizes, started)
        ctx = _Context(loaded.module, iface, seed, dev)
        swapped = attention_name if attention not in (None, "default") else ""
        for i, sc in enumerate(plans):
            if progress is not None:
                progress(i, len(plans), sc.name)
            s0 = time.perf_counter()
            result = _run_scenario(ctx, sc, loaded, swapped, report.dtype, shrink)
            result.seconds = time.perf_counter() - s0
            report.scenarios.append(result)
            report.seconds = time.perf_counter() - t0
            if on_scenario is not None:
                on_scenario(report)
        if progress is not None:
            progress(len(plans), len(plans), "done")
    report.seconds = time.perf_counter() - t0
    return report


def _new_report(loaded: Any, iface: Any, dev: torch.device, attention_name: str, seed: int,
                length: int, decode_steps: int, sizes: Any, started: str) -> ModelReport:
    """An empty report naming the model, its settings and the environment."""
    from invariance.report import Environment

    module = loaded.module
    first_param = next((p for p in module.parameters() if p.is_floating_point()), None)
    return ModelReport(
        model=loaded.name or type(module).__name__, model_type=type(module).__name__,
        source=loaded.source, parameters=sum(p.numel() for p in module.parameters()),
        dtype=str(first_param.dtype if first_param is not None else torch.float32
                  ).removeprefix("torch."),
        device=str(dev), attention=attention_name, inputs=iface.describe(), seed=seed,
        length=length, decode_steps=decode_steps, batch_sizes=sizes,
        modules=sum(1 for _ in module.modules()),
        environment=Environment.capture(str(dev)), started_at=started)


def _run_scenario(ctx: _Context, sc: Any, loaded: Any, attention: str, dtype: str,
                  shrink: bool) -> ScenarioResult:
    """One scenario's result: skipped (with the reason), compared, or an error that names its
    cause (the other scenarios still run)."""
    if isinstance(sc, Skip):
        return ScenarioResult(sc.name, sc.family, sc.description, "skipped", reason=sc.reason)
    try:
        return _scenario(ctx, sc, loaded, attention, dtype, shrink)
    except NoCache as exc:
        return ScenarioResult(sc.name, sc.family, sc.description, "skipped", reason=str(exc))
    except (RuntimeError, ValueError, TypeError, IndexError, KeyError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        return ScenarioResult(
            sc.name, sc.family, sc.description, "error",
            reason=f"{type(exc).__name__}: {first_line}",
            reference=sc.reference.describe(), variant=sc.variant.describe(),
            batch_size=sc.variant.batch_size)


# --------------------------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------------------------

class ModelMismatch(AssertionError):
    """:func:`replay_model`: the case's two runs still diverge (a difference, not an error of
    the model or the environment, which raise their own exceptions)."""


def replay_model(case: dict[str, Any], *, model: ModelSpec | None = None,
                 device: object = None) -> RunComparison:
    """Run a case's reference and variant plans (a reproducer's ``case``) and raise
    ``AssertionError`` naming the first differing module while they still diverge; returns the
    comparison when they agree. ``model`` replaces the case's model (needed when the case came
    from a module object); ``device`` its device."""
    if not isinstance(case, dict) or case.get("schema") != CASE_SCHEMA:
        got = case.get("schema") if isinstance(case, dict) else type(case).__name__
        raise ValueError(f"case: expected a model case (schema {CASE_SCHEMA!r}), got {got!r}")
    try:
        spec = model if model is not None else case["model"]
        if not spec:
            raise ValueError("model: the case names no model (it came from a module object); "
                             "pass model=")
        dev = _device(device if device is not None else case.get("device") or None)
        ref_plan, var_plan = Plan.from_dict(case["reference"]), Plan.from_dict(case["variant"])
        seed = _int("seed", case.get("seed", 0), 0)
        attention = case.get("attention") or None
        dtype = parse_model_dtype(case.get("dtype") or None)
        inputs = case.get("inputs") or None
    except (KeyError, TypeError) as exc:
        raise ValueError(f"case: malformed: {exc}") from None
    _enable_interpreter(dev, attention)
    loaded = load_model(spec, seed=seed, device=dev, dtype=dtype)
    iface = detect_interface(loaded.module, inputs)
    ctx = _Context(loaded.module, iface, seed, dev)
    nsteq = ref_plan.decode == var_plan.decode
    with _attention(loaded.module, attention) if attention else nullcontext():
        ref = ctx.record(ref_plan).recording
        var = ctx.record(var_plan, nsteq).recording
    cmp = compare_runs(ref, var, nsteq)
    if cmp.first is not None:
        step, call, leaves = cmp.first
        raise ModelMismatch(
            f"{case.get('scenario', 'case')}: still diverges: {var_plan.describe()} vs "
            f"{ref_plan.describe()}; first at {call.key[0] or '(model)'} [{call.type}] "
            f"(forward {step}): {leaves.diffs[0].summary()}")
    return cmp
