"""Training step of the SwiGLU MLP on one H200: checks, the forward's per-bucket table, step time
and memory of nn.Linear / torch.compile / ours saved / ours memory-lean (``swiglu_lab.research.train_step``).

    PYTHONPATH=src:lab python3 scripts/train_step_gpu.py          # results under $OUT when set

Exits 1 when a correctness check fails (the table is still printed).
"""

import sys

from swiglu_lab.research.train_step import main

if __name__ == "__main__":
    run = main()
    sys.exit(0 if all(c["passed"] for c in run["checks"]) else 1)
