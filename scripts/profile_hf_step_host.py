"""The host's time per Hugging Face training step, unpatched against ``swiglu_hf.apply``, and a
cProfile of each: where a host-bound step (few tokens, a slow CPU) spends its Python. The models
and the step are ``scripts/hf_step_gpu.py``'s (``Variant``: forward with the LM loss + backward,
gradients set to None first). Host time: ``time.perf_counter`` around one step, no synchronize
(every launch enqueued), ``--steps`` per block, the variants in turn for ``--rounds`` rounds; then
cProfile over ``--steps`` steps of each (Python 3.12's cProfile sees the autograd thread's Python),
the top ``--top`` functions by own time. ``--gc``: per block also the cyclic garbage collector's
passes per step and their ms (``gc.callbacks``: time a profiler spreads over whatever allocated),
and a block of each variant with the collector off. GPU only.

    python scripts/profile_hf_step_host.py --seq 512 --gc
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.util
import io
import pstats
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    spec = importlib.util.spec_from_file_location("hf_step_gpu", REPO / "scripts" / "hf_step_gpu.py")
    hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hf)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    hf.add_model_arguments(p, seq=512)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--gc", action="store_true", help="also the garbage collector's passes and a block with it off")
    args = p.parse_args(argv)

    import torch

    variants = {name: hf.Variant(name, args) for name in ("unpatched", "swiglu")}
    for v in variants.values():
        for _ in range(5):
            v._step()
    torch.cuda.synchronize()
    passes = {}  # generation -> [count, seconds] in the current block

    def on_gc(phase, info, _start=[0.0]):
        if phase == "start":
            _start[0] = time.perf_counter()
        else:
            entry = passes.setdefault(info["generation"], [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - _start[0]

    if args.gc:
        gc.callbacks.append(on_gc)
    for round_ in range(args.rounds + (1 if args.gc else 0)):
        collector_off = args.gc and round_ == args.rounds
        if collector_off:
            gc.disable()
        for name, v in variants.items():
            times = []
            passes.clear()
            for _ in range(args.steps):
                start = time.perf_counter()
                v._step()
                times.append((time.perf_counter() - start) * 1e3)
            torch.cuda.synchronize()
            gc_text = ""
            if args.gc:
                gc_text = " gc " + (
                    "off"
                    if collector_off
                    else " ".join(
                        f"gen{g}: {n / args.steps:.2f}/step {1e3 * s / args.steps:.3f} ms/step"
                        for g, (n, s) in sorted(passes.items())
                    )
                )
            print(f"{name}: host ms per step median {statistics.median(times):.2f} min {min(times):.2f}{gc_text}", flush=True)
        if collector_off:
            gc.enable()
    if args.gc:
        gc.callbacks.remove(on_gc)
    for name, v in variants.items():
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.steps):
            v._step()
        torch.cuda.synchronize()
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
        print(f"===== {name}\n{out.getvalue()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
