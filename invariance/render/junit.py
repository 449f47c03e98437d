"""The report as JUnit XML for CI: one ``<testcase>`` per (perturbation, dtype) cell (what it
compared in its ``<system-out>``) and one per dtype for accuracy; the whole report's coverage
is a property of the suite."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from invariance.render._common import (
    accuracy_row,
    coverage_line,
    coverage_text,
    fmt_float,
    more_violations,
    plural,
    shown_violations,
    violation_lines,
    violation_title,
)
from invariance.report import AccuracyResult, PerturbationResult, Report, describe_features

__all__ = ["to_junit"]


def _cell_case(parent: ET.Element, classname: str, cell: PerturbationResult) -> None:
    name = f"{cell.perturbation}[{cell.dtype}]"
    case = ET.SubElement(parent, "testcase", classname=classname,
                         name=f"{cell.check}: {name}" if cell.check else name,
                         time=f"{cell.seconds:.3f}")
    if cell.status == "failed":
        shown = shown_violations(cell)
        lines = [violation_title(cell), cell.description, ""]
        for v in shown:
            lines += [*violation_lines(v), "", "reproducer:", v.reproducer, ""]
        extra = more_violations(cell, len(shown))
        if extra:
            lines.append(f"... and {plural(extra, 'more violating case')} in this cell")
        failure = ET.SubElement(case, "failure", message=violation_title(cell),
                                type="invariance.Violation")
        failure.text = "\n".join(lines).rstrip() + "\n"
    elif cell.status == "error":
        err = ET.SubElement(case, "error", message=cell.error or "the backend raised",
                            type="invariance.BackendError")
        err.text = f"{violation_title(cell)}\n{cell.error or ''}\n"
    elif cell.status == "skipped":
        ET.SubElement(case, "skipped", message=cell.error or "skipped")
    if cell.coverage:
        ET.SubElement(case, "system-out").text = f"coverage: {coverage_text(cell)}\n"


def _accuracy_case(parent: ET.Element, classname: str, a: AccuracyResult) -> None:
    name = f"accuracy[{a.dtype}]"
    case = ET.SubElement(parent, "testcase", classname=classname,
                         name=f"{a.check}: {name}" if a.check else name, time="0.000")
    if not a.passed:
        row = accuracy_row(a)
        message = (f"{a.dtype} not within tolerance of the float64 reference: worst "
                   f"{fmt_float(a.worst_ratio)} x tolerance over {a.rows} rows"
                   + (f", {a.nan_rows} NaN rows" if a.nan_rows else ""))
        failure = ET.SubElement(case, "failure", message=message, type="invariance.Accuracy")
        failure.text = (
            f"rows {row[1]}, max abs err out {row[2]}, rel err out {row[3]}, max abs err lse "
            f"{row[4]}, worst/tolerance {row[5]} (atol {a.atol:g}, rtol {a.rtol:g}, lse atol "
            f"{a.lse_atol:g})\n")


def to_junit(report: Report) -> str:
    """``report`` as JUnit XML text (``<testsuites>`` holding one ``<testsuite>``)."""
    classname = f"invariance.{report.backend}"
    counts = report.counts()
    acc_failures = sum(1 for a in report.accuracy if not a.passed)
    tests = len(report.results) + len(report.accuracy)
    attrs = {
        "name": classname,
        "tests": str(tests),
        "failures": str(counts["failed"] + acc_failures),
        "errors": str(counts["error"]),
        "skipped": str(counts["skipped"]),
        "time": f"{report.seconds:.3f}",
    }
    root = ET.Element("testsuites", attrs)
    suite = ET.SubElement(root, "testsuite", attrs)
    if report.started_at:
        suite.set("timestamp", report.started_at)
    suite.set("hostname", report.environment.device_name)
    props = ET.SubElement(suite, "properties")
    env = report.environment
    values = {
        "backend": report.backend, "device": report.device, "dtypes": ",".join(report.dtypes),
        "heads": report.heads, "scale": report.scale, "budget": str(report.budget),
        "seed": str(report.seed), "device_name": env.device_name, "driver": env.driver or "",
        "cuda": env.cuda or "", "torch": env.torch, "triton": env.triton or "",
        "python": env.python, "platform": env.platform,
    }
    if report.features:
        values["features"] = describe_features(report.features)
    cmd = report.command
    if cmd:
        values["command"] = cmd
    values["coverage"] = coverage_line(report)
    for name, value in values.items():
        ET.SubElement(props, "property", name=name, value=value)
    for cell in report.results:
        _cell_case(suite, classname, cell)
    for a in report.accuracy:
        _accuracy_case(suite, classname, a)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
