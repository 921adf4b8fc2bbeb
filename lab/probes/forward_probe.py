"""Where the memory-lean forward's time goes against nn.Linear's at small T (H200, Hermes size).

Answer (data/train_step/20261130T154448Z-fec056d/forward_probe.log, docs/training.md): ours
takes nn.Linear's kernel time; the 2-6% it loses per call at T <= 512 is host time before the
first GEMM is queued, which a training loop running ahead of the GPU hides.

    PYTHONPATH=src:lab python3 lab/probes/forward_probe.py

Interleaved per call (plain, ours cuBLAS path, ours per the table, the three GEMMs alone), L2 not
flushed, device idle before each call (``swiglu_lab.bench.timing.median_step_ms``, as
``swiglu_lab.research.train_step`` times the forward); then torch.profiler's kernel times at T = 256
and 512. Recorded: data/train_step/20261130T154448Z-fec056d/forward_probe.log (the kernels of
ours take no longer than nn.Linear's; the gap per call is host time before the first GEMM).
"""

import statistics

import torch
import torch.nn.functional as F

from swiglu.kernels import forward as fwd
from swiglu_lab.bench.timing import median_step_ms

H, I = 16384, 53248
g = torch.Generator(device="cuda").manual_seed(0)
w = [torch.randn(s, generator=g, device="cuda", dtype=torch.bfloat16) / s[1] ** 0.5 for s in ((I, H), (I, H), (H, I))]


def plain(x):
    return F.linear(F.silu(F.linear(x, w[0])) * F.linear(x, w[1]), w[2])


def ours_cublas(x):
    return fwd.triton_swiglu_forward(x, *w, config=None)


def ours_auto(x):
    return fwd.triton_swiglu_forward(x, *w)


def gemms_only(x):
    a = F.linear(x, w[0])
    F.linear(x, w[1])
    return F.linear(a, w[2])


fns = dict(plain=plain, ours_cublas=ours_cublas, ours_auto=ours_auto, gemms_only=gemms_only)
for T in (128, 256, 512, 1024, 4096):
    x = torch.randn(T, H, generator=g, device="cuda", dtype=torch.bfloat16)
    times = {k: [] for k in fns}
    for it in range(40):
        for k, f in fns.items():
            if it >= 10:
                times[k].append(median_step_ms(lambda: f(x), 0, 1, "cuda"))
            else:
                f(x)
    print(f"T={T:5d} " + "  ".join(f"{k} {statistics.median(v):.3f}" for k, v in times.items()), flush=True)
    if T in (256, 512):
        from torch.profiler import profile, ProfilerActivity

        for k in ("plain", "ours_cublas"):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    fns[k](x)
                torch.cuda.synchronize()
            print(f"-- {k} T={T}")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6, max_name_column_width=60))
