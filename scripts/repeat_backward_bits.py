"""The whole Triton backward repeated at Hermes' size, every call's gradients compared bit for bit
with the first call's: a race between warp-specialized partitions shows as a call that differs.
GPU only.

    python scripts/repeat_backward_bits.py --tokens 200,256,130 --calls 40

Inputs from ``swiglu.make_inputs(1, T, 16384, 53248, seed=T)``; prints, per T, how many of the
``--calls`` calls differ from the first in each gradient (0 everywhere: no difference seen).
"""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAMES = ("grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="200,256,130")
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--hidden-size", type=int, default=16384)
    p.add_argument("--intermediate-size", type=int, default=53248)
    args = p.parse_args(argv)

    import torch

    from swiglu import make_inputs
    from swiglu.kernels import backward

    differing = 0
    for T in (int(t) for t in args.tokens.split(",")):
        a = make_inputs(1, T, args.hidden_size, args.intermediate_size, device="cuda", seed=T).as_tuple()
        first = [g.clone() for g in backward.triton_swiglu_backward(*a)]
        diff = dict.fromkeys(NAMES, 0)
        for _ in range(args.calls):
            for name, f, g in zip(NAMES, first, backward.triton_swiglu_backward(*a)):
                diff[name] += not torch.equal(f, g)
        print(f"T={T}: calls differing from the first, per output: {diff}", flush=True)
        differing += sum(diff.values())
        del first, a
        torch.cuda.empty_cache()
    return 1 if differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
