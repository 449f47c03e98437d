"""``invariance`` CLI with the Gluon prefill kernel's launches counted (reports/h100-round13):

    python benchmarks/count_gluon.py check --backend kernels --device cuda ...

Runs ``invariance.cli.main`` on the arguments, then prints how many ``unified_attention`` calls
ran the Gluon kernel and how many the Triton kernels: evidence that a check's PASS covers the
Gluon kernel, not only the Triton ones.
"""

from __future__ import annotations

import sys
from typing import Any

import kernels._gluon
import kernels.attention
from invariance.cli import main

COUNTS = {"gluon": 0, "triton fused": 0, "split": 0}


def _counted(name: str, fn: Any) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        COUNTS[name] += 1
        return fn(*args, **kwargs)
    return run


if __name__ == "__main__":
    gluon, fused, split = (kernels._gluon.launch_fused_prefill, kernels.attention._launch_fused,
                           kernels.attention._launch_split)
    kernels._gluon.launch_fused_prefill = _counted("gluon", gluon)
    # Every fused launch passes through _launch_fused; the Gluon ones are subtracted below.
    kernels.attention._launch_fused = _counted("triton fused", fused)
    kernels.attention._launch_split = _counted("split", split)
    rc = main(sys.argv[1:])
    COUNTS["triton fused"] -= COUNTS["gluon"]
    print(f"Gluon kernel launches: {COUNTS['gluon']}; Triton fused: {COUNTS['triton fused']}; "
          f"split plan: {COUNTS['split']}")
    sys.exit(rc)
