"""Measure how the Triton backward (CPU interpreter) differs from the same-rounding reference, in
bf16 ulps, over the shapes the CPU tests use: the numbers behind tests/ulp_oracle.py's
ULP_LIMITS["cpu"]. Also shows what a 0.1% scaling of the fp32 result (before rounding) does to
the same statistics.

    PYTHONPATH=src:tests python scripts/measure_ulps.py [seeds per shape and mode, default 4]

About 3-4 minutes at 4 seeds on the 2-core CI machine. Prints the worst value of each statistic per
output, and for the scaled results the smallest off-fraction and |mean shift| / s.e. seen.
"""

import os
from dataclasses import replace
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

from swiglu import make_inputs  # noqa: E402
from swiglu.kernels.backward import triton_swiglu_backward  # noqa: E402
from ulp_oracle import NAMES, same_rounding_fp32, ulp_stats  # noqa: E402
from triton_checks import SMALL_CONFIGS  # noqa: E402

SHAPES = [
    (1, 7, 200, 344),
    (1, 211, 64, 136),
    (3, 37, 72, 200),
    (1, 1, 64, 128),
    (2, 64, 128, 64),
    (1, 100, 72, 136),
    (1, 77, 128, 264),
    (1, 129, 136, 72),
    (1, 17, 72, 136),
    (2, 19, 72, 136),
    (1, 1, 8, 8),
    (1, 2, 16, 24),
    (1, 65, 24, 16),
]


def z(s):
    return abs(s.mean_rel) / s.se_rel if s.se_rel > 0 else 0.0


def main(seeds: int) -> None:
    worst, planted = {}, {}
    for shape in SHAPES:
        for mode in ("benchmark", "forward"):
            for seed in range(seeds):
                inp = make_inputs(*shape, mode=mode, seed=1000 + seed)
                args = list(inp.as_tuple())
                if mode == "forward" and seed % 2:
                    args[4] = None  # the kernels recompute silu (the memory-lean path)
                configs = SMALL_CONFIGS if seed % 2 == 0 else {k: replace(c, EPI_SPLIT=1) for k, c in SMALL_CONFIGS.items()}
                got = triton_swiglu_backward(*args, configs=configs)
                sums, allowances = same_rounding_fp32(args)
                for name, g, f, a in zip(NAMES, got, sums, allowances):
                    ref = f.bfloat16()
                    s = ulp_stats(g, ref, a, f)
                    w = worst.setdefault(name, dict(max_ulps=0.0, max_excess=-1e9, off=0.0, gt1=0.0, z=0.0, unexplained=0.0))
                    w.update(
                        max_ulps=max(w["max_ulps"], s.max_ulps),
                        max_excess=max(w["max_excess"], s.max_excess_ulps),
                        off=max(w["off"], s.off_fraction),
                        gt1=max(w["gt1"], s.gt1_fraction),
                        z=max(w["z"], z(s)),
                        unexplained=max(w["unexplained"], s.unexplained_fraction),
                    )
                    for factor in (0.999, 1.001):
                        b = ulp_stats((f * factor).bfloat16(), ref, a, f)
                        p = planted.setdefault(
                            f"{name} x {factor}", dict(min_off=1.0, n_at_min_off=0, min_z=1e9, min_unexplained=1.0)
                        )
                        if b.off_fraction < p["min_off"]:
                            p.update(min_off=b.off_fraction, n_at_min_off=b.n)
                        p["min_z"] = min(p["min_z"], z(b))
                        p["min_unexplained"] = min(p["min_unexplained"], b.unexplained_fraction)
    print(f"{len(SHAPES) * 2 * seeds} runs per output")
    for table in (worst, planted):
        for k, v in table.items():
            print(f"{k:26s}", "  ".join(f"{a}={b:.3g}" for a, b in v.items()))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
