"""How long torch.compile(mode="max-autotune") of the reference backward takes to compile at one T,
and its median time (CUDA events, L2 flushed). GPU only:  PYTHONPATH=src python3 lab/probes/probe_max_autotune.py 128

Answer (data/tuning/max_autotune_probe_20261130_t128.log, NOTES.md): at T = 128, 14.9 s to
compile and 7.02 ms per call against 3.61 for the default mode (its CUDA graphs copy the weights
on every call), so the bench's peer is ``max-autotune-no-cudagraphs``.
"""

import statistics
import sys
import time

import torch

from swiglu import make_inputs, reference_backward

T = int(sys.argv[1]) if len(sys.argv) > 1 else 128
inp = make_inputs(1, T, device="cuda", seed=T)
args = (
    inp.grad_output,
    inp.x,
    inp.gate_output,
    inp.up_output,
    inp.activated_gate,
    inp.gate_weight,
    inp.up_weight,
    inp.down_weight,
)
flush = torch.empty(64 << 20, device="cuda")
for mode in ("default", "max-autotune"):
    fn = torch.compile(reference_backward, mode=mode, dynamic=False)
    t0 = time.time()
    fn(*args)
    torch.cuda.synchronize()
    first = time.time() - t0
    for _ in range(5):
        fn(*args)
    ts = []
    for _ in range(30):
        flush.zero_()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        fn(*args)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    print(f"T={T} {mode}: first call {first:.1f} s, median {statistics.median(ts):.3f} ms", flush=True)
