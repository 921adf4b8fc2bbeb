"""How much of the MoE op's measured time is the host (Python, launches) and how much the GPU?

Per shape at 8192 tokens, ours and Liger (when installed): ``events`` (CUDA events around one call,
L2 flushed: the bench's protocol), ``gpu`` (the same call enqueued behind a 20 ms GPU spin, so the
host is ahead and the events time the GPU alone), ``host`` (perf_counter around the call, no
sync, median of 20) and ours' kernels by torch.profiler. ``events - gpu`` is what the host costs.

Answer (data/tuning/moe_host_20261204.log, Qwen3-30B-A3B): the torch-op routing, tile tables,
Triton's launch path and the custom ops cost 0.55 ms of a 2.14 ms forward and 0.77 of a 4.53 ms
backward; after the counting-sort routing, cached launches and the eager carrier the forward is
GPU-bound (host 0.14 ms) and the backward waits ~0.34 ms for its first launch.
Run: PYTHONPATH=src:lab python3 lab/probes/moe_host.py [shape ...]
"""

import statistics
import sys
import time

import torch

from moe_probe import SHAPES, flush, impls, inputs  # flush: moe_probe's 256 MiB L2 flush buffer


def spin(ms=20.0):
    torch.cuda._sleep(int(ms * 1.9e6))  # probe only: keeps the GPU busy while the host enqueues


def timed(fn, behind: bool, reps=10):
    ts = []
    for _ in range(reps):
        flush.zero_()
        if behind:
            spin()
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def host(fn, reps=20):
    ts = []
    for _ in range(reps):
        spin(5)
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(ts)


def run(name, T=8192):
    H, I, E, k = SHAPES[name]
    x, idx, w, gu, dp, go = inputs(H, I, E, k, T)
    for iname, fn in impls(gu, dp).items():
        if iname == "grouped_mm":
            continue
        xs, ws, gus, dps = [t.clone().requires_grad_() for t in (x, w, gu, dp)]
        f = lambda: fn(xs, idx, ws, gus, dps)  # noqa: E731
        for _ in range(3):
            torch.autograd.grad(f(), (xs, ws, gus, dps), go)
        out = f()
        b = lambda: torch.autograd.grad(out, (xs, ws, gus, dps), go, retain_graph=True)  # noqa: E731
        r = {m: (timed(fn_, False), timed(fn_, True), host(fn_)) for m, fn_ in (("fwd", f), ("bwd", b))}
        for m, (ev, gpu, h) in r.items():
            print(
                f"{name:12s} {iname:6s} {m}: events {ev:6.3f} ms  gpu {gpu:6.3f}  host {h:6.3f}  host cost {ev - gpu:6.3f}",
                flush=True,
            )
        if iname == "ours":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(3):
                    torch.autograd.grad(f(), (xs, ws, gus, dps), go)
                torch.cuda.synchronize()
            agg = {}
            for ev in p.events():
                if ev.device_type.name == "CUDA":
                    agg[ev.name[:70]] = agg.get(ev.name[:70], 0) + ev.device_time_total / 3 / 1000
            print(f"   kernels sum {sum(agg.values()):.3f} ms per fwd+bwd")
            for n, v in sorted(agg.items(), key=lambda kv: -kv[1])[:16]:
                print(f"   {v:8.3f} ms  {n}")


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for s in sys.argv[1:] or ["qwen3-30b", "qwen3-235b"]:
        run(s)
