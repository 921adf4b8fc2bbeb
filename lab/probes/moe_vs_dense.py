"""Is the MoE backward at Mixtral-8x7B's experts (8 experts of H 4096, I 14336, top-2) within 10% of
the dense backward's TFLOP/s at the same sizes?

Answer: 87% (620 against 716 TFLOP/s, data/tuning/moe_vs_dense_20261205.log, with the Gluon kernels;
78% before them, data/tuning/moe_vs_dense_20261204.log). The run times, in one process (do_bench, L2 flushed), the backward of
``swiglu_moe`` at 8192 tokens (16,384 routed rows, ~2048 per expert) and the dense
``swiglu_mlp_backward`` (ours and the reference's cuBLAS GEMMs) at 2048 tokens (one expert's rows)
and 8192 tokens (the same token count), each as 12 * rows * H * I FLOPs per time.
Run: PYTHONPATH=src:lab python3 lab/probes/moe_vs_dense.py [shape] (moe_probe.SHAPES names;
default mixtral)
"""

import sys

import torch

import moe_probe as P  # beside this file
import swiglu
from swiglu.roofline import flops

NAME = sys.argv[1] if len(sys.argv) > 1 else "mixtral"
H, I, E, k = P.SHAPES[NAME]
rows = []


def moe_backward_ms(T: int) -> tuple[int, float]:
    """(routed rows, ms) of the MoE backward at T tokens (balanced routing)."""
    _, _, _, _, S, x, idx, w, gu, dp, go = P.case(NAME, T)
    leaves = [t.clone().requires_grad_() for t in (x, w, gu, dp)]
    out = swiglu.swiglu_moe(leaves[0], idx, *leaves[1:], impl="triton")
    return S, P.kernel_ms(lambda: torch.autograd.grad(out, leaves, go, retain_graph=True))


S, ms = moe_backward_ms(8192)
rows.append((f"MoE backward, {S} routed rows", ms, flops(S, H, I) / ms / 1e9))
torch.cuda.empty_cache()

# The dense backward at one expert's rows and at the token count.
gen = torch.Generator(device=P.dev).manual_seed(0)
for T in (S // E, 8192):
    x = torch.randn(T, H, device=P.dev, generator=gen).to(torch.bfloat16)
    wg, wu = (torch.randn(I, H, device=P.dev, generator=gen).mul(H**-0.5).to(torch.bfloat16) for _ in range(2))
    wd = torch.randn(H, I, device=P.dev, generator=gen).mul(I**-0.5).to(torch.bfloat16)
    gate, up = x @ wg.T, x @ wu.T
    act = torch.nn.functional.silu(gate)
    go = torch.randn(T, H, device=P.dev, generator=gen).to(torch.bfloat16)
    args = (go, x, gate, up, act, wg, wu, wd)
    for impl in ("triton", "reference"):
        ms = P.kernel_ms(lambda: swiglu.swiglu_mlp_backward(*args, impl=impl))
        rows.append((f"dense backward, {T} tokens, {impl}", ms, flops(T, H, I) / ms / 1e9))

print(f"\n{NAME}: H {H}, I {I}, {E} experts, top-{k}")
for label, ms, tf in rows:
    print(f"{label:44s} {ms:8.3f} ms  {tf:6.0f} TFLOP/s")
