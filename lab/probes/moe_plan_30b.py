"""Which of the plan's untried choices at Qwen3-30B-A3B's hidden_size (2048) moves its forward +
backward: the Gluon dSwiGLU GEMM on a grad_out copy (the plan takes it only from hidden_size 4096),
that copy kept for grad_down_proj too (``share_grad_out_copy``), and the lab's Gluon grad_x kernel
(BN 256: the one shape and role where it won alone, data/tuning/moe_gluon_20261205.log)?

One forward + backward of the kernels (``moe_forward`` + ``moe_backward``) at 8192 tokens, balanced
routing, per variant (do_bench, L2 flushed, the fastest of three medians in rotated orders), the
outputs and gradients against the library plan's (bitwise, or the largest difference over the
largest value), and the peak memory of one forward + backward.
Answer (the H200, data/tuning/moe_h200_20261206/moe_plan_30b.log): all three lose; the library plan's
forward + backward 4.410 ms, the Gluon dSwiGLU 1.019x (within 1.0e-7 of the largest value: its
routing-weight partial sums add in another order), with the copy shared 1.062x (+0.25 GiB peak),
the Gluon grad_x 1.032x (bitwise).
Run: PYTHONPATH=src:lab python3 lab/probes/moe_plan_30b.py [--rep=MS] [--tokens=T]
"""

import dataclasses
import sys

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as kmoe
from swiglu_lab.experiments import moe_gluon_pairs as GP

REP = next((int(a[6:]) for a in sys.argv[1:] if a.startswith("--rep=")), 300)
TOKENS = next((int(a[9:]) for a in sys.argv[1:] if a.startswith("--tokens=")), 8192)

H, I, E, k, S, x, idx, w, gu, dp, go = P.case("qwen3-30b", TOKENS)
base = kmoe.moe_plan(S, E, H, I, kmoe._gluon_here(x.device))
gluon_dswiglu = dataclasses.replace(base, dswiglu=dataclasses.replace(base.dswiglu, GLUON=True))
PLANS = {
    "library": (base, False),
    "gluon dSwiGLU": (gluon_dswiglu, False),
    "gluon dSwiGLU + shared copy": (dataclasses.replace(gluon_dswiglu, share_grad_out_copy=True), False),
    "gluon grad_x (BN 256)": (base, True),
}
library_pairs = kmoe.launch_pairs
pairs_cfg = dataclasses.replace(GP.CONFIG, BN=256, STAGES=3)


def gluon_grad_x(a, w_, r, weights, y, tile, transposed):
    if not transposed and GP.supports(a, w_, y, transposed, pairs_cfg):
        return GP.launch_moe_pairs_gluon(a, w_, r, weights, y, transposed, dataclasses.replace(pairs_cfg, GROUP_M=tile.GROUP_M))
    return library_pairs(a, w_, r, weights, y, tile, transposed)


def step(name):
    plan, pairs = PLANS[name]
    kmoe.launch_pairs = gluon_grad_x if pairs else library_pairs
    try:
        out, gate, up, r = kmoe.moe_forward(x, idx, w, gu, dp, plan)
        return (out, *kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, plan, r))
    finally:
        kmoe.launch_pairs = library_pairs


ref = [t.float().cpu() for t in step("library")]
rows = {}
for name in PLANS:
    got = [t.float().cpu() for t in step(name)]
    same = all(torch.equal(a, b) for a, b in zip(got, ref))
    worst = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, ref))
    del got
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base_mem = torch.cuda.memory_allocated()
    step(name)
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base_mem) / 2**30
    rows[name] = [float("inf"), same, worst, peak]
    print(name, rows[name], flush=True)
names = list(PLANS)
for shift in range(3):
    for name in names[shift:] + names[:shift]:
        rows[name][0] = min(rows[name][0], P.kernel_ms(lambda n=name: step(n), rep=REP))
print(f"\nQwen3-30B-A3B, {TOKENS} tokens, one forward + backward of the kernels")
print("| variant | ms | / library | bitwise | largest diff / largest value | peak GiB over the inputs |")
print("|---|---|---|---|---|---|")
lib = rows["library"][0]
for name, (ms, same, worst, peak) in rows.items():
    print(f"| {name} | {ms:.3f} | {ms / lib:.3f} | {same} | {worst:.1e} | {peak:.2f} |")
