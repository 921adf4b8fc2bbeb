"""Can Gluon on triton >= 3.7 run a 2-CTA cluster tile with the shared operand TMA-multicast on
Hopper? One k-step of out[2*BM, BN] = A^T @ B per cluster: A [BK, 2*BM] split over the two CTAs
along M, B [BK, BN] held by both and loaded once per cluster with ``multicast=True``, each CTA's
wgmma on its half, a TMA store. The weight gradients' lever named in docs/kernels.md
("2-CTA clusters"): cuBLAS's and quack's kernels load one operand once per CTA pair.

Answer (data/validation/h200_multicast_probe_triton371_20261202.log, NOTES.md): yes; right
against float64 at 1, 8 and 132 clusters, multicast on and off, and the PTX has the multicast
load (``multicast::cluster``) and the 2-CTA cluster launch. Its kernel:
``swiglu_lab.experiments.multicast_tile``.

    python lab/probes/probe_multicast.py --compile-only   # any machine: compile for sm_90, check the PTX
    python lab/probes/probe_multicast.py                   # H200 with triton 3.7 (scripts/install_triton.sh)

The GPU run checks every output element against float64 at 1, 8 and 132 clusters, with
multicast on and off; the PTX check looks for the multicast TMA load and the cluster launch.
Exit status 1 on a wrong result or a missing instruction. Needs triton >= 3.7.
"""

from __future__ import annotations

import argparse
import sys

import triton

from swiglu_lab.experiments.multicast_tile import (
    BK,
    BM,
    BN,
    NUM_WARPS,
    PTX_NEEDS,
    compile_check,
    descriptors,
    multicast_tile_kernel,
    too_old,
)


def gpu_check() -> bool:
    """Run at 1, 8 and 132 clusters, multicast off and on; True when every result is right."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    ok = True
    for clusters in (1, 8, 132):
        M = 2 * BM * clusters
        a = torch.randn(BK, M, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(BK, BN, device="cuda", dtype=torch.bfloat16, generator=gen)
        ref = a.double().T @ b.double()
        for multicast in (False, True):
            c = torch.full((M, BN), float("nan"), device="cuda", dtype=torch.bfloat16)
            multicast_tile_kernel[(clusters,)](*descriptors(a, b, c, BM, BN, BK), multicast, num_warps=NUM_WARPS, num_ctas=2)
            torch.cuda.synchronize()
            # fp32 accumulation over K = 64, then one bf16 rounding: within one bf16 ulp of |ref|.
            err = (c.double() - ref).abs()
            bound = ref.abs() * 2.0**-8 + 1e-2
            right = not torch.isnan(c).any().item() and bool((err <= bound).all())
            ok &= right
            print(
                f"clusters {clusters:3d}, multicast {multicast!s:5}: max |err| {err.max().item():.3g} "
                f"(max |ref| {ref.abs().max().item():.3g}): {'right' if right else 'WRONG'}",
                flush=True,
            )
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compile-only", action="store_true", help="compile for sm_90 and check the PTX (no GPU)")
    args = p.parse_args(argv)
    if too_old():
        print(too_old())
        return 1
    missing = compile_check()
    print(
        f"triton {triton.__version__}: compiled for sm_90"
        + (f", PTX lacks {missing}" if missing else ", PTX has " + ", ".join(PTX_NEEDS))
    )
    if missing:
        return 1
    return 0 if args.compile_only or gpu_check() else 1


if __name__ == "__main__":
    sys.exit(main())
