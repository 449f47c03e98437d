"""The CLI's listings as rich tables: backends and perturbations (``invariance list``) and the
environment (``invariance env``)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from invariance.backends import BackendInfo
from invariance.perturb import Perturbation
from invariance.report import Environment

__all__ = ["print_environment", "print_listing"]


def print_listing(backends: Sequence[BackendInfo], perturbations: Sequence[Perturbation],
                  console: Console) -> None:
    """Every backend (whether it imports here, and why not) and every perturbation."""
    table = Table(title="backends", title_justify="left")
    for col in ("name", "importable", "source", "description"):
        table.add_column(col, no_wrap=col == "name", overflow="fold")
    for b in backends:
        ok = Text("yes", style="green") if b.importable else Text(f"no: {b.reason}",
                                                                     style="red")
        table.add_row(Text(b.name), ok, Text(b.source), Text(b.description))
    console.print(table)
    console.print(Text("any callable 'module:attr' or 'path/file.py:attr' (AttentionBatch -> "
                       "AttentionResult | (out, lse)) works too", style="dim"))
    console.print()
    perts = Table(title="perturbations", title_justify="left")
    perts.add_column("name", no_wrap=True)
    perts.add_column("what changes between the two schedules", overflow="fold")
    perts.add_column("cases/budget", justify="right")
    perts.add_column("needs")
    for p in perturbations:
        perts.add_row(Text(p.name), Text(p.description), Text(str(p.cases_per_budget)),
                      Text("CUDA" if p.requires_cuda else ""))
    console.print(perts)


def print_environment(env: Environment, extra: Sequence[tuple[str, str]],
                      console: Console) -> None:
    """The environment as a two-column table (no header row)."""
    table = Table(title="environment", title_justify="left", show_header=False)
    table.add_column("key", style="dim")
    table.add_column("value", overflow="fold")
    rows = [
        ("device", f"{env.device} ({env.device_name})"), ("GPUs", str(env.gpu_count)),
        ("driver", env.driver or "-"), ("CUDA", env.cuda or "-"), ("torch", env.torch),
        ("triton", env.triton or "not installed"), ("python", env.python),
        ("platform", env.platform), *extra,
    ]
    for key, value in rows:
        table.add_row(Text(key), Text(value))
    console.print(table)
