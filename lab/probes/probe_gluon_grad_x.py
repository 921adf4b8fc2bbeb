"""GPU probe of the Gluon grad_x kernel (``swiglu_lab.experiments.gluon_wgrad_probe.launch_grad_x_gluon``,
the weight-gradient kernel's ``A_KMAJOR`` orientation): bitwise against the tl grad_x kernel, then timed beside it.

Answer (data/tuning/gluon_grad_x_probe_96ffe16_20261202.csv, gluon_grad_x_deep_1bc9f92_20261202.csv,
docs/kernels.md): bitwise the tl kernel everywhere, but slower at every T but 1024 (0.74-0.99x its
speed at T = 128, 1.01x at 1024), deeper rings no faster: no ``gluon_grad_x`` table entry.

    OUT=$OUT PYTHONPATH=src:lab timeout 400 python3 lab/probes/probe_gluon_grad_x.py
    PYTHONPATH=src:lab python3 lab/probes/probe_gluon_grad_x.py --tokens 128,512 --configs 0,1 --block 10

First a ragged case (T = 200, H = 520, I = 1176: partial tiles on every edge, each K half ending
inside a k-step), then per T in --tokens at Hermes' size (or --hidden-size/--intermediate-size):
d_gate, d_up, gate_weight and up_weight random bf16; the tl kernel with the plan's grad_x config
(``backward.backward_plan(...).grad_x``) writes the reference, each candidate
(``swiglu_lab.experiments.candidates.GRAD_X_CANDIDATES``, or --configs) writes a NaN-poisoned output, compared bit for bit (where
not the same bits: the largest error against the fp32 product over Higham's bound). Timing: the
tl kernel and each candidate take turns in blocks of --block calls (a kernel's own power draw
sets its clock, as in the benchmark), 256 MB L2 flush before every call, CUDA events
(``swiglu_lab.bench.timing.time_iterations``), median of --iters per kernel. One process: run it
under ``timeout`` (a kernel that hangs holds the call). Table printed last; CSV to --out (default
$OUT/gluon_grad_x_probe.csv when OUT is set, else build/probe/).
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def inputs(T: int, H: int, I: int, seed: int):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(torch.bfloat16)

    # Weights at nn.Linear's init scale, activations' gradients O(1): sums of order one.
    return rand(T, I), rand(T, I), rand(I, H, scale=I**-0.5), rand(I, H, scale=I**-0.5)


def check(T: int, H: int, I: int, candidates, seed: int) -> list[dict]:
    """Each candidate's output against the tl kernel's: same bits, or its error over the bound."""
    import torch

    from swiglu.kernels import backward, devices
    from swiglu_lab.experiments.gluon_wgrad_probe import launch_grad_x_gluon

    d_gate, d_up, gw, uw = inputs(T, H, I, seed)
    plan = backward.backward_plan(T, H, I, backward.plan_device(d_gate.device))
    want = torch.full((T, H), float("nan"), device="cuda", dtype=torch.bfloat16)
    backward.launch_grad_x(d_gate, d_up, gw, uw, want, plan.grad_x, plan.grad_x_programs)
    exact = d_gate.float() @ gw.float() + d_up.float() @ uw.float()
    bound = exact.abs() * 2.0**-7 + 2 * I * 2.0**-23 * (
        d_gate.float().abs() @ gw.float().abs() + d_up.float().abs() @ uw.float().abs()
    )
    rows = []
    for index, cfg in candidates:
        got = torch.full_like(want, float("nan"))
        launch_grad_x_gluon(d_gate, d_up, gw, uw, got, cfg, devices.tile_programs(got.device, T, H, cfg))
        torch.cuda.synchronize()
        same = torch.equal(got, want)
        err = ((got.float() - exact).abs() / bound).max().item()
        rows.append(
            dict(
                T=T,
                H=H,
                I=I,
                config=index,
                label=str(cfg),
                tl_config=str(plan.grad_x),
                same_bits=same,
                finite=bool(torch.isfinite(got).all()),
                max_err_over_bound=round(err, 4),
            )
        )
        print(f"T={T} H={H} I={I} #{index}: same bits as tl {same}, max error / bound {err:.3f}", flush=True)
    return rows


def timing(T: int, H: int, I: int, candidates, iters: int, block: int, flush) -> dict:
    """Median ms of the tl kernel and of each candidate, in turns of ``block`` calls."""
    import torch

    from swiglu.kernels import backward, devices
    from swiglu_lab.experiments.gluon_wgrad_probe import launch_grad_x_gluon
    from swiglu_lab.bench.timing import time_iterations

    d_gate, d_up, gw, uw = inputs(T, H, I, seed=T)
    out = torch.empty((T, H), device="cuda", dtype=torch.bfloat16)
    plan = backward.backward_plan(T, H, I, backward.plan_device(d_gate.device))
    calls = {"tl": lambda: backward.launch_grad_x(d_gate, d_up, gw, uw, out, plan.grad_x, plan.grad_x_programs)}
    for index, cfg in candidates:
        nprog = devices.tile_programs(out.device, T, H, cfg)
        calls[index] = lambda cfg=cfg, nprog=nprog: launch_grad_x_gluon(d_gate, d_up, gw, uw, out, cfg, nprog)
    for call in calls.values():  # compiled and launched once before the clock
        call()
    times = {k: [] for k in calls}
    for _ in range(max(1, iters // block)):
        for k, call in calls.items():
            times[k] += time_iterations(call, lambda: (), block, out.device, flush.zero_)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="128,256,512,1024,2048,4096")
    p.add_argument("--configs", default="", help="GRAD_X_CANDIDATES indices (default all)")
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="FIELD=VALUE,...",
        help="an extra cooperative GluonConfig, e.g. BM=128,BN=128,BK=64,STAGES=6,NC=1 (repeatable)",
    )
    p.add_argument("--hidden-size", type=int, default=16384)
    p.add_argument("--intermediate-size", type=int, default=53248)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--block", type=int, default=10, help="calls per turn")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import pandas as pd
    import torch

    from swiglu.kernels.configs import GluonConfig
    from swiglu_lab.experiments.candidates import GRAD_X_CANDIDATES

    picked = [int(i) for i in args.configs.split(",") if i] or range(len(GRAD_X_CANDIDATES))
    candidates = [(i, GRAD_X_CANDIDATES[i]) for i in picked]
    for n, spec in enumerate(args.config):
        fields = dict(item.split("=") for item in spec.split(","))
        cfg = GluonConfig(**{k: int(v) for k, v in fields.items()})
        limit = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
        if cfg.smem_bytes() > limit:
            print(f"--config {spec}: {cfg.smem_bytes()} B of shared memory, over the device's {limit}: skipped")
            continue
        candidates.append((f"x{n}", cfg))
    H, I = args.hidden_size, args.intermediate_size
    rows = check(200, 520, 1176, candidates, seed=1)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for T in (int(t) for t in args.tokens.split(",")):
        checked = check(T, H, I, candidates, seed=T)
        ms = timing(T, H, I, candidates, args.iters, args.block, flush)
        for r in checked:
            r.update(ms=round(ms[r["config"]], 4), tl_ms=round(ms["tl"], 4), tl_over_gluon=round(ms["tl"] / ms[r["config"]], 4))
        rows += checked
        torch.cuda.empty_cache()
    table = pd.DataFrame(rows)
    out = Path(args.out) if args.out else (Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "build" / "probe")
    path = out if out.suffix == ".csv" else out / "gluon_grad_x_probe.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False)
    cols = [c for c in ("T", "config", "same_bits", "max_err_over_bound", "ms", "tl_ms", "tl_over_gluon") if c in table]
    print(table[cols].to_string(index=False))
    print(f"wrote {path}")
    return 0 if table["finite"].all() else 1


if __name__ == "__main__":
    raise SystemExit(main())
