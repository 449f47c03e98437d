"""Compile the fold test's kernel (``state_fold``) for sm_90 on any machine, GPU or not, and
count the ``-0.0`` constants that reach the PTX (reports/h100-round8/README.md, section 1).

    PYTHONPATH=. python benchmarks/fold_ptx.py

Prints the Triton version, whether the TTIR holds a float ``-0.0`` constant (the weight built
from its bits is an integer constant and a bitcast there), and how many ``selp``
instructions of the PTX select ``0f80000000`` (-0.0). Run it with another Triton first on
``PYTHONPATH`` (``pip download triton==3.6.0``, unpacked) to see what that version compiles.
"""

import re

import triton
from triton.backends.compiler import GPUTarget

from tests.triton_kernels.test_merge import _fold_kernel

SIGNATURE = {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "out_m_ptr": "*fp32",
             "out_l_ptr": "*fp32", "out_acc_ptr": "*fp32", "S": "i32", "BM": "constexpr",
             "D": "constexpr"}

src = triton.compiler.ASTSource(fn=_fold_kernel, signature=SIGNATURE,
                                constexprs={"BM": 16, "D": 32})
k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
ttir, ptx = k.asm["ttir"], k.asm["ptx"]
neg = "-0.000000e+00" in ttir
print(f"triton {triton.__version__}: TTIR has a float -0.0 constant: {neg}; "
      f"PTX selp of 0f80000000: {len(re.findall(r'selp[.]f32[^;]*0f80000000', ptx))}")
