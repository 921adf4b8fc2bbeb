"""Where does one MoE forward+backward's GPU time go, kernel by kernel, and did a change keep the bits?

``swiglu_moe(..., impl="triton")`` forward + ``autograd.grad`` of x and the three weights at 8192
tokens (``moe_probe.inputs``, seed 0), 3 warm-up steps, then torch.profiler over 5 steps (CUDA only,
no L2 flush): each kernel's CUDA time per step, sorted, and the sum; the step's outputs and
gradients saved to ``--save`` so two trees can be compared bitwise (``--against`` a file another
tree saved).

Answer (an H100, data/tuning/moe_plan_h100_20261205/profile.log and NOTES.md's fifth stop of
2026-12-05): at Qwen3-30B-A3B the weight gradients take 1.49 ms per step, the down projection and
grad_x 1.24, the up projection 0.75, dSwiGLU 0.67, the two combines 0.21, x's copy 0.11, routing and
the tile table 0.11; the tile table went from 46.1 to 4.2 us (one program per 64 tiles) with the
bits unchanged, and the counting sort's scatter reading [16, E_PAD] counts per step took 50.2 us
against 43.8 (not kept).
Run: PYTHONPATH=src:lab python3 lab/probes/moe_kernel_profile.py [shape] [--gpt-oss] [--save F] [--against F]
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import moe_probe as P  # beside this file
from swiglu import swiglu_moe

ap = argparse.ArgumentParser()
GPT_OSS = {"gpt-oss-20b": (2880, 2880, 32, 4)}  # experts shape; --gpt-oss adds its biases and clamp
ap.add_argument("shape", nargs="?", default="qwen3-30b", choices=sorted({**P.SHAPES, **GPT_OSS}))
ap.add_argument("--tokens", type=int, default=8192)
ap.add_argument("--save", default="")
ap.add_argument("--against", default="")
ap.add_argument("--gpt-oss", action="store_true", help="both biases, interleaved gate/up rows, limit 7, alpha 1.702")
args = ap.parse_args()
H, I, E, k = {**P.SHAPES, **GPT_OSS}[args.shape]
x, idx, w, gu, dp, go = P.inputs(H, I, E, k, args.tokens)
extra, kw = [], {}
if args.gpt_oss:
    extra = [0.1 * torch.randn(E, 2 * I, device=x.device).bfloat16(), 0.1 * torch.randn(E, H, device=x.device).bfloat16()]
    kw = dict(interleaved=True, swiglu_limit=7.0, swiglu_alpha=1.702)
leaves = [t.clone().requires_grad_() for t in (x, w, gu, dp, *extra)]


def step():
    bias = dict(zip(("gate_up_proj_bias", "down_proj_bias"), leaves[4:]))
    out = swiglu_moe(leaves[0], idx, *leaves[1:4], impl="triton", **bias, **kw)
    return (out, *torch.autograd.grad(out, leaves, go))


got = [t.cpu() for t in step()]
for _ in range(3):
    step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        step()
    torch.cuda.synchronize()
rows = sorted(((e.self_device_time_total / 5, e.key) for e in prof.key_averages()), reverse=True)
for us, name in rows:
    if us > 0:
        print(f"{args.shape} {name:32s} {us:9.1f} us/step")
print(f"{args.shape} all kernels {sum(us for us, _ in rows):9.1f} us/step")
if args.save:
    torch.save(got, args.save)
if args.against:
    want = torch.load(args.against)
    print("bitwise the other tree's:", all(torch.equal(a, b) for a, b in zip(got, want)))
