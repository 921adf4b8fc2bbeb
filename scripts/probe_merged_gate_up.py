"""grad_gate_weight and grad_up_weight in one launch over M = 2I (``launch_backward(...,
merge_gate_up=True)``: d_gate, d_up and h as one [T, 3I] buffer, the two gradients as halves of
one [2I, H] tensor, as quack's dW1) against two launches, in the whole backward at Hermes' size:
same process, the two taking turns in blocks of ``--block`` calls, 256 MB L2 flush before every
call, CUDA events (``swiglu_lab.bench.timing.time_iterations``), median of ``--iters``; the host
time per call (entering the call to its return) beside it; the results compared bit for bit.

    python scripts/probe_merged_gate_up.py --tokens 128,256,512,1024,2048 --iters 40 --block 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "lab")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="128,256,512,1024,2048")
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--block", type=int, default=10, help="calls per turn")
    p.add_argument("--out", default=str(REPO / "build" / "probe"))
    args = p.parse_args(argv)

    import torch

    from swiglu import make_inputs
    from swiglu.kernels import backward
    from swiglu_lab.bench.timing import time_iterations

    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    H, I = 16384, 53248
    for T in (int(t) for t in args.tokens.split(",")):
        a = make_inputs(1, T, H, I, device="cuda", seed=T).as_tuple()
        plan = backward.backward_plan(T, H, I, backward.plan_device(a[1].device))
        tensors = tuple(t.reshape(-1, t.shape[-1]) for t in a[:5]) + tuple(a[5:])

        def call(merge):
            return backward.launch_backward(tensors, plan=plan, needs=(True,) * 4, merge_gate_up=merge)

        results = {m: call(m) for m in (False, True)}
        same = all(torch.equal(x, y) for x, y in zip(results[False], results[True]))
        del results
        times = {False: [], True: []}
        host = {False: [], True: []}
        for _ in range(max(1, args.iters // args.block)):
            for m in (False, True):
                times[m] += time_iterations(call, lambda m=m: (m,), args.block, a[1].device, flush.zero_, host[m])
        row = dict(tokens=T, two_ms=statistics.median(times[False]), merged_ms=statistics.median(times[True]),
                   two_host_us=1e3 * statistics.median(host[False]), merged_host_us=1e3 * statistics.median(host[True]),
                   same_bits=same, block=args.block, iters=args.iters)
        row["merged_over_two"] = row["merged_ms"] / row["two_ms"]
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
        rows.append(row)
        pd.DataFrame(rows).to_csv(out / "merged_gate_up.csv", index=False)
        del a, tensors
        torch.cuda.empty_cache()
    print(pd.DataFrame(rows).round(4).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
