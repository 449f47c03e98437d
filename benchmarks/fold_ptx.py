"""Compile the fold test's kernel (``state_fold``) for sm_90 on any machine, GPU or not, and
count the ``-0.0`` constants that reach the PTX (reports/h100-round8/README.md, section 1).

    PYTHONPATH=. python benchmarks/fold_ptx.py

Prints the Triton version, whether the TTIR holds a float ``-0.0`` constant (the weight built
from its bits is an integer constant and a bitcast there), and how many ``selp``
instructions of the PTX select ``0f80000000`` (-0.0). Run it with another Triton first on
``PYTHONPATH`` (``pip download triton==3.6.0``, unpacked) to see what that version compiles.
"""

import re

import torch
import triton

from benchmarks.kernel_stats import compile_sm90
from tests.triton_kernels.test_merge import _fold_kernel

m, l, acc = torch.zeros(2, 16), torch.zeros(2, 16), torch.zeros(2, 16, 32)
k = compile_sm90(_fold_kernel, m, l, acc, torch.empty(16), torch.empty(16), torch.empty(16, 32),
                 2, BM=16, D=32)
ttir, ptx = k.asm["ttir"], k.asm["ptx"]
neg = "-0.000000e+00" in ttir
print(f"triton {triton.__version__}: TTIR has a float -0.0 constant: {neg}; "
      f"PTX selp of 0f80000000: {len(re.findall(r'selp[.]f32[^;]*0f80000000', ptx))}")
