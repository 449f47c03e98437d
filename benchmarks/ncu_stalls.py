"""Warp-stall samples of an Nsight Compute source page, summed.

    python benchmarks/ncu_stalls.py SOURCE.csv[.gz] [--kernel N] [--top K] [--order]

``SOURCE`` is what ``ncu -i REPORT --page source --csv --print-source sass`` prints (gzip or
plain); a file holding several profiled kernels is split at their ``"Kernel Name"`` lines and
``--kernel`` picks one (default: the last). Prints, as Markdown, the share of all samples of each
stall reason, then of each SASS opcode (predicates dropped) with its executed warp instructions
and its three largest reasons. ``--order`` also lists the tensor-core instructions, their waits,
barriers, mbarrier operations and runs of exponentials in address order with their sample shares:
where each warpgroup waits in the loop.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
#: Instructions ``--order`` lists one by one; exponentials and shuffles are counted in runs.
ORDER_KEYS = re.compile(r"HGMMA|DEPBAR|BAR\.|SYNCS|WARPGROUP\.ARRIVE")
RUN_OPS = ("MUFU.EX2", "SHFL.BFLY")


def kernels_in(text: str) -> list[tuple[str, list[dict[str, str]]]]:
    """(kernel name, rows) per profiled kernel of a source-page CSV."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith('"Kernel Name"'):
            name = next(csv.reader([line]))[1]
            out.append((name, []))
        elif out:
            out[-1][1].append(line)
    if not out:
        raise ValueError('no "Kernel Name" line: not an ncu source page (--page source --csv)')
    result = []
    for name, lines in out:
        rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
        if not rows or SAMPLES not in rows[0] or "Source" not in rows[0]:
            raise ValueError(f"kernel {name!r}: expected the columns {SAMPLES!r} and 'Source'")
        result.append((name, rows))
    return result


def _int(v: str | None) -> int:
    return int(v) if v not in (None, "", "-") else 0


def _opcode(source: str) -> str:
    s = re.sub(r"^@!?U?P\w+\s+", "", source.strip())
    return s.split()[0] if s else "?"


def summarize(rows: list[dict[str, str]], top: int) -> str:
    """Markdown: samples by reason, then by opcode."""
    reasons = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
    total = sum(_int(r[SAMPLES]) for r in rows)
    if total == 0:
        return "no samples\n"
    by_reason = collections.Counter({k: sum(_int(r[k]) for r in rows) for k in reasons})
    reason_total = sum(by_reason.values()) or 1
    lines = [f"{total} samples.", "", "| reason | share |", "|---|---|"]
    lines += [f"| {k} | {100 * v / reason_total:.1f}% |" for k, v in by_reason.most_common()
              if v]
    ops: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    samples: collections.Counter[str] = collections.Counter()
    executed: collections.Counter[str] = collections.Counter()
    for r in rows:
        op = _opcode(r["Source"])
        samples[op] += _int(r[SAMPLES])
        executed[op] += _int(r.get(EXECUTED))
        for k in reasons:
            ops[op][k] += _int(r[k])
    lines += ["", "| opcode | share of samples | warp instructions executed | largest reasons |",
              "|---|---|---|---|"]
    for op, v in samples.most_common(top):
        big = ", ".join(f"{k.removeprefix('stall_')} {100 * n / total:.1f}%"
                        for k, n in ops[op].most_common(3) if n)
        lines.append(f"| `{op}` | {100 * v / total:.1f}% | {executed[op]:,} | {big} |")
    return "\n".join(lines) + "\n"


def order(rows: list[dict[str, str]]) -> str:
    """The ``--order`` listing (module docstring)."""
    total = sum(_int(r[SAMPLES]) for r in rows) or 1
    out: list[str] = []
    run_op, run_n, run_s = None, 0, 0

    def flush() -> None:
        if run_op is not None:
            out.append(f"      {run_op} x{run_n}: {100 * run_s / total:.2f}% of samples")

    for r in rows:
        op = _opcode(r["Source"])
        if op in RUN_OPS:
            if op == run_op:
                run_n, run_s = run_n + 1, run_s + _int(r[SAMPLES])
                continue
            flush()
            run_op, run_n, run_s = op, 1, _int(r[SAMPLES])
            continue
        if not ORDER_KEYS.search(r["Source"]):
            continue
        flush()
        run_op = None
        share = 100 * _int(r[SAMPLES]) / total
        out.append(f"{r['Address'][-5:]} {r['Source'].strip()[:72]:72s} "
                   f"exec {_int(r.get(EXECUTED)):>11,} samples {share:.2f}%")
    flush()
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source")
    p.add_argument("--kernel", type=int, default=-1)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--order", action="store_true")
    a = p.parse_args(argv)
    if a.top < 1:
        p.error(f"--top: expected >= 1, got {a.top}")
    opener = gzip.open if a.source.endswith(".gz") else open
    try:
        with opener(a.source, "rt") as f:
            text = f.read()
        found = kernels_in(text)
    except (OSError, ValueError) as exc:
        p.error(f"source: {exc}")
    if not -len(found) <= a.kernel < len(found):
        p.error(f"--kernel: expected an index into the {len(found)} kernels, got {a.kernel}")
    name, rows = found[a.kernel]
    sys.stdout.write(f"## `{name[:120]}`\n\n" + summarize(rows, a.top))
    if a.order:
        sys.stdout.write("\n```\n" + order(rows) + "```\n")


if __name__ == "__main__":
    main()
