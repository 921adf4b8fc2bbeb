"""Do the MoE up projection and dSwiGLU GEMM gain from reading their gathered A operand (x's or
grad_out's token rows) from a transient expert-order copy through TMA, as the weight gradients do?

Answer (data/tuning/moe_copy_a_20261204.log, H200, 8192 tokens): no. Per kernel (do_bench, L2
flushed, the copy included) the up projection gains 0-7% at Qwen3-235B-A22B, Mixtral-8x7B and
DeepSeek-V3 and loses 5% at Qwen3-30B-A3B; dSwiGLU loses 2-10% except at Mixtral (-6%). In the
forward+backward (same process) the copies made every shape slower or level (Qwen3-30B-A3B 4.63
-> 4.89 ms with the up projection's copy). The library keeps the gathers in these two kernels'
loads; this probe runs against commit 3f51108, which has the COPY_A switch.
Run: PYTHONPATH=src:lab python3 lab/probes/moe_copy_a.py [shape ...] (moe_probe.SHAPES names)
"""

import dataclasses
import sys
import time

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as M

T0 = time.time()
RUN = [a for a in sys.argv[1:] if not a.startswith("--")] or ["qwen3-30b", "qwen3-235b", "mixtral", "deepseek-v3"]
rep = dataclasses.replace


for name in RUN:
    T = 8192
    H, I, E, k, S, x, idx, w, gu, dp, go = P.case(name, T)
    r = M.Routing(idx, E)
    base = M.moe_plan(S, E, H, I)
    gate, up, h = (torch.empty(S, I, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    dgu = torch.empty(S, 2 * I, device="cuda", dtype=torch.bfloat16)
    hw = torch.empty_like(gate)
    print(f"{name}: gather [S, H] = [{S}, {H}] {P.kernel_ms(lambda: M.gather_rows(x, r, k)):.3f} ms", flush=True)
    M.launch_up(x, gu, r, k, gate, up, h, base.up)
    ref_up = [t.clone() for t in (gate, up, h)]
    part = torch.empty(S, -(-I // base.dswiglu.BN), device="cuda")
    M.launch_dswiglu(go, dp, r, k, w, gate, up, dgu, hw, part, base.dswiglu)
    ref_dsw = [t.clone() for t in (dgu, hw, part)]
    up_tiles = [base.up, rep(base.up, num_stages=4), rep(base.up, BN=64, num_stages=4)]
    dsw_tiles = [base.dswiglu, rep(base.dswiglu, BM=128), rep(base.dswiglu, num_stages=3)]
    for t in up_tiles:
        for copy in (False, True):
            tc = rep(t, COPY_A=copy)
            for b in (gate, up, h):
                b.fill_(float("nan"))
            M.launch_up(x, gu, r, k, gate, up, h, tc)
            same = all(torch.equal(a, b) for a, b in zip((gate, up, h), ref_up))
            v = P.kernel_ms(lambda: M.launch_up(x, gu, r, k, gate, up, h, tc))
            print(f"  {name} up      COPY_A={copy!s:5s} {v:.3f} ms bitwise={same} {t}", flush=True)
    for t in dsw_tiles:
        for copy in (False, True):
            tc = rep(t, COPY_A=copy)
            for b in (dgu, hw):
                b.fill_(float("nan"))
            M.launch_dswiglu(go, dp, r, k, w, gate, up, dgu, hw, part, tc)
            same = all(torch.equal(a, b) for a, b in zip((dgu, hw), ref_dsw[:2]))
            v = P.kernel_ms(lambda: M.launch_dswiglu(go, dp, r, k, w, gate, up, dgu, hw, part, tc))
            print(f"  {name} dswiglu COPY_A={copy!s:5s} {v:.3f} ms bitwise={same} {t}", flush=True)
    plans = {
        "plan": base,
        "copy up": rep(base, up=rep(base.up, COPY_A=True)),
        "copy up+dswiglu": rep(base, up=rep(base.up, COPY_A=True), dswiglu=rep(base.dswiglu, COPY_A=True)),
    }
    grads = {}
    orig = M.moe_plan
    for pname, plan in plans.items():
        M.moe_plan = lambda *a, plan=plan: plan
        print(f"{name} {pname}:", flush=True)
        P.bench(name, T, impl_names=["ours"], profile=pname == "plan")
        xs_, ws_, gus_, dps_ = [t.clone().requires_grad_() for t in (x, w, gu, dp)]
        out = P.swiglu_moe(xs_, idx, ws_, gus_, dps_, impl="triton")
        grads[pname] = (out, *torch.autograd.grad(out, (xs_, ws_, gus_, dps_), go))
    M.moe_plan = orig
    first = grads.pop("plan")
    for pname, g in grads.items():
        print(f"{name}: {pname} bitwise the plan's:", [torch.equal(p, q) for p, q in zip(first, g)], flush=True)
    grads = first = None
    torch.cuda.empty_cache()
    print(f"time {time.time() - T0:.0f}s", flush=True)
