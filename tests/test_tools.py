"""The maintained tools of ``benchmarks/``, run as scripts (tests never import them): what they
can do without a GPU (offline compile statistics, argument checks before any GPU work)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

#: Subprocess runs and whole checks through the interpreter: `nox -s slow` (CI).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def test_kernel_stats_compiles_for_sm90_without_a_gpu() -> None:
    """benchmarks/kernel_stats.py: the kernels compiled for an H100 on this machine (Triton's
    own ptxas, no launch), in a fresh process without the interpreter."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_stats.py"),
                           "--workload", "decode-b1-ctx1k"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # One 1k-token decode on 8 KV heads: the split plan, 64-row tiles; its 8 lead splits per
    # row make 64 programs, so 2 V column blocks and one tile per loop step (the rules on 132
    # SMs); the split kernel and the merge.
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| decode-b1-ctx1k")]
    assert len(rows) == 2, proc.stdout
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1:4] == ["split", "64/64/4/5/2/1", "unified_attention_split_kernel"], cells
    assert 32 <= int(cells[4]) <= 255 and int(cells[6]) > 0, cells
    assert cells[7].startswith("wgmma ") and cells[7].endswith("mma.sync 0"), cells
    assert int(cells[7].split()[1].rstrip(",")) > 0, cells  # the Hopper family only
    assert rows[1].split("|")[4].strip() == "merge_splits_kernel", rows
    # An FP8 cache: the same kernel compiled on its FP8 path, the same MMA family.
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_stats.py"),
                           "--workload", "decode-b1-ctx1k", "--kv-dtype", "fp8_e4m3"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fp8_e4m3 cache" in proc.stdout, proc.stdout
    fp8 = [line for line in proc.stdout.splitlines() if "unified_attention_split_kernel" in line]
    assert len(fp8) == 1 and "mma.sync 0 |" in fp8[0] and "| wgmma 0," not in fp8[0], fp8
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_stats.py"),
                           "--workload", "decode-b1-ctx1k", "--dot-waits", "--sass-order"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # --sass-order: the split kernel's SASS has its score wgmma
    # (m64n64k16, 8 along the head dim), a wait for it, and exponentials.
    sass = [line for line in proc.stdout.splitlines()
            if line.startswith("  unified_attention_split_kernel SASS: ")]
    assert len(sass) == 1, proc.stdout
    assert "mma64x64x16x8" in sass[0] and "wait0" in sass[0] and "exp2" in sass[0], sass[0]
    # The split kernel's loops: each with its score dots and its exponentials.
    waits = [line for line in proc.stdout.splitlines()
             if line.startswith("  unified_attention_split_kernel: ")]
    assert len(waits) == 1, proc.stdout
    assert "for[ dot64x64 wait0" in waits[0] and "exp2:64x64" in waits[0], waits[0]
    # Every loop opened in the listing was closed (a missed closing brace would leave one open).
    assert waits[0].count("for[") == waits[0].count("]"), waits[0]


def test_kernel_stats_takes_heads_and_writes_ptx(tmp_path: Path) -> None:
    """benchmarks/kernel_stats.py --heads HQ:HKV:D compiles at those heads (head dim 256: the
    64-key Triton tile, --no-keys-rows where Triton 3.6's Gluon would take decode), --ptx-dir
    writes each kernel's PTX (the row sum's order is read off it); a
    malformed --heads is a usage error naming it, before anything compiles."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    script = str(ROOT / "benchmarks" / "kernel_stats.py")
    proc = subprocess.run([sys.executable, script, "--workload", "decode-b1-ctx1k", "--heads",
                           "16:8:256", "--plan", "split", "--no-keys-rows", "--ptx-dir",
                           str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = [line for line in proc.stdout.splitlines() if "unified_attention_split_kernel" in line]
    assert len(row) == 1 and "| split | 64/64/" in row[0], proc.stdout
    ptx = (tmp_path / "decode-b1-ctx1k.unified_attention_split_kernel.ptx").read_text()
    assert "wgmma.mma_async" in ptx and "shfl.sync.bfly" in ptx
    assert (tmp_path / "decode-b1-ctx1k.merge_splits_kernel.ptx").exists()
    proc = subprocess.run([sys.executable, script, "--workload", "decode-b1-ctx1k", "--heads",
                           "16:8"], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)
    assert proc.returncode == 2 and "--heads: " in proc.stderr and "'16:8'" in proc.stderr, (
        proc.stderr[-1000:])
    assert proc.stdout == "", proc.stdout  # refused before the table's header


def test_kernel_stats_gluon_switch_names_a_bad_switch() -> None:
    """benchmarks/kernel_stats.py --gluon-switch: a name kernels._gluon lacks, one that is not a
    bool or int switch, a missing value or a value of the wrong type is a usage error naming
    it, before anything compiles."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for bad, said in (("NO_SUCH_SWITCH=1", "'NO_SUCH_SWITCH=1'"), ("RING_SLOTS", "'RING_SLOTS'"),
                      ("GLUON_TRITON=3.7.", "'GLUON_TRITON=3.7.'"),
                      ("RING_SLOTS=abc", "expected RING_SLOTS as int (it is 4), got 'abc'"),
                      ("RING_SLOTS=--5", "got '--5'"), ("RING_SLOTS=2.5", "got '2.5'")):
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kernel_stats.py"),
                               "--workload", "prefill-varlen", "--gluon-switch", bad],
                              capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
        assert proc.returncode == 2, (bad, proc.stdout[-500:], proc.stderr[-1000:])
        assert "--gluon-switch: expected" in proc.stderr and said in proc.stderr, proc.stderr


def test_peer_ab_rejects_bad_arguments_before_cuda(tmp_path) -> None:
    """benchmarks/peer_ab.py: --rounds / --iters / --sustain-passes below 1 (or above 1 without
    --sustain), a --sustain that is negative, not finite or too short for its samples, a
    --sustain without nvidia-smi, an unknown or repeated --backend and an unknown --workload
    are usage errors naming the argument, the value expected and the value given, before any
    GPU work and before the output folder is made."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    no_smi = dict(env, PATH=str(tmp_path / "empty"))
    out = tmp_path / "out"
    for args, said, e in (
            (["--rounds", "0"], "--rounds: expected >= 1, got 0", env),
            (["--iters", "0"], "--iters: expected >= 1, got 0", env),
            (["--sustain", "-1"], "--sustain: expected 0 (off) or a finite", env),
            (["--sustain", "nan"], "got nan", env), (["--sustain", "inf"], "got inf", env),
            (["--sustain", "1"], "got 1.0", env),
            (["--sustain-passes", "0"], "--sustain-passes: expected >= 1", env),
            (["--sustain-passes", "3"], "got 3 (--sustain 0.0)", env),
            (["--sustain", "4"], "--sustain: needs nvidia-smi on the PATH", no_smi),
            (["--backend", "kernels", "--backend", "kernels"],
             "--backend: expected distinct backends, got ['kernels', 'kernels']", env),
            (["--backend", "no-such-backend"], "--backend: ", env),
            (["--workload", "no-such-workload"], "--workload: ", env)):
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peer_ab.py"), str(out),
                               *args], capture_output=True, text=True, cwd=ROOT, env=e,
                              timeout=120)
        assert proc.returncode == 2, (args, proc.stderr[-1000:])
        assert said in proc.stderr, (args, proc.stderr)
        assert not out.exists(), args
    # The unknown names are named back.
    for arg, name in (("--backend", "no-such-backend"), ("--workload", "no-such-workload")):
        proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peer_ab.py"), str(out),
                               arg, name], capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=120)
        assert proc.returncode == 2 and name in proc.stderr.splitlines()[-1], proc.stderr


def test_profile_peer_rejects_bad_arguments(tmp_path) -> None:
    """benchmarks/profile_peer.py (an Nsight Compute target): --replays below 1, an unknown
    workload and an unknown backend are usage errors naming the argument and the value given,
    before any GPU work; without CUDA it says so instead of failing later."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    script = str(ROOT / "benchmarks" / "profile_peer.py")
    cases = [(["kernels", "prefill-varlen", "--replays", "0"], "--replays: expected >= 1, got 0"),
             (["kernels", "no-such-workload"], "workload: expected a bench workload name or "
              "length spec, got 'no-such-workload'"),
             (["no-such-backend", "prefill-varlen"], "backend: ")]
    if not torch.cuda.is_available():
        cases.append((["kernels", "prefill-varlen"], "needs a CUDA device"))
    for args, said in cases:
        proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=120)
        assert proc.returncode == 2 and said in proc.stderr, (args, proc.stderr[-800:])

