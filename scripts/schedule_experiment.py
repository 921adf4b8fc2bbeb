"""Launch schedules and co-resident configurations of the Triton backward at small and mid T.

Run on the GPU:  PYTHONPATH=src python3 scripts/schedule_experiment.py --tokens 128,256,512,1024,2048 --out $OUT

For every T and variant (one stream or two, tuned or co-resident tile configs, SM splits) it runs
the whole backward (``triton_swiglu_backward``) on the benchmark's inputs at full Hermes size,
checks the four gradients against the one-stream tuned schedule (bitwise, else relative error;
outputs poisoned with NaN first), and times it as the benchmark does (CUDA events, L2 flushed
before every iteration, median), with NVML power and SM clock sampled beside the timed loop.
Writes schedule.csv to --out and prints a table last.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import threading
import time
from dataclasses import asdict

import torch

from swiglu import make_inputs, relative_error
from swiglu.triton_backward import (KernelConfig as K, launch_dswiglu, launch_grad_down, launch_grad_x,
                                    triton_swiglu_backward)

# Co-resident tile configs: 4 warps and <= ~110 KB of shared memory each, so one program of a
# read-bound kernel and one of a write-bound kernel fit on one SM together (228 KB, 64K registers).
CORES_A = dict(dswiglu=K(128, 128, 64, 8, 2, 3, 4), grad_weights=K(128, 128, 64, 32, 1, 2, 4, flatten=True),
               grad_x=K(64, 256, 64, 8, 1, 3, 4))
CORES_B = dict(dswiglu=K(128, 128, 64, 8, 2, 4, 4), grad_weights=K(128, 128, 64, 32, 2, 2, 4, flatten=True),
               grad_x=K(64, 256, 64, 8, 1, 4, 4))
CORES_C = dict(dswiglu=K(64, 256, 64, 8, 2, 3, 4), grad_weights=K(128, 128, 64, 32, 1, 2, 4, flatten=True),
               grad_x=K(64, 256, 64, 8, 1, 3, 4))


def split(configs_for_t, read_programs: int, write_programs: int):
    from dataclasses import replace
    return dict(dswiglu=replace(configs_for_t["dswiglu"], max_programs=read_programs),
                grad_x=replace(configs_for_t["grad_x"], max_programs=read_programs),
                grad_weights=replace(configs_for_t["grad_weights"], max_programs=write_programs))


def tuned(T):
    from swiglu.triton_backward import config_for
    return {k: config_for(k, T) for k in ("dswiglu", "grad_weights", "grad_x")}


def weights(T, cfg):
    from dataclasses import replace
    t = tuned(T)
    t["grad_weights"] = cfg
    return t


def variants(T):
    t = tuned(T)
    return [
        ("serial-tuned", False, None),
        ("cublas-weights", False, "cublas"),
        ("w-bk128-e4-s2", False, weights(T, K(128, 256, 128, 32, 4, 2, 8, flatten=True))),
        ("w-e4-s3", False, weights(T, K(128, 256, 64, 32, 4, 3, 8, flatten=True))),
        ("w-e2-s2", False, weights(T, K(128, 256, 64, 32, 2, 2, 8, flatten=True))),
        ("w-256x128", False, weights(T, K(256, 128, 64, 32, 2, 3, 8, flatten=True))),
        ("w-e1-s2", False, weights(T, K(128, 256, 64, 32, 1, 2, 8, flatten=True))),
    ]


def cublas_weights_backward(go, x, gate, up, act, gw, uw, dw, out=None):
    """Our dswiglu and grad_x kernels, cuBLAS (torch.mm) for the three weight gradients."""
    from swiglu.triton_backward import config_for, launch_dswiglu, launch_grad_x
    T, H = go.shape[-2] * (go.numel() // (go.shape[-1] * go.shape[-2])), go.shape[-1]
    go, x = go.reshape(T, H), x.reshape(T, H)
    I = gw.shape[0]
    gate, up, act = (t.reshape(T, I) for t in (gate, up, act))
    d_gate, d_up, h = (torch.empty((T, I), device=go.device, dtype=torch.bfloat16) for _ in range(3))
    launch_dswiglu(go, dw, gate, up, act, d_gate, d_up, h, config_for("dswiglu", T))
    out = out or (None,) * 4
    grad_x = out[0] if out[0] is not None else torch.empty((T, H), device=go.device, dtype=torch.bfloat16)
    launch_grad_x(d_gate, d_up, gw, uw, grad_x, config_for("grad_x", T))
    ggw = torch.mm(d_gate.t(), x, out=out[1]) if out[1] is not None else torch.mm(d_gate.t(), x)
    guw = torch.mm(d_up.t(), x, out=out[2]) if out[2] is not None else torch.mm(d_up.t(), x)
    gdw = torch.mm(go.t(), h, out=out[3]) if out[3] is not None else torch.mm(go.t(), h)
    return grad_x, ggw, guw, gdw


class Power:
    """NVML power (W) and SM clock (MHz) sampled every 20 ms while active."""

    def __init__(self):
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nv = pynvml
            self.h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        except Exception as e:  # noqa: BLE001 - power is optional here
            print("no NVML:", e)
            self.nv = None
        self.samples = []

    def __enter__(self):
        self.samples = []
        self.stop = threading.Event()
        if self.nv:
            self.e0 = self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h)
            self.t = threading.Thread(target=self._run, daemon=True)
            self.t.start()
        return self

    def _run(self):
        while not self.stop.is_set():
            self.samples.append((self.nv.nvmlDeviceGetPowerUsage(self.h) / 1e3,
                                 self.nv.nvmlDeviceGetClockInfo(self.h, self.nv.NVML_CLOCK_SM)))
            time.sleep(0.02)

    def __exit__(self, *a):
        self.stop.set()
        if self.nv:
            self.t.join()
            self.energy_j = (self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h) - self.e0) / 1e3

    def summary(self):
        if not self.samples:
            return float("nan"), float("nan"), float("nan")
        return (statistics.mean(s[0] for s in self.samples), statistics.mean(s[1] for s in self.samples),
                self.energy_j)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="128,256,512,1024,2048")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default=os.environ.get("OUT", "build"))
    ap.add_argument("--only", default="", help="comma-separated variant names")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    H, I = 16384, 53248
    flush = torch.empty(256 * 1024 * 1024 // 4, device="cuda", dtype=torch.float32)
    rows = []
    for T in [int(t) for t in args.tokens.split(",")]:
        inp = make_inputs(1, T, H, I, device="cuda", seed=T)
        tensors = (inp.grad_output, inp.x, inp.gate_output, inp.up_output, inp.activated_gate,
                   inp.gate_weight, inp.up_weight, inp.down_weight)
        base = None
        for name, streams, cfgs in variants(T):
            if args.only and name not in args.only.split(","):
                continue
            row = dict(tokens=T, variant=name, streams=streams,
                       configs=cfgs if isinstance(cfgs, str) else {k: asdict(v) for k, v in (cfgs or {}).items()})
            try:
                outs = (torch.full((T, H), float("nan"), device="cuda", dtype=torch.bfloat16),
                        torch.full((I, H), float("nan"), device="cuda", dtype=torch.bfloat16),
                        torch.full((I, H), float("nan"), device="cuda", dtype=torch.bfloat16),
                        torch.full((H, I), float("nan"), device="cuda", dtype=torch.bfloat16))
                t0 = time.time()
                if cfgs == "cublas":
                    call = lambda out=None: cublas_weights_backward(*tensors, out=out)  # noqa: E731
                else:
                    call = lambda out=None: triton_swiglu_backward(*tensors, configs=cfgs, streams=streams, out=out)  # noqa: E731
                grads = call(outs)
                torch.cuda.synchronize()
                row["first_call_s"] = round(time.time() - t0, 2)
                grads = [g.clone() for g in grads]
                if base is None:
                    base = grads
                row["bitwise"] = all(torch.equal(g, b) for g, b in zip(grads, base))
                row["max_rel_err_vs_serial"] = max(relative_error(g, b) for g, b in zip(grads, base))
                row["all_finite"] = all(bool(torch.isfinite(g).all()) for g in grads)
                del grads, outs
                fn = call
                for _ in range(args.warmup):
                    fn()
                times = []
                with Power() as pw:
                    for _ in range(args.iters):
                        flush.zero_()
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        fn()
                        e.record()
                        e.synchronize()
                        times.append(s.elapsed_time(e))
                p, clk, ej = pw.summary()
                row.update(ms=statistics.median(times), p20=sorted(times)[len(times) // 5], power_w=p, sm_mhz=clk,
                           energy_j_window=ej, note="")
            except Exception as e:  # noqa: BLE001 - one bad variant must not end the run
                import traceback
                traceback.print_exc(limit=3)
                row.update(ms=float("nan"), note=f"{type(e).__name__}: {str(e)[:160]}")
            rows.append(row)
            print(row, flush=True)
        del inp, tensors, base
        torch.cuda.empty_cache()

    path = os.path.join(args.out, "schedule.csv")
    keys = sorted({k for r in rows for k in r})
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    print(f"\n{'T':>5} {'variant':<17} {'ms':>7} {'vs serial':>9} {'W':>5} {'MHz':>5} bitwise err", file=sys.stderr)
    serial = {r["tokens"]: r["ms"] for r in rows if r["variant"] == "serial-tuned"}
    for r in rows:
        print(f"{r['tokens']:>5} {r['variant']:<17} {r['ms']:>7.3f} {serial.get(r['tokens'], float('nan')) / r['ms']:>9.3f} "
              f"{r.get('power_w', float('nan')):>5.0f} {r.get('sm_mhz', float('nan')):>5.0f} {r.get('bitwise')} "
              f"{r.get('max_rel_err_vs_serial', float('nan')):.1e} {r['note'][:50]}", file=sys.stderr)


if __name__ == "__main__":
    main()
