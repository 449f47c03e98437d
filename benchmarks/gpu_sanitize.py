"""A small driver of every kernel path, for compute-sanitizer (``benchmarks/gpu_sanitize.sh``).

    python benchmarks/gpu_sanitize.py [--device cuda] [--dtypes float16 bfloat16 float32]
        [--valid-only] [--match NAME ...]

At each dtype, on two head configurations, small batches (built by the harness's
``materialize``; shuffled pages, NaN-filled unused memory, unused block-table columns) go through:
the fused and the split plan at two split sizes (validate=True; the two plans must agree bit for
bit), the fused plan with 128- and 256-row tiles and its nested loop (half precision),
``plan="auto"``, the control mode (``split_size=None``), a step without query tokens,
``merge_states`` (with empty, NaN and +inf partials), the Gluon kernels where they run (half
precision at head dim 128 on Hopper with Triton 3.6: the 128-key contract's fused and split
kernels, bits compared with the Triton kernels at 128 keys, the split kernel with 2 and 4 V
column blocks, and the 64-key contract's prefill tile and Triton rules through
``Tuning(block_n=64)``; the keys-as-rows tile at every head dim it serves, 128 keys at head dims
64 and 128 and 64 keys at 256, with the fewest and the most V blocks, against the Triton split
kernel), and malformed index values with
``validate=False`` (the kernels' integer guards: page ids out of range, ``kv_lens`` past the
block table, negative or below ``q_len``, ``cu_seqlens_q`` past T or not starting at 0). Outputs
of malformed calls are never read (their garbage rows may be unwritten); ``--valid-only`` leaves
them out (for initcheck: garbage rows may read workspace no program wrote, which the contract
allows). Prints one line per case; exits 1 if a valid case breaks a check. ``--device cpu`` (with
TRITON_INTERPRET=1) is a quick smoke run.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch

from invariance import Chunk, HeadConfig, PageLayout, Request, Step, Workload, materialize
from kernels import (
    DEFAULT_SPLIT_SIZE,
    Tuning,
    merge_states,
    plan_attention,
    tile_config,
    unified_attention,
)

Args = tuple[torch.Tensor, ...]
# (heads, page size, (q_len, kv_len) per request): decode rows, prefill chunks, a prefill from 0,
# empty requests, rows longer than the default split; page size 1 gathers every key.
BATCHES = [
    (HeadConfig(4, 2, 64), 16, [(1, 300), (37, 150), (0, 40), (0, 0), (5, 5), (12, 97)]),
    (HeadConfig(8, 2, 128), 1, [(1, DEFAULT_SPLIT_SIZE + 90), (40, 64), (3, 200)]),
    # Prefill-like at head dim 128 with 16-token pages: half precision on Hopper runs the Gluon
    # prefill kernel (kernels/_gluon) in the fused plan.
    (HeadConfig(8, 2, 128), 16, [(300, 1200), (1, 500), (64, 64), (0, 30), (7, 1030)]),
    # Decode-like at head dims 64 and 256 with 16-token pages: on Hopper with Triton 3.6 the
    # keys-as-rows tile at 128 and 64 keys, and the Gluon kernels at head dim 64 when asked.
    (HeadConfig(8, 1, 64), 16, [(1, 1300), (1, 77), (2, 600), (0, 12)]),
    (HeadConfig(4, 2, 256), 16, [(1, 1300), (1, 77), (3, 600), (0, 12)]),
]
FAILURES: list[str] = []


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


#: Only the cases whose name contains one of these (``--match``; empty: every case).
MATCH: list[str] = []


def case(name: str, fn: Callable[[], bool | None]) -> None:
    if MATCH and not any(m in name for m in MATCH):
        return
    t0 = time.perf_counter()
    ok = fn()
    if ok is False:
        FAILURES.append(name)
    print(f"[{'FAIL' if ok is False else 'ok'}] {name} ({time.perf_counter() - t0:.2f}s)",
          flush=True)


def build(dtype: torch.dtype, heads: HeadConfig, page: int, shape: list[tuple[int, int]],
          device: str) -> Args:
    requests = tuple(Request(i, kv) for i, (_, kv) in enumerate(shape))
    step = Step(tuple(Chunk(i, kv - q, kv) for i, (q, kv) in enumerate(shape)))
    layout = PageLayout(page, "shuffled", extra_pages=2, extra_columns=2, fill="nan")
    b = materialize(Workload(requests, heads, dtype), step, layout, device)
    return b.q, b.k_cache, b.v_cache, b.cu_seqlens_q, b.kv_lens, b.block_table


def call(args: Args, **kwargs: object) -> None:
    """Run unified_attention; the result is not read."""
    unified_attention(*args, **kwargs)  # type: ignore[arg-type]


def plans_agree(args: Args, split: int, block_n: int | None = None) -> bool:
    """The plans and their launch variants at ``split`` (bits compared), with the tile width
    ``block_n`` (None: the default, 128 keys for half precision at head dim 128 on Hopper)."""

    def tuned(**kw: object) -> Tuning:
        return Tuning(block_n=block_n, **kw)  # type: ignore[arg-type]

    lp = plan_attention(*args, split_size=split, plan="fused", tuning=tuned())
    # Hopper's 128-key contract (tile_config without a GPU gives the 64-key tile).
    wide = lp.block_n != tile_config(args[0].dtype, args[0].shape[2]).block_n
    fused = unified_attention(*args, split_size=split, plan="fused", tuning=tuned())
    split_plan = unified_attention(*args, split_size=split, plan="split", tuning=tuned())
    # The fused plan with its slots sorted on the device, longest first, and with its nested
    # loop (at 64 keys two tiles per step, K as rows; bits compared too).
    ordered = unified_attention(*args, split_size=split, plan="fused",
                                tuning=tuned(slot_order=True))
    # Two 64-key tiles per step need more shared memory than Hopper has at head dim 256.
    two = not wide and args[0].shape[2] <= 128
    nested = unified_attention(*args, split_size=split, plan="fused",
                               tuning=tuned(nested_loop=True, tiles_per_step=2 if two else None))
    unified_attention(*args, split_size=split, plan="auto", tuning=tuned())
    same = True
    if lp.gluon or wide:
        # The Gluon kernels against the Triton kernels (bits compared); at 128 keys in both plans.
        for plan in ("fused", "split") if wide else ("fused",):
            triton = unified_attention(*args, split_size=split, plan=plan,
                                       tuning=tuned(gluon=False))
            same = same and all(torch.equal(bits(a), bits(b))
                                for a, b in zip(fused, triton, strict=True))
    if wide and lp.gluon:
        # The Gluon split kernel with 2 and 4 V column blocks, its merge as an ordinary
        # launch, and the keys-as-rows decode tile forced, with 1 and 2 V blocks
        # and the scores ahead (bits compared).
        for tuning in (tuned(value_blocks=2), tuned(value_blocks=4),
                       tuned(dependent_merge=False), tuned(keys_rows=True),
                       *(tuned(keys_rows=True, value_blocks=vb, scores_ahead=ahead)
                         for vb in (1, 2) for ahead in (False, True))):
            cut = unified_attention(*args, split_size=split, plan="split", tuning=tuning)
            same = same and all(torch.equal(bits(a), bits(b))
                                for a, b in zip(cut, split_plan, strict=True))
    # 128- and 256-row tiles in the fused kernel (K loaded as columns there; bits not compared:
    # BLOCK_M 128 and 256 are measured bit-neutral at head dim 128 only). The 64-key rules only.
    # At head dim 256 these tiles and two tiles per step need more shared memory than Hopper
    # has: the rules' launches only, and V column blocks one tile per step.
    if args[0].dtype != torch.float32 and not wide:
        if two:
            unified_attention(*args, split_size=split, plan="fused", tuning=tuned(block_m=128))
            unified_attention(*args, split_size=split, plan="fused",
                              tuning=tuned(block_m=256, num_warps=8, num_stages=3))
            # The prefill tile: 128 rows on 8 warps, nested loop, two tiles per step.
            unified_attention(*args, split_size=split, plan="fused",
                              tuning=tuned(block_m=128, num_warps=8, num_stages=3,
                                           nested_loop=True, tiles_per_step=2))
        # The split plan with its V columns cut into 2, 4 and 8 programs (8 at head dim 128
        # and more: 16 columns each), walking two tiles per loop step, and with the merge as an
        # ordinary launch instead of a dependent one (bits compared too).
        steps = 2 if two else None
        eight = ([tuned(value_blocks=8, tiles_per_step=steps)] if args[0].shape[2] >= 128
                 else [])
        for tuning in (tuned(value_blocks=2), tuned(value_blocks=4), tuned(tiles_per_step=steps),
                       tuned(value_blocks=4, tiles_per_step=steps), *eight,
                       tuned(dependent_merge=False)):
            cut = unified_attention(*args, split_size=split, plan="split", tuning=tuning)
            same = same and all(torch.equal(bits(a), bits(b))
                                for a, b in zip(cut, split_plan, strict=True))
    # host_lens that understate every length: they steer the plan only, never memory sizes.
    q_lens = (args[3][1:] - args[3][:-1]).tolist()
    unified_attention(*args, split_size=split, validate=False,
                      host_lens=(q_lens, [max(1, n) for n in q_lens]), tuning=tuned())
    return same and all(torch.equal(bits(a), bits(b)) and torch.equal(bits(a), bits(c))
                        and torch.equal(bits(a), bits(d))
                        for a, b, c, d in zip(fused, split_plan, ordered, nested, strict=True))


def keys_rows_settings(args: Args) -> list[Tuning]:
    """The keys-as-rows tile's settings this batch's shapes take (none off Hopper, without
    Triton 3.6, or at a head dim or dtype it does not serve): the fewest and the most V column
    blocks, the second with the scores ahead."""
    taken = []
    for blocks in (1, 2, 4):
        tuning = Tuning(keys_rows=True, value_blocks=blocks, scores_ahead=blocks > 1)
        try:
            plan_attention(*args, plan="split", tuning=tuning)
        except ValueError:
            continue
        taken.append(tuning)
    return taken[:1] + taken[-1:] if len(taken) > 1 else taken


def keys_rows_agree(args: Args, tuning: Tuning) -> bool:
    """The keys-as-rows tile gives the Triton split kernel's bits (validate=True)."""
    kt = unified_attention(*args, plan="split", tuning=tuning)
    ref = unified_attention(*args, plan="split", tuning=Tuning(keys_rows=False, gluon=False))
    return all(torch.equal(bits(x), bits(y)) for x, y in zip(kt, ref, strict=True))


def malformed(args: Args) -> dict[str, Args]:
    """validate=False inputs with malformed values (request 0 of each batch is a decode row)."""
    q, k, v, cu, kv, bt = args
    T, dev = q.shape[0], q.device

    def ints(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=dev)

    huge = 1 << 30
    return {
        "page-ids-huge": (q, k, v, cu, kv, torch.full_like(bt, huge)),
        "page-ids-negative": (q, k, v, cu, kv, torch.full_like(bt, -5)),
        "kv-past-block-table": (q, k, v, cu, torch.full_like(kv, huge), bt),
        "kv-negative": (q, k, v, cu, torch.full_like(kv, -huge), bt),
        "kv-below-q": (q, k, v, cu, torch.zeros_like(kv), bt),
        "cu-past-T": (q, k, v, torch.cat([cu[:-1], ints([T + huge])]), kv, bt),
        "cu-garbage": (q, k, v, torch.flip(cu, [0]) + 3, kv, bt),
    }


def run_dtype(dtype: torch.dtype, device: str, valid_only: bool) -> None:
    name = str(dtype).removeprefix("torch.")
    for heads, page, shape in BATCHES:
        tag = f"{name}/{heads}/page{page}"
        args = build(dtype, heads, page, shape, device)
        block_n = plan_attention(*args).block_n
        for split in (block_n, DEFAULT_SPLIT_SIZE):
            case(f"{tag}/S{split}/fused==split", lambda a=args, s=split: plans_agree(a, s))
        narrow = tile_config(dtype, heads.head_dim).block_n
        if block_n != narrow:  # Hopper's 128-key default: the 64-key contract's paths too
            for split in (narrow, DEFAULT_SPLIT_SIZE):
                case(f"{tag}/S{split}/block_n{narrow}/fused==split",
                     lambda a=args, s=split, n=narrow: plans_agree(a, s, n))
        case(f"{tag}/control", lambda a=args: call(a, split_size=None))
        # Whether the fused plan of this batch's shapes runs the Gluon kernel (malformed values
        # keep the shapes, hence the answer), and the keys-as-rows tile's settings it takes.
        gluon = plan_attention(*args, plan="fused").gluon
        kt = keys_rows_settings(args)
        for t in kt:
            case(f"{tag}/split-keys-rows-{t.value_blocks}-value-blocks-ahead-{t.scores_ahead}"
                 f"==triton", lambda a=args, k=t: keys_rows_agree(a, k))
        for label, bad in ({} if valid_only else malformed(args)).items():
            for plan in ("fused", "split"):
                case(f"{tag}/validate=False/{label}/{plan}",
                     lambda b=bad, p=plan: call(b, validate=False, plan=p))
            case(f"{tag}/validate=False/{label}/fused-slot-order",
                 lambda b=bad: call(b, validate=False, plan="fused",
                                    tuning=Tuning(slot_order=True)))
            steps = 2 if heads.head_dim <= 128 else 1  # two tiles need too much shared memory
            case(f"{tag}/validate=False/{label}/fused-nested-{steps}-tiles-per-step",
                 lambda b=bad, n=narrow, k=steps: call(b, validate=False, plan="fused",
                                                       tuning=Tuning(nested_loop=True,
                                                                     tiles_per_step=k,
                                                                     block_n=n)))
            if gluon:
                case(f"{tag}/validate=False/{label}/fused-gluon",
                     lambda b=bad: call(b, validate=False, plan="fused",
                                        tuning=Tuning(gluon=True)))
            if block_n != narrow and gluon:
                case(f"{tag}/validate=False/{label}/split-gluon-4-value-blocks",
                     lambda b=bad: call(b, validate=False, plan="split",
                                        tuning=Tuning(gluon=True, value_blocks=4)))
            for t in kt:
                case(f"{tag}/validate=False/{label}/split-keys-rows-{t.value_blocks}-value-"
                     f"blocks-ahead-{t.scores_ahead}",
                     lambda b=bad, k=t: call(b, validate=False, plan="split", tuning=k))
            if block_n != narrow:
                for plan in ("fused", "split"):
                    case(f"{tag}/validate=False/{label}/{plan}-triton-{block_n}-keys",
                         lambda b=bad, p=plan: call(b, validate=False, plan=p,
                                                    tuning=Tuning(gluon=False)))
                    case(f"{tag}/validate=False/{label}/{plan}-{narrow}-keys",
                         lambda b=bad, p=plan, n=narrow: call(b, validate=False, plan=p,
                                                              tuning=Tuning(block_n=n)))
            if dtype != torch.float32:
                blocks = 8 if heads.head_dim >= 128 else 4
                case(f"{tag}/validate=False/{label}/split-{blocks}-value-blocks-{steps}-tiles-"
                     f"per-step",
                     lambda b=bad, n=blocks, w=narrow, k=steps: call(
                         b, validate=False, plan="split",
                         tuning=Tuning(value_blocks=n, tiles_per_step=k, block_n=w)))
        empty = build(dtype, heads, page, [(0, 9), (0, 0)], device)
        case(f"{tag}/no-query-tokens", lambda e=empty: unified_attention(*e)[0].numel() == 0)
        for label, feats in features(args).items():
            case(f"{tag}/features/{label}/fused==split",
                 lambda a=feats[0], f=feats[1], s=block_n: features_agree(a, f, s))
            if not valid_only:
                for bad_label, bad in malformed(feats[0]).items():
                    case(f"{tag}/validate=False/{bad_label}/features/{label}",
                         lambda b=bad, f=feats[1]: call(b, validate=False, **f))


def features(args: Args) -> dict[str, tuple[Args, dict[str, object]]]:
    """The window, sinks and soft-cap on ``args``, and with half precision the same batch
    on an FP8 cache with per-KV-head scales (the feature paths of the Triton kernels)."""
    q, k, v = args[:3]
    Hq, Hkv = q.shape[1], k.shape[2]
    dev = q.device
    sinks = torch.linspace(-4.0, 4.0, Hq, device=dev)
    out = {"window-sinks-softcap": (args, {"window_left": 37, "sinks": sinks,
                                           "logits_soft_cap": 7.0})}
    if q.dtype != torch.float32:
        # NaN in the unused slots stays NaN in e4m3 (its NaN encoding).
        fp8 = (q, k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn), *args[3:])
        scale = torch.linspace(0.5, 2.0, Hkv, device=dev)
        out["fp8-window-sinks"] = (fp8, {"k_scale": scale, "v_scale": scale,
                                         "window_left": 100, "sinks": sinks})
    return out


def features_agree(args: Args, feats: dict[str, object], split: int) -> bool:
    """Both plans with the features, at split sizes of one tile and the default (bits
    compared)."""
    same = True
    for s in (split, DEFAULT_SPLIT_SIZE):
        a = unified_attention(*args, split_size=s, plan="fused", **feats)  # type: ignore[arg-type]
        b = unified_attention(*args, split_size=s, plan="split", **feats)  # type: ignore[arg-type]
        same = same and all(torch.equal(bits(x), bits(y)) for x, y in zip(a, b, strict=True))
    return same


def run_merge(device: str) -> None:
    g = torch.Generator().manual_seed(0)
    o = torch.randn(6, 5, 20, 128, generator=g).to(device)
    lse = (torch.randn(6, 5, 20, generator=g) * 4).to(device)
    lse[:, 1] = float("-inf")
    lse[1, 2, 3], lse[2, 0, 0] = float("nan"), float("inf")

    def check() -> bool:
        _, out_lse = merge_states(o, lse)
        return bool(torch.isnan(out_lse[1, 3])) and bool(torch.isnan(out_lse[2, 0]))

    case("merge_states/-inf,nan,+inf", check)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16", "float32"])
    p.add_argument("--valid-only", action="store_true", help="leave out malformed inputs")
    p.add_argument("--match", nargs="+", default=[],
                   help="run only the cases whose name contains one of these strings")
    args = p.parse_args()
    MATCH[:] = args.match
    t0 = time.perf_counter()
    for dtype in args.dtypes:
        run_dtype(getattr(torch, dtype), args.device, args.valid_only)
    run_merge(args.device)
    if args.device == "cuda":
        torch.cuda.synchronize()
    print(f"{len(FAILURES)} failed {FAILURES} in {time.perf_counter() - t0:.1f}s", flush=True)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
