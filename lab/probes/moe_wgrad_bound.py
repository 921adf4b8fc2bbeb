"""What bounds the ping-pong MoE weight gradients at 256-512 rows per expert (the SMs, shared
bandwidth, the epilogue's chunk buffers or its stores), and what do cuBLAS and torch's grouped_mm
do there that they do not?

Both weight gradients (grad_gate_up_proj "gu", grad_down_proj "dp") of each shape at 8192 tokens,
balanced routing; do_bench, L2 flushed; "bitwise": NaN-poisoned output against the reference launch.
- ``scaling``: the library's gathering kernel at all SMs and half of them; three stages with three
  and two chunk buffers per warpgroup, four with one; the lab kernel (``moe_wgrad_hostdesc``, host
  descriptors) without stores (wrong sums, " *": time only) at all and half the SMs; writing the
  output alone (``c.fill_``); ``torch.bmm`` over equal groups (S / E rows each) on copy-fed operands.
- ``cooperative``: copy-fed, the ping-pong kernel against the lab's cooperative kernel
  (``moe_gluon_wgrad_cooperative``: a storer warp) at 128x128, 256x128 and 128x256 (three stages,
  one output buffer); ``torch.bmm`` and the cuBLAS kernel it runs (torch.profiler).
- ``grouped_mm``: ``launch_wgrad`` as the backward runs it (the plan's tile, gathering) against
  ``F.grouped_mm`` on copy-fed operands, the copy that needs, max |diff| (expert by expert).
- ``chunks``: one chunk buffer per MMA warpgroup (``CONFIGS[1]`` / ``GATHER_CONFIGS[1]``) against
  two, in the backward's form (gathering at <= ``GATHER_MAX_ROWS`` rows per expert, copy-fed above),
  5 interleaved rounds, medians, bitwise.
"lib" / "ws2 (lib)" / "pp copy" are two chunk buffers, the library's choice at every shape when the
logs were taken; the plan takes one at hidden_size <= 2048 and Mixtral's size since, which
``grouped_mm``'s "ours" (the plan's tile) now runs at Qwen3-30B-A3B.
Answer (one H100, data/tuning/moe_wgrad_bound_h100_20261206/: scaling_chunks_h100.log,
cooperative_cublas_h100.log, grouped_mm_h100.log, wg_ab_h100.log): shared bandwidth. Without
stores (lab kernel, wrong sums) half the SMs take only 1.29x the time at DeepSeek-V3's
grad_gate_up_proj (6.37 -> 8.19 ms), 1.56x at Qwen3-30B-A3B (0.564 -> 0.878); the stores add 0.3 ms
at 30B (0.564 -> 0.869) and 3.1 ms at DeepSeek-V3 (6.37 -> 9.49), about the time of writing the
output alone (c.fill_: 0.248 and 4.57 ms). torch.bmm over equal groups (cuBLAS's
nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA: a 256x128 cooperative tile on a 2-CTA cluster,
multicast) takes 0.615-0.630 ms and 7.49-7.82 ms for the same grad_gate_up_proj products: 0.70-0.80x
the library's gathering kernel, 0.80-0.87x the copy-fed ping-pong (both gradients). The lab's
cooperative kernel at 256x128 or 128x256 (storer warp, one output buffer) takes 1.2-1.8x the
ping-pong's time (DeepSeek-V3 gu 13.8 / 16.3 ms against 9.2). torch's grouped_mm on copy-fed
operands is level with ours (0.92-1.13x our time, bitwise equal outputs) before the copy it needs
(0.12-0.40 ms). One chunk buffer per warpgroup: 0.96x / 1.00x at 30B (gu / dp), 0.97x / 0.99x at
Mixtral, 1.005-1.02x at Qwen3-235B-A22B and DeepSeek-V3, bitwise (the plan's choice since). So the
2-CTA multicast tile is what cuBLAS has and we lack; Gluon's TMA multicast needs triton >= 3.7 (the
GPU image has 3.6.0; see lab/swiglu_lab/experiments/multicast_wgrad.py).
Run: PYTHONPATH=src:lab python3 lab/probes/moe_wgrad_bound.py {scaling|cooperative|grouped_mm|chunks} [shape ...]
"""

import dataclasses
import statistics
import sys
from types import SimpleNamespace

import torch
import torch.nn.functional as F

import moe_probe as P  # beside this file
from swiglu.kernels import moe as M
from swiglu.kernels import moe_gluon_wgrad_pingpong as PP
from swiglu_lab.experiments import moe_gluon_wgrad_cooperative as C
from swiglu_lab.experiments import moe_wgrad_hostdesc as D

T = 8192
ROLES = ("gu", "dp")  # grad_gate_up_proj [E, 2I, H], grad_down_proj [E, H, I]
# The cooperative kernel's tiles (default maxnreg: 232 fails with its 384 threads).
COOP = {
    "coop 128x128": C.CONFIG,
    "coop 256x128 s3": dataclasses.replace(C.CONFIG, BM=256, BN=128, STAGES=3, NC=1),
    "coop 128x256 s3": dataclasses.replace(C.CONFIG, BM=128, BN=256, STAGES=3, NC=1),
}


def shape_case(name):
    """Shape ``name`` at T tokens: its routing, the backward's operands (grad of gate_up ``dgu`` and
    ``hw`` = h * w, random; x and grad_out ``go``) and the two gradients' output shapes. The expert
    weights themselves are dropped (DeepSeek-V3's gate_up_proj is 15 GB)."""
    H, I, E, k, S, x, idx, w, gu, dp, go = P.case(name, T)
    out, dtype = {"gu": gu.shape, "dp": dp.shape}, gu.dtype
    del gu, dp
    r = M.Routing(idx, E)
    dgu = torch.randn(S, 2 * I, device="cuda").bfloat16()
    hw = torch.randn(S, I, device="cuda").bfloat16()
    return SimpleNamespace(name=name, H=H, I=I, E=E, k=k, S=S, x=x, go=go, r=r, dgu=dgu, hw=hw, out=out, dtype=dtype)


def operands(s, role, gather):
    """(a, b) of gradient ``role`` (c[e] = a_e^T @ b_e), its token rows (x's for gu, grad_out's for dp)
    as ``TokenRows`` where ``gather`` (the gathering launchers read them in place), else copied into
    expert order."""
    src = s.x if role == "gu" else s.go
    rows = M.TokenRows(src, s.k) if gather else M.gather_rows(src, s.r, s.k)
    return (s.dgu, rows) if role == "gu" else (rows, s.hw)


def poisoned(c, launch):
    """What ``launch`` writes into a NaN-filled c (a copy: the reference)."""
    c.fill_(float("nan"))
    launch()
    return c.clone()


def matches(c, want, launch, *what):
    """Whether ``launch`` writes exactly ``want`` into a NaN-filled c; None where it fails (printed)."""
    c.fill_(float("nan"))
    try:
        launch()
        torch.cuda.synchronize()
        return torch.equal(c, want)
    except Exception as e:
        print("fail", *what, type(e).__name__, str(e)[:300], flush=True)
        return None


def bmm_equal_groups(c, a, b, s):
    """torch.bmm into c over E equal groups of S // E rows of copy-fed a and b (no routing)."""
    g, E = s.S // s.E, s.E
    return lambda: torch.bmm(a[: g * E].view(E, g, -1).mT, b[: g * E].view(E, g, -1), out=c)


def cuda_kernels(fn):
    """Names of the CUDA kernels (and memsets) one call of fn runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}


def max_abs(t, minus=None):
    """max |t - minus| (or |t|), expert by expert: a float copy of all of it would not fit."""
    return max((t[e].float() - (0 if minus is None else minus[e].float())).abs().max().item() for e in range(t.shape[0]))


def scaling(s, role, c):
    sms = torch.cuda.get_device_properties(c.device).multi_processor_count
    a, b = operands(s, role, gather=True)

    def lib(cfg=PP.GATHER_CONFIGS[2], n=None):
        PP.launch_moe_wgrad_gather(c, a, b, s.r, cfg=cfg, num_programs=n)

    want = poisoned(c, lib)
    row = {"shape": s.name, "grad": role}
    for label, n in (("lib", None), ("lib half SMs", sms // 2)):
        row[label] = P.kernel_ms(lambda n=n: lib(n=n))
    for st, ws in ((3, 3), (3, 2), (4, 1)):
        cfg = dataclasses.replace(PP.GATHER_CONFIGS[2], STAGES=st, wg_store=ws)
        ok = matches(c, want, lambda cfg=cfg: lib(cfg), st, ws)
        row[f"st{st} ws{ws}"] = float("nan") if ok is None else P.kernel_ms(lambda cfg=cfg: lib(cfg))
        row[f"st{st} ws{ws} bitwise"] = ok
    del want
    for label, n in (("no stores *", None), ("no stores * half SMs", sms // 2)):
        row[label] = P.kernel_ms(lambda n=n: D.launch(c, a, b, s.r, host=1, store=False, num_programs=n))
    row["fill c"] = P.kernel_ms(lambda: c.fill_(0.0))
    row["bmm equal groups"] = P.kernel_ms(bmm_equal_groups(c, *operands(s, role, gather=False), s))
    row["GB out"] = c.numel() * 2 / 1e9
    row["TFLOP"] = 2 * s.S * c.shape[1] * c.shape[2] / 1e12
    return row


def cooperative(s, role, c):
    a, b = operands(s, role, gather=False)
    want = poisoned(c, lambda: PP.launch_moe_wgrad_pingpong(c, a, b, s.r.expert_start, PP.CONFIGS[2]))
    row = {"shape": s.name, "grad": role}
    row["pp copy"] = P.kernel_ms(lambda: PP.launch_moe_wgrad_pingpong(c, a, b, s.r.expert_start, PP.CONFIGS[2]))
    for label, cfg in COOP.items():
        coop = lambda cfg=cfg: C.launch_moe_wgrad_gluon(c, a, b, s.r.expert_start, cfg)
        ok = matches(c, want, coop, label)
        row[label] = float("nan") if ok is None else P.kernel_ms(coop)
        row[label + " ok"] = ok
    del want
    bmm = bmm_equal_groups(c, a, b, s)
    row["bmm"] = P.kernel_ms(bmm)
    print(s.name, role, "bmm kernels:", cuda_kernels(bmm), flush=True)
    return row


def grouped_mm(s, role, c):
    gmm = getattr(F, "grouped_mm", None) or torch._grouped_mm
    tile = getattr(M.moe_plan(s.S, s.E, s.H, s.I, True), "wgrad_" + role)
    a, b = operands(s, role, gather=True)
    M.launch_wgrad(c, a, b, s.r, tile)
    ours = c.clone()
    A, B = operands(s, role, gather=False)
    offs = s.r.expert_start[1:].to(torch.int32)
    ref = gmm(A.t(), B, offs=offs)
    diff, top = max_abs(ref, ours), max_abs(ours)
    del ref, ours
    src = s.x if role == "gu" else s.go
    return {
        "shape": s.name,
        "grad": role,
        "ours": P.kernel_ms(lambda: M.launch_wgrad(c, a, b, s.r, tile)),
        "grouped_mm copy-fed": P.kernel_ms(lambda: gmm(A.t(), B, offs=offs)),
        "gather copy": P.kernel_ms(lambda: M.gather_rows(src, s.r, s.k)),
        "max |diff|": diff,
        "max |ours|": top,
    }


def chunks(s, role, c):
    gather = s.S <= PP.GATHER_MAX_ROWS * s.E
    a, b = operands(s, role, gather)
    if gather:
        configs, run = PP.GATHER_CONFIGS, lambda cfg: PP.launch_moe_wgrad_gather(c, a, b, s.r, cfg=cfg)
    else:
        configs, run = PP.CONFIGS, lambda cfg: PP.launch_moe_wgrad_pingpong(c, a, b, s.r.expert_start, cfg=cfg)
    cfgs = {"ws2 (lib)": configs[2], "ws1": configs[1]}
    want = poisoned(c, lambda: run(cfgs["ws2 (lib)"]))
    ok = all([matches(c, want, lambda cfg=cfg: run(cfg), label) for label, cfg in cfgs.items()])
    del want
    times = {label: [] for label in cfgs}
    for _ in range(5):
        for label, cfg in cfgs.items():
            times[label].append(P.kernel_ms(lambda cfg=cfg: run(cfg), rep=30))
    row = {"shape": s.name, "grad": role, "form": "gather" if gather else "copy"}
    row |= {label: statistics.median(t) for label, t in times.items()}
    row["ws1 / ws2"] = row["ws1"] / row["ws2 (lib)"]
    row["bitwise"] = ok
    return row


# subcommand: (one gradient's row, default shapes)
COMMANDS = {
    "scaling": (scaling, ["qwen3-30b", "deepseek-v3"]),
    "cooperative": (cooperative, ["qwen3-30b", "deepseek-v3"]),
    "grouped_mm": (grouped_mm, ["qwen3-30b", "qwen3-235b", "deepseek-v3"]),
    "chunks": (chunks, ["qwen3-30b", "qwen3-235b", "deepseek-v3", "mixtral"]),
}


def table(rows):
    if rows:
        print("\n| " + " | ".join(rows[0]) + " |")
        print("|" + "---|" * len(rows[0]))
        for row in rows:
            print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()) + " |")


def each_shape(names, body):
    """``body``'s row for both gradients of each shape, printed as they come and as a table at the
    end (also after a failure); one output at a time, the cache emptied after each."""
    rows = []
    try:
        for name in names:
            s = shape_case(name)
            for role in ROLES:
                c = torch.empty(s.out[role], device="cuda", dtype=s.dtype)
                row = body(s, role, c)
                del c
                torch.cuda.empty_cache()
                rows.append(row)
                print(row, flush=True)
            del s
            torch.cuda.empty_cache()
    finally:
        table(rows)


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(COMMANDS)}}} [shape ...]")
    body, defaults = COMMANDS[sys.argv[1]]
    if body is grouped_mm:
        print("F.grouped_mm public:", hasattr(F, "grouped_mm"), torch.__version__)
    each_shape(sys.argv[2:] or defaults, body)


if __name__ == "__main__":
    main()
