"""How many MMA rows beyond the routed rows do the MoE kernels' tiles issue, per shape, at 8192 tokens?

An expert's rows end inside its last M tile (the up and down projections, dSwiGLU, grad_x) and
inside its last k-step (the weight gradients, K = the expert's rows); bmm over equal groups, the
GEMM floor the issue's targets were set against, pays neither. Counted on the CPU, balanced routing
as the bench draws it (softmax of random logits, top-k, seed 0), with the plan's M tiles
(``moe_plan(..., gluon=True)``: BM, half tiles; where the plan runs the Gluon dSwiGLU kernel, its own
128-row M tile) and the ping-pong weight gradients' BK of 64.

Answer (this script's output, recorded in data/tuning/moe_wgrad_bound_h100_20261206/tile_waste.log;
the first record, data/tuning/moe_wgrad_desc_20261206/tile_waste.log, counted the tl kernel's
64-row tile for dSwiGLU where the Gluon kernel runs with 128): issued / routed MMA rows over the
backward's FLOPs (dSwiGLU 2, grad_x 4, weight gradients 6 of 12 N*H*I): Qwen3-30B-A3B 1.064x
(512 +- 21 rows per expert), Qwen3-235B-A22B 1.076x (its Gluon dSwiGLU 1.131x), DeepSeek-V3 1.148x
(256 +- 16: dSwiGLU and the up projection 1.254x, the others 1.127x), Mixtral 1.018x. So the H200's
419 TFLOP/s of routed work at DeepSeek-V3 is ~481 of issued MMAs.
Run: PYTHONPATH=src:lab python3 lab/probes/moe_tile_waste.py (no GPU)
"""

import math

import torch

from swiglu.kernels import moe_gluon_dswiglu, moe_gluon_wgrad_pingpong
from swiglu.kernels.moe import moe_plan

SHAPES = {  # H, I, E, top-k (moe_probe.SHAPES; that module needs a GPU)
    "qwen3-30b": (2048, 768, 128, 8),
    "qwen3-235b": (4096, 1536, 128, 8),
    "deepseek-v3": (7168, 2048, 256, 8),
    "mixtral": (4096, 14336, 8, 2),
}
T = 8192
WGRAD_BK = moe_gluon_wgrad_pingpong.CONFIG.BK  # the ping-pong weight gradients' k-step


def m_rows(counts: torch.Tensor, bm: int, half: bool) -> float:
    """MMA rows the M-tiled kernels issue for these experts' row counts."""
    full = torch.div(counts, bm, rounding_mode="floor")
    rem = counts - full * bm
    last = torch.where(rem == 0, 0, torch.where((rem <= bm // 2) & half, bm // 2, bm))
    return float((full * bm + last).sum())


def main() -> None:
    print("| shape | rows per expert | dSwiGLU | grad_x | weight gradients | backward (FLOP-weighted) | up | down |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (H, I, E, k) in SHAPES.items():
        g = torch.Generator().manual_seed(0)
        idx = torch.randn(T, E, generator=g).softmax(-1).topk(k).indices
        counts = torch.bincount(idx.flatten(), minlength=E)
        S = int(counts.sum())
        plan = moe_plan(S, E, H, I, gluon=True)
        r = {
            n: m_rows(counts, t.BM, t.HALF) / S
            for n, t in (("dswiglu", plan.dswiglu), ("grad_x", plan.grad_x), ("up", plan.up), ("down", plan.down))
        }
        if plan.dswiglu.GLUON:  # the Gluon dSwiGLU kernel's own M tile (no half tiles), not the tl tile's
            r["dswiglu"] = m_rows(counts, moe_gluon_dswiglu.CONFIG.BM, False) / S
        r["wgrad"] = float((counts.div(WGRAD_BK).ceil().clamp(min=1) * WGRAD_BK).sum()) / S
        bwd = (2 * r["dswiglu"] + 4 * r["grad_x"] + 6 * r["wgrad"]) / 12
        c = counts.double()
        print(
            f"| {name} | {c.mean():.0f} +- {c.std():.0f} | {r['dswiglu']:.3f} | {r['grad_x']:.3f} | {r['wgrad']:.3f} | "
            f"{bwd:.3f} | {r['up']:.3f} | {r['down']:.3f} |"
        )
        assert math.isfinite(bwd)


if __name__ == "__main__":
    main()
