"""Do the ping-pong forms of the down-projection-shaped GEMM
(``swiglu_lab.experiments.moe_gluon_pairs_pingpong``) and of the dSwiGLU GEMM
(``moe_gluon_dswiglu_pingpong``: two MMA warpgroups on alternate tiles, each tile's epilogue under
the other's main loop) move the whole MoE forward + backward: the forward's down projection,
grad_x's, both, the dSwiGLU GEMM (on a grad_out copy), and that copy shared with grad_down_proj?

Why it might: at Qwen3-30B-A3B, 8192 tokens, these two GEMMs are 1.21 of the 4.26 ms kernel sum
(H100, data/tuning/moe_wgrad_desc_20261206/profile_qwen3-30b.log; 467 and 557 TFLOP/s on the H200),
and their short K (I = 768 in the down projection) leaves each tile's epilogue as long as its MMAs,
as it was for the weight gradients, which the same arrangement took 0.897x (docs/moe.md).
One forward + backward of the kernels (``moe_forward`` + ``moe_backward``) per shape at 8192 tokens,
balanced routing, per variant: the library plan, the pairs kernel in the down projection, in
grad_x, in both (``launch_pairs`` routed to it where ``supports`` holds), the dSwiGLU kernel
(``launch_dswiglu`` routed to it), with the plan's ``share_grad_out_copy`` too; outputs and
gradients against the library's (bitwise; the dSwiGLU kernel's routing-weight partial sums add in
another order: the largest difference over the largest value); do_bench (L2 flushed), the fastest
of three medians in rotated orders. The kernels alone: ``lab/probes/moe_gluon_pairs.py --pingpong``,
``lab/probes/moe_gluon_dswiglu.py --pingpong`` (``--smoke`` first).
Answer (one H100, data/tuning/moe_pairs_pingpong_h100_20261206/, moe_dswiglu_pingpong_h100_20261206/):
neither moves it: the pairs kernel 0.997x at Qwen3-30B-A3B in the down projection, 1.01-1.15x
slower elsewhere; the dSwiGLU kernel 0.996-1.018x (shared copy 0.996-1.069x). Both stay in the lab.
Run: PYTHONPATH=src:lab python3 lab/probes/moe_pingpong_ab.py [--rep=MS] [--dswiglu] [shape ...]
"""

import dataclasses
import sys

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as kmoe
from swiglu_lab.experiments import moe_gluon_dswiglu_pingpong as PPD
from swiglu_lab.experiments import moe_gluon_pairs_pingpong as PP

REP = next((int(a[6:]) for a in sys.argv[1:] if a.startswith("--rep=")), 200)
# variant: (pairs roles on the ping-pong kernel, dSwiGLU on it ("coop": its 256 x 128 form), grad_out's copy shared)
VARIANTS = {
    "library": ((), False, False),
    "pp down": ((True,), False, False),
    "pp grad_x": ((False,), False, False),
    "pp both": ((True, False), False, False),
}
if "--dswiglu" in sys.argv:  # the dSwiGLU kernel's variants only, beside the library and the pairs kernel in the down projection
    VARIANTS = {
        "library": ((), False, False),
        "pp dswiglu": ((), True, False),
        "pp dswiglu shared": ((), True, True),
        "pp dswiglu shared + down": ((True,), True, True),
        "coop256 dswiglu": ((), "coop", False),
        "coop256 dswiglu shared": ((), "coop", True),
    }
library_pairs, library_dswiglu = kmoe.launch_pairs, kmoe.launch_dswiglu


def routed(roles):
    def launch_pairs(a, w, r, weights, y, tile, transposed):
        if transposed in roles and PP.supports(a, w, y, transposed):
            return PP.launch_moe_pairs_pingpong(a, w, r, weights, y, transposed, PP.Config(GROUP_M=tile.GROUP_M))
        return library_pairs(a, w, r, weights, y, tile, transposed)

    return launch_pairs


def dswiglu_with(base):
    def launch(grad_out, down_proj, r, k, weights, gate, up, dgu, hw, part, tile, gos=None, limit=None, alpha=None):
        return dswiglu(grad_out, down_proj, r, k, weights, gate, up, dgu, hw, part, tile, gos, limit, alpha, base)

    return launch


def dswiglu(grad_out, down_proj, r, k, weights, gate, up, dgu, hw, part, tile, gos=None, limit=None, alpha=None, base=PPD.CONFIG):
    if limit is None and alpha is None and PPD.supports(grad_out, down_proj, dgu, part, base):
        gos = kmoe.gather_rows(grad_out, r, k) if gos is None else gos
        cfg = dataclasses.replace(base, GROUP_M=tile.GROUP_M)
        return PPD.launch_moe_dswiglu_pingpong(gos, down_proj, r, weights, gate, up, dgu, hw, part, cfg)
    return library_dswiglu(grad_out, down_proj, r, k, weights, gate, up, dgu, hw, part, tile, gos, limit, alpha)


rows = []


def rel_diff(a, b, chunk=2**26):
    """max |a - b| / max |b| in fp32, a chunk of elements at a time (DeepSeek-V3's weight gradients
    are 15 GB in bf16)."""
    a, b = a.reshape(-1), b.reshape(-1)
    diff = max((a[i : i + chunk].float() - b[i : i + chunk].float()).abs().max().item() for i in range(0, a.numel(), chunk))
    return diff / max(b[i : i + chunk].float().abs().max().item() for i in range(0, b.numel(), chunk))


def run(name):
    H, I, E, k, S, x, idx, w, gu, dp, go = P.case(name)
    plan = kmoe.moe_plan(S, E, H, I, kmoe._gluon_here(x.device))

    def step(variant):
        roles, dsw, share = VARIANTS[variant]
        kmoe.launch_pairs = routed(roles)
        if dsw:
            kmoe.launch_dswiglu = dswiglu_with(PPD.COOP_CONFIG if dsw == "coop" else PPD.CONFIG)
        try:
            p = dataclasses.replace(plan, share_grad_out_copy=True) if share else plan
            out, gate, up, r = kmoe.moe_forward(x, idx, w, gu, dp, p)
            return (out, *kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, p, r))
        finally:
            kmoe.launch_pairs, kmoe.launch_dswiglu = library_pairs, library_dswiglu

    ref = [t.clone() for t in step("library")]
    res = {}
    for v in VARIANTS:
        got = step(v)
        same = all(torch.equal(a, b) for a, b in zip(got, ref))
        worst = max(rel_diff(a, b) for a, b in zip(got, ref))
        res[v] = [float("inf"), same, worst]
        del got
        print(name, v, "bitwise", same, f"largest diff / largest value {worst:.1e}", flush=True)
    del ref
    names = list(VARIANTS)
    for shift in range(3):
        for v in names[shift:] + names[:shift]:
            res[v][0] = min(res[v][0], P.kernel_ms(lambda v=v: step(v), rep=REP))
    for v, (ms, same, worst) in res.items():
        rows.append((name, v, ms, ms / res["library"][0], same, worst))
        print(f"{name:12s} {v:12s} {ms:8.3f} ms  {ms / res['library'][0]:.3f}x  bitwise={same}", flush=True)


for name in [a for a in sys.argv[1:] if not a.startswith("--")] or ["qwen3-30b", "qwen3-235b", "deepseek-v3", "mixtral"]:
    run(name)
    torch.cuda.empty_cache()

print("\n| shape | variant | fwd+bwd ms | / library | bitwise | largest diff / largest value |")
print("|---|---|---|---|---|---|")
for name, v, ms, rel, same, worst in rows:
    print(f"| {name} | {v} | {ms:.3f} | {rel:.3f} | {same} | {worst:.1e} |")
