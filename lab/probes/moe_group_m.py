"""Does the order of the MoE kernels' tiles matter: bands of GROUP_M M tiles with M fastest
(``Tile.GROUP_M``) against N tiles fastest, per kernel and for the whole forward+backward?

Why it might: with N tiles fastest, the programs in flight cover one or two M tiles and every
N tile, so each M tile re-reads its expert's whole B. At Mixtral-8x7B's shape (I = 14336, 2048
pairs per expert) the up projection's B is 235 MB per expert, far beyond the 50 MB L2, and the up
and dSwiGLU GEMMs ran at 420 and 360 TFLOP/s against grad_x's 650 (lab/probes/moe_persistent.py).
Answer: at Mixtral-8x7B, yes (data/tuning/moe_group_m_20261204.log, e2d7870): bands of 8 took
up from 8.81 to 7.35 ms and dSwiGLU from 4.91 to 4.09, grad_x 5.79 to 5.32, grad_down_proj with
16 from 3.60 to 3.39; the forward+backward 33.3 to 31.9 ms. At Qwen3-30B-A3B, Qwen3-235B-A22B and
DeepSeek-V3 (12 or fewer N tiles, or B read once anyway) every kernel within noise, and the
whole pass no faster: the plan keeps N tiles fastest there. Prints per kernel the time (do_bench, L2 flushed, 8192 tokens) of
GROUP_M 1, 4, 8, 16 and whether its outputs are GROUP_M 1's bits, then the forward+backward
with each kernel's best GROUP_M beside the plan's.
Run: PYTHONPATH=src:lab python3 lab/probes/moe_group_m.py [shape ...] (moe_probe.SHAPES names)
"""

import dataclasses
import sys
import time

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as M

T0 = time.time()
RUN = [a for a in sys.argv[1:] if not a.startswith("--")] or ["mixtral", "qwen3-30b", "qwen3-235b", "deepseek-v3"]
GROUPS = (1, 4, 8, 16)
rows = []


def kernels(name):
    """Each kernel at each GROUP_M: ms, bitwise GROUP_M 1's; returns {role: best GROUP_M}."""
    H, I, E, k, S, x, idx, w, gu, dp, go = P.case(name, 8192)
    r = M.Routing(idx, E)
    plan = M.moe_plan(S, E, H, I)
    bf = dict(device=x.device, dtype=torch.bfloat16)
    gate, up, h = (torch.empty(S, I, **bf) for _ in range(3))
    dgu = torch.randn(S, 2 * I, device=x.device).to(torch.bfloat16)
    y = torch.empty(S, H, **bf)
    M.launch_up(x, gu, r, k, gate, up, h, plan.up)
    g0, u0, h0 = gate.clone(), up.clone(), h.clone()
    d_out, hw = torch.empty_like(dgu), torch.empty_like(gate)
    part = torch.empty(S, -(-I // plan.dswiglu.BN), device=x.device)
    xs, gos = M.gather_rows(x, r, k), M.gather_rows(go, r, k)
    g_gu, g_dp = torch.empty_like(gu), torch.empty_like(dp)
    cases = {
        "up": (lambda t: M.launch_up(x, gu, r, k, gate, up, h, t), (gate, up, h)),
        "down": (lambda t: M.launch_pairs(h0, dp, r, w, y, t, transposed=True), (y,)),
        "grad_x": (lambda t: M.launch_pairs(dgu, gu, r, w, y, t, transposed=False), (y,)),
        "dswiglu": (lambda t: M.launch_dswiglu(go, dp, r, k, w, g0, u0, d_out, hw, part, t), (d_out, hw, part)),
        "wgrad_gu": (lambda t: M.launch_wgrad(g_gu, dgu, xs, r, t), (g_gu,)),
        "wgrad_dp": (lambda t: M.launch_wgrad(g_dp, gos, h0, r, t), (g_dp,)),
    }
    best = {}
    for role, (fn, outs) in cases.items():
        want, times = None, {}
        for g in GROUPS:
            t = dataclasses.replace(getattr(plan, role), GROUP_M=g)
            for o in outs:
                o.fill_(float("nan"))
            try:
                fn(t)
                torch.cuda.synchronize()
            except Exception as e:
                print(f"{name:12s} {role:8s} G{g:<3d} failed: {type(e).__name__}: {str(e)[:100]}", flush=True)
                continue
            got = [o.clone() for o in outs]
            ok = want is None or all(torch.equal(a, b) for a, b in zip(want, got))
            want = want or got
            ms = times[g] = P.kernel_ms(lambda: fn(t))
            rows.append((name, role, f"GROUP_M {g}", ms, ok))
            print(f"{name:12s} {role:8s} GROUP_M {g:<3d} {ms:7.3f} ms  bitwise={ok}", flush=True)
        best[role] = min(times, key=times.get) if times else 1
    return best


def whole(name, best):
    """The forward+backward (P.bench) with the plan's tiles and with each kernel's best GROUP_M."""
    plan_fn = M.moe_plan
    for label, groups in (("plan", {}), ("best GROUP_M", best)):
        M.moe_plan = lambda *a: dataclasses.replace(  # noqa: E731
            plan_fn(*a), **{role: dataclasses.replace(getattr(plan_fn(*a), role), GROUP_M=g) for role, g in groups.items()}
        )
        try:
            res = P.bench(name, 8192, impl_names=["ours"]).get("ours")
            rows.append((name, "fwd+bwd", f"{label} {groups or ''}", sum(res) if res else float("inf"), True))
        finally:
            M.moe_plan = plan_fn


try:
    for name in RUN:
        try:
            whole(name, kernels(name))
        except Exception as e:  # reported; the other shapes still run
            print(f"{name} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        torch.cuda.empty_cache()
        print(f"{name} done {time.time() - T0:.0f}s", flush=True)
finally:
    print("\nshape        kernel   variant                 ms      bitwise")
    for name, role, label, ms, ok in rows:
        print(f"{name:12s} {role:8s} {label:22s} {ms:8.3f}  {ok}")
