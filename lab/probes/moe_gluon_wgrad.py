"""Is the warp-specialized Gluon weight gradient over all experts
(now the lab's ``swiglu_lab.experiments.moe_gluon_wgrad_cooperative``) right, and faster than the tl kernel
(``swiglu.kernels.moe.launch_wgrad``, one program per tile)?

Why it might be: at Qwen3-30B-A3B, 8192 tokens, the two weight gradients take 1.40 of the 4.38 ms
forward+backward at ~440 TFLOP/s (docs/moe.md); each tile's K is only an expert's ~512 rows, so
its store is a large part of its time, and the Gluon kernel's storer warp overlaps it with the
next tiles' MMAs (the dense backward's choice at K <= 2048).
Answer: bitwise everywhere; faster at hidden_size >= 4096 (1.07-1.24x: Qwen3-235B-A22B 3.20 vs 3.55 ms
and 1.65 vs 2.00, Mixtral 5.87 vs 6.29 and 2.95 vs 3.17), a tie or slower at Qwen3-30B-A3B (0.899 vs
0.893, 0.519 vs 0.466): data/tuning/moe_gluon_20261205.log; the plan took it at H >= 4096.
Then: does the dense table's ping-pong tile at K = 129-2048 (two warpgroups on alternate 128 x 192
tiles, each storing its own; ``swiglu.kernels.moe_gluon_wgrad_pingpong``) beat both at
~256-512 rows per expert, and does its form that gathers x's / grad_out's rows itself ("pingpong
gather", timed without the copy the others read) save the copy? Answer (one H100, bitwise
everywhere): ping-pong k64 is the fastest at Mixtral-8x7B (5.57 vs Gluon 6.09, tl 7.25 ms; 2.61 vs
2.77) and Qwen3-235B-A22B's grad_down_proj (1.73 vs 1.76); the gathering form is within 0.04-0.06 ms of
the copy-fed kernels at 256-512 rows per expert (so it saves the copy there: 30B 1.02 vs tl 0.95 plus
x's copy) and 1.17 ms slower at Mixtral's 2048: data/tuning/moe_gluon_pingpong_gather_20261205.log;
the plan takes the ping-pong kernel at every shape, gathering at up to 1024 rows per expert.
``--smoke``: one small case (skewed routing, an expert with no rows, experts whose rows end inside
a K box) against the library's kernel and float64, then exits; run it first under a timeout (a
fault in the barriers hangs). Otherwise: each weight gradient at 8192 tokens per shape
(moe_probe.SHAPES), the library's kernel and the Gluon kernel's configs, NaN-poisoned outputs,
bitwise against the library's, do_bench times (L2 flushed); a table last.
Run: PYTHONPATH=src:lab timeout -k 5 240 python3 lab/probes/moe_gluon_wgrad.py [--smoke] [shape ...]
"""

import dataclasses
import sys

import torch
import triton

import moe_probe as P  # beside this file
from swiglu.kernels import moe as M
from swiglu_lab.experiments import moe_gluon_wgrad_cooperative as G
from swiglu.kernels import moe_gluon_wgrad_pingpong as PP

# Device-side descriptors take their memory from this allocator.
triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
CONFIGS = {
    "gluon s4 nc2 g8": G.CONFIG,
    "gluon s3 nc1 g8": dataclasses.replace(G.CONFIG, STAGES=3, NC=1),
    "gluon s4 nc2 g1": dataclasses.replace(G.CONFIG, GROUP_M=1),
    # The lab's ping-pong 128 x 192 tile (the dense table's at K = 129-2048), 64- and 32-deep k-steps.
    "pingpong k64 s4 g8": PP.CONFIG,
    "pingpong k32 s8 g8": dataclasses.replace(PP.CONFIG, BK=32, STAGES=8),
    # ... gathering x's (grad_gate_up_proj) or grad_out's (grad_down_proj) rows itself: no copy.
    "pingpong gather": PP.GATHER_CONFIG,
}
if "--sweep" in sys.argv:  # more stages and orders (each compiled for sm_90 under triton 3.6 without spills before its run)
    CONFIGS |= {
        "gluon s5 nc2 g8": dataclasses.replace(G.CONFIG, STAGES=5),
        "gluon s6 nc1 g8": dataclasses.replace(G.CONFIG, STAGES=6, NC=1),
        "gluon s4 nc2 g16": dataclasses.replace(G.CONFIG, GROUP_M=16),
        "gluon s4 nc2 g4": dataclasses.replace(G.CONFIG, GROUP_M=4),
    }
rows = []
GATHERED = {}  # role -> (a, b) with TokenRows in place of the copy (``operands``)


def operands(H, I, E, k, T, skew=False, drop=None):
    """(r, pairs) : the routing and, per weight gradient, (c, a, b) as the backward passes them."""
    x, idx, w, gu, dp, go = P.inputs(H, I, E, k, T, skew)
    if drop is not None:  # no token routes to expert ``drop``
        idx = torch.where(idx == drop, (idx + 1) % E, idx)
    idx = idx.contiguous()
    r = M.Routing(idx, E)
    S = T * k
    dgu = torch.randn(S, 2 * I, device="cuda").to(torch.bfloat16)
    hw = torch.randn(S, I, device="cuda").to(torch.bfloat16)
    xs, gos = M.gather_rows(x, r, k), M.gather_rows(go, r, k)
    # The gathering kernel's operands: the copied one given as TokenRows (its source and top-k).
    GATHERED.update({"wgrad_gu": (dgu, M.TokenRows(x, k)), "wgrad_dp": (M.TokenRows(go, k), hw)})
    return r, {"wgrad_gu": (torch.empty_like(gu), dgu, xs), "wgrad_dp": (torch.empty_like(dp), gos, hw)}


def check(name, r, role, c, a, b, tile, time_it, num_programs=None, repeats=1):
    """The library's kernel, then each Gluon config: bitwise against it (``repeats`` launches,
    each output compared: a race shows only now and then), max |difference| and (``time_it``)
    do_bench ms, the output compared again after the timed launches; ``num_programs`` persistent
    programs (None: one per SM)."""
    c.fill_(float("nan"))
    M.launch_wgrad(c, a, b, r, tile)
    want = c.clone()
    lib_ms = P.kernel_ms(lambda: M.launch_wgrad(c, a, b, r, tile)) if time_it else float("nan")
    rows.append((name, role, "library (tl)", lib_ms, True, 0.0))
    for label, cfg in CONFIGS.items():
        label += f" x{num_programs}" if num_programs else ""
        if label.startswith("pingpong gather"):
            ga, gb = GATHERED[role]
            launch = lambda cfg=cfg, ga=ga, gb=gb: PP.launch_moe_wgrad_gather(c, ga, gb, r, cfg, num_programs)  # noqa: E731
        else:
            launcher = PP.launch_moe_wgrad_pingpong if cfg.pingpong else G.launch_moe_wgrad_gluon
            launch = lambda cfg=cfg, f=launcher: f(c, a, b, r.expert_start, cfg, num_programs)  # noqa: E731
        same, diff = True, 0.0
        try:
            for _ in range(repeats):
                c.fill_(float("nan"))
                launch()
                torch.cuda.synchronize()
                same &= torch.equal(c, want)
                diff = max(diff, (c.float() - want.float()).abs().nan_to_num(float("inf")).max().item())
        except Exception as e:
            print(f"{name} {role} {label} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        ms = float("nan")
        if time_it:
            ms = P.kernel_ms(launch)
            same &= torch.equal(c, want)  # the last timed launch's output
        rows.append((name, role, label, ms, same, diff))
        print(f"{name:12s} {role:8s} {label:18s} {ms:7.3f} ms  bitwise={same}  max|diff|={diff:.3g}", flush=True)


def smoke():
    """Small experts (M = 768 and 256, multiples of BM), skewed routing, expert 3 without rows;
    also against float64 per expert."""
    E, k, T, H, I = 8, 2, 300, 256, 384
    r, pairs = operands(H, I, E, k, T, skew=True, drop=3)
    start = r.expert_start.tolist()
    assert start[4] == start[3], start
    for role, (c, a, b) in pairs.items():
        # Three programs: each walks many tiles of changing experts (its loader rewrites the
        # descriptor slots while earlier loads are in flight); then one program per SM.
        tile = M.moe_plan(T * k, E, H, I).wgrad_gu
        check("smoke", r, role, c, a, b, tile, time_it=False, num_programs=3, repeats=30)
        check("smoke", r, role, c, a, b, tile, time_it=False, repeats=30)
        worst = 0.0
        for e in range(E):
            lo, hi = start[e], start[e + 1]
            ref = a[lo:hi].double().T @ b[lo:hi].double()
            worst = max(
                worst, ((c[e].double() - ref).norm() / ref.norm().clamp_min(1e-30)).item() if hi > lo else c[e].abs().max().item()
            )
        print(f"smoke {role}: worst relative error per expert against float64 {worst:.3g} (bf16 rounding ~2e-3)", flush=True)


try:
    if "--smoke" in sys.argv:
        smoke()
    else:
        for name in [a for a in sys.argv[1:] if not a.startswith("--")] or ["qwen3-30b", "qwen3-235b", "deepseek-v3", "mixtral"]:
            H, I, E, k = P.SHAPES[name]
            r, pairs = operands(H, I, E, k, 8192)
            plan = M.moe_plan(8192 * k, E, H, I)
            for role, (c, a, b) in pairs.items():
                check(name, r, role, c, a, b, getattr(plan, role), time_it=True)
            del r, pairs
            torch.cuda.empty_cache()
finally:
    print("\nshape        kernel   variant            ms       bitwise  max|diff|")
    for name, role, label, ms, same, diff in rows:
        print(f"{name:12s} {role:8s} {label:18s} {ms:7.3f}  {same!s:7s}  {diff:.3g}")
