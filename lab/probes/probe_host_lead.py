"""Where the host's time before a Triton backward's first kernel goes: each step of
``swiglu_mlp_backward(impl="triton")`` timed alone on the host, at Hermes' size. A probe, not a test.

Answer (data/host_overhead/, docs/kernels.md): mostly in Triton's runner and in TMA descriptors
of reshaped tensors; the direct launch and taking 2-D tensors without a reshape cut the host's
work before the first kernel from 167 to 62 us at T = 256.

    python lab/probes/probe_host_lead.py --tokens 128 256 --out build/host_lead

GPU only. Per token count, each step runs ``--iters`` times (after ``--warmup``), timed with
``time.perf_counter_ns`` around the step alone, the garbage collector off, the device
synchronized after each call outside the timed span (so each call finds an idle device, as
after the flush; the host only enqueues). Reported: median and p20/p80
in microseconds. The steps before the first launch (validation, the backend decision, the plan,
the TMA-ready views, the [T, I] buffers, the dSwiGLU launch) add up to the host lead, the GPU
idle time that follows the L2 flush in the benchmark's protocol; the later launches and a plain
``torch.mm`` launch are printed as yardsticks, and the whole backward once more through Triton's
own Python runner (``swiglu.kernels.launch.DIRECT_LAUNCH`` off). Writes ``host_lead.csv`` to ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

import pandas as pd  # noqa: E402
import torch  # noqa: E402

import swiglu  # noqa: E402
from swiglu import ops  # noqa: E402
from swiglu.checks import check_backward_inputs  # noqa: E402


def time_us(fn, iters: int, warmup: int, device: torch.device) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    out = []
    gc.disable()
    try:
        for _ in range(iters):
            t0 = time.perf_counter_ns()
            fn()
            out.append((time.perf_counter_ns() - t0) / 1e3)
            torch.cuda.synchronize(device)  # untimed: each call finds an idle device, as after a flush
    finally:
        gc.enable()
    torch.cuda.synchronize(device)
    return out


def steps(T: int, H: int, I: int, device: torch.device) -> dict:
    """name -> zero-argument callable, in the order the backward runs them."""
    from swiglu.kernels import backward as bw
    from swiglu.kernels.tma import tma_ready

    tensors = swiglu.make_inputs(1, T, H, I, seed=0, device=device).as_tuple()
    flat = tuple(t.reshape(-1, t.shape[-1]) for t in tensors[:5]) + tensors[5:]
    go, x, gate, up, act, gate_w, up_w, down_w = flat
    plan = bw.backward_plan(T, H, I, bw.plan_device(device))
    d_gate, d_up, h = (torch.empty((T, I), device=device, dtype=torch.bfloat16) for _ in range(3))
    grad_w = torch.empty((I, H), device=device, dtype=torch.bfloat16)
    grad_x = torch.empty((T, H), device=device, dtype=torch.bfloat16)
    gd = plan.gluon_dswiglu

    def dswiglu():
        bw.launch_planned_dswiglu(plan, go, down_w, gate, up, act, d_gate, d_up, h)

    a_mm, b_mm = torch.empty((T, I), device=device, dtype=torch.bfloat16), up_w
    out_mm = torch.empty((T, H), device=device, dtype=torch.bfloat16)
    return {
        "whole backward (5 launches)": lambda: swiglu.swiglu_mlp_backward(*tensors, impl="triton"),
        "check_backward_inputs": lambda: check_backward_inputs(*tensors),
        "resolve_impl": lambda: ops.resolve_impl("triton", tensors[1], tensors[5]),
        "reshape x5 + backward_plan": lambda: (
            tuple(t.reshape(-1, t.shape[-1]) for t in tensors[:5]),
            bw.backward_plan(T, H, I, bw.plan_device(device)),
        ),
        "tma_ready x8": lambda: [tma_ready(t) for t in flat],
        "torch.empty [T, I] x3": lambda: [torch.empty((T, I), device=device, dtype=torch.bfloat16) for _ in range(3)],
        f"dSwiGLU launch ({'Gluon' if gd is not None else 'tl'})": dswiglu,
        "weight-gradient launch": lambda: bw.launch_grad_weight_gluon_or_tl(
            d_gate, x, grad_w, plan.grad_weights, plan.gluon_grad_weights
        ),
        "grad_x launch (tl)": lambda: bw.launch_grad_x(d_gate, d_up, gate_w, up_w, grad_x, plan.grad_x),
        "yardstick: torch.mm(out=) launch": lambda: torch.mm(a_mm, b_mm, out=out_mm),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 256])
    p.add_argument("--hidden-size", type=int, default=16384)
    p.add_argument("--intermediate-size", type=int, default=53248)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--profile", action="store_true", help="also cProfile the whole backward (top 25 by tottime)")
    p.add_argument("--out", default="build/host_lead")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    device = torch.device("cuda", torch.cuda.current_device())
    rows = []
    from swiglu.kernels import launch

    def record(T, name, fn):
        us = sorted(time_us(fn, args.iters, args.warmup, device))
        rows.append(
            dict(
                tokens=T,
                step=name,
                us_median=statistics.median(us),
                us_p20=us[len(us) // 5],
                us_p80=us[4 * len(us) // 5],
                iters=args.iters,
            )
        )

    for T in args.tokens:
        table = steps(T, args.hidden_size, args.intermediate_size, device)
        for name, fn in table.items():
            record(T, name, fn)
        # The same whole backward through Triton's Python runner (launch.DIRECT_LAUNCH off).
        launch.DIRECT_LAUNCH = False
        launch.clear_launches()
        record(T, "whole backward, Triton's runner", table["whole backward (5 launches)"])
        launch.DIRECT_LAUNCH = True
        launch.clear_launches()
        if args.profile:
            import cProfile
            import pstats

            whole = steps(T, args.hidden_size, args.intermediate_size, device)["whole backward (5 launches)"]
            prof = cProfile.Profile()
            prof.enable()
            time_us(whole, args.iters, 0, device)
            prof.disable()
            print(f"--- cProfile, T={T}, {args.iters} whole backwards (each synchronized after, untimed) ---")
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "host_lead.csv", index=False)
    for r in rows:
        print(f"T={r['tokens']:5d} {r['step']:34s} {r['us_median']:8.1f} us  (p20 {r['us_p20']:.1f}, p80 {r['us_p80']:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
