"""The scenarios of ``invariance model``: pairs of runs that compute the same request's tokens.

Each scenario runs the focus request (id 0, ``length`` tokens) in a *reference* plan (alone, one
prefill unless said otherwise) and a *variant* plan that a batch-invariant model must give the
same bits:

- ``batch-N``: inside a batch of N requests of the same length (no padding: only the batch size
  changes), the focus request in the first row;
- ``order``: the same in the last row of a batch of the smallest batch size >= 3 asked for;
- ``pad-left`` / ``pad-right``: next to a longer and a shorter request, padded on that side (with
  ``attention_mask``; the focus request is padded too);
- ``decode``: a prefill and then decode steps through the model's KV cache, alone vs next to two
  requests of other prompt lengths (left-padded, as generation pads);
- ``decode-vs-prefill``: the same tokens computed by decode steps vs by one prefill, alone.

A scenario the model cannot run (no mask, no cache, no tokens) is skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from invariance.model.inputs import FOCUS, Member, ModelInterface, Plan

__all__ = ["FAMILIES", "Scenario", "Skip", "build_scenarios"]

#: Scenario families: name -> what changes between the two runs.
FAMILIES: dict[str, str] = {
    "batch": "the batch size: other requests of the same length next to it (no padding)",
    "order": "the request's row: last in the batch instead of alone",
    "pad-left": "left padding next to a longer and a shorter request (attention mask)",
    "pad-right": "right padding next to a longer and a shorter request (attention mask)",
    "decode": "decode steps with the KV cache, alone vs in a batch of other prompt lengths",
    "decode-vs-prefill": "the same tokens by decode steps with the KV cache vs one prefill",
}


@dataclass(frozen=True)
class Scenario:
    """Two plans that must give the focus request the same bits."""

    name: str
    family: str
    description: str
    reference: Plan
    variant: Plan


@dataclass(frozen=True)
class Skip:
    """A scenario the model cannot run, and why."""

    name: str
    family: str
    description: str
    reason: str


def _others(first_id: int, lengths: Sequence[int]) -> list[Member]:
    return [Member(first_id + i, n) for i, n in enumerate(lengths)]


def build_scenarios(iface: ModelInterface, families: Sequence[str], batch_sizes: Sequence[int],
                    length: int, decode_steps: int) -> list[Scenario | Skip]:
    """The scenarios of ``families`` (in :data:`FAMILIES` order) for a model of ``iface``."""
    n = 1 if iface.kind == "rows" else length
    focus = Member(FOCUS, n)
    alone = Plan((focus,))
    out: list[Scenario | Skip] = []
    tokens = iface.kind != "rows"
    for family in FAMILIES:
        if family not in families:
            continue
        what = FAMILIES[family]
        if family == "batch":
            for size in batch_sizes:
                plan = Plan((focus, *_others(1, [n] * (size - 1))))
                out.append(Scenario(f"batch-{size}", family, what, alone, plan))
        elif family == "order":
            size = min((s for s in batch_sizes if s >= 3), default=max(batch_sizes))
            plan = Plan((*_others(1, [n] * (size - 1)), focus))
            out.append(Scenario(f"order-{size}", family, what, alone, plan))
        elif family in ("pad-left", "pad-right"):
            reason = ("" if tokens and iface.mask else
                      "one feature row per request: nothing to pad" if not tokens else
                      "the model's forward takes no attention_mask")
            if reason:
                out.append(Skip(family, family, what, reason))
                continue
            plan = Plan((Member(1, n + 3), focus, Member(2, max(1, n - 2))),
                        "left" if family == "pad-left" else "right")
            out.append(Scenario(family, family, what, alone, plan))
        else:
            reason = ("" if iface.cache is not None else
                      "the model's forward takes no KV cache (cache / past_key_values)")
            if not reason and decode_steps < 1:
                reason = "decode_steps is 0"
            if not reason and n - decode_steps < 1:
                reason = f"length {n} leaves no prompt before {decode_steps} decode steps"
            if reason:
                out.append(Skip(family, family, what, reason))
                continue
            k = decode_steps
            if family == "decode":
                lengths = ([n + 3, max(k + 1, n - 2)] if iface.mask else [n, n])
                plan = Plan((Member(1, lengths[0]), focus, Member(2, lengths[1])), "left", k)
                out.append(Scenario(family, family, what, Plan((focus,), decode=k), plan))
            else:
                out.append(Scenario(family, family, what, alone, Plan((focus,), decode=k)))
    return out
