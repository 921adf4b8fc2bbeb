"""Do our kernels give the same bits while another process shares the GPU? On an H100, the whole
suite in 8 pytest workers (and then `test_gluon.py`'s weight-gradient tests beside a process running
bf16 matmuls and holding 50 GiB) left NaN in the ping-pong weight gradient's output at buckets 1024
and 2048 and changed 1 of 20 launches' bits in the one-buffer ping-pong test; alone, the same tests
pass. Which kernel, and is it the other process's compute (the GPU time-slices the two contexts) or
its memory?

Each mode starts a second process (``compute``: 8192^3 bf16 matmuls in a loop; ``fill``: holds all but
12 GiB and sleeps; ``both``), then launches each kernel ``--launches`` times into a NaN-poisoned
output and counts launches with NaN left and launches whose bits differ from the kernel's own launch
on the idle GPU; cuBLAS's product (``torch.mm``) is the control. Then the whole dense backward
(Hermes-4-405B's H and I, T = 1024) and the MoE op (Qwen3-30B-A3B's experts, 8192 tokens), the same way.
Answer (one H100, data/tuning/wgrad_time_slicing_h100_20261207/): beside compute, the ping-pong tile
whose MMA warpgroups store their own chunks (``wg_store``) left NaN and other bits in 20 of 20
launches at K = 1024 (a preempted tile's first chunk, 16 of its 64 columns); every other kernel,
the storer warp's ping-pong tile included, kept its bits; memory alone changed nothing. The table
runs the storer warp since.
Run: PYTHONPATH=src:lab python3 lab/probes/time_slicing.py [--launches=20] [--modes=compute,fill,both]
"""

import subprocess
import sys
import time
from dataclasses import replace

import torch

import swiglu
from swiglu.kernels import backward

ARGS = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
LAUNCHES = int(ARGS.get("launches", 20))
MODES = ARGS.get("modes", "compute,fill,both").split(",")

LOAD = """
import sys, time, torch
compute, fill = sys.argv[1] == "1", sys.argv[2] == "1"
free = torch.cuda.mem_get_info()[0]
hold = torch.empty(max(0, free - (12 << 30)), dtype=torch.uint8, device="cuda") if fill else None
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
while True:
    if compute:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
    else:
        time.sleep(0.1)
"""


def start_load(mode):
    p = subprocess.Popen([sys.executable, "-c", LOAD, str(int(mode in ("compute", "both"))), str(int(mode in ("fill", "both")))],
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    return p


def wgrad_cases():
    gen = torch.Generator(device="cuda").manual_seed(0)
    M, N = 53248, 16384
    cases = {}
    for K in (256, 1024):
        a = torch.randn(K, M, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16, generator=gen)
        tl_cfg = backward.config_for("grad_weights", K)
        g = backward.GLUON_CONFIGS[K]
        coop = replace(g, pingpong=False, BN2=0, mma_regs=0, wg_store=0) if g.pingpong else g
        kernels = {
            "cuBLAS mm": lambda out, a=a, b=b: torch.mm(a.T, b, out=out),
            "tl wgrad": lambda out, a=a, b=b, c=tl_cfg: backward.launch_grad_weight_gluon_or_tl(a, b, out, c, None),
            "Gluon cooperative": lambda out, a=a, b=b, c=tl_cfg, g=coop: backward.launch_grad_weight_gluon_or_tl(a, b, out, c, g),
        }
        if g.pingpong:
            kernels[f"Gluon ping-pong wg_store={g.wg_store} (table)"] = lambda out, a=a, b=b, c=tl_cfg, g=g: backward.launch_grad_weight_gluon_or_tl(a, b, out, c, g)  # fmt: skip
            g1 = replace(g, wg_store=1)
            kernels["Gluon ping-pong wg_store=1"] = lambda out, a=a, b=b, c=tl_cfg, g=g1: backward.launch_grad_weight_gluon_or_tl(a, b, out, c, g)  # fmt: skip
        for name, fn in kernels.items():
            cases[f"wgrad K={K}: {name}"] = (fn, (M, N))
    return cases


def whole_ops():
    gen = torch.Generator(device="cuda").manual_seed(1)
    r = lambda *s, scale=1.0: (torch.randn(*s, device="cuda", generator=gen) * scale).bfloat16()  # noqa: E731
    T, H, I = 1024, 16384, 53248
    dense = (r(T, H), r(T, H), r(T, I), r(T, I), None, r(I, H, scale=0.01), r(I, H, scale=0.01), r(H, I, scale=0.01))
    dense = dense[:4] + (torch.nn.functional.silu(dense[2].float()).bfloat16(),) + dense[5:]

    def dense_bwd():
        return swiglu.swiglu_mlp_backward(*dense, impl="triton")

    Tm, Hm, Im, E, k = 8192, 2048, 768, 128, 8
    x = r(Tm, Hm).requires_grad_()
    logits = torch.randn(Tm, E, device="cuda", generator=gen)
    w, idx = torch.softmax(logits, -1).topk(k)
    w = w.requires_grad_()
    gu = r(E, 2 * Im, Hm, scale=0.02).requires_grad_()
    dp = r(E, Hm, Im, scale=0.02).requires_grad_()
    go = r(Tm, Hm)

    def moe_fwd_bwd():
        out = swiglu.swiglu_moe(x, idx, w, gu, dp, impl="triton")
        grads = torch.autograd.grad(out, (x, w, gu, dp), go)
        return (out.detach(), *grads)

    return {"dense backward T=1024 (Hermes H, I)": dense_bwd, "MoE fwd+bwd Qwen3-30B-A3B 8192 tokens": moe_fwd_bwd}


def main():
    print(torch.cuda.get_device_name(), f"{LAUNCHES} launches per kernel and mode", flush=True)
    cases = wgrad_cases()
    ops = whole_ops()
    refs = {}
    for name, (fn, shape) in cases.items():  # the idle GPU's bits
        out = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        fn(out)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), f"{name}: NaN left on the idle GPU"
        refs[name] = out
    out = torch.empty_like(out)  # every case has the same [M, N]
    op_refs = {name: [t.clone() for t in fn()] for name, fn in ops.items()}
    torch.cuda.synchronize()
    rows = []
    for mode in ["idle"] + MODES:
        load = None if mode == "idle" else start_load(mode)
        try:
            for name, (fn, _) in cases.items():
                nan_launches = differ = worst = 0
                for _ in range(LAUNCHES):
                    out.fill_(float("nan"))
                    fn(out)
                    bad = int((~torch.isfinite(out)).sum())
                    nan_launches += bad > 0
                    worst = max(worst, bad)
                    differ += not torch.equal(out, refs[name])
                rows.append((mode, name, nan_launches, differ, worst))
                print(
                    f"{mode:8s} {name:48s} NaN in {nan_launches:2d}, bits differ in {differ:2d} (worst {worst} NaN)", flush=True
                )
            for name, fn in ops.items():
                differ = 0
                try:
                    for _ in range(max(2, LAUNCHES // 4)):
                        got = fn()
                        differ += not all(torch.equal(g, want) for g, want in zip(got, op_refs[name]))
                        del got
                except torch.OutOfMemoryError:
                    differ = "out of memory"
                rows.append((mode, name, "-", differ, "-"))
                print(f"{mode:8s} {name:48s} bits differ in {differ} of {max(2, LAUNCHES // 4)}", flush=True)
        finally:
            if load is not None:
                load.kill()
                load.wait()
    print("\n| load | kernel | launches with NaN left | launches with other bits | most NaN |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")


if __name__ == "__main__":
    main()
