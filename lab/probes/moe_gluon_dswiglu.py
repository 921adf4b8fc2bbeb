"""Is the warp-specialized Gluon dSwiGLU GEMM over all experts
(``swiglu.kernels.moe_gluon_dswiglu``) right, and faster than the library's tl kernel
(``swiglu.kernels.moe.launch_dswiglu``, the epilogue in the MMA warps)?

Why it might be: at Qwen3-30B-A3B, 8192 tokens, the dSwiGLU GEMM runs at 350 TFLOP/s (0.59 of the
4.38 ms forward+backward; docs/moe.md): its epilogue (gate and up loads, d_gate, d_up and h * w
stores, the routing-weight sums) runs between main loops. The Gluon kernel runs it in its own warps
under the next tile's MMAs; it reads grad_out from a copy in expert order (``gather_rows``, timed
with it, and without it as "kernel").
Answer: d_gate, d_up, h * w bitwise, the partial sums within 2e-7; faster at hidden_size >= 4096
(1.07-1.21x), slower at Qwen3-30B-A3B with the grad_out copy (0.675 vs 0.594 ms; the kernel alone
0.549): data/tuning/moe_gluon_20261205.log; the plan takes it at H >= 4096.
Then: does the lab's kernel gathering grad_out's rows itself with cp.async
(``swiglu_lab.experiments.moe_gluon_dswiglu_gather``, "gather") win at every shape without the copy?
Answer (one H100, bitwise): not at every shape: ahead of Gluon plus its copy at Qwen3-30B-A3B (0.66 vs
0.78 ms; tl 0.67) and DeepSeek-V3 (5.18 vs 5.23), behind at Qwen3-235B-A22B (2.12 vs 1.99) and
Mixtral (4.03 vs 3.70); the copy is shared with grad_down_proj in the library, so the bench's whole
backward decides: data/tuning/moe_gluon_pingpong_gather_20261205.log.
``--smoke``: one small case (skewed routing, an expert with no rows, experts whose rows end inside
an M tile) against the library's kernel, then exits; run it first under a timeout (a fault in the
barriers hangs). Otherwise: the dSwiGLU GEMM at 8192 tokens per shape (moe_probe.SHAPES), the
library's kernel, the Gluon launch (copy and tile table included) and its kernel alone,
NaN-poisoned outputs: d_gate | d_up and h * w bitwise against the library's, the routing-weight
partial sums (another fp32 summation order) to 1e-5; do_bench times (L2 flushed); a table last.
``--wide``: also 128 x 256 tiles (the fp32 handover leaves BK 32 x 4 or 64 x 2 stages). Answer (one
H100, data/tuning/moe_wgrad_bound_h100_20261206/dswiglu_bn256_h100.log, the same configs from a
one-off script): 2.0-3.0x slower at every shape, the epilogue warps the bound; bitwise.
``--bm64``: 64-row M tiles (one MMA warpgroup, or two on the N halves; 4 or 5 stages), where the
128-row tiles issue ~1.25x the routed rows (DeepSeek-V3's 256 +- 16 rows per expert). Answer (one
H100, bitwise): slower at every shape, 1.08-1.46x the 128-row kernel's time at the best config (DeepSeek-V3
7.07 against 5.20 ms): data/tuning/moe_dswiglu_bm64_h100_20261206/.
``--pingpong``: the lab's ping-pong kernel (``swiglu_lab.experiments.moe_gluon_dswiglu_pingpong``: two MMA
warpgroups on alternate 128 x 128 tiles, each running its own epilogue under the other's main loop)
beside the library's kernels, with its grad_out copy and alone ("kernel": the copy made beforehand).
Answer (one H100, data/tuning/moe_dswiglu_pingpong_h100_20261206/): bitwise (partial sums within
1.7e-7); alone at the library Gluon kernel's speed (Qwen3-30B-A3B 0.598 against 0.605 ms), the whole
op 0.996-1.018x (lab/probes/moe_pingpong_ab.py --dswiglu): not taken. With it, "pingpong coop256":
the module's cooperative 256 x 128 kernel (both warpgroups on one tile, 85 FLOP per L2 operand
byte against 64), compiled for sm_90, not yet run.
Run: PYTHONPATH=src:lab timeout -k 5 240 python3 lab/probes/moe_gluon_dswiglu.py [--smoke] [--sweep] [--wide] [--bm64] [--pingpong] [shape ...]
"""

import dataclasses
import sys

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as M
from swiglu.kernels import moe_gluon_dswiglu as G
from swiglu.kernels.moe_gluon_up import _layout, tile_table
from swiglu_lab.experiments import moe_gluon_dswiglu_gather as DG
from swiglu_lab.experiments import moe_gluon_dswiglu_pingpong as PPD

CONFIGS = {"gluon g1": G.CONFIG, "gluon g8": dataclasses.replace(G.CONFIG, GROUP_M=8)}
# The lab's kernel gathering grad_out's rows itself (cp.async), no copy: its launch is its kernel (and the table).
CONFIGS |= {"gather g1": DG.CONFIG, "gather g8": dataclasses.replace(DG.CONFIG, GROUP_M=8)}
if "--sweep" in sys.argv:  # more stages and orders (each compiled for sm_90 under triton 3.6 without spills before its run)
    CONFIGS |= {
        "gluon s5 g1": dataclasses.replace(G.CONFIG, STAGES=5),
        "gluon s5 g8": dataclasses.replace(G.CONFIG, STAGES=5, GROUP_M=8),
        "gluon s3 g1": dataclasses.replace(G.CONFIG, STAGES=3),
        "gluon g16": dataclasses.replace(G.CONFIG, GROUP_M=16),
    }
if "--bm64" in sys.argv:  # 64-row M tiles (the tl plan's below 128 rows per expert): one MMA warpgroup, or two on N halves
    CONFIGS |= {
        f"gluon bm64 w{w} s{st}": dataclasses.replace(G.CONFIG, BM=64, num_warps=w, STAGES=st) for w in (4, 8) for st in (4, 5)
    }
if "--wide" in sys.argv:  # 128 x 256 tiles: the fp32 handover leaves BK 32 x 4 or 64 x 2 stages; 12 warps so
    # the 8 MMA warps get 168 registers (two epilogue warps: 290 bytes of spills under triton 3.6)
    wide = dataclasses.replace(G.CONFIG, BN=256, BK=32, STAGES=4, EPI_M=8, epi_warps=2, maxnreg=168, epi_regs=168)
    CONFIGS |= {
        "gluon 256 bk32": wide,
        "gluon 256 bk64 s2": dataclasses.replace(wide, BK=64, STAGES=2),
        "gluon 256 bk32 g8": dataclasses.replace(wide, GROUP_M=8),
    }
if "--pingpong" in sys.argv:  # the ping-pong kernel (two MMA warpgroups on alternate tiles) beside the library's
    CONFIGS = {"gluon g1": G.CONFIG, "pingpong g1": PPD.CONFIG, "pingpong g8": dataclasses.replace(PPD.CONFIG, GROUP_M=8)}
    # and its cooperative 256 x 128 form (both warpgroups on one tile: cuBLAS's tile intensity, no cluster)
    CONFIGS |= {"pingpong coop256 g1": PPD.COOP_CONFIG, "pingpong coop256 g8": dataclasses.replace(PPD.COOP_CONFIG, GROUP_M=8)}
rows = []


def operands(H, I, E, k, T, skew=False, drop=None):
    """(grad_out, down_proj, routing, k, weights, gate, up, outputs (dgu, hw, part))."""
    x, idx, w, gu, dp, go = P.inputs(H, I, E, k, T, skew)
    if drop is not None:  # no token routes to expert ``drop``
        idx = torch.where(idx == drop, (idx + 1) % E, idx)
    r = M.Routing(idx.contiguous(), E)
    S = T * k
    gate, up = (torch.randn(S, I, device="cuda").bfloat16() for _ in range(2))
    outs = (
        torch.empty(S, 2 * I, dtype=torch.bfloat16, device="cuda"),
        torch.empty(S, I, dtype=torch.bfloat16, device="cuda"),
        torch.empty(S, I // 128, dtype=torch.float32, device="cuda"),
    )
    return go, dp, r, k, w.contiguous(), gate, up, outs


def compare(outs, want):
    """(d_gate | d_up and h * w bitwise, the partial sums' max relative difference; of each pair's
    total where the tiles' widths differ)."""
    same = torch.equal(outs[0], want[0]) and torch.equal(outs[1], want[1])
    got, ref = (outs[2], want[2]) if outs[2].shape == want[2].shape else (outs[2].sum(1), want[2].sum(1))
    rel = ((got - ref).abs().max() / ref.abs().max()).nan_to_num(float("inf")).item()
    return same, rel


def check(name, go, dp, r, k, w, gate, up, outs, tile, time_it, num_programs=None, repeats=1):
    """The library's kernel, then each Gluon config (``repeats`` launches, each compared: a race
    shows only now and then) and (``time_it``) do_bench ms of the launch and the kernel alone."""
    lib = lambda: M.launch_dswiglu(go, dp, r, k, w, gate, up, *outs, tile)  # noqa: E731
    for o in outs:
        o.fill_(float("nan"))
    lib()
    want = [o.clone() for o in outs]
    lib_ms = P.kernel_ms(lib) if time_it else float("nan")
    rows.append((name, "library (tl)", lib_ms, float("nan"), True, 0.0))
    for label, cfg in CONFIGS.items():
        label += f" x{num_programs}" if num_programs else ""
        o3 = outs  # the partial sums per BN columns of h * w [S, I]: narrower for wider tiles
        if outs[2].shape[1] != outs[1].shape[1] // cfg.BN:
            o3 = (*outs[:2], outs[2].new_empty(outs[1].shape[0], outs[1].shape[1] // cfg.BN))
        if label.startswith("gather"):
            launch = lambda cfg=cfg: DG.launch_moe_dswiglu_gather(go, dp, r, k, w, gate, up, *o3, cfg, num_programs)  # noqa: E731
        elif label.startswith("pingpong"):
            launch = lambda cfg=cfg: PPD.launch_moe_dswiglu_pingpong(
                M.gather_rows(go, r, k), dp, r, w, gate, up, *o3, cfg, num_programs
            )  # noqa: E731
        else:
            launch = lambda cfg=cfg: G.launch_moe_dswiglu_gluon(
                M.gather_rows(go, r, k), dp, r, w, gate, up, *o3, cfg, num_programs
            )  # noqa: E731
        same, rel = True, 0.0
        try:
            for _ in range(repeats):
                for o in o3:
                    o.fill_(float("nan"))
                launch()
                torch.cuda.synchronize()
                s, e = compare(o3, want)
                same, rel = same and s, max(rel, e)
        except Exception as e:
            print(f"{name} {label} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        ms = kernel = float("nan")
        if time_it:
            ms = P.kernel_ms(launch)
            if label.startswith("gather"):
                kernel = ms
            elif label.startswith("pingpong"):  # the copy made beforehand; the tile table with the kernel
                gos = M.gather_rows(go, r, k)
                kernel = P.kernel_ms(lambda cfg=cfg, gos=gos: PPD.launch_moe_dswiglu_pingpong(gos, dp, r, w, gate, up, *o3, cfg))
            else:
                kernel = P.kernel_ms(kernel_only(go, dp, r, k, w, gate, up, o3, cfg))
        rows.append((name, label, ms, kernel, same, rel))
        print(f"{name:12s} {label:14s} {ms:7.3f} ms (kernel {kernel:7.3f})  bitwise={same}  part rel={rel:.2g}", flush=True)


def kernel_only(go, dp, r, k, w, gate, up, outs, cfg=G.CONFIG):
    """The Gluon kernel's launch with the copy of grad_out and the tile table made beforehand."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    E, H, I = dp.shape
    gos, table = M.gather_rows(go, r, k), tile_table(r, cfg.BM)
    gos_desc = TensorDescriptor.from_tensor(gos, [cfg.BM, cfg.BK], _layout((cfg.BM, cfg.BK)))
    dp_desc = TensorDescriptor.from_tensor(dp.view(E * H, I), [cfg.BK, cfg.BN], _layout((cfg.BK, cfg.BN)))
    nprog = torch.cuda.get_device_properties(go.device).multi_processor_count
    args = (gos_desc, dp_desc, table, r.order, w, gate, up, *outs, E, H, I, table.shape[1])
    meta = (cfg.GROUP_M, cfg.STAGES, cfg.EPI_M, cfg.epi_warps, cfg.load_regs, cfg.epi_regs)
    return lambda: G.moe_dswiglu_gluon_kernel[(nprog,)](*args, *meta, num_warps=cfg.num_warps, maxnreg=cfg.maxnreg)


def smoke():
    """Small experts (H = 256, I = 384: three N tiles), skewed routing, expert 3 without rows."""
    E, k, T, H, I = 8, 2, 300, 256, 384
    ops = operands(H, I, E, k, T, skew=True, drop=3)
    start = ops[2].expert_start.tolist()
    assert start[4] == start[3], start
    tile = M.moe_plan(T * k, E, H, I).dswiglu
    # Three programs: each walks many tiles of changing experts; then one program per SM.
    check("smoke", *ops, tile, time_it=False, num_programs=3, repeats=30)
    check("smoke", *ops, tile, time_it=False, repeats=30)


try:
    if "--smoke" in sys.argv:
        smoke()
    else:
        for name in [a for a in sys.argv[1:] if not a.startswith("--")] or ["qwen3-30b", "qwen3-235b", "deepseek-v3", "mixtral"]:
            H, I, E, k = P.SHAPES[name]
            ops = operands(H, I, E, k, 8192)
            check(name, *ops, M.moe_plan(8192 * k, E, H, I).dswiglu, time_it=True)
            del ops
            torch.cuda.empty_cache()
finally:
    print("\nshape        variant          ms      kernel ms  bitwise  part rel")
    for name, label, ms, kernel, same, rel in rows:
        print(f"{name:12s} {label:14s} {ms:7.3f}  {kernel:7.3f}    {same!s:7s}  {rel:.2g}")
