"""Whole-backward time with the dSwiGLU kernel the table dispatches (Gluon where it has an entry)
against the same backward with the tl dSwiGLU kernel, at model shapes other than the table's
(Hermes) one: does the per-bucket choice hold for them? Same process, alternating, 256 MB L2
flush before every call, CUDA events, median of ``--iters``.

Answer (data/tuning/dswiglu_dispatch_186a437.csv, docs/kernels.md): it holds; the whole backward
with the table's choice is 1.06-1.07x as fast at Llama-3-8B layers (T = 512-8192), 1.04x at
Llama-3-70B's (T = 2048), 1.02-1.05x at Hermes'.

    python lab/probes/probe_dswiglu_dispatch.py --out build/probe   # GPU only, about a minute
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SHAPES = [
    (4096, 14336, 512),
    (4096, 14336, 2048),
    (4096, 14336, 8192),
    (8192, 28672, 2048),
    (16384, 53248, 256),
    (16384, 53248, 2048),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO / "build" / "probe"))
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args(argv)

    import torch

    from swiglu import make_inputs
    from swiglu.kernels import backward

    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    rows = []
    for H, I, T in SHAPES:
        inp = make_inputs(1, T, H, I, device="cuda", seed=T)
        a = inp.as_tuple()
        variants = {"table": None, "tl_dswiglu": {"dswiglu": backward.config_for("dswiglu", T)}}
        times = {k: [] for k in variants}
        for _ in range(3):
            for cfg in variants.values():
                backward.triton_swiglu_backward(*a, configs=cfg)
        for _ in range(args.iters):
            for name, cfg in variants.items():
                flush.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                backward.triton_swiglu_backward(*a, configs=cfg)
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end))
        g = backward.gluon_dswiglu_config_for(T, torch.device("cuda"), H, I)
        row = dict(
            hidden_size=H,
            intermediate_size=I,
            tokens=T,
            gluon=g.name() if g else "",
            **{f"{k}_ms": round(statistics.median(v), 4) for k, v in times.items()},
        )
        row["tl_over_table"] = round(row["tl_dswiglu_ms"] / row["table_ms"], 4)
        rows.append(row)
        print(row, flush=True)
        del inp, a
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "dswiglu_dispatch.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print("| H | I | T | table ms | tl dSwiGLU ms | tl / table |\n|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['hidden_size']} | {r['intermediate_size']} | {r['tokens']} | {r['table_ms']} | {r['tl_dswiglu_ms']} | "
            f"{r['tl_over_table']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
