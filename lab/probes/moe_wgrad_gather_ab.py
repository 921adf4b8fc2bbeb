"""Does the ping-pong weight gradient's gathering form (x's rows gathered by cp.async loader warps,
``GATHER_MAX_ROWS``) beat the copy-fed form (x's rows copied to expert order, TMA boxes) in the
whole backward at each shape, 8192 tokens?

The backward (``swiglu.kernels.moe.moe_backward``, balanced routing, do_bench with L2 flushed, the
faster of two medians timed A B then B A) with the library's threshold and with
``GATHER_MAX_ROWS = 0`` (every weight gradient copy-fed); the gradients compared bitwise.
Answer (an H100, data/tuning/moe_half_tiles_h100_20261206/moe_wgrad_gather_ab.log): the library's
threshold is the faster at all three shapes, bitwise the copy-fed form: the backward 3.125 against
3.299 ms at Qwen3-30B-A3B (copy-fed 1.056x), 10.44 against 10.56 at Qwen3-235B-A22B (1.012x), 29.11
against 29.27 at DeepSeek-V3 (1.005x).
Run: PYTHONPATH=src:lab python3 lab/probes/moe_wgrad_gather_ab.py [--rep=MS] [shape ...]
"""

import sys

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as kmoe

REP = next((int(a[6:]) for a in sys.argv[1:] if a.startswith("--rep=")), 300)


def measure(name: str) -> tuple:
    H, I, E, k, S, x, idx, w, gu, dp, go = P.case(name, 8192)
    plan = kmoe.moe_plan(S, E, H, I, kmoe._gluon_here(x.device))
    out, gate, up, r = kmoe.moe_forward(x, idx, w, gu, dp, plan)
    wg = kmoe._gluon().wgrad
    default = wg.GATHER_MAX_ROWS

    def backward(limit):
        wg.GATHER_MAX_ROWS = limit
        try:
            return kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, plan, r)
        finally:
            wg.GATHER_MAX_ROWS = default

    a = [t.cpu() for t in backward(default)]
    same = all(torch.equal(t.cpu(), b) for t, b in zip(backward(0), a))
    del a
    ms = [float("inf")] * 2
    for order in ((0, 1), (1, 0)):
        for j in order:
            ms[j] = min(ms[j], P.kernel_ms(lambda lim=(default, 0)[j]: backward(lim), rep=REP))
    return name, S // E, *ms, same


rows = []
for name in [a for a in sys.argv[1:] if not a.startswith("--")] or ["qwen3-30b", "qwen3-235b", "deepseek-v3"]:
    rows.append(measure(name))
    print(rows[-1], flush=True)
    torch.cuda.empty_cache()
print("\n| shape | rows per expert | backward, library ms | backward, copy-fed ms | copy / library | bitwise |")
print("|---|---|---|---|---|---|")
for name, rpe, a, b, same in rows:
    print(f"| {name} | {rpe} | {a:.3f} | {b:.3f} | {b / a:.3f} | {same} |")
