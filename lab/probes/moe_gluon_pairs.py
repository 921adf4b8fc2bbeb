"""Is the warp-specialized Gluon down-projection-shaped GEMM over all experts
(``swiglu_lab.experiments.moe_gluon_pairs``: the forward's down projection and grad_x's pieces)
right, and faster than the library's tl kernel (``swiglu.kernels.moe.launch_pairs``)?

Why it might be: at Qwen3-30B-A3B, 8192 tokens, these two GEMMs took 1.18 of the 4.49 ms kernel
sum (~350 TFLOP/s; docs/moe.md): their K is short (I = 768 for the down projection), so each tile's
epilogue (the routing weight, BM scattered rows of y) is a large part of it. The Gluon kernel runs
the epilogue in its own warps under the next tile's MMAs.
Answer: bitwise; slower than the tl kernels at every shape but Qwen3-30B-A3B's grad_x at BN 256
(0.697 vs 0.740 ms): data/tuning/moe_gluon_20261205.log; it stays in the lab.
``--smoke``: one small case (skewed routing, an expert with no rows, experts whose rows end inside
an M tile), both GEMMs, against the library's kernel, then exits; run it first under a timeout (a
fault in the barriers hangs). Otherwise: both GEMMs at 8192 tokens per shape (moe_probe.SHAPES),
the library's kernel and the Gluon launch at BN 128 and 256 (N tiles fastest and in bands of 8),
NaN-poisoned outputs, bitwise against the library's, do_bench times (L2 flushed); a table last.
``--pingpong``: the lab's ping-pong form (``swiglu_lab.experiments.moe_gluon_pairs_pingpong``: two
MMA warpgroups on alternate tiles, each epilogue under the other's main loop) alone beside the
library's kernel. Answer (one H100, data/tuning/moe_pairs_pingpong_h100_20261206/): bitwise; faster
only at Qwen3-30B-A3B's down projection (0.410 against 0.468 ms), 0.97-1.25x at the larger shapes
in bands of 8 M tiles; in the whole op (lab/probes/moe_pingpong_ab.py) 0.997x at 30B: not taken.
Run: PYTHONPATH=src:lab timeout -k 5 240 python3 lab/probes/moe_gluon_pairs.py [--smoke] [--pingpong] [shape ...]
"""

import dataclasses
import sys

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as M
from swiglu_lab.experiments import moe_gluon_pairs as G
from swiglu_lab.experiments import moe_gluon_pairs_pingpong as PP

CONFIGS = {
    "gluon 128 g1": G.CONFIG,
    "gluon 128 g8": dataclasses.replace(G.CONFIG, GROUP_M=8),
    "gluon 256 g1": dataclasses.replace(G.CONFIG, BN=256, STAGES=3),
    "pingpong 128 g1": PP.CONFIG,
    "pingpong 128 g8": dataclasses.replace(PP.CONFIG, GROUP_M=8),
}
if "--pingpong" in sys.argv:  # the ping-pong kernel alone beside the library's
    CONFIGS = {k: v for k, v in CONFIGS.items() if k.startswith("pingpong")}
rows = []


def operands(H, I, E, k, T, skew=False, drop=None):
    """(routing, weights, {"down": (a, w, y, True), "grad_x": (a, w, y, False)}) as the forward
    and the backward pass them: h [S, I] @ down_proj[e].T, d_gate | d_up [S, 2I] @ gate_up_proj[e]."""
    x, idx, w, gu, dp, go = P.inputs(H, I, E, k, T, skew)
    if drop is not None:  # no token routes to expert ``drop``
        idx = torch.where(idx == drop, (idx + 1) % E, idx)
    r = M.Routing(idx.contiguous(), E)
    S = T * k
    h = torch.randn(S, I, device="cuda").bfloat16()
    dgu = torch.randn(S, 2 * I, device="cuda").bfloat16()
    y = torch.empty(S, H, dtype=torch.bfloat16, device="cuda")
    return r, w.contiguous(), {"down": (h, dp, y, True), "grad_x": (dgu, gu, y, False)}


def check(name, r, weights, role, a, w, y, tile, time_it, num_programs=None, repeats=1):
    """The library's kernel, then each Gluon config: bitwise against it (``repeats`` launches,
    each compared: a race shows only now and then) and (``time_it``) do_bench ms."""
    y.fill_(float("nan"))
    M.launch_pairs(a, w, r, weights, y, tile, transposed=role == "down")
    want = y.clone()
    lib_ms = (
        P.kernel_ms(lambda: M.launch_pairs(a, w, r, weights, y, tile, transposed=role == "down")) if time_it else float("nan")
    )
    rows.append((name, role, "library (tl)", lib_ms, True))
    for label, cfg in CONFIGS.items():
        if w.shape[1 if role == "down" else 2] % cfg.BN:
            continue
        label += f" x{num_programs}" if num_programs else ""
        fn = PP.launch_moe_pairs_pingpong if isinstance(cfg, PP.Config) else G.launch_moe_pairs_gluon
        launch = lambda cfg=cfg, fn=fn: fn(a, w, r, weights, y, role == "down", cfg, num_programs)  # noqa: E731
        same = True
        try:
            for _ in range(repeats):
                y.fill_(float("nan"))
                launch()
                torch.cuda.synchronize()
                same &= torch.equal(y, want)
        except Exception as e:
            print(f"{name} {role} {label} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        ms = float("nan")
        if time_it:
            ms = P.kernel_ms(launch)
            same &= torch.equal(y, want)
        rows.append((name, role, label, ms, same))
        print(f"{name:12s} {role:7s} {label:16s} {ms:7.3f} ms  bitwise={same}", flush=True)


def smoke():
    """Small experts (H = 256, I = 384), skewed routing, expert 3 without rows; both GEMMs."""
    E, k, T, H, I = 8, 2, 300, 256, 384
    r, weights, pairs = operands(H, I, E, k, T, skew=True, drop=3)
    start = r.expert_start.tolist()
    assert start[4] == start[3], start
    plan = M.moe_plan(T * k, E, H, I)
    for role, ops in pairs.items():
        # Three programs: each walks many tiles of changing experts; then one program per SM.
        tile = plan.down if role == "down" else plan.grad_x
        check("smoke", r, weights, role, *ops[:3], tile, time_it=False, num_programs=3, repeats=30)
        check("smoke", r, weights, role, *ops[:3], tile, time_it=False, repeats=30)


try:
    if "--smoke" in sys.argv:
        smoke()
    else:
        for name in [a for a in sys.argv[1:] if not a.startswith("--")] or ["qwen3-30b", "qwen3-235b", "deepseek-v3", "mixtral"]:
            H, I, E, k = P.SHAPES[name]
            r, weights, pairs = operands(H, I, E, k, 8192)
            plan = M.moe_plan(8192 * k, E, H, I)
            for role, ops in pairs.items():
                check(name, r, weights, role, *ops[:3], plan.down if role == "down" else plan.grad_x, time_it=True)
            del r, pairs
            torch.cuda.empty_cache()
finally:
    print("\nshape        GEMM    variant          ms       bitwise")
    for name, role, label, ms, same in rows:
        print(f"{name:12s} {role:7s} {label:16s} {ms:7.3f}  {same}")
