"""Is the warp-specialized Gluon up projection with SwiGLU over all experts
(``swiglu.kernels.moe_gluon_up``) right, and faster than the library's tl kernel
(``swiglu.kernels.moe.launch_up``, one program per tile, the epilogue in the MMA warps)?

Why it might be: at Qwen3-30B-A3B, 8192 tokens, the up projection takes 0.93 of the 4.38 ms
forward+backward at 443 TFLOP/s (docs/moe.md); its epilogue (SwiGLU, three [BM, BN] stores) runs
between main loops. The Gluon kernel runs it in its own warps under the next tile's MMAs, as the
dense Gluon dSwiGLU kernel does (1.07-1.15x the tl kernel's speed on its GEMM at T >= 256, docs/kernels.md); it reads x from a copy
in expert order (``gather_rows``: timed with it, and without it as "kernel").
Answer: bitwise; faster at all four shapes, the x copy included (1.08-1.21x: 0.829 vs 0.896 ms at
Qwen3-30B-A3B, 6.00 vs 7.29 at Mixtral with GROUP_M 8): data/tuning/moe_gluon_20261205.log; the plan takes it.
Then: does the lab's kernel gathering x's rows itself with cp.async
(``swiglu_lab.experiments.moe_gluon_up_gather``, "gather") save the copy (0.13 ms at Qwen3-30B-A3B)?
Answer (one H100, bitwise): no, slower than Gluon with the copy at every shape (0.97 vs 0.92 ms at
Qwen3-30B-A3B, 3.63 vs 3.24 at Qwen3-235B-A22B, 9.83 vs 9.11 at DeepSeek-V3, 7.33 vs 5.65 at
Mixtral): one cp.async warp does not feed the MMAs as TMA boxes do;
data/tuning/moe_gluon_pingpong_gather_20261205.log. The library keeps the copy.
``--smoke``: one small case (skewed routing, an expert with no rows, experts whose rows end inside
an M tile) against the library's kernel, then exits; run it first under a timeout (a fault in the
barriers hangs). Otherwise: the up projection at 8192 tokens per shape (moe_probe.SHAPES), the
library's kernel, the Gluon launch (copy and tile table included) and its kernel alone,
NaN-poisoned outputs, bitwise against the library's, do_bench times (L2 flushed); a table last.
Run: PYTHONPATH=src:lab timeout -k 5 240 python3 lab/probes/moe_gluon_up.py [--smoke] [shape ...]
"""

import dataclasses
import sys

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as M
from swiglu.kernels import moe_gluon_up as G
from swiglu_lab.experiments import moe_gluon_up_gather as UG

CONFIGS = {"gluon g1": G.CONFIG, "gluon g8": dataclasses.replace(G.CONFIG, GROUP_M=8)}
# The lab's kernel gathering x's rows itself (cp.async), no copy: its launch is its kernel (and the table).
GATHER = {"gather g1": UG.CONFIG, "gather g8": dataclasses.replace(UG.CONFIG, GROUP_M=8)}
CONFIGS |= GATHER
if "--sweep" in sys.argv:  # more tiles and orders (each compiled for sm_90 under triton 3.6 without spills before its run)
    CONFIGS |= {
        "gluon g4": dataclasses.replace(G.CONFIG, GROUP_M=4),
        "gluon g16": dataclasses.replace(G.CONFIG, GROUP_M=16),
        "gluon bk32 s6 g1": dataclasses.replace(G.CONFIG, BK=32, STAGES=6),
        "gluon bk32 s6 g8": dataclasses.replace(G.CONFIG, BK=32, STAGES=6, GROUP_M=8),
    }
rows = []


def operands(H, I, E, k, T, skew=False, drop=None):
    """(x, gate_up_proj, routing, k, outputs (gate, up, h) [S, I])."""
    x, idx, w, gu, dp, go = P.inputs(H, I, E, k, T, skew)
    if drop is not None:  # no token routes to expert ``drop``
        idx = torch.where(idx == drop, (idx + 1) % E, idx)
    r = M.Routing(idx.contiguous(), E)
    outs = [torch.empty(T * k, I, dtype=torch.bfloat16, device="cuda") for _ in range(3)]
    return x, gu, r, k, outs


def check(name, x, gu, r, k, outs, tile, time_it, num_programs=None, repeats=1):
    """The library's kernel, then each Gluon config: gate, up and h bitwise against it
    (``repeats`` launches, each compared: a race shows only now and then), and (``time_it``)
    do_bench ms of the launch and of the kernel alone (copy and table made once)."""
    for o in outs:
        o.fill_(float("nan"))
    M.launch_up(x, gu, r, k, *outs, tile)
    want = [o.clone() for o in outs]
    lib_ms = P.kernel_ms(lambda: M.launch_up(x, gu, r, k, *outs, tile)) if time_it else float("nan")
    rows.append((name, "library (tl)", lib_ms, float("nan"), True))
    for label, cfg in CONFIGS.items():
        label += f" x{num_programs}" if num_programs else ""
        if label.startswith("gather"):
            launch = lambda cfg=cfg: UG.launch_moe_up_gather(x, gu, r, k, *outs, cfg, num_programs)  # noqa: E731
        else:
            launch = lambda cfg=cfg: G.launch_moe_up_gluon(M.gather_rows(x, r, k), gu, r, *outs, cfg, num_programs)  # noqa: E731
        same = True
        try:
            for _ in range(repeats):
                for o in outs:
                    o.fill_(float("nan"))
                launch()
                torch.cuda.synchronize()
                same &= all(torch.equal(o, w) for o, w in zip(outs, want))
        except Exception as e:
            print(f"{name} {label} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        ms = kernel = float("nan")
        if time_it:
            ms = P.kernel_ms(launch)
            same &= all(torch.equal(o, w) for o, w in zip(outs, want))
            kernel = ms if label.startswith("gather") else P.kernel_ms(kernel_only(x, gu, r, k, outs, cfg))
        rows.append((name, label, ms, kernel, same))
        print(f"{name:12s} {label:14s} {ms:7.3f} ms (kernel {kernel:7.3f})  bitwise={same}", flush=True)


def kernel_only(x, gu, r, k, outs, cfg):
    """The Gluon kernel's launch with the copy of x and the tile table made beforehand."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    E, I2, H = gu.shape
    xs, table = M.gather_rows(x, r, k), G.tile_table(r, cfg.BM)
    xs_desc = TensorDescriptor.from_tensor(xs, [cfg.BM, cfg.BK], G._layout((cfg.BM, cfg.BK)))
    w_desc = TensorDescriptor.from_tensor(gu.view(E * I2, H), [cfg.BN, cfg.BK], G._layout((cfg.BN, cfg.BK)))
    nprog = torch.cuda.get_device_properties(x.device).multi_processor_count
    args = (xs_desc, w_desc, table, *outs, E, I2 // 2, table.shape[1], cfg.GROUP_M, cfg.STAGES, cfg.EPI_M, cfg.epi_warps)
    return lambda: G.moe_up_gluon_kernel[(nprog,)](
        *args, cfg.load_regs, cfg.epi_regs, num_warps=cfg.num_warps, maxnreg=cfg.maxnreg
    )


def smoke():
    """Small experts (I = 384, three N tiles), skewed routing, expert 3 without rows."""
    E, k, T, H, I = 8, 2, 300, 256, 384
    x, gu, r, k, outs = operands(H, I, E, k, T, skew=True, drop=3)
    start = r.expert_start.tolist()
    assert start[4] == start[3], start
    tile = M.moe_plan(T * k, E, H, I).up
    # Three programs: each walks many tiles of changing experts; then one program per SM.
    check("smoke", x, gu, r, k, outs, tile, time_it=False, num_programs=3, repeats=30)
    check("smoke", x, gu, r, k, outs, tile, time_it=False, repeats=30)


try:
    if "--smoke" in sys.argv:
        smoke()
    else:
        for name in [a for a in sys.argv[1:] if not a.startswith("--")] or ["qwen3-30b", "qwen3-235b", "deepseek-v3", "mixtral"]:
            H, I, E, k = P.SHAPES[name]
            ops = operands(H, I, E, k, 8192)
            check(name, *ops, M.moe_plan(8192 * k, E, H, I).up, time_it=True)
            del ops
            torch.cuda.empty_cache()
finally:
    print("\nshape        variant          ms      kernel ms  bitwise")
    for name, label, ms, kernel, same in rows:
        print(f"{name:12s} {label:14s} {ms:7.3f}  {kernel:7.3f}    {same}")
