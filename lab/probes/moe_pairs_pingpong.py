"""Does the ping-pong down-projection-shaped GEMM (``swiglu_lab.experiments.moe_gluon_pairs_pingpong``:
two MMA warpgroups on alternate tiles, each tile's epilogue under the other's main loop) move the
whole MoE forward + backward, as the forward's down projection, as grad_x's, or both?

Why it might: at Qwen3-30B-A3B, 8192 tokens, these two GEMMs are 1.21 of the 4.26 ms kernel sum
(H100, data/tuning/moe_wgrad_desc_20261206/profile_qwen3-30b.log; 467 and 557 TFLOP/s on the H200),
and their short K (I = 768 in the down projection) leaves each tile's epilogue as long as its MMAs,
as it was for the weight gradients, which the same arrangement took 0.897x (docs/moe.md).
One forward + backward of the kernels (``moe_forward`` + ``moe_backward``) per shape at 8192 tokens,
balanced routing, per variant: the library plan, the ping-pong kernel in the down projection, in
grad_x, in both (``launch_pairs`` routed to it where ``supports`` holds); outputs and gradients
bitwise against the library's; do_bench (L2 flushed), the fastest of three medians in rotated orders.
The kernels alone, bitwise and timed: ``lab/probes/moe_gluon_pairs.py --pingpong`` (``--smoke`` first).
Run: PYTHONPATH=src:lab python3 lab/probes/moe_pairs_pingpong.py [--rep=MS] [shape ...]
"""

import sys

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as kmoe
from swiglu_lab.experiments import moe_gluon_pairs_pingpong as PP

REP = next((int(a[6:]) for a in sys.argv[1:] if a.startswith("--rep=")), 200)
VARIANTS = {"library": (), "pp down": (True,), "pp grad_x": (False,), "pp both": (True, False)}
library_pairs = kmoe.launch_pairs


def routed(roles):
    def launch_pairs(a, w, r, weights, y, tile, transposed):
        if transposed in roles and PP.supports(a, w, y, transposed):
            return PP.launch_moe_pairs_pingpong(a, w, r, weights, y, transposed, PP.Config(GROUP_M=tile.GROUP_M))
        return library_pairs(a, w, r, weights, y, tile, transposed)

    return launch_pairs


rows = []


def run(name):
    H, I, E, k, S, x, idx, w, gu, dp, go = P.case(name)
    plan = kmoe.moe_plan(S, E, H, I, kmoe._gluon_here(x.device))

    def step(variant):
        kmoe.launch_pairs = routed(VARIANTS[variant])
        try:
            out, gate, up, r = kmoe.moe_forward(x, idx, w, gu, dp, plan)
            return (out, *kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, plan, r))
        finally:
            kmoe.launch_pairs = library_pairs

    ref = [t.clone() for t in step("library")]
    res = {}
    for v in VARIANTS:
        got = step(v)
        res[v] = [float("inf"), all(torch.equal(a, b) for a, b in zip(got, ref))]
        del got
        print(name, v, "bitwise", res[v][1], flush=True)
    del ref
    names = list(VARIANTS)
    for shift in range(3):
        for v in names[shift:] + names[:shift]:
            res[v][0] = min(res[v][0], P.kernel_ms(lambda v=v: step(v), rep=REP))
    for v, (ms, same) in res.items():
        rows.append((name, v, ms, ms / res["library"][0], same))
        print(f"{name:12s} {v:12s} {ms:8.3f} ms  {ms / res['library'][0]:.3f}x  bitwise={same}", flush=True)


for name in [a for a in sys.argv[1:] if not a.startswith("--")] or ["qwen3-30b", "qwen3-235b", "deepseek-v3", "mixtral"]:
    run(name)
    torch.cuda.empty_cache()

print("\n| shape | variant | fwd+bwd ms | / library | bitwise |")
print("|---|---|---|---|---|")
for name, v, ms, rel, same in rows:
    print(f"| {name} | {v} | {ms:.3f} | {rel:.3f} | {same} |")
