"""Time each Triton kernel of the backward alone, per candidate configuration, against cuBLAS.

Run on the GPU:  PYTHONPATH=src:lab python3 scripts/tune_kernels.py --tokens 256,4096 --out $OUT
For every token count and kernel it checks the kernel's output against PyTorch (cuBLAS) on the
same inputs (relative Frobenius error of the difference) and times it with
``triton.testing.do_bench`` (median; do_bench zeroes a 256 MB buffer before each rep, which
flushes L2). Writes ``tuning.csv`` to --out and prints a table. The chosen configurations go
into ``backward_configs.json`` with the time that chose them (``--write-best``, through ``swiglu_lab.bench.tables``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
import traceback
from dataclasses import asdict

import torch
import triton
from triton.testing import do_bench

from swiglu import make_inputs
from swiglu_lab.bench.tables import backward_table
from swiglu.kernels.backward import TUNED_CONFIGS_PATH, KernelConfig, launch_dswiglu, launch_grad_x
from swiglu_lab.bench.tp import launch_mlp_grad_weights

K = KernelConfig
# The winners behind tuned_configs.json and their nearest rivals, for a re-run after a kernel
# change. Every round's candidates and times: data/tuning/ (NOTES.md summarizes them). Round 6 tried
# a resident-A weight-gradient kernel for T <= 256 (whole K in one tile, commit 2b88070): 1.94 ms
# against 2.02 at T = 128 and 3.3-4.7 ms against 3.05 at T = 256 (run6b), so it was not kept.
CANDIDATES = {
    "dswiglu": [
        K(128, 256, 64, 32, 4, 3, 8, flatten=True),
        K(128, 256, 64, 8, 4, 3, 8),
        K(128, 256, 64, 8, 4, 3, 8, warp_specialize=True, flatten=True),
        K(128, 128, 64, 8, 2, 4, 8),
    ],
    "grad_weights": [
        K(128, 256, 64, 32, 2, 3, 8, flatten=True),
        K(128, 256, 64, 32, 2, 3, 8, warp_specialize=True, flatten=True),
        K(128, 256, 64, 16, 2, 3, 8, flatten=True),
        K(128, 256, 64, 16, 2, 3, 8),
    ],
    "grad_x": [
        # 128-wide tiles: at H = 4096 and T = 512 the 128x256 tiles are 64 for 132 SMs.
        K(64, 128, 64, 8, 1, 4, 4),
        K(128, 128, 64, 8, 2, 4, 8),
        K(64, 256, 64, 8, 1, 4, 4),
        K(128, 256, 64, 8, 2, 3, 8),
        K(128, 256, 64, 8, 2, 3, 8, warp_specialize=True),
        K(128, 256, 64, 8, 2, 3, 8, flatten=True),
    ],
}


def measure_ceilings() -> list[dict]:
    """Memory ceilings this run's numbers are read against: write-only (fill), read-only (sum)
    and copy bandwidth over 4 GiB, GB/s counting every byte moved."""
    n = 1 << 31  # bf16 elements: 4 GiB
    a = torch.empty(n, device="cuda", dtype=torch.bfloat16).normal_()
    b = torch.empty_like(a)
    rows = []
    for name, fn, nbytes in (
        ("write (fill_)", lambda: b.fill_(1.0), 2 * n),
        ("read (sum)", lambda: a.sum(), 2 * n),
        ("copy", lambda: b.copy_(a), 4 * n),
    ):
        ms = do_bench(fn, rep=200, return_mode="median")
        rows.append(
            dict(
                tokens=0,
                kernel="ceiling",
                config=name,
                config_dict={},
                cublas_ms=ms,
                ms=ms,
                tflops=float("nan"),
                err=0.0,
                compile_s=0.0,
                note=f"{nbytes / ms / 1e6:.0f} GB/s",
            )
        )
        print(rows[-1], flush=True)
    a = b = None  # freed (the timed lambdas close over the names)
    torch.cuda.empty_cache()
    return rows


def write_best(rows: list[dict], path: str) -> None:
    """Fastest correct config per kernel and token bucket merged into the table at ``path`` (or
    the package's when ``path`` does not exist yet): ``swiglu_lab.bench.tables.backward_table``."""
    utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open(path if os.path.exists(path) else TUNED_CONFIGS_PATH) as f:
        old = json.load(f)
    meta = dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        utc=utc,
        protocol="scripts/tune_kernels.py: triton.testing.do_bench median, L2 flushed by do_bench",
    )
    with open(path, "w") as f:
        json.dump(backward_table(rows, old, meta), f, indent=1)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="256,1024,4096")
    ap.add_argument("--kernels", default="dswiglu,grad_weights,grad_x")
    ap.add_argument("--hidden-size", type=int, default=16384)
    ap.add_argument("--intermediate-size", type=int, default=53248)
    ap.add_argument("--rep", type=int, default=200, help="do_bench rep (ms)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument(
        "--write-best",
        default=None,
        help="write the fastest correct config per kernel and "
        "token bucket to this JSON (the format of swiglu/kernels/backward_configs.json)",
    )
    ap.add_argument("--ceilings", action="store_true", help="also measure write/read/copy bandwidth first")
    args = ap.parse_args(argv)
    H, I = args.hidden_size, args.intermediate_size
    rows = measure_ceilings() if args.ceilings else []
    for T in [int(t) for t in args.tokens.split(",")]:
        inp = make_inputs(1, T, H, I, device="cuda", seed=T)
        go, x = inp.grad_output.view(T, H), inp.x.view(T, H)
        gate, up, act = (t.view(T, I) for t in (inp.gate_output, inp.up_output, inp.activated_gate))
        gw, uw, dw = inp.gate_weight, inp.up_weight, inp.down_weight
        # PyTorch intermediates for the per-kernel checks (reference order of operations).
        g = go @ dw
        h_ref = act * up
        d_up_ref = g * act
        s = torch.sigmoid(gate.float())
        d_gate_ref = ((g * up).float() * s * (1 + gate * (1 - s))).to(torch.bfloat16)
        del g, s
        flops = 2 * T * H * I
        for kernel in args.kernels.split(","):
            if kernel == "dswiglu":
                outs = [torch.empty_like(gate) for _ in range(3)]
                refs = [d_gate_ref, d_up_ref, h_ref]
                run = lambda c: launch_dswiglu(go, dw, gate, up, act, *outs, c)  # noqa: E731
                cublas = lambda: go @ dw  # noqa: E731
                kflops = flops
            elif kernel == "grad_weights":
                outs = [torch.empty_like(gw), torch.empty_like(uw), torch.empty_like(dw)]
                refs = [d_gate_ref.t() @ x, d_up_ref.t() @ x, go.t() @ h_ref]

                run = lambda c: launch_mlp_grad_weights(d_gate_ref, d_up_ref, h_ref, x, go, *outs, c)  # noqa: E731
                cublas = lambda: (d_gate_ref.t() @ x, d_up_ref.t() @ x, go.t() @ h_ref)  # noqa: E731
                kflops = 3 * flops
            else:
                outs = [torch.empty((T, H), device="cuda", dtype=torch.bfloat16)]
                refs = [d_gate_ref @ gw + d_up_ref @ uw]
                run = lambda c: launch_grad_x(d_gate_ref, d_up_ref, gw, uw, outs[0], c)  # noqa: E731
                cublas = lambda: (d_gate_ref @ gw, d_up_ref @ uw)  # noqa: E731
                kflops = 2 * flops
            ms = cublas_ms = do_bench(cublas, rep=args.rep, return_mode="median")
            rows.append(
                dict(
                    tokens=T,
                    kernel=kernel,
                    config="cublas",
                    config_dict={},
                    cublas_ms=ms,
                    ms=ms,
                    tflops=kflops / ms / 1e9,
                    err=0.0,
                    compile_s=0.0,
                    note="",
                )
            )
            for c in CANDIDATES[kernel]:
                row = dict(
                    tokens=T, kernel=kernel, config=str(tuple(asdict(c).values())), config_dict=asdict(c), cublas_ms=cublas_ms
                )
                try:
                    for o in outs:
                        o.fill_(float("nan"))
                    t0 = time.time()
                    run(c)
                    torch.cuda.synchronize()
                    row["compile_s"] = time.time() - t0
                    row["err"] = max(rel(o, r) for o, r in zip(outs, refs))
                    ms = do_bench(lambda: run(c), rep=args.rep, return_mode="median")
                    row.update(ms=ms, tflops=kflops / ms / 1e9, note="")
                except Exception as e:  # record and go on: one bad config must not end the sweep
                    row.update(
                        ms=float("nan"),
                        tflops=float("nan"),
                        err=float("nan"),
                        compile_s=float("nan"),
                        note=f"{type(e).__name__}: {str(e)[:200]}",
                    )
                    traceback.print_exc(limit=2)
                rows.append(row)
                print(row, flush=True)
        inp = go = x = gate = up = act = gw = uw = dw = d_gate_ref = d_up_ref = h_ref = None  # freed (closures use the names)
        torch.cuda.empty_cache()
    if args.write_best:
        write_best(rows, args.write_best)
    path = os.path.join(args.out, "tuning.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    print(f"\n{'T':>6} {'kernel':<13} {'config':<52} {'ms':>8} {'TFLOP/s':>8} {'err':>8} note", file=sys.stderr)
    for r in rows:
        print(
            f"{r['tokens']:>6} {r['kernel']:<13} {r['config']:<52} {r['ms']:>8.3f} {r['tflops']:>8.1f} "
            f"{r['err']:>8.1e} {r['note'][:60]}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
