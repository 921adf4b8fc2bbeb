"""Does the weight-gradient kernels' tile order set their write rate at small T? One weight
gradient ``out = a.T @ b`` (a [T, M], b [T, N], out [M, N] bf16) at Hermes size, both
orientations, with the table's config and the same config at other GROUP_M (GROUP_M = 1: tiles in
row-major order, so the programs running at once write whole rows of ``out``), Gluon and tl
kernels, beside cuBLAS and ``out.fill_`` (the write ceiling at that size). 256 MB L2 flush before
each call, CUDA events, median of ``--iters``; every result checked against cuBLAS.

Answer (data/tuning/wgrad_order_*.csv, docs/kernels.md): no; a row-major order (GROUP_M 1)
was slower at every T; other GROUP_M were within the spread of two machines.

    python lab/probes/probe_wgrad_order.py --out build/probe   # GPU only, about a minute
"""

from __future__ import annotations

import argparse
import csv
import statistics
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO / "build" / "probe"))
    p.add_argument("--tokens", default="128,256,512,1024")
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--group-m", default="table,8,1", help="GROUP_M values to try ('table': the table's)")
    p.add_argument("--kernels", default="tl,gluon")
    args = p.parse_args(argv)

    import torch

    from swiglu.kernels import backward

    H, I = 16384, 53248
    dev = torch.device("cuda", torch.cuda.current_device())
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)

    def timed(fn) -> float:
        fn()
        times = []
        for _ in range(args.iters):
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        return statistics.median(times)

    rows = []
    for T in [int(t) for t in args.tokens.split(",")]:
        gen = torch.Generator(device=dev).manual_seed(T)
        for M, N in ((I, H), (H, I)):
            a = torch.randn(T, M, device=dev, dtype=torch.bfloat16, generator=gen)
            b = torch.randn(T, N, device=dev, dtype=torch.bfloat16, generator=gen)
            out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
            want = a.T @ b
            gb = M * N * 2 / 1e9
            base = dict(T=T, M=M, N=N)
            ms = timed(lambda: torch.matmul(a.T, b, out=out))
            rows.append(dict(base, kernel="cublas", config="", GROUP_M="", ms=ms, write_tbps=gb / ms, ok=True))
            ms = timed(lambda: out.fill_(1.0))
            rows.append(dict(base, kernel="fill_", config="", GROUP_M="", ms=ms, write_tbps=gb / ms, ok=True))
            tl = backward.config_for("grad_weights", T)
            g = backward.gluon_config_for(T, dev)

            def group_ms(table_value):
                return [table_value if v == "table" else int(v) for v in args.group_m.split(",")]

            variants = []
            if "tl" in args.kernels:
                variants += [("tl", replace(tl, GROUP_M=gm), None) for gm in group_ms(tl.GROUP_M)]
            if g is not None and "gluon" in args.kernels:
                variants += [("gluon", tl, replace(g, GROUP_M=gm)) for gm in group_ms(g.GROUP_M)]
            for kernel, c, gc in variants:
                out.fill_(float("nan"))
                try:
                    backward.launch_grad_weight_gluon_or_tl(a, b, out, c, gc)
                    torch.cuda.synchronize()
                    ok = bool(((out.float() - want.float()).abs() <= want.float().abs() * 2**-6 + 1e-2).all())
                    ms = timed(lambda: backward.launch_grad_weight_gluon_or_tl(a, b, out, c, gc))
                except Exception as exc:  # one failing variant must not end the probe
                    print(f"T={T} {kernel} GROUP_M={(gc or c).GROUP_M}: {type(exc).__name__}: {exc}", flush=True)
                    ok, ms = False, float("nan")
                rows.append(
                    dict(base, kernel=kernel, config=str(gc or c), GROUP_M=(gc or c).GROUP_M, ms=ms, write_tbps=gb / ms, ok=ok)
                )
            for r in rows[-len(variants) - 2 :]:
                print(
                    f"T={T} {M}x{N} {r['kernel']:6} G={r['GROUP_M']!s:3} {r['ms']:.4f} ms {r['write_tbps']:.2f} TB/s ok={r['ok']}",
                    flush=True,
                )
            a = b = out = want = None  # freed (the timed lambdas close over the names)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "wgrad_order.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
