"""Do the MoE grouped GEMMs (up projection, dSwiGLU, forward down, grad_x) and weight gradients gain from
persistent programs that walk the tiles with the next tile's loads issued during this one's
epilogue (``swiglu_lab.experiments.moe_persistent``), against the library's one program per tile?

Answer: no (data/tuning/moe_persistent_20261204.log, b5a89e7): bitwise the library's on the GPU;
each kernel's best persistent variant is 2-46% slower in 10 of 18 kernel-shape pairs (all weight
gradients, dSwiGLU at Qwen3), within 1% in 3, and 2-8% faster in 5 (Mixtral's up, down and
dSwiGLU, whose gain the library's tile bands now take: moe_group_m.py); the whole
forward+backward 1.25-1.34x the library's time. With the library's 3-stage 128 x 128 tiles two
programs share an SM, so one's main loop already covers the other's fill and epilogue. The run
writes the per-kernel
times (do_bench, L2 flushed, 8192 tokens), a bitwise check against the library's kernels on the
GPU, and the whole forward+backward with the persistent kernels swapped in, beside the library's.
Run: PYTHONPATH=src:lab python3 lab/probes/moe_persistent.py [shape ...] (moe_probe.SHAPES names)
"""

import dataclasses
import sys
import time

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as M
from swiglu.moe import swiglu_moe
from swiglu_lab.experiments import moe_persistent as X

T0 = time.time()
RUN = [a for a in sys.argv[1:] if not a.startswith("--")] or ["qwen3-30b", "qwen3-235b", "mixtral"]
SMS = torch.cuda.get_device_properties(0).multi_processor_count
rows = []


def variants(lib, pers, role, tile):
    """(label, fn) of the library's launch and the persistent one's settings: one program per SM,
    flattened or not, two per SM (where a tile's shared memory lets two share an SM, one's
    epilogue overlaps the other's main loop; not flattened, which takes more shared memory), and
    one stage more or less than the plan's."""
    yield "library", lib
    wgrad = role.startswith("wgrad")
    for per_sm in (1, 2):
        for flatten in (False,) if wgrad or per_sm == 2 else (True, False):  # wgrad: loops that cannot be flattened
            yield f"persistent x{per_sm}{' flat' if flatten else ''}", lambda n=per_sm * SMS, f=flatten: pers(n, f)
    for stages in (tile.num_stages - 1, tile.num_stages + 1):
        if stages >= 2:
            t = dataclasses.replace(tile, num_stages=stages)
            yield f"persistent x1{'' if wgrad else ' flat'} s{stages}", lambda t=t: pers(SMS, not wgrad, t)


def kernels(name):
    """Each kernel: the library's and the persistent variants, timed and checked bitwise."""
    H, I, E, k, S, x, idx, w, gu, dp, go = P.case(name, 8192)
    r = M.Routing(idx, E)
    plan = M.moe_plan(S, E, H, I)
    gate, up, h = (torch.empty(S, I, device=x.device, dtype=torch.bfloat16) for _ in range(3))
    dgu = torch.randn(S, 2 * I, device=x.device).to(torch.bfloat16)
    y = torch.empty(S, H, device=x.device, dtype=torch.bfloat16)
    M.launch_up(x, gu, r, k, gate, up, h, plan.up)
    want_up = [t.clone() for t in (gate, up, h)]
    M.launch_pairs(h, dp, r, w, y, plan.down, transposed=True)
    want_down = y.clone()
    M.launch_pairs(dgu, gu, r, w, y, plan.grad_x, transposed=False)
    want_gx = y.clone()
    d_out = torch.empty_like(dgu)
    hw = torch.empty_like(gate)
    part = torch.empty(S, -(-I // plan.dswiglu.BN), device=x.device)
    M.launch_dswiglu(go, dp, r, k, w, want_up[0], want_up[1], d_out, hw, part, plan.dswiglu)
    want_dsw = [t.clone() for t in (d_out, hw, part)]
    xs, gos = M.gather_rows(x, r, k), M.gather_rows(go, r, k)
    g_gu, g_dp = torch.empty_like(gu), torch.empty_like(dp)
    M.launch_wgrad(g_gu, dgu, xs, r, plan.wgrad_gu)
    M.launch_wgrad(g_dp, gos, want_up[2], r, plan.wgrad_dp)
    want_wg = (g_gu.clone(), g_dp.clone())
    cases = {
        "up": (
            lambda: M.launch_up(x, gu, r, k, gate, up, h, plan.up),
            lambda n, f, t=plan.up: X.launch_up(x, gu, r, k, gate, up, h, t, n, f),
            lambda: [torch.equal(a, b) for a, b in zip(want_up, (gate, up, h))],
        ),
        "down": (
            lambda: M.launch_pairs(want_up[2], dp, r, w, y, plan.down, transposed=True),
            lambda n, f, t=plan.down: X.launch_pairs(want_up[2], dp, r, w, y, t, True, n, f),
            lambda: [torch.equal(want_down, y)],
        ),
        "grad_x": (
            lambda: M.launch_pairs(dgu, gu, r, w, y, plan.grad_x, transposed=False),
            lambda n, f, t=plan.grad_x: X.launch_pairs(dgu, gu, r, w, y, t, False, n, f),
            lambda: [torch.equal(want_gx, y)],
        ),
        "dswiglu": (
            lambda: M.launch_dswiglu(go, dp, r, k, w, want_up[0], want_up[1], d_out, hw, part, plan.dswiglu),
            lambda n, f, t=plan.dswiglu: X.launch_dswiglu(go, dp, r, k, w, want_up[0], want_up[1], d_out, hw, part, t, n, f),
            lambda: [torch.equal(a, b) for a, b in zip(want_dsw, (d_out, hw, part))],
        ),
        "wgrad_gu": (
            lambda: M.launch_wgrad(g_gu, dgu, xs, r, plan.wgrad_gu),
            lambda n, f, t=plan.wgrad_gu: X.launch_wgrad(g_gu, dgu, xs, r, t, n, f),
            lambda: [torch.equal(want_wg[0], g_gu)],
        ),
        "wgrad_dp": (
            lambda: M.launch_wgrad(g_dp, gos, want_up[2], r, plan.wgrad_dp),
            lambda n, f, t=plan.wgrad_dp: X.launch_wgrad(g_dp, gos, want_up[2], r, t, n, f),
            lambda: [torch.equal(want_wg[1], g_dp)],
        ),
    }
    outputs = {
        "up": (gate, up, h),
        "down": (y,),
        "grad_x": (y,),
        "dswiglu": (d_out, hw, part),
        "wgrad_gu": (g_gu,),
        "wgrad_dp": (g_dp,),
    }
    for role, (lib, pers, same) in cases.items():
        for label, fn in variants(lib, pers, role, getattr(plan, role)):
            for t in outputs[role]:  # poisoned
                t.fill_(float("nan"))
            try:
                fn()
                torch.cuda.synchronize()
            except Exception as e:  # a stage count whose buffers do not fit
                print(f"{name:12s} {role:8s} {label:21s} failed: {type(e).__name__}: {str(e)[:100]}", flush=True)
                continue
            ok = all(same())
            ms = P.kernel_ms(fn)
            rows.append((name, role, label, ms, ok))
            print(f"{name:12s} {role:8s} {label:21s} {ms:7.3f} ms  bitwise={ok}", flush=True)


def outputs(name):
    """One forward+backward's output and gradients (the case's fixed inputs)."""
    H, I, E, k, S, x, idx, w, gu, dp, go = P.case(name, 8192)
    leaves = [t.clone().requires_grad_() for t in (x, w, gu, dp)]
    out = swiglu_moe(leaves[0], idx, *leaves[1:], impl="triton")
    return (out.detach(), *torch.autograd.grad(out, leaves, go))


def whole(name):
    """The whole forward+backward with the persistent kernels in the library's place, and whether
    its output and gradients are the library's bits."""
    want = None
    for label in ("library", "persistent x1 flat"):
        if label != "library":
            lib_up, lib_pairs, lib_dsw = M.launch_up, M.launch_pairs, M.launch_dswiglu
            M.launch_up = lambda *a: X.launch_up(*a, SMS, True)  # noqa: E731
            M.launch_dswiglu = lambda *a: X.launch_dswiglu(*a, SMS, True)  # noqa: E731
            lib_wgrad, M.launch_wgrad = M.launch_wgrad, lambda *a: X.launch_wgrad(*a, SMS, False)
            M.launch_pairs = lambda *a: X.launch_pairs(*a, SMS, True)  # noqa: E731
        try:
            got = outputs(name)
            same = want is None or all(torch.equal(g, w) for g, w in zip(got, want))
            want = got if want is None else want
            del got
            res = P.bench(name, 8192, impl_names=["ours"]).get("ours")  # {} when it failed (printed)
            rows.append((name, "fwd+bwd", label, sum(res) if res else float("inf"), same))
        except Exception as e:  # reported; the other shapes still run
            print(f"{name} fwd+bwd {label} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        finally:
            if label != "library":
                M.launch_up, M.launch_pairs, M.launch_dswiglu, M.launch_wgrad = lib_up, lib_pairs, lib_dsw, lib_wgrad


try:
    for name in RUN:
        for part in (kernels, whole):
            try:
                part(name)
            except Exception as e:  # reported; the rest still runs
                print(f"{name} {part.__name__} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
            torch.cuda.empty_cache()  # the kernels' buffers: DeepSeek-V3's weight gradients take tens of GB
        print(f"{name} done {time.time() - T0:.0f}s", flush=True)
finally:
    print("\nshape        kernel   variant               ms      bitwise")
    for name, role, label, ms, ok in rows:
        print(f"{name:12s} {role:8s} {label:21s} {ms:7.3f}  {ok}")
