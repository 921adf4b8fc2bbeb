"""Weight-gradient tiles under sustained load: time per call, board power and SM clock.

Answer (data/tuning/wgrad_power_*.csv, data/profiles/README.md): under sustained load each
variant settles at its own clock below the cap's; at T = 1024 the table tile ran at 1460 MHz
(2.854 ms), a 128x256x32 tile at 1503 MHz (2.807 ms), cuBLAS at 1570 MHz (2.917 ms); the larger
tile's gain did not carry into the whole backward.

Nsight Compute replays one launch at a time, with pauses between its passes, so the clock it
reads is not the one a kernel keeps in a loop at the card's power cap. Here each variant of one
weight gradient ``out = a.T @ b`` at Hermes size (a [T, I], b [T, H]) runs back to back for
``--seconds`` (optionally with the benchmark's 256 MB L2 flush before each call), with NVML
sampling board power and SM clock (``swiglu_lab.bench.power``), the variants taken in turn for
``--rounds`` rounds (drift hits all alike); per (T, variant, flush) the median over rounds of ms
per call, and mean power, clock and energy per call (the flush included where on). Variants: cuBLAS (``torch.matmul``), the
Gluon kernel with the table's config (``table``) and named cooperative tiles ("BMxBNxBK Sn NCm", or
"BMxBN+BN2xBK ..." for a wide tile of two accumulators; a name ending in
`` plain`` or `` plain2``: that tile with st.global stores by the MMA warps or the storer warp,
``plain_store`` 1 or 2). Where the table has no Gluon entry (T >= 4097), its tl kernel
(``tl table``) and the ``--tiles`` named, from ``GluonConfig``'s defaults. Each output is
checked close to cuBLAS's. GPU only.

``--resident [I,J]`` adds ``swiglu_lab.experiments.gluon_wgrad_resident``'s candidates (all, or those indices) that hold
T tokens (``--resident-groups G,H``: each at those GROUP_M; ``--resident-defer 0,1``: with and
without the deferred epilogue). Every Gluon and resident weight gradient is also compared bitwise
with the table's Gluon kernel, or where the table has none with the first Gluon tile
(``same_bits_as_table``; the per-element sum runs over the same K-steps whatever the tile, and
every candidate measured gave the same bits).

``--ablate`` adds, for the table's config (and each tile of ``--tiles`` when given), the same
kernel with its stores skipped (a ping-pong config: only that one), with its loads skipped after the ring's first fill, with both, without its wgmmas (zeros
stored), and without wgmmas and loads (the store path alone) (the ABLATE switch of
``swiglu_lab.experiments.gluon_wgrad_probe``, the library's kernel with the probes' switches; their
outputs are not checked), and ``fill_`` of the output (the write ceiling): the
time each part of the weight gradient costs alone, at the clock it runs at.

    python lab/probes/probe_wgrad_power.py --tokens 256,1024 --out build/probe
    python lab/probes/probe_wgrad_power.py --tokens 128,256 --ablate --flush 1
    python lab/probes/probe_wgrad_power.py --tokens 128,256 --resident --flush 1
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]

TILES = ("table", "128x256x32 S4 NC2", "128x256x64 S3 NC1")


def sustained(fn, calls: int, monitor=None, before=None) -> tuple[float, dict]:
    """``fn()`` ``calls`` times back to back (``before()`` ahead of each when given), between CUDA
    events: (ms per call, ``monitor``'s power columns over the loop, {} without a monitor)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    window = monitor.open_window() if monitor else None
    start.record()
    for _ in range(calls):
        if before is not None:
            before()
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls, monitor.close_window(window, calls) if monitor else {}


def in_turn(labels, rounds: int, measure) -> dict[str, list[dict]]:
    """``measure(label)`` for every label, ``rounds`` rounds, the order rotated by one each round
    (drift hits all alike): label -> its rounds' results."""
    labels = list(labels)
    got = {label: [] for label in labels}
    for r in range(rounds):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            got[label].append(measure(label))
    return got


def power_summary(got: list[dict]) -> dict:
    """One variant's rounds (each with ``ms`` and ``sustained``'s power columns) -> the median ms
    per call and the mean board W, SM MHz and J per call (NaN without a monitor)."""
    mhz = statistics.mean(g.get("sm_clock_mhz", math.nan) for g in got)
    return dict(
        ms_per_call=round(statistics.median(g["ms"] for g in got), 4),
        power_w=round(statistics.mean(g.get("power_w", math.nan) for g in got), 1),
        sm_clock_mhz=mhz if math.isnan(mhz) else round(mhz),
        energy_j_per_call=round(statistics.mean(g.get("energy_j", math.nan) for g in got), 4),
    )


#: ``--ablate``'s variants: label suffix -> ``launch_grad_weight_gluon``'s ``ablate``.
ABLATIONS = {
    "stores skipped": 1,
    "loads skipped": 2,
    "loads and stores skipped": 3,
    "wgmma skipped": 4,
    "wgmma and stores skipped": 5,
    "wgmma and loads skipped": 6,
}


def variants_at(
    T: int, a, b, dev, ablate: bool = False, resident: str | None = None, groups: str = "", defers: str = "", tiles: tuple = ()
):
    """label -> callable(out) for one token count (``--ablate``: the ablations and ``fill_`` too,
    their labels in ``unchecked``; ``tiles``: the Gluon tiles instead of ``TILES``; ``--resident``: ``swiglu_lab.experiments.gluon_wgrad_resident``'s candidates that hold
    T tokens)."""
    import torch

    from swiglu.kernels import backward
    from swiglu_lab.experiments.gluon_wgrad_probe import launch_grad_weight_gluon

    M, N = a.shape[1], b.shape[1]
    out = {"cublas": lambda o: torch.matmul(a.T, b, out=o)}
    table = backward.gluon_config_for(T, dev)
    if table is None:  # the table's tl kernel at this T; named Gluon tiles from GluonConfig's defaults
        out["tl table"] = lambda o: backward.launch_grad_weight(a, b, o, backward.config_for("grad_weights", T))
        if not tiles or "table" in tiles:
            return out
        from swiglu.kernels.configs import GluonConfig

        table = GluonConfig()
    for name in tiles or TILES:
        cfg, plain = tile_config(name, table)
        nprog = backward.tile_programs(dev, M, N, cfg)
        label = f"gluon {name}" + (
            f" ({cfg.BM}x{cfg.BN}x{cfg.BK} S{cfg.STAGES} NC{cfg.NC}{' ping-pong' if cfg.pingpong else ''})"
            if name == "table"
            else ""
        )
        out[label] = (lambda c, p, pl: lambda o: launch_grad_weight_gluon(a, b, o, c, p, plain_store=pl))(cfg, nprog, plain)
    if resident is not None:
        from swiglu_lab.experiments.gluon_wgrad_resident import RESIDENT_CANDIDATES

        chosen = [int(i) for i in resident.split(",")] if resident else range(len(RESIDENT_CANDIDATES))
        for i in chosen:
            for group, defer in [
                (int(g), bool(int(d)))
                for g in (groups.split(",") if groups else [RESIDENT_CANDIDATES[i].GROUP_M])
                for d in (defers.split(",") if defers else [int(RESIDENT_CANDIDATES[i].defer)])
            ]:
                cfg = replace(RESIDENT_CANDIDATES[i], GROUP_M=group, defer=defer)
                if T > cfg.resident_k:
                    continue
                label = (
                    f"resident {i} ({cfg.BM}x{cfg.BN}x{cfg.BK} S{cfg.STAGES} NC{cfg.NC} K{cfg.resident_k} G{group}"
                    f"{' defer' if defer else ''})"
                )
                nprog = backward.tile_programs(dev, M, N, cfg)
                out[label] = (lambda c, p: lambda o: backward.launch_grad_weight_gluon_or_tl(a, b, o, None, c, p))(cfg, nprog)
    if ablate:
        out["fill_ (write ceiling)"] = lambda o: o.fill_(1.0)
        for name in tiles or ("table",):
            cfg, plain = tile_config(name, table)  # bit 1 (the storer's TMA stores) does not apply to plain stores
            nprog = backward.tile_programs(dev, M, N, cfg)
            for suffix, mode in ABLATIONS.items():
                if not (plain and mode & 1) and not (cfg.pingpong and mode != 1):  # ping-pong: stores skipped only
                    out[f"gluon {name}, {suffix}"] = (
                        lambda c, p, m, pl: lambda o: launch_grad_weight_gluon(a, b, o, c, p, ablate=m, plain_store=pl)
                    )(cfg, nprog, mode, plain)
    return out


def tile_config(name: str, table):
    """A ``--tiles`` name's config and ``plain_store`` mode: "table" is ``table``, another tile is
    ``table`` with that cooperative tile (``probe_wgrad_defer.parse``); a suffix `` plain`` is
    mode 1 (the MMA warps' st.global), `` plain2`` mode 2 (the storer warp's), none 0."""
    from probe_wgrad_defer import parse  # the tile names' reader, in this folder

    tile, mode = name, 0
    for suffix, m in ((" plain2", 2), (" plain", 1)):
        if name.endswith(suffix):
            tile, mode = name[: -len(suffix)], m
            break
    # A cooperative tile; a wide one ("BMxBN+BN2xBK ...": two accumulators) is never deferred.
    base = replace(table, pingpong=False, BN2=0, mma_regs=0, wg_store=0, **({"defer": False} if "+" in tile else {}))
    return (table if tile == "table" else parse(tile, base)), mode


def unchecked(label: str) -> bool:
    """Whether a variant's output is not a weight gradient (``--ablate``'s)."""
    return label.startswith("fill_") or any(label.endswith(suffix) for suffix in ABLATIONS)


def main(argv=None) -> int:
    import torch

    from swiglu_lab.bench.power import open_monitor

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="256,1024")
    p.add_argument("--seconds", type=float, default=0.6, help="per variant, round and flush mode")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--flush", default="0,1", help="0: back to back; 1: L2 flush before each call")
    p.add_argument("--ablate", action="store_true", help="add the kernel's ablations and fill_ (module docstring)")
    p.add_argument(
        "--resident",
        nargs="?",
        const="",
        default=None,
        metavar="I,J",
        help="add gluon_wgrad_resident's candidates (A held in shared memory): all, or these indices",
    )
    p.add_argument(
        "--resident-groups",
        default="",
        metavar="G,H",
        help="each resident candidate at these GROUP_M (programs per run of tiles) instead of its own",
    )
    p.add_argument(
        "--tiles",
        default="",
        metavar='"table;128x128x64 S2 NC5"',
        help="the Gluon tiles, ';'-separated (default: " + "; ".join(TILES) + ")",
    )
    p.add_argument(
        "--resident-defer",
        default="",
        metavar="0,1",
        help="each resident candidate with these defer values (0/1) instead of its own",
    )
    p.add_argument("--out", default=str(REPO / "build" / "probe"))
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    monitor, why = open_monitor(dev, interval_s=0.01, min_window_s=0.0)
    print(why)
    flush_buf = torch.empty(256 * 2**20, dtype=torch.uint8, device=dev)
    H, I = 16384, 53248
    rows = []
    for T in (int(t) for t in args.tokens.split(",")):
        a = torch.randn(T, I, device=dev, dtype=torch.bfloat16, generator=gen)
        b = torch.randn(T, H, device=dev, dtype=torch.bfloat16, generator=gen)
        ref = torch.matmul(a.T, b).float()
        scale = ref.abs().max().item()
        outs, calls, table_out = {}, {}, None
        for label, fn in variants_at(
            T,
            a,
            b,
            dev,
            args.ablate,
            args.resident,
            args.resident_groups,
            args.resident_defer,
            tuple(t for t in args.tiles.split(";") if t),
        ).items():
            o = torch.full((I, H), float("nan"), device=dev, dtype=torch.bfloat16)
            fn(o)
            torch.cuda.synchronize()
            close = None if unchecked(label) else bool(torch.allclose(o.float(), ref, rtol=2e-2, atol=2e-2 * scale))
            if label.startswith("gluon table (") or table_out is None and label.startswith("gluon ") and close:
                table_out = o  # the table's Gluon kernel, or the first Gluon tile where the table has none
            same = (
                None
                if table_out is None or table_out is o or not label.startswith(("resident", "gluon ")) or unchecked(label)
                else bool(torch.equal(o, table_out))
            )
            calls[label] = max(3, math.ceil(args.seconds * 1e3 / sustained(lambda: fn(o), 3)[0]))  # noqa: B023
            outs[label] = (fn, o, close, same)
        del ref
        for flush in (int(f) for f in args.flush.split(",")):

            def measure(label, flush=flush):
                fn, o, _, _ = outs[label]
                ms, power = sustained(lambda: fn(o), calls[label], monitor, flush_buf.zero_ if flush else None)
                return dict(ms=ms, **power)

            for label, got in in_turn(outs, args.rounds, measure).items():
                rows.append(
                    dict(
                        T=T,
                        variant=label,
                        flush=bool(flush),
                        calls=calls[label],
                        **power_summary(got),
                        close_to_cublas=outs[label][2],
                        same_bits_as_table=outs[label][3],
                    )
                )
    df = pd.DataFrame(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    df.to_csv(out / f"wgrad_power_{stamp}.csv", index=False)
    if monitor:
        monitor.close()
    print(df.to_string(index=False))
    return 0 if all(c is not False for c in df.close_to_cublas) else 1


if __name__ == "__main__":
    raise SystemExit(main())
