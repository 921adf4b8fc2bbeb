"""Is the Triton MoE path right at model shapes on the GPU, and where does its time go?

Answer (data/tuning/moe_tiles_sweep_20261204.log, first run): errors 0.66-1.00x the bf16
reference's against float64 (Qwen3-30B-A3B at 1000 tokens, Mixtral at 300, balanced and skewed),
bitwise repeatable; at 8192 tokens the weight gradients (varlen-K) and the dSwiGLU GEMM take the
most time. Run: PYTHONPATH=src:lab python3 lab/probes/moe_probe.py [check|bench|all]
"""

import sys
import time
import torch
from transformers.integrations import moe as tmoe
from swiglu.moe import swiglu_moe, moe_float64

SHAPES = {
    "qwen3-30b": (2048, 768, 128, 8),
    "qwen3-235b": (4096, 1536, 128, 8),
    "deepseek-v3": (7168, 2048, 256, 8),
    "mixtral": (4096, 14336, 8, 2),
}
dev = "cuda"
try:
    from liger_kernel.ops.fused_moe import LigerFusedMoEFunction
except Exception as e:
    print("no liger", e)
    LigerFusedMoEFunction = None


class Stand(torch.nn.Module):
    def __init__(s, gu, dp):
        super().__init__()
        s.gate_up_proj, s.down_proj = gu, dp
        s.num_experts = gu.shape[0]
        s.has_gate, s.has_bias, s.is_transposed, s._is_expert_parallel = True, False, False, False
        s.has_post_expert_norm = False
        s.act_fn = torch.nn.SiLU()
        s.is_concatenated = True

    def _apply_gate(s, x):
        g, u = x.chunk(2, -1)
        return s.act_fn(g) * u


def inputs(H, I, E, k, T, skew=False, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(T, H, device=dev, generator=g).bfloat16()
    logits = torch.randn(T, E, device=dev, generator=g)
    if skew:
        logits[: T // 3, 0] += 100
    w, idx = torch.softmax(logits, -1).topk(k)
    gu = (torch.randn(E, 2 * I, H, device=dev, generator=g) / H**0.5).bfloat16()
    dp = (torch.randn(E, H, I, device=dev, generator=g) / I**0.5).bfloat16()
    go = torch.randn(T, H, device=dev, generator=g).bfloat16()
    return x, idx, w, gu, dp, go


def case(name, T=8192):
    """``(H, I, E, k, S, x, idx, w, gu, dp, go)`` of shape ``name`` at T tokens: ``inputs`` with
    the routing contiguous, as the kernels' launchers take it (S = T * k routed pairs)."""
    H, I, E, k = SHAPES[name]
    x, idx, w, gu, dp, go = inputs(H, I, E, k, T)
    return H, I, E, k, T * k, x, idx.contiguous(), w.contiguous(), gu, dp, go


def kernel_ms(fn, rep=40, quiet=False):
    """triton's do_bench of fn (ms; L2 flushed); inf where it fails (a tile that does not fit),
    printing why unless ``quiet``."""
    from triton.testing import do_bench

    try:
        return do_bench(fn, warmup=5, rep=rep)
    except Exception as e:
        if not quiet:
            print("   failed:", type(e).__name__, str(e)[:120])
        return float("inf")


def impls(gu, dp):
    st = Stand(gu, dp)
    d = {
        "ours": lambda x, i, w, gu, dp: swiglu_moe(x, i, w, gu, dp, impl="triton"),
        "grouped_mm": lambda x, i, w, gu, dp: tmoe.grouped_mm_experts_forward(st, x, i, w),
    }
    if LigerFusedMoEFunction is not None:
        d["liger"] = lambda x, i, w, gu, dp: LigerFusedMoEFunction.apply(x, gu, dp, i.int(), w)
    return d


flush = torch.empty(256 * 2**20, dtype=torch.int8, device=dev)


def timeit(fn, reps=10, warm=2):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        flush.zero_()
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def check(name, T):
    H, I, E, k = SHAPES[name]
    for skew in (False, True):
        x, idx, w, gu, dp, go = inputs(H, I, E, k, T, skew, seed=1)
        ref64 = moe_float64(x, idx, w, gu, dp, go)
        rows = []
        for impl in ("reference", "triton"):
            xs, ws, gus, dps = [t.clone().requires_grad_() for t in (x, w, gu, dp)]
            out = swiglu_moe(xs, idx, ws, gus, dps, impl=impl)
            gr = torch.autograd.grad(out, (xs, ws, gus, dps), go)
            rows.append([((a.double() - b).norm() / b.norm()).item() for a, b in zip((out, *gr), ref64)])
        ratio = [o / max(r, 1e-30) for o, r in zip(rows[1], rows[0])]
        print(
            f"check {name} T={T} skew={skew}: ref {['%.2e' % v for v in rows[0]]} ours/ref {['%.2f' % v for v in ratio]}",
            flush=True,
        )
    # bitwise repeat
    xs, ws, gus, dps = [t.clone().requires_grad_() for t in (x, w, gu, dp)]
    o1 = swiglu_moe(xs, idx, ws, gus, dps, impl="triton")
    g1 = torch.autograd.grad(o1, (xs, ws, gus, dps), go)
    o2 = swiglu_moe(xs, idx, ws, gus, dps, impl="triton")
    g2 = torch.autograd.grad(o2, (xs, ws, gus, dps), go)
    print("  bitwise repeat:", all(torch.equal(a, b) for a, b in zip((o1, *g1), (o2, *g2))))


def bench(name, T, impl_names=None, profile=False):
    H, I, E, k = SHAPES[name]
    x, idx, w, gu, dp, go = inputs(H, I, E, k, T)
    fl = 6 * H * I * T * k
    res = {}
    for iname in list(impls(gu, dp)):
        if impl_names and iname not in impl_names:
            continue
        xs, ws, gus, dps = [t.clone().requires_grad_() for t in (x, w, gu, dp)]
        fn = impls(gus, dps)[iname]
        try:
            f_ms = timeit(lambda: fn(xs, idx, ws, gus, dps))
            out = fn(xs, idx, ws, gus, dps)
            b_ms = timeit(lambda: torch.autograd.grad(out, (xs, ws, gus, dps), go, retain_graph=True))
            del out
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            out = fn(xs, idx, ws, gus, dps)
            g = torch.autograd.grad(out, (xs, ws, gus, dps), go)
            del out, g
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30
        except Exception as e:
            print(f"  {iname} failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        res[iname] = (f_ms, b_ms)
        print(
            f"bench {name} T={T} {iname:11s} fwd {f_ms:7.3f} ms ({fl / f_ms / 1e9:5.0f} TF/s)  bwd {b_ms:7.3f} ms ({2 * fl / b_ms / 1e9:5.0f} TF/s)  total {f_ms + b_ms:7.3f}  peak {peak:.2f} GiB",
            flush=True,
        )
    if profile:
        xs, ws, gus, dps = [t.clone().requires_grad_() for t in (x, w, gu, dp)]
        from torch.profiler import profile as prof, ProfilerActivity

        for _ in range(2):
            out = swiglu_moe(xs, idx, ws, gus, dps, impl="triton")
            torch.autograd.grad(out, (xs, ws, gus, dps), go)
        torch.cuda.synchronize()
        with prof(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(3):
                out = swiglu_moe(xs, idx, ws, gus, dps, impl="triton")
                torch.autograd.grad(out, (xs, ws, gus, dps), go)
            torch.cuda.synchronize()
        agg = {}
        for ev in p.events():
            if ev.device_type.name == "CUDA":
                agg[ev.name[:60]] = agg.get(ev.name[:60], 0) + ev.device_time_total / 3 / 1000
        for n, v in sorted(agg.items(), key=lambda kv: -kv[1])[:14]:
            print(f"   {v:8.3f} ms  {n}")
    return res


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    t0 = time.time()
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    if which in ("all", "check"):
        check("qwen3-30b", 1000)
        check("mixtral", 300)
    print("checks", time.time() - t0, flush=True)
    if which in ("all", "bench"):
        bench("qwen3-30b", 8192, profile=True)
        bench("qwen3-235b", 8192, profile=True)
        bench("deepseek-v3", 8192, impl_names=["ours", "grouped_mm"])
        bench("mixtral", 8192, impl_names=["ours", "grouped_mm"], profile=True)
    print("total", time.time() - t0)
