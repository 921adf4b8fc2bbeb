"""Is the GPU idle inside one backward in the benchmark's protocol? ``swiglu_mlp_backward(impl="triton")``
at Hermes' size, per token count, timed three ways in one process:

Answer (data/host_overhead/ runs "-idle" and "-pdl", docs/kernels.md "PDL"): the gaps between
kernels are about 6 us per backward; PDL removes them but makes the timed loop longer (+0.5-3.9%),
so it stays off.

* ``continuous_ms``: the benchmark's loop (``swiglu_lab.bench.timing.time_iterations``: L2 flush,
  CUDA events, two alternating input sets, one synchronize at the end, so the host runs ahead);
* ``synchronized_ms``: the same with a synchronize after every iteration (the host's time before
  the first launch exposed, as in ``probe_host_lead.py``'s steps);
* the continuous loop under ``torch.profiler`` (``swiglu_lab.bench.breakdown.profile_calls``, the
  bench's own breakdown): ``lead_ms`` from the end of the flush kernel to our first kernel,
  ``busy_ms`` the union of the kernels' intervals, ``gaps_ms`` the time between our first kernel's
  start and last kernel's end not covered by a kernel (launch gaps); medians over the calls.

``event_kernels``: the continuous loop once more with a CUDA event recorded after each of our
launches (``swiglu.kernels.launch.launch`` wrapped in every launcher module), so each kernel's
unprofiled time is the span between consecutive events (the first from the event before the call):
medians per position, to set beside the profiled ones (``kernels``) and find which kernel runs
longer outside the profiler.

``--pdl all``: each token count measured in every programmatic dependent launch mode (0 off,
1 trigger at start, 2 at the end: ``swiglu.kernels.launch.PDL``), one after the other in the
same process (``pdl`` column);
the gaps and the continuous loop say what PDL saves per backward. (``event_kernels`` records an
event between launches, which stands between a kernel and its PDL predecessor.)

Beside them the caching allocator's counters over the two timed loops (``num_device_alloc``,
``num_device_free``, ``num_alloc_retries``: cudaMalloc/cudaFree would synchronize the host). GPU
only; a probe, not a test. Writes ``idle_gaps.csv`` and ``environment.json`` to ``--out``.

    python lab/probes/probe_idle_gaps.py --tokens 128 512 --out build/idle_gaps
    python lab/probes/probe_idle_gaps.py --tokens 128 2048 --pdl all --out build/idle_gaps_pdl
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

ALLOC_KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries")


def measure(T: int, iters: int) -> dict:
    import torch

    from swiglu import make_inputs, swiglu_mlp_backward
    from swiglu_lab.bench.breakdown import profile_calls
    from swiglu_lab.bench.timing import L2Flusher, alternating, time_iterations

    dev = torch.device("cuda", torch.cuda.current_device())
    flush = L2Flusher(dev)
    sets = [make_inputs(1, T, 16384, 53248, device=dev, seed=seed).as_tuple() for seed in (1, 2)]
    make = alternating(sets)

    def call(*args):
        return swiglu_mlp_backward(*args, impl="triton")

    def counters():
        stats = torch.cuda.memory_stats(dev)
        return [stats.get(k, 0) for k in ALLOC_KEYS]

    time_iterations(call, make, 10, dev, flush)  # warm-up: compile, plans, allocator pools
    before = counters()
    continuous = time_iterations(call, make, iters, dev, flush)
    synchronized = [time_iterations(call, make, 1, dev, flush)[0] for _ in range(iters)]
    after = counters()
    event_ms = event_split(call, make, iters, dev, flush)
    rows = profile_calls(call, make, 12, dev, flush)
    med = statistics.median
    return dict(
        tokens=T,
        continuous_ms=round(med(continuous), 4),
        synchronized_ms=round(med(synchronized), 4),
        lead_ms=round(rows[0]["lead_ms"], 4),
        busy_ms=round(rows[0]["busy_ms"], 4),
        gaps_ms=round(rows[0]["gaps_ms"], 4),
        kernels=" ".join(f"{r['kernel'].split('(')[0][:24]}:{r['ms']:.3f}" for r in rows),
        event_kernels=" ".join(f"{v:.3f}" for v in event_ms),
        event_total_ms=round(sum(event_ms), 4),
        profiled_iterations=rows[0]["profiled_calls"],
        iters=iters,
        **{k: a - b for k, a, b in zip(ALLOC_KEYS, after, before)},
    )


def event_split(call, make, iters: int, dev, flush) -> list[float]:
    """Medians per launch position of the spans between CUDA events recorded before the call and
    after each of its launches, in a continuous loop like ``time_iterations`` (ms)."""
    import torch

    from swiglu.kernels import backward, forward, gluon_dswiglu, gluon_wgrad, launch

    modules = (backward, forward, gluon_dswiglu, gluon_wgrad)
    marks: list = []

    def launch_and_mark(*args, **kwargs):
        launch.launch(*args, **kwargs)
        marks.append(torch.cuda.Event(enable_timing=True))
        marks[-1].record()

    per_call = []
    saved = [m.launch for m in modules]
    try:
        for m in modules:
            m.launch = launch_and_mark
        for _ in range(iters):
            args = make()
            flush()
            marks = [torch.cuda.Event(enable_timing=True)]
            marks[0].record()
            out = call(*args)
            per_call.append(marks)
            del out, args
        torch.cuda.synchronize(dev)
    finally:
        for m, f in zip(modules, saved):
            m.launch = f
    spans = [[a.elapsed_time(b) for a, b in zip(c, c[1:])] for c in per_call]
    return [statistics.median(s[i] for s in spans) for i in range(min(len(s) for s in spans))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 512])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument(
        "--pdl",
        choices=["default", "0", "1", "2", "all"],
        default="default",
        help="programmatic dependent launch mode: as configured (SWIGLU_PDL), 0, 1, 2, or all three",
    )
    p.add_argument("--out", default=str(REPO / "build" / "idle_gaps"))
    args = p.parse_args(argv)
    if args.iters < 1:
        p.error("--iters must be >= 1")

    import pandas as pd
    import torch

    from swiglu.kernels import launch
    from swiglu_lab.bench import environment

    dev = torch.device("cuda", torch.cuda.current_device())
    modes = {"default": [launch.PDL], "all": list(launch.PDL_MODES)}.get(args.pdl) or [int(args.pdl)]
    rows = []
    for T in args.tokens:
        for pdl in modes:
            launch.set_pdl(pdl)
            rows.append({**measure(T, args.iters), "pdl": launch.PDL})
            torch.cuda.empty_cache()
            r = rows[-1]
            print(
                f"T={T} pdl={r['pdl']}: continuous {r['continuous_ms']} ms, synchronized {r['synchronized_ms']} ms; profiled: lead "
                f"{r['lead_ms']} busy {r['busy_ms']} gaps {r['gaps_ms']} ms; device allocs {r['num_device_alloc']}, "
                f"frees {r['num_device_free']}",
                flush=True,
            )
            print(
                f"    profiled kernels: {r['kernels']}\n    unprofiled (events): {r['event_kernels']} "
                f"(total {r['event_total_ms']})",
                flush=True,
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "idle_gaps.csv", index=False)
    env = {
        "git": environment.git_info(REPO),
        "gpu": environment.gpu_info(dev),
        "nvidia_smi": environment.nvidia_smi_info(dev),
        "software": environment.software_info(),
        "utc": environment.utc_now().isoformat(timespec="seconds"),
    }
    (out / "environment.json").write_text(json.dumps(env, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
