"""Which tiles do gpt-oss's up projection and dSwiGLU GEMM want? The plan's were swept at Qwen3's
shapes (data/tuning/moe_tiles_sweep_20261204.log), where dSwiGLU's K (hidden_size 2048) is short and
its epilogue heavy; gpt-oss-20b's experts (hidden_size 2880, intermediate_size 2880, 32 experts,
top-4, interleaved gate/up rows, both biases, limit 7, alpha 1.702) run dSwiGLU at ~300 TFLOP/s and
the up projection at ~490 on an H100 (data/tuning/moe_gptoss_bias_h100_20261207/prof_new_gptoss.log).

One forward + backward of the kernels (``moe_forward`` + ``moe_backward``) at 8192 tokens, balanced
routing, the weights in gpt-oss's own transposed memory (as a ``GptOssExperts`` module passes them),
per variant of one role's tile (do_bench, L2 flushed, the fastest of three medians in rotated
orders), its outputs and gradients against the library plan's (bitwise, or the largest difference
over the largest value: the routing-weight partial sums add per BN columns).
Answer (one H100, data/tuning/moe_gptoss_tiles_h100_20261207/): the plan's tiles; every other
dSwiGLU tile takes 1.03-1.28x the step's time, every other up tile 1.03-1.24x.
Run: PYTHONPATH=src:lab python3 lab/probes/moe_gptoss_tiles.py [--rep=MS] [--tokens=T] [--own] [--only=dswiglu|up] [--max=N]
"""

import dataclasses
import sys

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as kmoe

REP = next((int(a[6:]) for a in sys.argv[1:] if a.startswith("--rep=")), 200)
TOKENS = next((int(a[9:]) for a in sys.argv[1:] if a.startswith("--tokens=")), 8192)
MAX = next((int(a[6:]) for a in sys.argv[1:] if a.startswith("--max=")), 99)  # variants per role, the first ones
ONLY = next((a[7:] for a in sys.argv[1:] if a.startswith("--only=")), "")  # "dswiglu" or "up": that role's variants alone
H, I, E, k = 2880, 2880, 32, 4
S = TOKENS * k
x, idx, w, gu, dp, go = P.inputs(H, I, E, k, TOKENS)
idx, w = idx.contiguous(), w.contiguous()
if "--own" not in sys.argv:  # gpt-oss's parameters: [E, H, 2I] and [E, I, H], passed as their mT
    gu, dp = gu.mT.contiguous().mT, dp.mT.contiguous().mT
g = torch.Generator(device="cuda").manual_seed(1)
bgu = (0.1 * torch.randn(E, 2 * I, device="cuda", generator=g)).bfloat16()
bd = (0.1 * torch.randn(E, H, device="cuda", generator=g)).bfloat16()
KW = dict(swiglu_limit=7.0, swiglu_alpha=1.702, interleaved=True)

base = kmoe.moe_plan(S, E, H, I, kmoe._gluon_here(x.device))
T_ = dataclasses.replace
PLANS = {"library": base}
# dSwiGLU: (BN, BK, warps, stages, BM, EPI_SPLIT)
for v in [(128, 64, 8, 3, 128, 2), (128, 64, 8, 4, 128, 2), (128, 64, 8, 4, 64, 2), (128, 64, 8, 3, 128, 1),
          (64, 64, 4, 4, 64, 1), (64, 64, 4, 4, 128, 1), (256, 64, 8, 3, 64, 2), (128, 128, 8, 3, 64, 2)][:MAX]:  # fmt: skip
    bn, bk, nw, ns, bm, split = v
    if ONLY != "up":
        PLANS[f"dswiglu {v}"] = T_(
            base, dswiglu=T_(base.dswiglu, BN=bn, BK=bk, num_warps=nw, num_stages=ns, BM=bm, EPI_SPLIT=split)
        )
# up: (BN, BK, warps, stages, BM)
for v in [(128, 64, 8, 4, 128), (64, 64, 4, 4, 128), (64, 64, 8, 4, 128), (128, 64, 8, 3, 64), (128, 128, 8, 3, 128),
          (64, 128, 4, 3, 128)][:MAX]:  # fmt: skip
    bn, bk, nw, ns, bm = v
    if ONLY != "dswiglu":
        PLANS[f"up {v}"] = T_(base, up=T_(base.up, BN=bn, BK=bk, num_warps=nw, num_stages=ns, BM=bm))


def step(name):
    plan = PLANS[name]
    out, gate, up, r = kmoe.moe_forward(x, idx, w, gu, dp, plan, None, KW["swiglu_limit"], KW["swiglu_alpha"], bgu,
                                        True, bd)  # fmt: skip
    grads = kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, plan, r, swiglu_limit=7.0, swiglu_alpha=1.702,
                              interleaved=True, bias_grad=True, down_proj_bias=bd, down_bias_grad=True)  # fmt: skip
    return (out, *grads)


ref = [t.float().cpu() for t in step("library")]
rows = {}
for name in PLANS:
    try:
        got = [t.float().cpu() for t in step(name)]
    except Exception as e:  # a tile that does not compile or fit
        print(name, "failed:", type(e).__name__, str(e)[:160], flush=True)
        continue
    same = all(torch.equal(a, b) for a, b in zip(got, ref))
    worst = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, ref))
    rows[name] = [float("inf"), same, worst]
    print(name, rows[name], flush=True)
names = list(rows)
for shift in range(3):
    for name in names[shift:] + names[:shift]:
        rows[name][0] = min(rows[name][0], P.kernel_ms(lambda n=name: step(n), rep=REP, quiet=True))
print(
    f"\ngpt-oss-20b experts, {TOKENS} tokens, {'own' if '--own' in sys.argv else 'transposed'} layout, one forward + backward of the kernels"
)
print(f"library: up {base.up}\n         dswiglu {base.dswiglu}")
print("| variant | ms | / library | bitwise | largest diff / largest value |")
print("|---|---|---|---|---|")
lib = rows["library"][0]
for name, (ms, same, worst) in rows.items():
    print(f"| {name} | {ms:.3f} | {ms / lib:.3f} | {same} | {worst:.1e} |")
