"""What does ``swiglu_limit`` (DeepSeek-V4's clamped SwiGLU) cost in the MoE op, with the clamp in the
Gluon up and dSwiGLU epilogues against the tl kernels a limited call ran on before?

Answer (an H100, data/tuning/moe_limit_h100_20261205/): the limit costs 0-2.5% over the unlimited
op in a sustained run (0.993-1.025x); the tl kernels with it are 1-5% slower than the Gluon ones
sustained, up to 19% in short runs (Qwen3-235B-A22B); bitwise but the routing-weight gradient. The run times, per shape at 8192
tokens (balanced routing; do_bench, L2 flushed), one forward + backward of the kernels
(``swiglu.kernels.moe.moe_forward`` and ``moe_backward``) three ways: the plan without a limit, the
plan with limit 1.0 (gate and up ~N(0, 1) here: about a quarter of the values clamped), and the
plan with limit 1.0 whose up and dSwiGLU tiles say tl (what a limited call ran before the Gluon
kernels had the clamp); then checks that the last two agree (bitwise but the routing-weight gradient,
whose partial sums add in another order: within 1e-5 of its largest value).
``--alpha=A``: the limited variants also take ``swiglu_alpha`` A (MiniMax-M3's form; with 1.702 on an
H100, data/tuning/moe_alpha_transposed_h100_20261205/: 1.025x / 0.989x the plain op at Qwen3-235B-A22B
/ DeepSeek-V3, the tl kernels 1.047x / 1.017x slower than the Gluon ones, bitwise but the routing-weight gradient).
Run: PYTHONPATH=src:lab python3 lab/probes/moe_limit.py [--rep=MS] [--alpha=A] [shape ...]
(moe_probe.SHAPES names; default all)
"""

import dataclasses
import sys

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as kmoe

LIMIT = 1.0
REP = next((int(a[6:]) for a in sys.argv[1:] if a.startswith("--rep=")), 200)  # ms of timed calls per median
ALPHA = next((float(a[8:]) for a in sys.argv[1:] if a.startswith("--alpha=")), None)


def measure(name: str) -> tuple:
    """(shape, Gluon up, Gluon dSwiGLU, ms without a limit, with it, with it on tl up/dSwiGLU, agree, worst)."""
    H, I, E, k, S, x, idx, w, gu, dp, go = P.case(name, 8192)
    plan = kmoe.moe_plan(S, E, H, I, kmoe._gluon_here(x.device))
    tl_plan = dataclasses.replace(
        plan, up=dataclasses.replace(plan.up, GLUON=False), dswiglu=dataclasses.replace(plan.dswiglu, GLUON=False)
    )

    def step(p, limit):
        alpha = None if limit is None else ALPHA
        out, gate, up, r = kmoe.moe_forward(x, idx, w, gu, dp, p, swiglu_limit=limit, swiglu_alpha=alpha)
        return (out, *kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, p, r, swiglu_limit=limit, swiglu_alpha=alpha))

    plain = step(plan, None)[0]
    want = [t.cpu() for t in step(tl_plan, LIMIT)]  # on the host: two sets of DeepSeek-V3's gradients do not fit 80 GB
    got = step(plan, LIMIT)
    clamped = not torch.equal(got[0], plain)
    same = all(torch.equal(a.cpu(), b) for j, (a, b) in enumerate(zip(got, want)) if j != 2)
    worst = ((got[2].cpu() - want[2]).abs().max() / want[2].abs().max()).item()
    del got, want, plain
    # Timed in the order A B C, then C B A (the clock drifts as the board heats): the faster of each one's two medians.
    variants = ((plan, None), (plan, LIMIT), (tl_plan, LIMIT))
    ms = [float("inf")] * 3
    for order in ((0, 1, 2), (2, 1, 0)):
        for j in order:
            ms[j] = min(ms[j], P.kernel_ms(lambda p=variants[j][0], lim=variants[j][1]: step(p, lim), rep=REP))
    return (name, plan.up.GLUON, plan.dswiglu.GLUON, *ms, same and worst <= 1e-5 and clamped, worst)


rows = []
for name in [a for a in sys.argv[1:] if not a.startswith("--")] or list(P.SHAPES):
    rows.append(measure(name))
    print(rows[-1], flush=True)
    torch.cuda.empty_cache()

print("\n| shape | Gluon up / dSwiGLU | no limit ms | limit ms | limit, tl up/dSwiGLU ms | limit / none | tl / Gluon | agree |")
print("|---|---|---|---|---|---|---|---|")
for name, gu_, gd_, a, b, c, ok, worst in rows:
    print(f"| {name} | {gu_} / {gd_} | {a:.3f} | {b:.3f} | {c:.3f} | {b / a:.3f} | {c / b:.3f} | {ok} ({worst:.1e}) |")
