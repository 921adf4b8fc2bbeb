"""Whole-backward time with the table's kernel configurations (the tl kernels' and the Gluon
weight-gradient, dSwiGLU and grad_x entries) against another table's (a ``backward_configs.json`` given
with ``--against-json``, e.g. ``git show REV:src/swiglu/kernels/backward_configs.json``; a bucket
it has no Gluon entry for runs the tl kernel): does a per-kernel probe's choice hold in the backward? Hermes' size, same
process, the two alternating, 256 MB L2 flush before every call, CUDA events
(``swiglu_lab.bench.timing.time_iterations``), median of ``--iters``; the two results compared bit for bit (``same_bits``).
``--block N`` takes turns in blocks of N calls, as the benchmark times one implementation's 50 in
a row: a kernel's own power draw then sets the clock it runs at, which alternating call by call
shares between the two tables (data/tuning/wgrad_power_880e424_20261202.csv).

Answer: per table change, in that entry's ``source`` in src/swiglu/kernels/backward_configs.json
(and data/tuning/*table_ab*.csv, data/tuning/README.md); the wide tiles' gain, for one, did not hold.

    python lab/probes/probe_wgrad_table_ab.py --against-json build/old_configs.json --tokens 128,1024,2048
    python lab/probes/probe_wgrad_table_ab.py --against-json build/new.json --tokens 128,1024 --iters 150 --block 50
    python lab/probes/probe_wgrad_table_ab.py --against-json build/ab/A.json build/ab/B.json --tokens 128 --block 10
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]


def measure(T: int, ours: tuple, other: tuple, flush, iters: int, block: int = 1) -> dict:
    """One token count: the two tables' medians and whether their results are the same bits.
    A table: (Gluon weight-gradient entries, Gluon dSwiGLU entries, {tl kernel: entries}, Gluon
    grad_x entries), by bucket."""
    import torch

    from swiglu import make_inputs
    from swiglu.kernels import backward
    from swiglu_lab.bench.timing import time_iterations

    a = make_inputs(1, T, 16384, 53248, device="cuda", seed=T).as_tuple()
    tables = {"table": ours, "against": other}
    times, outs = {k: [] for k in tables}, {}

    def run(name):
        backward.GLUON_CONFIGS.update(tables[name][0])
        backward.GLUON_DSWIGLU.update(tables[name][1])
        for kernel, entries in tables[name][2].items():
            backward.CONFIGS[kernel].update(entries)
        backward.GLUON_GRAD_X.update(tables[name][3])
        backward.clear_plans()
        backward.backward_plan(T, 16384, 53248, backward.plan_device(a[1].device))  # planned before the timer
        return a

    for name in tables:
        run(name)
        outs[name] = backward.triton_swiglu_backward(*a)
    for _ in range(max(1, iters // block)):
        for name in tables:
            run(name)
            times[name] += time_iterations(backward.triton_swiglu_backward, lambda: a, block, a[1].device, flush.zero_)
    backward.GLUON_CONFIGS.update(ours[0])
    backward.GLUON_DSWIGLU.update(ours[1])
    for kernel, entries in ours[2].items():
        backward.CONFIGS[kernel].update(entries)
    backward.GLUON_GRAD_X.update(ours[3])
    backward.clear_plans()
    bucket = backward.bucket_for(T)
    row = dict(
        tokens=T,
        block=block,
        table=str(ours[0][bucket]),
        against=str(other[0][bucket]),
        table_dswiglu=str(ours[1][bucket]),
        against_dswiglu=str(other[1][bucket]),
        table_grad_x=str(ours[3][bucket]),
        against_grad_x=str(other[3][bucket]),
        **{f"{k}_ms": round(statistics.median(v), 4) for k, v in times.items()},
        same_bits=all(torch.equal(x, y) for x, y in zip(outs["table"], outs["against"])),
    )
    row["against_over_table"] = round(row["against_ms"] / row["table_ms"], 4)
    print(
        f"T={T}: table {row['table_ms']} ms, against {row['against_ms']} ms, against/table "
        f"{row['against_over_table']}, same bits {row['same_bits']}",
        flush=True,
    )
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--against-json",
        required=True,
        nargs="+",
        help="backward_configs.json files whose kernel configurations to compare, each in turn",
    )
    p.add_argument("--tokens", default="128,1024,2048")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--block", type=int, default=1, help="calls per turn (1: alternate call by call)")
    p.add_argument("--out", default=str(REPO / "build" / "probe"))
    args = p.parse_args(argv)

    import torch

    from swiglu.kernels import backward
    from swiglu.kernels.configs import DswigluGluonConfig, GluonConfig, KernelConfig, parse_bucket

    ours = (
        dict(backward.GLUON_CONFIGS),
        dict(backward.GLUON_DSWIGLU),
        {kernel: dict(entries) for kernel, entries in backward.CONFIGS.items()},
        dict(backward.GLUON_GRAD_X),
    )
    others = {}
    for path in args.against_json:
        others[path] = other = (
            {b: None for b in ours[0]},
            {b: None for b in ours[1]},
            {kernel: {} for kernel in ours[2]},
            {b: None for b in ours[3]},
        )
        table = json.loads(Path(path).read_text())
        for kernel, entries in table.get("configs", {}).items():
            for key, entry in entries.items():
                other[2][kernel][parse_bucket(key)] = KernelConfig(**entry["config"])
        for i, (section, cls) in (
            (0, ("gluon_grad_weights", GluonConfig)),
            (1, ("gluon_dswiglu", DswigluGluonConfig)),
            (3, ("gluon_grad_x", GluonConfig)),
        ):
            for key, entry in table.get(section, {}).items():
                other[i][parse_bucket(key)] = cls(**entry["config"])
    if any(g is not None and g.resident_k for other in others.values() for g in other[0].values()):
        # A table entry with resident_k runs this lab kernel (it sets backward.RESIDENT_LAUNCHER).
        import swiglu_lab.experiments.gluon_wgrad_resident  # noqa: F401
    if any(g is not None and g.plain_store for t in (ours, *others.values()) for g in t[0].values()) or any(
        g is not None for t in (ours, *others.values()) for g in t[3].values()
    ):
        # An entry with plain_store, or a gluon_grad_x entry, runs this lab kernel (it sets
        # backward.PLAIN_STORE_LAUNCHER and backward.GRAD_X_LAUNCHER).
        import swiglu_lab.experiments.gluon_wgrad_probe  # noqa: F401
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for path, other in others.items():
        for T in (int(t) for t in args.tokens.split(",")):
            print(f"against {path}:", end=" ")
            rows.append(dict(against_json=Path(path).name, **measure(T, ours, other, flush, args.iters, args.block)))
            table = pd.DataFrame(rows)
            table.to_csv(out / "wgrad_table_ab.csv", index=False)  # after every row: a timeout keeps the rest
            torch.cuda.empty_cache()
    print(table[["against_json", "tokens", "table_ms", "against_ms", "against_over_table", "same_bits"]].to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
