"""The interpreter shortcut (kernels/_interpreter.py): a helper call inside a launch skips the
language re-patch, and the kernels' bits are the same with and without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                                reason="the shortcut is for Triton's CPU interpreter")

ROOT = Path(__file__).resolve().parents[2]

#: One mixed call through both plans; prints a hash of the raw bits of out and LSE.
SCRIPT = """
import hashlib, torch, invariance, kernels
wl = invariance.Workload((invariance.Request(0, 300), invariance.Request(1, 20)),
                         invariance.HeadConfig(4, 2, 64), torch.float16, 0)
step = invariance.Step((invariance.Chunk(0, 299, 300), invariance.Chunk(1, 5, 20)))
b = invariance.materialize(wl, step, invariance.PageLayout(page_size=16), "cpu")
h = hashlib.sha256()
for plan in ("fused", "split"):
    out, lse = kernels.unified_attention(b.q, b.k_cache, b.v_cache, b.cu_seqlens_q, b.kv_lens,
                                         b.block_table, split_size=128, plan=plan)
    h.update(out.view(torch.int16).numpy().tobytes())
    h.update(lse.view(torch.int32).numpy().tobytes())
print(h.hexdigest())
"""


def _bits(patch: str) -> str:
    env = {**os.environ, "TRITON_INTERPRET": "1", "KERNELS_INTERPRETER_PATCH": patch,
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


@pytest.mark.slow
def test_same_bits_with_and_without_the_shortcut() -> None:
    assert _bits("1") == _bits("0")


def test_a_launch_patches_the_language_once(make_batch, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Without the shortcut every helper call walks the language modules again; with it, a
    launch walks them once (a few ``_patch_builtin`` calls, not a few per helper call), and
    restores them when it ends."""
    import torch
    from triton.runtime import interpreter

    import kernels
    from kernels import _interpreter

    if os.environ.get("KERNELS_INTERPRETER_PATCH") == "0":
        pytest.skip("the shortcut is switched off (KERNELS_INTERPRETER_PATCH=0)")
    _interpreter.install()
    import triton.language as tl
    originals = (tl.range, tl.load, tl.tensor.__add__)
    walks, launches = [], []
    original, launch = interpreter._patch_builtin, interpreter.GridExecutor.__call__
    monkeypatch.setattr(interpreter, "_patch_builtin",
                        lambda *a, **k: walks.append(1) or original(*a, **k))
    monkeypatch.setattr(interpreter.GridExecutor, "__call__",
                        lambda *a, **k: launches.append(1) or launch(*a, **k))
    batch = make_batch(torch.float16, [(1, 40)])
    kernels.unified_attention(batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q,
                              batch.kv_lens, batch.block_table, plan="fused")
    # A launch walks tl, tl.tensor, tl.math and the tensor descriptor base (4); then, once,
    # the modules of triton.language's own helpers (tl.zeros, tl.sum, ...), which see tl.core
    # too (6 more): at most 10 per launch. As shipped, the interpreter walks again on every
    # helper call (341 walks for this call).
    assert launches and 0 < len(walks) <= 10 * len(launches), (len(walks), len(launches))
    # The launch restored what it patched: a language left patched would leak between launches.
    assert (tl.range, tl.load, tl.tensor.__add__) == originals
