"""Does quack's layout copy before every call change the timed call after it? An A/B in one process.

Answer (data/tuning/quack_prepare_363c35f_20261202.csv, docs/results.md): yes; with the copy
before each call quack took 0.927-0.942x its time without at T = 128 and 0.985-0.990x at 2048, ours
after the same copy 0.945-0.998x: the bench now makes quack's layout once per input set.

The harness once made quack's interleaved W1 and preact (a 2 x 3.5 GB copy at Hermes size)
before every timed iteration, outside the timed span but on the GPU just ahead of the L2 flush
and the call; it now makes them once per input set (``BenchImpl.prepare_every_call``; the runs
before and after are named in docs/results.md). This runs, in the bench's own protocol
(``swiglu_lab.bench.runner.run_benchmark``, L2 flushed before every call, power window):

- ``quack``: the layout once per input set (the bench now);
- ``quack-copy-each-call``: the layout made before every call (the bench before);
- ``triton``: ours;
- ``triton-after-copy``: ours with the same copy before every call, its result dropped;

for ``--rounds`` rounds, the implementation order reversed in every other round. A copy ahead of
the call that speeds the call up speeds up both ``*-copy`` rows. (``quack-copy-each-call`` keeps
its copy alive through the call, ``triton-after-copy`` drops it before: the GPU work before the
call is the same, the allocator's state not quite.) GPU only (quack installed).

    python lab/probes/probe_quack_prepare.py --cases s128_b1,s256_b1,s256_b2,s512_b4 --out build/probe
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]

IMPL_NAMES = ("quack", "quack-copy-each-call", "triton", "triton-after-copy")


def impls_with_copies(impls: dict, to_layout) -> dict:
    """``impls`` plus the two ``*-copy`` variants of quack and ours (module docstring)."""

    def copy_then(args: tuple) -> tuple:
        to_layout(args)  # the same GPU work as quack's prepare; its result is dropped
        return args

    return {
        **impls,
        "quack-copy-each-call": replace(impls["quack"], name="quack-copy-each-call", prepare_every_call=True),
        "triton-after-copy": replace(impls["triton"], name="triton-after-copy", prepare=copy_then),
    }


def main(argv=None) -> int:
    import torch

    from swiglu.workloads import HIDDEN_SIZE, INTERMEDIATE_SIZE, select_cases
    from swiglu_lab.bench import quack_peer
    from swiglu_lab.bench.impls import IMPLS
    from swiglu_lab.bench.runner import BenchConfig, run_benchmark

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="s128_b1,s256_b1,s256_b2,s512_b4")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=str(REPO / "build" / "probe"))
    args = p.parse_args(argv)
    impls = impls_with_copies(IMPLS, quack_peer.to_quack_layout)
    frames = []
    for r in range(args.rounds):
        order = list(IMPL_NAMES) if r % 2 == 0 else list(reversed(IMPL_NAMES))
        config = BenchConfig(
            cases=select_cases(args.cases),
            hidden_size=HIDDEN_SIZE,
            intermediate_size=INTERMEDIATE_SIZE,
            impls=order,
            device=torch.device("cuda"),
            measure_ceilings=False,
        )
        frames.append(run_benchmark(config, impls=impls, progress=False).rows.assign(round=r))
    rows = pd.concat(frames, ignore_index=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    rows.to_csv(out / f"quack_prepare_{stamp}.csv", index=False)
    table = rows.pivot_table(index=["tokens", "case", "round"], columns="impl", values="median_ms")[list(IMPL_NAMES)]
    table["quack copy / once"] = table["quack-copy-each-call"] / table["quack"]
    table["ours copy / none"] = table["triton-after-copy"] / table["triton"]
    table["ours / quack"] = table["triton"] / table["quack"]
    print(rows.pivot_table(index=["tokens", "round"], columns="impl", values="sm_clock_mhz").round(0).to_string())
    print(table.round(4).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
