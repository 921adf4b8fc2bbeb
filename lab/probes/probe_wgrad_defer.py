"""Does storing each tile's output after the next tile's first wgmma (``GluonConfig.defer``) speed
up the Gluon weight-gradient kernel? One weight gradient ``out = a.T @ b`` at Hermes size, both
orientations (a [T, I] with b [T, H], and a [T, H] with b [T, I]), per token count: Gluon
candidates with ``defer`` off and on, the tl kernel's table config and cuBLAS; with ``--pingpong``
also the ping-pong kernel's candidates beside their cooperative twins ("... twin"); with ``--wide``
the wide tiles (``swiglu_lab.experiments.candidates.WIDE_CANDIDATES``: the ping-pong kernel at 232 registers on 128 x 128 and
128 x 192, the cooperative 256 x 192),
each bitwise against the table's kernel; ``--only-table``: of the other Gluon candidates none.
Checks: each deferred or ping-pong variant bitwise equal to its twin (``bitwise_defer_off``), every
kernel close to cuBLAS. Timing: 256 MB L2 flush before each call, CUDA events
(``swiglu_lab.bench.timing.time_iterations``), the variants interleaved round by round (drift hits
all alike), median of ``--iters``. GPU only.

Answer (data/tuning/wgrad_defer_20261201.csv, docs/kernels.md): no; slower in 33 of 36 (T,
orientation, tile) cases, a little faster only at T = 128 and 1.2% slower there in the whole
backward; no table entry uses it.

    python lab/probes/probe_wgrad_defer.py --tokens 128,256,512,1024,2048,4096 --out build/probe
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
import statistics
from dataclasses import replace
from pathlib import Path

import pandas as pd

from swiglu_lab.bench.tables import parse_tile as parse  # the tile names' reader (also scripts/ncu_wgrad.py's)

REPO = Path(__file__).resolve().parents[2]

#: Gluon candidates beside the table's own: the three shapes the table uses at T <= 1024. All
#: cooperative (a ping-pong table entry's flag is not carried over: the ping-pong kernel with a
#: 128x256 tile spilled and ran 5-10x slower). Cooperative 256x128 tiles (BK 64 S3, BK 32 S5) ran
#: 5-21% slower than the table at T = 256 and 1024 (data/tuning/wgrad_cooperative256_018d517_20261201.csv).
CANDIDATES = ("table", "128x128x64 S4 NC3", "128x256x32 S4 NC2", "128x256x64 S3 NC1")


def gluon_label(cfg, table: bool = False) -> str:
    """A Gluon variant's label, as ``swiglu_lab.bench.tables.gluon_wgrad_table`` parses it back."""
    return (
        f"gluon {'table ' if table else ''}{'ping-pong ' if cfg.pingpong else ''}{cfg.BM}x{cfg.BN}"
        f"{f'+{cfg.BN2}' if cfg.BN2 else ''}x{cfg.BK} S{cfg.STAGES} NC{cfg.NC}{f' r{cfg.mma_regs}' if cfg.mma_regs else ''}"
        f"{' defer' if cfg.defer else ''}"
    )


def measure(
    T: int, M: int, N: int, dev, flush, gen, iters: int, pingpong: bool = False, wide: bool = False, only_table: bool = False
) -> list[dict]:
    """Rows for one token count and orientation (see the module docstring)."""
    import torch

    from swiglu.kernels import backward
    from swiglu.kernels.configs import GluonConfig
    from swiglu_lab.experiments.gluon_wgrad_probe import launch_grad_weight_gluon  # the deferred and wide cooperative tiles too
    from swiglu_lab.experiments.candidates import PINGPONG_CANDIDATES, WIDE_CANDIDATES
    from swiglu_lab.bench.timing import time_iterations

    table = backward.gluon_config_for(T, dev) or GluonConfig(BM=128, BN=256, BK=64, STAGES=3, NC=1)
    tl_cfg = backward.config_for("grad_weights", T)
    a = torch.randn(T, M, device=dev, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(T, N, device=dev, dtype=torch.bfloat16, generator=gen)
    ref = torch.matmul(a.T, b)
    variants = {
        "cublas": lambda out: torch.matmul(a.T, b, out=out),
        f"tl {tl_cfg.BM}x{tl_cfg.BN}x{tl_cfg.BK}": lambda out: backward.launch_grad_weight(a, b, out, tl_cfg),
    }

    def gluon(cfg):  # the Gluon kernel with cfg, one persistent program per SM as the backward runs it
        nprog = backward.tile_programs(dev, M, N, cfg)
        return lambda out: launch_grad_weight_gluon(a, b, out, cfg, nprog)

    tried = set()
    for name in CANDIDATES[:1] if only_table else CANDIDATES:
        base = replace(table, defer=False) if name == "table" else replace(parse(name, table), defer=False, pingpong=False)
        if base in tried:
            continue
        tried.add(base)
        for defer in (False,) if only_table else (False, True):
            cfg = replace(base, defer=defer)
            variants[gluon_label(cfg, name == "table")] = gluon(cfg)
    if pingpong:  # the ping-pong kernel's candidates, bitwise against their cooperative twins
        for cfg in PINGPONG_CANDIDATES:
            label = gluon_label(replace(cfg, pingpong=False))
            variants[label + " pingpong"] = gluon(cfg)
            variants[label + " twin"] = gluon(replace(cfg, pingpong=False))
    twin = {}  # label -> the label its output must equal bitwise
    if wide:
        table_label = next(k for k in variants if k.startswith("gluon table"))
        for cfg in WIDE_CANDIDATES:
            label = gluon_label(cfg)
            if label not in variants:
                variants[label] = gluon(cfg)
                twin[label] = table_label
    outs, times = {}, {k: [] for k in variants}
    for label, fn in variants.items():
        out = torch.full((M, N), float("nan"), device=dev, dtype=torch.bfloat16)
        fn(out)
        torch.cuda.synchronize()
        outs[label] = out
    for _ in range(iters):
        for label, fn in variants.items():
            times[label] += time_iterations(fn, lambda: (outs[label],), 1, dev, flush.zero_)  # noqa: B023 (called at once)
    scale = ref.float().abs().max().item()
    rows = []
    for label, out in outs.items():
        pair = (
            label.replace(" defer", "")
            if label.endswith(" defer")
            else (label.replace(" pingpong", " twin") if label.endswith(" pingpong") else twin.get(label))
        )
        close = bool(torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2 * scale))
        rows.append(
            dict(
                T=T,
                shape=f"{M}x{N}",
                variant=label,
                ms=round(statistics.median(times[label]), 4),
                close_to_cublas=close,
                bitwise_defer_off=None if pair is None else bool(torch.equal(out, outs[pair])),
            )
        )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO / "build" / "probe"))
    p.add_argument("--tokens", default="128,256,512,1024,2048,4096")
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--pingpong", action="store_true", help="also the ping-pong kernel's candidates")
    p.add_argument(
        "--wide",
        action="store_true",
        help="also swiglu_lab.experiments.candidates.WIDE_CANDIDATES (ping-pong 128 x 128 and 128 x 192 at 232 registers, cooperative 256 x 192)",
    )
    p.add_argument("--only-table", action="store_true", help="of CANDIDATES the table's alone, without defer")
    p.add_argument(
        "--write-table",
        action="store_true",
        help="write the winners into src/swiglu/kernels/backward_configs.json (swiglu_lab.bench.tables."
        "gluon_wgrad_table: only where faster than the current choice by 2%%)",
    )
    args = p.parse_args(argv)

    import torch

    H, I = 16384, 53248
    dev = torch.device("cuda", torch.cuda.current_device())
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for T in (int(t) for t in args.tokens.split(",")):
        for M, N in ((I, H), (H, I)):
            new = measure(T, M, N, dev, flush, gen, args.iters, args.pingpong, args.wide, args.only_table)
            torch.cuda.empty_cache()
            rows += new
            # Written and printed as each shape finishes: a run cut by a time bound keeps what it measured.
            pd.DataFrame(rows).to_csv(out_dir / "wgrad_defer.csv", index=False)
            for r in new:
                flags = ("" if r["close_to_cublas"] else "  NOT CLOSE") + (
                    "" if r["bitwise_defer_off"] in (None, True) else "  DIFFERS FROM its twin"
                )
                print(f"T={r['T']:5d} {r['shape']:12s} {r['variant']:40s} {r['ms']:8.4f} ms{flags}", flush=True)
    if args.write_table:
        import json
        from dataclasses import asdict

        from swiglu.kernels.configs import TUNED_CONFIGS_PATH, GluonConfig
        from swiglu_lab.bench.tables import gluon_wgrad_table

        old = json.loads(Path(TUNED_CONFIGS_PATH).read_text())
        base = {
            k: v for k, v in asdict(GluonConfig()).items() if k in ("GROUP_M", "num_warps", "maxnreg", "load_regs", "store_regs")
        }
        record = Path("data", "tuning", f"wgrad_defer_{datetime.now(timezone.utc):%Y%m%d}.csv")  # copy the CSV there
        new = gluon_wgrad_table(rows, old, base, f"{record} (lab/probes/probe_wgrad_defer.py)")
        Path(TUNED_CONFIGS_PATH).write_text(json.dumps(new, indent=1) + "\n")
        for key, entry in new["gluon_grad_weights"].items():
            print(f"table {key}: {entry['config']}" + (" (new)" if entry != old.get("gluon_grad_weights", {}).get(key) else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
