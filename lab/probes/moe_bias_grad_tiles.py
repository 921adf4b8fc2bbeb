"""Which launch does the bias-gradient kernel want? It is a column sum over each expert's sorted
rows, a pure memory pass: gate_up_proj's bias reads dgu [S, 2I], down_proj's gathers w * grad_out
rows [T, H] by pair. The library launched it with BM 32, BN 128, 4 warps, 1 stage; at gpt-oss-20b's
shape (8192 tokens, 32 experts, top-4, 2880 / 2880) the two take 0.26 and 0.15 ms on an H100
(1.45 and 1.26 TB/s; data/tuning/moe_gptoss_bias_h100_20261207/prof_new_gptoss.log).

Each form at each (BM, BN, warps, stages): do_bench (L2 flushed), GB/s of the bytes it must read,
the result against the library launch's (largest difference over the largest value: BM changes
the fp32 sums' grouping).
Answer (one H100, 8192 tokens, data/tuning/moe_gptoss_tiles_h100_20261207/bias_grad_h100.log): BM 128,
BN 64, 4 warps, 3 stages, the fastest in both forms: 258 -> 148 us (2.56 TB/s) and 148 -> 57 us
(3.30 TB/s); ``launch_bias_grad`` launches it.
Run: PYTHONPATH=src:lab python3 lab/probes/moe_bias_grad_tiles.py [--tokens=T]
"""

import sys

import torch
from triton.testing import do_bench

from swiglu.kernels import moe as kmoe

TOKENS = next((int(a[9:]) for a in sys.argv[1:] if a.startswith("--tokens=")), 8192)
H, I, E, k = 2880, 2880, 32, 4
S = TOKENS * k
g = torch.Generator(device="cuda").manual_seed(0)
idx = torch.softmax(torch.randn(TOKENS, E, device="cuda", generator=g), -1).topk(k)
w, idx = idx.values.contiguous(), idx.indices.contiguous()
r = kmoe.Routing(idx, E)
dgu = torch.randn(S, 2 * I, device="cuda", generator=g).bfloat16()
go = torch.randn(TOKENS, H, device="cuda", generator=g).bfloat16()
FORMS = {"gate_up (dgu)": (dgu, None, 1, S * 2 * I * 2), "down (w * grad_out rows)": (go, w, k, S * H * 2)}


def launch(src, weights, kk, BM, BN, warps, stages):
    N = src.shape[1]
    out = torch.empty(E, N, dtype=src.dtype, device=src.device)
    gather = weights is not None
    kmoe._launch(kmoe.moe_bias_grad_kernel, (E, -(-N // BN)), warps, stages, src, r.expert_start, r.order,
                 weights if gather else src, out, N, kk, BM=BM, BN=BN, GATHER=gather, UPCAST=kmoe.INTERPRET)  # fmt: skip
    return out


# The library's launch first (launch_bias_grad), then the one it had and the others.
CONFIGS = [kmoe.BIAS_GRAD_LAUNCH, (32, 128, 4, 1), (32, 128, 4, 3), (64, 128, 4, 3), (64, 128, 8, 3), (32, 256, 4, 3),
           (64, 256, 8, 3), (128, 128, 8, 2), (16, 256, 4, 4), (64, 64, 4, 4)]  # fmt: skip
print(torch.cuda.get_device_name(), f"{TOKENS} tokens")
print("| form | BM, BN, warps, stages | us | GB/s | largest diff / largest value |")
print("|---|---|---|---|---|")
for name, (src, weights, kk, nbytes) in FORMS.items():
    ref = launch(src, weights, kk, *CONFIGS[0]).float()
    assert torch.equal(ref.to(src.dtype), kmoe.launch_bias_grad(src, r, weights, kk)), "CONFIGS[0] is not the library's"
    for cfg in CONFIGS:
        try:
            got = launch(src, weights, kk, *cfg).float()
            ms = min(do_bench(lambda c=cfg: launch(src, weights, kk, *c), warmup=5, rep=100) for _ in range(2))
        except Exception as e:  # a launch that does not fit
            print(f"| {name} | {cfg} | failed: {type(e).__name__} {str(e)[:80]} | | |")
            continue
        diff = ((got - ref).abs().max() / ref.abs().max()).item()
        print(f"| {name} | {cfg} | {ms * 1e3:.1f} | {nbytes / ms / 1e6:.0f} | {diff:.1e} |", flush=True)
