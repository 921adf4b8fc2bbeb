"""Run the Triton backward at one token count, so that a profiler can read its kernels.

On the GPU, under Nsight Compute (the first call compiles, the second is profiled; -k keeps the
input generation's kernels out of the skip/count):
  ncu --clock-control none -k 'regex:dswiglu|grad_weight|grad_x' --launch-skip 4 --launch-count 4 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --csv --page details \
      python3 scripts/profile_kernels.py --tokens 128
``--configs`` overrides the table per kernel with a JSON object of KernelConfig fields, e.g.
'{"grad_weights": {"BM": 128, "BN": 256, "BK": 64, "GROUP_M": 16, "flatten": true}}'.
Profiles taken this way: data/profiles/.
"""

from __future__ import annotations

import argparse
import json

import torch

from swiglu import make_inputs
from swiglu.kernels.backward import KernelConfig, triton_swiglu_backward


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--hidden-size", type=int, default=16384)
    ap.add_argument("--intermediate-size", type=int, default=53248)
    ap.add_argument("--configs", default="{}", help="JSON: kernel -> KernelConfig fields")
    ap.add_argument("--calls", type=int, default=2)
    args = ap.parse_args(argv)
    configs = {k: KernelConfig(**v) for k, v in json.loads(args.configs).items()}
    inp = make_inputs(1, args.tokens, args.hidden_size, args.intermediate_size, device="cuda")
    for _ in range(args.calls):
        triton_swiglu_backward(*inp.as_tuple(), configs=configs)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
