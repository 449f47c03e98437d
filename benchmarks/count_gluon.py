"""``invariance`` CLI with the Gluon kernels' launches counted:

    python benchmarks/count_gluon.py check --backend kernels --device cuda ...

Runs ``invariance.cli.main`` on the arguments, then prints how many ``unified_attention`` calls
ran each plan on the Gluon kernels and on the Triton kernels: evidence that a check's PASS
covers the Gluon kernels, not only the Triton ones. The Gluon split launches are also counted by
their tile (the keys-as-rows decode tile or the 128-row one), their V column blocks and,
with several splits, by how the merge was launched.
"""

from __future__ import annotations

import sys
from typing import Any

import kernels._gluon
import kernels.attention  # its _launch_fused and _launch_split are wrapped
from invariance.cli import main

COUNTS = {"gluon fused": 0, "gluon split": 0, "triton fused": 0, "triton split": 0}


def _counted(fn: Any, gluon: str, triton: str) -> Any:
    """``fn`` (a launcher taking the LaunchPlan first), counted by the kernels its plan runs."""
    def run(lp: Any, *args: Any, **kwargs: Any) -> Any:
        on_gluon = getattr(lp, "gluon", False)
        COUNTS[gluon if on_gluon else triton] += 1
        if on_gluon and lp.plan == "split":
            tile = "keys-as-rows tile" if getattr(lp, "keys_rows", False) else "128-row tile"
            for key in (f"gluon split on the {tile}",
                        f"gluon split with {lp.value_blocks} V blocks",
                        "gluon split, one split per row" if lp.num_splits == 1 else
                        f"gluon split, merge {'dependent' if lp.dependent_merge else 'plain'}"):
                COUNTS[key] = COUNTS.get(key, 0) + 1
        return fn(lp, *args, **kwargs)
    return run


if __name__ == "__main__":
    fused, split = kernels.attention._launch_fused, kernels.attention._launch_split
    kernels.attention._launch_fused = _counted(fused, "gluon fused", "triton fused")
    kernels.attention._launch_split = _counted(split, "gluon split", "triton split")
    rc = main(sys.argv[1:])
    print("Gluon and Triton launches: " + "; ".join(f"{k}: {v}" for k, v in COUNTS.items()))
    sys.exit(rc)
