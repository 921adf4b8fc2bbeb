"""What do transposed expert weights (Aria's layout: gate_up_proj stored [E, H, 2I], down_proj
[E, I, H], passed to the op as their ``mT``) cost against the op's own layout?

With the transposed layout the down projection and grad_x read B in its other form and the weight
gradients are written as the transposed product (contiguous, TMA and the Gluon kernel as before);
the up projection and dSwiGLU run on the tl kernels, reading TMA boxes of the weights' own memory. The run
times, per shape at 8192 tokens (balanced routing; do_bench, L2 flushed), one forward + backward of
the kernels (``swiglu.kernels.moe.moe_forward`` and ``moe_backward``) with each layout, and
transformers' grouped_mm on the transposed layout (Aria's own path), then compares the two layouts'
outputs and gradients (largest difference over the largest value).
Answer (an H100, data/tuning/moe_gptoss_tiles_h100_20261206/): 1.039x the own layout's time at
Qwen3-30B-A3B (bitwise) and 1.086x at Qwen3-235B-A22B (within 1.3e-7 of the largest value); still
2.38x and 1.66x faster than transformers' grouped_mm on the same transposed weights. With pointer
loads in the up and dSwiGLU GEMMs (data/tuning/moe_alpha_transposed_h100_20261205/): 1.047x and 1.068x.
Run: PYTHONPATH=src:lab python3 lab/probes/moe_transposed.py [--rep=MS] [shape ...] (moe_probe.SHAPES
names; default all but DeepSeek-V3, whose two layouts' weights and gradients do not fit 80 GB)
"""

import sys

import torch
from transformers.integrations import moe as tmoe

import moe_probe as P  # beside this file
from swiglu.kernels import moe as kmoe

REP = next((int(a[6:]) for a in sys.argv[1:] if a.startswith("--rep=")), 200)  # ms of timed calls per median


def measure(name: str) -> tuple:
    """(shape, ms own layout, ms transposed, ms grouped_mm transposed, worst relative difference)."""
    H, I, E, k, S, x, idx, w, gu, dp, go = P.case(name, 8192)
    gu_t, dp_t = gu.mT.contiguous().mT, dp.mT.contiguous().mT  # same values, transposed memory
    plan = kmoe.moe_plan(S, E, H, I, kmoe._gluon_here(x.device))

    def step(g, d):
        out, gate, up, r = kmoe.moe_forward(x, idx, w, g, d, plan)
        return (out, *kmoe.moe_backward(go, x, idx, w, g, d, gate, up, plan, r))

    own = [t.cpu() for t in step(gu, dp)]
    got = step(gu_t, dp_t)
    assert got[3].stride() == gu_t.stride() and got[4].stride() == dp_t.stride()
    worst = max(((a.cpu().float() - b.float()).abs().max() / b.float().abs().max()).item() for a, b in zip(got, own))
    del got, own
    # Aria's module: [E, H, 2I] and [E, I, H] parameters
    stand = P.Stand(gu_t.mT.detach().requires_grad_(), dp_t.mT.detach().requires_grad_())
    stand.is_transposed = True
    xs = x.clone().requires_grad_()

    def grouped():
        out = tmoe.grouped_mm_experts_forward(stand, xs, idx, w)
        return torch.autograd.grad(out, (xs, stand.gate_up_proj, stand.down_proj), go)

    variants = (lambda: step(gu, dp), lambda: step(gu_t, dp_t), grouped)
    ms = [float("inf")] * 3
    for order in ((0, 1, 2), (2, 1, 0)):  # the faster of two medians, timed A B C then C B A
        for j in order:
            ms[j] = min(ms[j], P.kernel_ms(variants[j], rep=REP))
    return (name, *ms, worst)


rows = []
for name in [a for a in sys.argv[1:] if not a.startswith("--")] or [s for s in P.SHAPES if s != "deepseek-v3"]:
    rows.append(measure(name))
    print(rows[-1], flush=True)
    torch.cuda.empty_cache()

print("\n| shape | own layout ms | transposed ms | transposed / own | grouped_mm transposed ms | worst rel. diff |")
print("|---|---|---|---|---|---|")
for name, a, b, c, worst in rows:
    print(f"| {name} | {a:.3f} | {b:.3f} | {b / a:.3f} | {c:.3f} | {worst:.1e} |")
