"""Run one weight gradient ``out = a.T @ b`` at Hermes size (a [T, I], b [T, H]) a few times, so that
Nsight Compute can read one launch of it: the Gluon kernel with the table's config at T, a named
tile (``--tile "128x256x32 S4 NC2"``, cooperative) or cuBLAS (``--tile cublas``). The first call
compiles, the later ones are profiled with ``--launch-skip 1``. GPU only.

    ncu --clock-control none -k regex:wgrad_kernel --launch-skip 1 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats --export build/ncu/ours \\
        python3 scripts/ncu_wgrad.py --tokens 1024 --tile table
    ncu --clock-control none -k regex:nvjet --launch-skip 1 --launch-count 1 ... --tile cublas

Profiles taken this way: data/profiles/ (its README has the table and the command per file).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> None:
    import torch

    from swiglu.kernels import backward

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--hidden-size", type=int, default=16384)
    ap.add_argument("--intermediate-size", type=int, default=53248)
    ap.add_argument(
        "--tile",
        default="table",
        help='"table", "cublas", "BMxBNxBK S<stages> NC<buffers>" or '
        '"resident:I" (swiglu_lab.experiments.gluon_wgrad_resident.RESIDENT_CANDIDATES[I])',
    )
    ap.add_argument("--calls", type=int, default=2)
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    T, M, N = args.tokens, args.intermediate_size, args.hidden_size
    a = torch.randn(T, M, device=dev, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(T, N, device=dev, dtype=torch.bfloat16, generator=gen)
    out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    if args.tile == "cublas":
        run = lambda: torch.matmul(a.T, b, out=out)  # noqa: E731
    else:
        cfg = backward.gluon_config_for(T, dev)
        if cfg is None:
            raise SystemExit(f"no Gluon weight-gradient config at T = {T} on this device")
        if args.tile.startswith("resident:"):
            from swiglu_lab.experiments.gluon_wgrad_resident import RESIDENT_CANDIDATES

            cfg = RESIDENT_CANDIDATES[int(args.tile.partition(":")[2])]
        elif args.tile != "table":
            from swiglu_lab.bench.tables import parse_tile

            cfg = replace(parse_tile(args.tile, cfg), pingpong=False, BN2=0)
        nprog = backward.tile_programs(dev, M, N, cfg)
        print(f"T = {T}: {cfg}, {nprog} programs")
        run = lambda: backward.launch_grad_weight_gluon_or_tl(a, b, out, None, cfg, nprog)  # noqa: E731
    for _ in range(args.calls):
        run()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
