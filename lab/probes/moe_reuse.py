"""Does ``swiglu_moe(reuse_saved_buffers=True)`` lower the peak memory of a forward+backward, and
at what cost in time?

Answer (first form: grad_x's A by per-element pointer selects, the saved gate/up kept until the
backward returns; H200, one process): no: the same peak (Qwen3-30B-A3B 1.72 GiB, Mixtral-8x7B 4.19
GiB at 8192 tokens: the default's peak is at grad_down_proj, after d_gate|d_up is freed) and
slower (4.79 -> 5.76 ms and 34.4 -> 39.5 ms), gradients bitwise the default's
(data/tuning/moe_reuse_20261204.log). Second form (d_gate/d_up over gate/up, grad_x in two TMA
loops, gate/up released before grad_down_proj): Mixtral-8x7B 3.31 against 4.19 GiB for 36.3
against 34.2 ms, Qwen3-30B-A3B 1.53 against 1.72 GiB for 5.23 against 4.63 ms
(data/tuning/moe_reuse_shipped_20261204.log). The present form (the default's kernels, gate/up
released once the dSwiGLU GEMM is launched; an H100, data/tuning/moe_plan_h100_20261205/reuse.log):
bitwise the default's; peak 3.31 against 4.19 GiB at Mixtral-8x7B, 8192 tokens, 1.28 against 1.47
at Qwen3-30B-A3B; time 1.00x at Qwen3-30B-A3B, 1.05x at Mixtral (29.16 against 27.83 ms, both
blocks slower: not the kernels, which are the same; the allocator's reuse of the freed blocks is
the suspect, not measured).
Run: PYTHONPATH=src:lab python3 lab/probes/moe_reuse.py
"""

import torch

import moe_probe as P  # beside this file
from swiglu import swiglu_moe

for name in ("qwen3-30b", "mixtral"):
    H, I, E, k = P.SHAPES[name]
    for T in (2048, 8192):
        x, idx, w, gu, dp, go = P.inputs(H, I, E, k, T)
        res = {}
        for reuse in (False, True, False, True):  # two blocks each, alternating
            xs, ws, gus, dps = [t.clone().requires_grad_() for t in (x, w, gu, dp)]

            def step(reuse=reuse, xs=xs, ws=ws, gus=gus, dps=dps):
                out = swiglu_moe(xs, idx, ws, gus, dps, impl="triton", reuse_saved_buffers=reuse)
                return (out, *torch.autograd.grad(out, (xs, ws, gus, dps), go))

            ms = P.timeit(step)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            g = step()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30
            res.setdefault(reuse, []).append((ms, peak, g))
            del g
        same = all(torch.equal(a, b) for a, b in zip(res[False][0][2], res[True][0][2]))
        for reuse, v in res.items():
            print(
                f"{name} T={T} reuse={reuse!s:5s} fwd+bwd {min(a for a, _, _ in v):.3f} ms "
                f"(blocks {v[0][0]:.3f}, {v[1][0]:.3f}) peak {v[0][1]:.2f} GiB",
                flush=True,
            )
        print(f"{name} T={T}: bitwise equal {same}", flush=True)
        res = None
        torch.cuda.empty_cache()
