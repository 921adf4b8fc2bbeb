"""Another process keeping the GPU busy, for tests of our kernels on a time-sliced GPU: the GPU
switches between the two CUDA contexts and preempts our kernels mid-launch (a 2-3 ms weight
gradient about once per launch on an H100; lab/probes/time_slicing.py measured it)."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager

_MATMULS = """
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
while True:
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
"""


@contextmanager
def matmuls_in_another_process():
    """Within the block a second process runs 8192^3 bf16 matmuls on the current GPU; it is
    killed on leaving."""
    load = subprocess.Popen([sys.executable, "-c", _MATMULS], stdout=subprocess.PIPE, text=True)
    try:
        assert load.stdout.readline().strip() == "ready", "the matmul process did not start"
        yield
    finally:
        load.kill()
        load.wait()
