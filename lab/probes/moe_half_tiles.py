"""Do half tiles (``Tile.HALF``: an expert's last M tile of at most BM / 2 rows run as a BM / 2
tile, so the MMAs skip the empty half) speed up the down projection and grad_x, and the whole
forward + backward, at each shape, 8192 tokens?

With balanced routing about half of the experts end in a tile of few rows (Qwen3-30B-A3B: ~512 ±
23 rows per expert against BM 128; DeepSeek-V3: ~256 ± 16), so a tenth to a fifth of the M tiles'
MMA work is on masked rows. The probe prints the share of half tiles, times the two
down-projection-shaped GEMMs alone (``launch_pairs``) and one forward + backward of the kernels
(``moe_forward`` + ``moe_backward``) with HALF off and on (do_bench, L2 flushed, the faster of two
medians timed A B then B A), and compares their outputs and gradients bitwise.
Answer (an H100, data/tuning/moe_half_tiles_h100_20261206/): bitwise everywhere; 10.5% of the M
tiles are half tiles at Qwen3-30B-A3B and Qwen3-235B-A22B, 20% at DeepSeek-V3, 3% at Mixtral. The
forward's down projection gains 1.6% (0.492 -> 0.484 ms), 7% (1.738 -> 1.620) and 3.3% (4.90 ->
4.74), Mixtral's loses 2% (2.73 -> 2.79); grad_x 0.3-2% (Mixtral 6.18 -> 5.70, within its runs'
spread); the whole forward + backward within the runs' spread (1.004x, 0.949x, 1.006x, 1.000x): the
down-projection-shaped kernels are not bound by their MMAs' rows alone (a tile's fill and its
scattered stores stay).
Run: PYTHONPATH=src:lab python3 lab/probes/moe_half_tiles.py [--rep=MS] [shape ...] (moe_probe.SHAPES)
"""

import dataclasses
import sys

import torch

import moe_probe as P  # beside this file
from swiglu.kernels import moe as kmoe

REP = next((int(a[6:]) for a in sys.argv[1:] if a.startswith("--rep=")), 200)


def with_half(plan, half: bool):
    return dataclasses.replace(
        plan, down=dataclasses.replace(plan.down, HALF=half), grad_x=dataclasses.replace(plan.grad_x, HALF=half)
    )


def ab(fns) -> list:
    ms = [float("inf")] * len(fns)
    for order in (range(len(fns)), reversed(range(len(fns)))):
        for j in order:
            ms[j] = min(ms[j], P.kernel_ms(fns[j], rep=REP))
    return ms


def measure(name: str) -> tuple:
    H, I, E, k, S, x, idx, w, gu, dp, go = P.case(name, 8192)
    base = kmoe.moe_plan(S, E, H, I, kmoe._gluon_here(x.device))
    plans = [with_half(base, False), with_half(base, True)]
    counts = torch.bincount(idx.reshape(-1), minlength=E)
    bm = base.down.BM
    rem = counts % bm
    half_share = ((rem > 0) & (rem <= bm // 2)).sum().item() / (-(-counts // bm)).sum().item()

    def step(plan):
        out, gate, up, r = kmoe.moe_forward(x, idx, w, gu, dp, plan)
        return (out, *kmoe.moe_backward(go, x, idx, w, gu, dp, gate, up, plan, r))

    ref = [t.cpu() for t in step(plans[0])]
    same = all(torch.equal(a.cpu(), b) for a, b in zip(step(plans[1]), ref))
    del ref
    out, gate, up, r = kmoe.moe_forward(x, idx, w, gu, dp, plans[0])
    h = torch.randn(S, I, device=x.device).bfloat16()
    dgu = torch.randn(S, 2 * I, device=x.device).bfloat16()
    y = torch.empty(S, H, device=x.device, dtype=torch.bfloat16)
    down = ab([lambda p=p: kmoe.launch_pairs(h, dp, r, w, y, p.down, True) for p in plans])
    grad_x = ab([lambda p=p: kmoe.launch_pairs(dgu, gu, r, w, y, p.grad_x, False) for p in plans])
    whole = ab([lambda p=p: step(p) for p in plans])
    return name, bm, half_share, *down, *grad_x, *whole, same


rows = []
for name in [a for a in sys.argv[1:] if not a.startswith("--")] or list(P.SHAPES):
    rows.append(measure(name))
    print(rows[-1], flush=True)
    torch.cuda.empty_cache()
print("\n| shape | BM | half tiles | down off / on ms | grad_x off / on ms | fwd+bwd off / on ms | on / off | bitwise |")
print("|---|---|---|---|---|---|---|---|")
for name, bm, share, d0, d1, g0, g1, a, b, same in rows:
    print(
        f"| {name} | {bm} | {share:.1%} | {d0:.3f} / {d1:.3f} | {g0:.3f} / {g1:.3f} | {a:.3f} / {b:.3f} | {b / a:.3f} | {same} |"
    )
