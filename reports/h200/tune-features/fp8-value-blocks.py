"""The FP8-cache V-block finding: is the 4-block (32-column) launch wrong, or only different?
Error of each V-block count against the float64 reference, and bits differing from 1 block."""

import torch

import kernels
import kernels.plan as kp
from invariance.backends.kernels import feature_kwargs
from invariance.bench import BenchWorkload, build_batch
from invariance.features import Features
from invariance.workload import HeadConfig
from kernels.reference import reference_attention

kp._FP8_REFUSED_V_COLUMNS = -1  # lift the refusal for this experiment
heads = HeadConfig(32, 8, 128)
for name, q_lens, kv_lens in (("decode:8kx8", (1,) * 8, (8192,) * 8),
                              ("decode:1kx4", (1,) * 4, (1000, 1500, 777, 2048))):
    for kv_dtype in ("fp8_e4m3", None):
        b = build_batch(BenchWorkload(name, q_lens, kv_lens), heads, torch.bfloat16, 16, "cuda",
                        features=Features(kv_dtype=kv_dtype) if kv_dtype else None)
        args = (b.q, b.k_cache, b.v_cache, b.cu_seqlens_q, b.kv_lens, b.block_table)
        fk = feature_kwargs(b, kernels.unified_attention)
        ref_o, ref_l = reference_attention(*args, sm_scale=b.sm_scale, out_dtype=torch.float64,
                                           **fk)
        res = {}
        for vb in (1, 2, 4, 8):
            t = kernels.Tuning(value_blocks=vb)
            lp = kernels.plan_attention(*args, plan="split", tuning=t, **fk)
            o, l = kernels.unified_attention(*args, sm_scale=b.sm_scale, plan="split", tuning=t,
                                             **fk)
            torch.cuda.synchronize()
            res[vb] = (o, l)
            err = (o.double() - ref_o).abs()
            lerr = (l.double() - ref_l.double()).abs()
            d1 = (o.view(torch.int16) != res[1][0].view(torch.int16)).sum().item()
            # where the error is: per column block of 32
            col = err.amax(dim=(0, 1)).view(-1, 32).amax(1).tolist()
            print(f"{name} {kv_dtype} vb{vb} gluon={lp.gluon} kr={lp.keys_rows} "
                  f"max|err| {err.max().item():.3e} mean {err.mean().item():.3e} "
                  f"lse {lerr.max().item():.3e} nan {torch.isnan(o).sum().item()} "
                  f"differ-from-vb1 {d1}/{o.numel()} colmax {[f'{c:.1e}' for c in col]}",
                  flush=True)
