"""Which tiles does each MoE kernel want at full model shapes (H200, 8192 tokens)?

Answer (data/tuning/moe_tiles_sweep_20261204.log): BM 128 for the up/down projections and grad_x,
BN 256 for grad_x and the wide down projection, BM 64 for the epilogue-heavy dSwiGLU GEMM, 128x128x64
weight-gradient tiles; the tiles move the whole forward+backward by ~4% (7.55 -> 7.30 ms at
Qwen3-30B-A3B), level with Liger's fused MoE. Run: PYTHONPATH=src:lab python3 lab/probes/moe_sweep.py
[shape ...] (moe_probe.SHAPES names; default qwen3-30b qwen3-235b; mixtral and deepseek-v3 not swept yet)
"""

import sys
import time
import torch
from triton.testing import do_bench
from swiglu.kernels import moe as M
import moe_probe as P  # beside this file

T0 = time.time()
RUN = sys.argv[1:] or ["qwen3-30b", "qwen3-235b"]


def ms(fn):
    try:
        return do_bench(fn, warmup=5, rep=30)
    except Exception:
        return float("inf")


UP = [(128, 64, 8, 3), (64, 64, 4, 4), (128, 64, 8, 4), (64, 64, 8, 4), (128, 32, 8, 4), (64, 128, 4, 3)]
PAIRS = [(128, 64, 8, 3), (128, 64, 8, 4), (256, 64, 8, 3), (128, 64, 4, 4), (64, 64, 4, 4), (128, 128, 8, 3)]
DSW = [(128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 4), (64, 64, 8, 3), (128, 32, 8, 4), (64, 128, 4, 3)]
# (BN, BK, warps, stages, EPI_SPLIT): wide dSwiGLU tiles with the epilogue in two column pieces
DSW += [(128, 64, 8, 3, 2), (128, 64, 8, 4, 2), (256, 64, 8, 3, 2)]
WG = [
    (128, 128, 64, 8, 3),
    (128, 128, 32, 8, 4),
    (128, 256, 64, 8, 3),
    (256, 128, 64, 8, 3),
    (128, 128, 64, 4, 3),
    (64, 128, 64, 4, 4),
    (128, 128, 64, 8, 4),
]
best_all = {}
for name in RUN:
    H, I, E, k = P.SHAPES[name]
    T = 8192
    S = T * k
    x, idx, w, gu, dp, go = P.inputs(H, I, E, k, T)
    idx = idx.contiguous()
    w = w.contiguous()
    gate = torch.empty(S, I, device="cuda", dtype=torch.bfloat16)
    up = torch.empty_like(gate)
    h = torch.empty_like(gate)
    y = torch.empty(S, H, device="cuda", dtype=torch.bfloat16)
    dgu = torch.empty(S, 2 * I, device="cuda", dtype=torch.bfloat16)
    hw = torch.empty_like(gate)
    ggu = torch.empty_like(gu)
    gdp = torch.empty_like(dp)
    res = {}
    for BM in (64, 128):
        r = M.Routing(idx, E)
        M.launch_up(x, gu, r, k, gate, up, h, M.Tile(128, 64, 8, 3, BM))
        for c in UP:
            res[("up", BM, c)] = ms(lambda: M.launch_up(x, gu, r, k, gate, up, h, M.Tile(*c, BM)))
        for c in PAIRS:
            res[("down", BM, c)] = ms(lambda: M.launch_pairs(h, dp, r, w, y, M.Tile(*c, BM), True))
            res[("grad_x", BM, c)] = ms(lambda: M.launch_pairs(dgu, gu, r, w, y, M.Tile(*c, BM), False))
        for c in DSW:
            part = torch.zeros(S, -(-I // c[0]), device="cuda")
            res[("dswiglu", BM, c)] = ms(
                lambda: M.launch_dswiglu(go, dp, r, k, w, gate, up, dgu, hw, part, M.Tile(*c[:4], BM, *c[4:]))
            )
        print(f"{name} BM={BM} done {time.time() - T0:.0f}s", flush=True)
    for c in WG:
        t = M.Tile(c[1], c[2], c[3], c[4], c[0])
        res[("wgrad_gu", 0, c)] = ms(lambda: M.launch_wgrad(ggu, dgu, x, r, k, False, True, t))
        res[("wgrad_dp", 0, c)] = ms(lambda: M.launch_wgrad(gdp, go, hw, r, k, True, False, t))
    for role in ("up", "down", "grad_x", "dswiglu", "wgrad_gu", "wgrad_dp"):
        rows = sorted((v, bm, c) for (ro, bm, c), v in res.items() if ro == role)
        print(
            f"{name} {role:9s} " + "  ".join(f"{v:.3f}ms BM{bm} {c}" for v, bm, c in rows[:4]) + f"   worst {rows[-1][0]:.3f}",
            flush=True,
        )
        best_all[(name, role)] = rows
    print(f"time {time.time() - T0:.0f}s", flush=True)
# Best plan per shape (BM shared: pick the BM with the lower sum over m-tiled roles)
for name in RUN:
    H, I, E, k = P.SHAPES[name]
    sums = {}
    for BM in (64, 128):
        sums[BM] = sum(min(v for v, bm, c in best_all[(name, ro)] if bm == BM) for ro in ("up", "down", "grad_x", "dswiglu"))
    BM = min(sums, key=sums.get)
    pick = {ro: min((v, c) for v, bm, c in best_all[(name, ro)] if bm == BM)[1] for ro in ("up", "down", "grad_x", "dswiglu")}
    wg = {ro: min(best_all[(name, ro)])[2] for ro in ("wgrad_gu", "wgrad_dp")}
    plan = M.MoEPlan(
        **{ro: M.Tile(*c[:4], BM, *c[4:]) for ro, c in pick.items()},
        **{ro: M.Tile(c[1], c[2], c[3], c[4], c[0]) for ro, c in wg.items()},
    )
    print("PLAN", name, plan, flush=True)
    orig = M.moe_plan
    M.moe_plan = lambda *a, plan=plan: plan
    P.bench(name, 8192)
    M.moe_plan = orig
print(f"total {time.time() - T0:.0f}s")
