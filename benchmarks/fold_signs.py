"""Where ``state_fold`` changes the bits of -0.0 and NaN (reports/h100-round7/ and round8/).

    PYTHONPATH=. python benchmarks/fold_signs.py   # on a GPU, or with TRITON_INTERPRET=1

(It imports the fold kernel of tests/triton_kernels/test_merge.py, so pytest must be importable:
on the GPU machine add gpu_site/ to PYTHONPATH, as benchmarks/gpu_round7.sh says.)

Folds one real state (with a -0.0 and a NaN) into and next to empty states in several orders
(r = the real state, e = an empty one; the fold starts from the empty running state) and prints
the bits of the two special elements after each sequence, and whether every other element, m
and l came through unchanged. Under the interpreter every line keeps 0x80000000 / 0x7fc00000;
on an H100 (round 8, with the -0.0 weight built from its bits) 0x80000000 / 0x7fffffff, the
GPU's canonical NaN. (With the literal -0.0 weight that Triton 3.6 compiles to +0.0, round 7's
test saw -0.0 come out +0.0; this script has not run with that weight.)
"""

import torch

from tests.triton_kernels.test_merge import _fold


def bits(x):
    """The raw bits of a one-element float32 tensor (NaN payloads included)."""
    return hex(x.reshape(1).view(torch.int32).item() & 0xFFFFFFFF)

dev = "cuda" if torch.cuda.is_available() else "cpu"
BM, D = 16, 32
g = torch.Generator().manual_seed(1)
m = (torch.randn(1, BM, generator=g) * 8).to(dev)
l = (1 + torch.rand(1, BM, generator=g) * 100).to(dev)
acc = (torch.randn(1, BM, D, generator=g) * 10).to(dev)
acc[0, 0, 0] = -0.0
acc[0, 1, 1] = float("nan")
e_m, e_l, e_acc = torch.full_like(m, float("-inf")), torch.zeros_like(l), torch.zeros_like(acc)
print("input", bits(acc[0, 0, 0]), bits(acc[0, 1, 1]))
for seq in ("r", "er", "re", "ere", "eer", "rr"):
    def pick(r, e, seq=seq):
        return torch.cat([r if c == "r" else e for c in seq])
    fm, fl, fa = _fold(pick(m, e_m), pick(l, e_l), pick(acc, e_acc))
    if seq == "rr":  # two real states: a real fold, for comparison
        print(seq, bits(fa[0, 0]), bits(fa[1, 1]))
        continue
    same = bool(((fa == acc[0]) | (fa != fa)).all())
    print(seq, bits(fa[0, 0]), bits(fa[1, 1]), "others equal:", same, "m, l equal:",
          bool((fm == m[0]).all()), bool((fl == l[0]).all()))
