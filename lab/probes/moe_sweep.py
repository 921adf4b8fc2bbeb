"""Which tiles does each MoE kernel want at full model shapes (H200, 8192 tokens)?

Answer (data/tuning/moe_tiles_sweep_20261204.log): BM 128 for the up/down projections and grad_x,
BN 256 for grad_x and the wide down projection, BM 64 for the epilogue-heavy dSwiGLU GEMM, 128x128x64
weight-gradient tiles; the tiles move the whole forward+backward by ~4% (7.55 -> 7.30 ms at
Qwen3-30B-A3B), level with Liger's fused MoE. Run: PYTHONPATH=src:lab python3 lab/probes/moe_sweep.py
[shape ...] (moe_probe.SHAPES names; default qwen3-30b qwen3-235b; mixtral and deepseek-v3 not swept yet)
"""

import dataclasses
from functools import partial
import sys
import time
import torch
from swiglu.kernels import moe as M
import moe_probe as P  # beside this file

T0 = time.time()
RUN = [a for a in sys.argv[1:] if not a.startswith("--")] or ["qwen3-30b", "qwen3-235b"]
# --roles=wgrad_gu,wgrad_dp,dswiglu: sweep only these (the others keep moe_plan's tiles); --no-bench
ROLES = next((a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--roles=")), None)
BENCH = "--no-bench" not in sys.argv
ms = partial(P.kernel_ms, rep=30, quiet=True)


UP = [(128, 64, 8, 3), (64, 64, 4, 4), (128, 64, 8, 4), (64, 64, 8, 4), (128, 32, 8, 4), (64, 128, 4, 3)]
PAIRS = [(128, 64, 8, 3), (128, 64, 8, 4), (256, 64, 8, 3), (128, 64, 4, 4), (64, 64, 4, 4), (128, 128, 8, 3)]
DSW = [(128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 4), (64, 64, 8, 3), (128, 32, 8, 4), (64, 128, 4, 3)]
# (BN, BK, warps, stages, EPI_SPLIT): wide dSwiGLU tiles with the epilogue in two column pieces
DSW += [(128, 64, 8, 3, 2), (128, 64, 8, 4, 2), (256, 64, 8, 3, 2)]
# (BM, BN, BK, warps, stages)
WG = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4)]
best_all = {}
for name in RUN:
    H, I, E, k, S, x, idx, w, gu, dp, go = P.case(name)
    gate = torch.empty(S, I, device="cuda", dtype=torch.bfloat16)
    up = torch.empty_like(gate)
    h = torch.empty_like(gate)
    y = torch.empty(S, H, device="cuda", dtype=torch.bfloat16)
    dgu = torch.empty(S, 2 * I, device="cuda", dtype=torch.bfloat16)
    hw = torch.empty_like(gate)
    ggu = torch.empty_like(gu)
    gdp = torch.empty_like(dp)
    res = {}
    want = lambda role: ROLES is None or role in ROLES  # noqa: E731
    for BM in (64, 128):
        r = M.Routing(idx, E)
        M.launch_up(x, gu, r, k, gate, up, h, M.Tile(128, 64, 8, 3, BM))
        for c in UP if want("up") else []:
            res[("up", BM, c)] = ms(lambda: M.launch_up(x, gu, r, k, gate, up, h, M.Tile(*c, BM)))
        for c in PAIRS:
            if want("down"):
                res[("down", BM, c)] = ms(lambda: M.launch_pairs(h, dp, r, w, y, M.Tile(*c, BM), True))
            if want("grad_x"):
                res[("grad_x", BM, c)] = ms(lambda: M.launch_pairs(dgu, gu, r, w, y, M.Tile(*c, BM), False))
        for c in DSW if want("dswiglu") else []:
            part = torch.zeros(S, -(-I // c[0]), device="cuda")
            res[("dswiglu", BM, c)] = ms(
                lambda: M.launch_dswiglu(go, dp, r, k, w, gate, up, dgu, hw, part, M.Tile(*c[:4], BM, *c[4:]))
            )
        print(f"{name} BM={BM} done {time.time() - T0:.0f}s", flush=True)
    # TMA for the weights (and the down projections' A) against pointer loads, at moe_plan's tiles
    base = M.moe_plan(S, E, H, I)
    r = M.Routing(idx, E)
    part = torch.zeros(S, -(-I // base.dswiglu.BN), device="cuda")
    runs = {
        "up": lambda t: M.launch_up(x, gu, r, k, gate, up, h, t),
        "down": lambda t: M.launch_pairs(h, dp, r, w, y, t, True),
        "grad_x": lambda t: M.launch_pairs(dgu, gu, r, w, y, t, False),
        "dswiglu": lambda t: M.launch_dswiglu(go, dp, r, k, w, gate, up, dgu, hw, part, t),
    }
    for role, fn in runs.items():
        t = getattr(base, role)
        got = {(a, b): ms(lambda: fn(dataclasses.replace(t, TMA_A=a, TMA_B=b))) for a in (True, False) for b in (True, False)}
        print(f"{name} {role:9s} TMA (A, B): " + "  ".join(f"{ab} {v:.3f}" for ab, v in got.items()) + f" ms ({t})", flush=True)
    xs, gos = M.gather_rows(x, r, k), M.gather_rows(go, r, k)  # the weight gradients' operands
    for c in WG:
        t = M.Tile(c[1], c[2], c[3], c[4], c[0])
        if want("wgrad_gu"):
            res[("wgrad_gu", 0, c)] = ms(lambda: M.launch_wgrad(ggu, dgu, xs, r, t))
        if want("wgrad_dp"):
            res[("wgrad_dp", 0, c)] = ms(lambda: M.launch_wgrad(gdp, gos, hw, r, t))
    for role in ("up", "down", "grad_x", "dswiglu", "wgrad_gu", "wgrad_dp"):
        rows = sorted((v, bm, c) for (ro, bm, c), v in res.items() if ro == role)
        if not rows:
            continue
        print(
            f"{name} {role:9s} " + "  ".join(f"{v:.3f}ms BM{bm} {c}" for v, bm, c in rows[:4]) + f"   worst {rows[-1][0]:.3f}",
            flush=True,
        )
        best_all[(name, role)] = rows
    print(f"time {time.time() - T0:.0f}s", flush=True)
# Best plan per shape (BM shared: pick the BM with the lower sum over m-tiled roles); roles not swept keep moe_plan's
for name in RUN if BENCH else []:
    H, I, E, k = P.SHAPES[name]
    base = M.moe_plan(8192 * k, E, H, I)
    grouped = [ro for ro in ("up", "down", "grad_x", "dswiglu") if (name, ro) in best_all]
    tiles = {}
    if grouped:
        sums = {}
        for BM in (64, 128):
            sums[BM] = sum(min(v for v, bm, c in best_all[(name, ro)] if bm == BM) for ro in grouped)
        BM = min(sums, key=sums.get)
        for ro in grouped:
            c = min((v, c) for v, bm, c in best_all[(name, ro)] if bm == BM)[1]
            tiles[ro] = M.Tile(*c[:4], BM, *c[4:])
    for ro in ("wgrad_gu", "wgrad_dp"):
        if (name, ro) in best_all:
            c = min(best_all[(name, ro)])[2]
            tiles[ro] = M.Tile(c[1], c[2], c[3], c[4], c[0])
    plan = dataclasses.replace(base, **tiles)
    print("PLAN", name, plan, flush=True)
    orig = M.moe_plan
    M.moe_plan = lambda *a, plan=plan: plan
    P.bench(name, 8192)
    M.moe_plan = orig
print(f"total {time.time() - T0:.0f}s")
