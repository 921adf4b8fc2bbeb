"""What bounds the MoE dSwiGLU GEMM: its GEMM (what cuBLAS does with the same product), its
epilogue's memory traffic, or the two not overlapping?

At Qwen3-30B-A3B, 8192 tokens, the dSwiGLU GEMM runs at ~309 TFLOP/s (0.667 ms on an H100), and two
arrangements that overlap its epilogue with the MMAs differently (the library's epilogue warps, the
lab's ping-pong warpgroups) land within 2% of each other (data/tuning/moe_dswiglu_pingpong_h100_20261206/).
Per shape at 8192 tokens, balanced routing (do_bench, L2 flushed):
- ``ours``: the library's launch as the backward runs it (the plan's tile; the Gluon kernel with its
  grad_out copy where the plan takes it, the tl kernel with its pointer gathers elsewhere);
- ``bmm``: the same product without the epilogue, cuBLAS over E equal groups of S / E copied rows
  ([E, S / E, H] @ [E, H, I], bf16 out), and ``mm``: one dense [S, H] @ [H, I] (no grouping);
- ``memory``: the epilogue's own traffic without its math, read gate and up, write h * w
  (``torch.add``) and d_gate | d_up (``fill_``): 2 S I bf16 read, 3 S I written;
- ``bmm + memory``: both, as if they did not overlap.
``ours`` near ``bmm + memory``: the two do not overlap; near ``bmm``: the GEMM bounds it, and cuBLAS's
tile (2-CTA clusters, multicast) is the lever; ``bmm`` well below the dense rate: the shape itself.
Answer (one H100, data/tuning/moe_dswiglu_bound_h100_20261206/): the GEMM. Ours is slower than
cuBLAS's product and the epilogue's traffic run one after the other (30B 0.671 ms against 0.305 +
0.167; DeepSeek-V3 5.349 against 2.922 + 0.436); cuBLAS does the product at 659-737 TFLOP/s with
its 256 x 128 cooperative tile on a 2-CTA cluster with multicast (the weight gradients' too).
Run: PYTHONPATH=src:lab python3 lab/probes/moe_dswiglu_bound.py [shape ...]
"""

import sys

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as M

T = 8192
rows = []


def run(name):
    H, I, E, k, S, x, idx, w, gu, dp, go = P.case(name, T)
    del x, gu
    r = M.Routing(idx, E)
    plan = M.moe_plan(S, E, H, I, M._gluon_here(go.device))
    gate, up = (torch.randn(S, I, device=go.device).bfloat16() for _ in range(2))
    dgu = torch.empty(S, 2 * I, dtype=torch.bfloat16, device=go.device)
    hw = torch.empty(S, I, dtype=torch.bfloat16, device=go.device)
    part = torch.empty(S, -(-I // plan.dswiglu.BN), dtype=torch.float32, device=go.device)
    ours = P.kernel_ms(lambda: M.launch_dswiglu(go, dp, r, k, w, gate, up, dgu, hw, part, plan.dswiglu))
    gos = M.gather_rows(go, r, k)
    g = S // E
    out = torch.empty(E, g, I, dtype=torch.bfloat16, device=go.device)
    bmm = P.kernel_ms(lambda: torch.bmm(gos[: g * E].view(E, g, H), dp, out=out))
    flat = torch.empty(S, I, dtype=torch.bfloat16, device=go.device)
    mm = P.kernel_ms(lambda: torch.mm(gos, dp[0], out=flat))

    def memory():
        torch.add(gate, up, out=hw)
        dgu.fill_(0)

    mem = P.kernel_ms(memory)
    tflops = lambda ms: 2 * S * H * I / ms / 1e9  # noqa: E731
    row = (name, ours, bmm, mm, mem, bmm + mem, tflops(ours), tflops(bmm), tflops(mm), 5 * S * I * 2 / mem / 1e9)
    rows.append(row)
    print(*(f"{v:.3f}" if isinstance(v, float) else v for v in row), flush=True)


for name in [a for a in sys.argv[1:] if not a.startswith("--")] or ["qwen3-30b", "qwen3-235b", "deepseek-v3", "mixtral"]:
    run(name)
    torch.cuda.empty_cache()

print(f"\n{torch.cuda.get_device_name()}, {T} tokens, balanced routing; ms (do_bench, L2 flushed)")
print("| shape | ours | bmm | mm | memory | bmm + memory | ours TFLOP/s | bmm TFLOP/s | mm TFLOP/s | memory TB/s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for row in rows:
    print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else v for v in row) + " |")
