"""Pipelined 2-CTA cluster weight gradients with the shared operand TMA-multicast (Gluon, triton
>= 3.7), beside their twins without multicast, the library's 1-CTA Gluon kernel and cuBLAS.

Answer (data/validation/h200_multicast_wgrad_*_triton371_20261202.log,
data/tuning/multicast_wgrad_bn256_32d826e_triton371_20261202.log, docs/kernels.md "2-CTA clusters
with multicast"): right and bitwise its twins, but multicast is not the lever it was predicted to
be: 1.4% against its own twin at T = 128, 0-0.7% elsewhere, 2% with 256-wide tiles at T = 4096-8192.
Its kernels: ``swiglu_lab.experiments.multicast_wgrad``.

    out[M, N] = A^T @ B,  A [K, M] (d_gate: [T, I]), B [K, N] (x: [T, H]), Hermes' size, K = T.

Each program is a cluster of two CTAs on a [2*BM, BN] tile: A split along M, B held by both and
loaded once per cluster (``multicast=True``). A stage may be refilled only when both CTAs' wgmmas
have read it, so its free barrier counts two arrivals: this CTA's, and the peer's through inline
PTX (``mapa`` + ``mbarrier.arrive.shared::cluster``, as CUTLASS's ``ClusterBarrier::arrive``), at
the barrier's offset in shared memory, read from a first compile's PTX (Gluon 3.7 has no API
for either). Two kernels: ``multicast_wgrad_kernel``, one partition of two warpgroups per CTA, and
``multicast_wgrad_ws_kernel``, the library's warp-specialized 1-CTA kernel (TMA loader, two MMA
warpgroups, TMA storer) on the cluster tile, bitwise that kernel's output. Measured on the H200:
data/validation/h200_multicast_wgrad_*_triton371_20261202.log and docs/kernels.md.

    python lab/probes/probe_multicast_wgrad.py --compile-only   # any machine: both kernels for sm_90
    timeout 300 python lab/probes/probe_multicast_wgrad.py      # H200 + triton 3.7 (scripts/install_triton.sh)

GPU: each variant's first launch is announced before it runs (an outer ``timeout`` catches a
hang), checked close to cuBLAS, bitwise against its twin without multicast and (warp-specialized,
where the table's tile is the cluster's half) against the 1-CTA kernel, at ``--check-tokens`` and
``--tokens``; then at ``--tokens`` each runs back to back for ``--seconds`` per round (NVML clock
and power; ``swiglu_lab.bench.power``), ``--rounds`` rounds in turn, and a table is printed last.
Exit status 1 on a wrong result.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import triton

from swiglu_lab.experiments import multicast_wgrad as mw
from swiglu_lab.experiments.multicast_tile import descriptors, too_old

#: The 2-CTA variants by name: (warp-specialized, multicast settings, peer arrive). "ws:local"
#: is the warp-specialized kernel with no cross-CTA arrive at all (each CTA frees its own stages;
#: right without multicast only), the first step of a bisection when a variant hangs.
KINDS = {
    "ws": (True, (False, True), True),
    "plain": (False, (False, True), True),
    "ws:local": (True, (False,), False),
    "ws:peer": (True, (False,), True),
    "ws:multicast": (True, (True,), True),
}


def _two_cta_variants(a, b, like_out, clusters: int, kinds: tuple[str, ...]) -> dict:
    """label -> callable(out) for the 2-CTA kernels named in ``kinds`` (``KINDS``); the barrier
    offsets planned on a compile for ``like_out`` (an output of the right shape, not written)."""
    variants = {}
    for kind in kinds:
        ws, multicasts, peer = KINDS[kind]
        kernel = mw.multicast_wgrad_ws_kernel if ws else mw.multicast_wgrad_kernel
        opts = dict(num_warps=mw.NUM_WARPS, num_ctas=2, **(dict(maxnreg=mw.MAXNREG) if ws else {}))
        for multicast in multicasts:

            def ptx_of(consts, kernel=kernel, opts=opts):
                return kernel.warmup(*descriptors(a, b, like_out, mw.BM, mw.BN, mw.BK), **consts, grid=(clusters,), **opts).asm[
                    "ptx"
                ]

            consts = mw.planned(ptx_of, multicast, ws) if peer else dict(mw.constexprs(multicast, ws=ws), FREE_COUNT=1)
            label = (
                f"2-CTA{' WS' if ws else ''}{'' if peer else ' no peer arrive'} "
                f"{'multicast' if multicast else 'each CTA loads B'}"
            )
            variants[label] = (
                lambda k, c, o: lambda out: k[(clusters,)](*descriptors(a, b, out, mw.BM, mw.BN, mw.BK), **c, **o)
            )(kernel, consts, opts)
    return variants


def gpu_run(tokens: list[int], check_tokens: list[int], seconds: float, rounds: int, kinds: tuple[str, ...]) -> bool:
    """Every variant checked at ``check_tokens`` and ``tokens`` (close to cuBLAS, the multicast
    run bitwise its twin without, the warp-specialized one bitwise the library's 1-CTA kernel
    where the table's tile is the cluster's half), then timed sustained at ``tokens``."""
    import torch
    from probe_wgrad_power import sustained  # this folder's sustained-load timer

    from swiglu.kernels import backward
    from swiglu.kernels.gluon_wgrad import launch_grad_weight_gluon
    from swiglu_lab.bench.power import open_monitor

    dev = torch.device("cuda")
    monitor, why = open_monitor(dev, interval_s=0.01, min_window_s=0.0)
    print(why, flush=True)
    clusters = torch.cuda.get_device_properties(dev).multi_processor_count // 2
    gen = torch.Generator(device=dev).manual_seed(0)
    H, I = 16384, 53248
    ok = True
    rows = []
    for T in check_tokens + tokens:
        a = torch.randn(T, I, device=dev, dtype=torch.bfloat16, generator=gen)
        b = torch.randn(T, H, device=dev, dtype=torch.bfloat16, generator=gen)
        ref = torch.matmul(a.T, b)
        scale = ref.float().abs().max().item()
        variants = {"cublas": lambda o: torch.matmul(a.T, b, out=o)}  # noqa: B023 (used in this iteration)
        table = backward.gluon_config_for(T, dev)
        same_tile = table is not None and (table.BM, table.BN, table.BK) == (mw.BM, mw.BN, mw.BK) and not table.pingpong
        if table is not None:
            nprog = backward.tile_programs(dev, I, H, table)
            variants["1-CTA table"] = lambda o, c=table, n=nprog: launch_grad_weight_gluon(a, b, o, c, n)  # noqa: B023
        else:  # the table's tl kernel there (T >= 4097), as the baseline
            tl_cfg = backward.config_for("grad_weights", T)
            variants["1-CTA table"] = lambda o, c=tl_cfg: backward.launch_grad_weight(a, b, o, c)  # noqa: B023
        variants.update(_two_cta_variants(a, b, ref, clusters, kinds))
        outs = {}
        for label, fn in variants.items():
            o = torch.full_like(ref, float("nan"))
            print(f"T = {T}, {label}: first launch ...", flush=True)
            t0 = time.time()
            fn(o)
            torch.cuda.synchronize()
            close = bool(torch.allclose(o.float(), ref.float(), rtol=2e-2, atol=2e-2 * scale))
            twin = label.replace("multicast", "each CTA loads B")
            same = bool(torch.equal(o, outs[twin][1])) if twin != label and twin in outs else None
            same_1cta = bool(torch.equal(o, outs["1-CTA table"][1])) if "WS" in label and same_tile else None
            ok &= close and same is not False and same_1cta is not False
            print(
                f"   returned in {time.time() - t0:.1f} s; close to cuBLAS {close}; bitwise its twin without "
                f"multicast {same}; bitwise the 1-CTA table kernel {same_1cta}",
                flush=True,
            )
            outs[label] = (fn, o)
        if T not in tokens:
            continue
        times = {label: [] for label in outs}
        for r in range(rounds):
            for label, (fn, o) in outs.items():
                n = max(3, int(seconds * 1e3 / (2.9 * T / 1024 + 0.3)))
                ms, power = sustained(lambda: fn(o), n, monitor)  # noqa: B023 (called at once)
                times[label].append((ms, power.get("sm_clock_mhz"), power.get("power_w")))
        for label, got in times.items():
            row = dict(
                T=T,
                variant=label,
                ms=statistics.median(x[0] for x in got),
                sm_clock_mhz=statistics.mean(x[1] or 0 for x in got),
                power_w=statistics.mean(x[2] or 0 for x in got),
            )
            rows.append(row)
    print("\n| T | variant | ms per call | SM MHz | W | / 1-CTA table |\n|---|---|---:|---:|---:|---:|")
    for row in rows:
        base = next((r["ms"] for r in rows if r["T"] == row["T"] and r["variant"] == "1-CTA table"), None)
        rel = f"{row['ms'] / base:.3f}" if base else ""
        print(f"| {row['T']} | {row['variant']} | {row['ms']:.4f} | {row['sm_clock_mhz']:.0f} | {row['power_w']:.0f} | {rel} |")
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--tokens", default="128,256,1024,2048", help="checked and timed")
    p.add_argument("--check-tokens", default="1,77,300", help="checked only (odd K: TMA's zero fill)")
    p.add_argument("--kernels", default="ws", help=f"2-CTA kernels, comma-separated: {', '.join(KINDS)}; or both (ws,plain)")
    p.add_argument("--nc", type=int, default=mw.NC, help="the warp-specialized kernel's output buffers")
    p.add_argument("--bn", type=int, default=mw.BN, help="each CTA's tile columns (the multicast operand's width)")
    p.add_argument("--stages", type=int, default=mw.STAGES, help="operand ring stages")
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if too_old():
        print(too_old())
        return 1
    mw.NC, mw.BN, mw.STAGES = args.nc, args.bn, args.stages  # read by the kernels' helpers at call time
    kinds = ("ws", "plain") if args.kernels == "both" else tuple(args.kernels.split(","))
    if set(kinds) - set(KINDS):
        p.error(f"--kernels: {sorted(set(kinds) - set(KINDS))} not among {sorted(KINDS)} or both")
    if args.compile_only:
        for ws in (False, True):
            ptx = mw.compile_check(ws)
            print(
                f"triton {triton.__version__}, {'warp-specialized' if ws else 'one partition'}: both passes compiled "
                f"for sm_90; multicast load {'multicast::cluster' in ptx}, peer arrive "
                f"{'mbarrier.arrive.shared::cluster' in ptx}"
            )
        return 0
    ints = [int(t) for t in args.tokens.split(",")], [int(t) for t in args.check_tokens.split(",") if t]
    return 0 if gpu_run(*ints, args.seconds, args.rounds, kinds) else 1


if __name__ == "__main__":
    sys.exit(main())
