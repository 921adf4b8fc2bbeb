"""Each GEMM of the backward under sustained load, ours beside cuBLAS's: time, power, SM clock.

Answer (data/tuning/backward_power_0f70282_20261202.csv, docs/results.md): every variant runs
at the power cap, none thermally slowed; our weight gradients take 7-14% less time than cuBLAS's
at T = 128-512 at a 2.5-17% lower clock, grad_x 5.7% more at T = 128 and 1.5-2.7% at 256-512,
dSwiGLU 4-8% more than the bare cuBLAS GEMM at 256-512; all level at 2048.

The bench's power window covers a whole backward; this finds which of its kernels runs at which
clock at the card's power cap. Per token count, at Hermes size, each variant runs back to back
for ``--seconds`` (the benchmark's 256 MB L2 flush before each call with ``--flush 1``), the
variants taken in turn for ``--rounds`` rounds; NVML samples board power and SM clock
(``swiglu_lab.bench.power``) and, in a thread of its own, the clock event reasons (the fraction
of samples with the software power cap, and with any thermal or hardware slowdown). Per variant:
median ms per call, mean W, MHz, J per call and kilocycles per call (ms x MHz: the work a kernel
needs at its own clock). Variants: the whole backward (ours: the plan's launches; eager: the
reference); our dSwiGLU, one weight gradient per output shape, grad_x, each as the plan
launches it; cuBLAS's GEMMs of the same shapes (the dSwiGLU's g = grad_output @ down_weight
without its epilogue; grad_x over K = 2I as one GEMM). GPU only.

    python lab/probes/probe_backward_power.py --tokens 128,256,512,2048 --out build/probe
"""

from __future__ import annotations

import argparse
import math
import statistics
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]

from probe_wgrad_power import in_turn, power_summary, sustained  # noqa: E402  (this folder)

#: NVML clock event reason bits (nvmlClocksEventReason*): software power cap; thermal and
#: hardware slowdowns (HW slowdown, SW thermal, HW thermal, HW power brake).
POWER_CAP = 0x4
SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80


def host_sustained(fn, calls: int, monitor=None, before=None) -> tuple[float, dict]:
    """``sustained`` on the CPU (host wall clock, no power columns)."""
    t0 = time.perf_counter()
    for _ in range(calls):
        if before is not None:
            before()
        fn()
    return (time.perf_counter() - t0) * 1e3 / calls, {}


class Reasons:
    """Samples ``nvmlDeviceGetCurrentClocksEventReasons`` every ``interval_s`` in a thread;
    ``window()`` -> (fraction power-capped, fraction slowed) since the last call."""

    def __init__(self, device, interval_s: float = 0.01):
        import pynvml

        from swiglu_lab.bench.power import _nvml_handle  # by UUID: CUDA and NVML number GPUs apart

        pynvml.nvmlInit()
        self.nvml, self.handle = pynvml, _nvml_handle(pynvml, device)
        self.read = getattr(
            pynvml, "nvmlDeviceGetCurrentClocksEventReasons", getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        )
        self.samples: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
        self.thread.start()

    def _run(self, interval_s: float) -> None:
        while not self.stop.is_set():
            try:
                self.samples.append(int(self.read(self.handle)))
            except Exception:  # noqa: BLE001 - a missed sample
                pass
            time.sleep(interval_s)

    def window(self) -> tuple[float, float]:
        """(fraction of samples power-capped, fraction slowed down) since the last call; NaN
        when there was no sample."""
        got, self.samples = self.samples, []
        if not got:
            return math.nan, math.nan
        return sum(bool(s & POWER_CAP) for s in got) / len(got), sum(bool(s & SLOWDOWN) for s in got) / len(got)

    def close(self) -> None:
        """Stop the sampling thread."""
        self.stop.set()
        self.thread.join()


def variants_at(T: int, dev, gen, H: int = 16384, I: int = 53248):
    """(label -> callable(), label -> (output, reference) to check after its first call) for one
    token count: our variants' outputs against the eager reference's gradients."""
    import torch

    from swiglu.inputs import make_inputs
    from swiglu.kernels import backward
    from swiglu.kernels.tma import tma_ready
    from swiglu.reference import reference_backward

    inp = make_inputs(1, T, H, I, generator=gen, device=dev)
    tensors = tuple(t.reshape(-1, t.shape[-1]) if t.dim() == 3 else t for t in inp.as_tuple())
    ref_x, ref_gate_w, _, ref_down_w = reference_backward(*tensors)
    go, x, gate, up, act, gate_w, up_w, down_w = (tma_ready(t) for t in tensors)
    backward.clear_plans()
    plan = backward.backward_plan(T, H, I, backward.plan_device(dev))
    d_gate, d_up, h = (torch.empty(T, I, device=dev, dtype=torch.bfloat16) for _ in range(3))
    backward.launch_planned_dswiglu(plan, go, down_w, gate, up, act, d_gate, d_up, h)
    d_cat = torch.cat([d_gate, d_up], dim=1)
    w_cat = torch.cat([gate_w, up_w], dim=0)
    o_ih, o_hi = torch.empty(I, H, device=dev, dtype=torch.bfloat16), torch.empty(H, I, device=dev, dtype=torch.bfloat16)
    o_ti, o_th = torch.empty(T, I, device=dev, dtype=torch.bfloat16), torch.empty(T, H, device=dev, dtype=torch.bfloat16)
    g_gate, g_up, g_hi = (torch.empty_like(t) for t in (d_gate, d_up, h))

    def grad_x():
        backward.launch_planned_grad_x(plan, d_gate, d_up, gate_w, up_w, o_th)

    wg, gwg = plan.grad_weights, plan.gluon_grad_weights
    checks = {
        "ours grad_gate_weight [I,H]": (o_ih, ref_gate_w),
        "ours grad_down_weight [H,I]": (o_hi, ref_down_w),
        "ours grad_x": (o_th, ref_x.reshape(T, H)),
    }
    return {
        "ours backward": lambda: backward.launch_backward(tensors, plan=plan, needs=(True,) * 4),
        "eager backward": lambda: reference_backward(*tensors),
        "ours dSwiGLU": lambda: backward.launch_planned_dswiglu(plan, go, down_w, gate, up, act, g_gate, g_up, g_hi),
        "cublas g = go @ down_w": lambda: torch.matmul(go, down_w, out=o_ti),
        "ours grad_gate_weight [I,H]": lambda: backward.launch_grad_weight_gluon_or_tl(
            d_gate, x, o_ih, wg, gwg, plan.grad_weight_programs_ih
        ),
        "cublas grad_gate_weight [I,H]": lambda: torch.matmul(d_gate.T, x, out=o_ih),
        "ours grad_down_weight [H,I]": lambda: backward.launch_grad_weight_gluon_or_tl(
            go, h, o_hi, wg, gwg, plan.grad_weight_programs_hi
        ),
        "cublas grad_down_weight [H,I]": lambda: torch.matmul(go.T, h, out=o_hi),
        "ours grad_x": grad_x,
        "cublas grad_x (K = 2I)": lambda: torch.matmul(d_cat, w_cat, out=o_th),
    }, checks


def main(argv=None) -> int:
    import torch

    from swiglu_lab.bench.power import open_monitor

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="128,256,512,2048")
    p.add_argument("--seconds", type=float, default=0.5, help="per variant, round and flush mode")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--flush", default="1", help="0: back to back; 1: L2 flush before each call")
    p.add_argument("--only", default="", help="comma-separated label prefixes to keep (default: all)")
    p.add_argument("--hidden-size", type=int, default=16384)
    p.add_argument("--intermediate-size", type=int, default=53248)
    p.add_argument("--device", default="cuda", help="cpu: the wiring and checks only (Triton interpreter)")
    p.add_argument("--out", default=str(REPO / "build" / "probe"))
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    gen = torch.Generator(device=dev).manual_seed(0)
    monitor, why = open_monitor(dev, interval_s=0.01, min_window_s=0.0)
    print(why)
    reasons = Reasons(dev) if dev.type == "cuda" else None
    flush_buf = torch.empty(256 * 2**20 if dev.type == "cuda" else 1024, dtype=torch.uint8, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    timer = sustained if dev.type == "cuda" else host_sustained
    failed = []
    keep = tuple(k for k in args.only.split(",") if k)
    rows = []
    for T in (int(t) for t in args.tokens.split(",")):
        fns, checks = variants_at(T, dev, gen, args.hidden_size, args.intermediate_size)
        fns = {k: v for k, v in fns.items() if not keep or k.startswith(keep)}
        calls = {}
        for label, fn in fns.items():
            if label in checks:
                checks[label][0].fill_(float("nan"))
            fn()
            sync()
            if label in checks:
                got, ref = (t.float() for t in checks[label])
                err = ((got - ref).abs().max() / ref.abs().max()).item()
                print(f"T={T} {label}: max error / max |reference| {err:.2e}")
                if not err <= 2e-2:  # NaN fails too
                    failed.append(f"T={T} {label}")
            calls[label] = max(3, math.ceil(args.seconds * 1e3 / timer(fn, 3)[0]))
        for flush in (int(f) for f in args.flush.split(",")):

            def measure(label, flush=flush, fns=fns):
                if reasons:
                    reasons.window()
                ms, power = timer(fns[label], calls[label], monitor, flush_buf.zero_ if flush else None)
                capped, slowed = reasons.window() if reasons else (math.nan, math.nan)
                return dict(ms=ms, capped=capped, slowed=slowed, **power)

            for label, got in in_turn(fns, args.rounds, measure).items():
                ms = statistics.median(g["ms"] for g in got)
                mhz = statistics.mean(g.get("sm_clock_mhz", math.nan) for g in got)
                summary = power_summary(got)
                rows.append(
                    dict(
                        T=T,
                        variant=label,
                        flush=bool(flush),
                        calls=calls[label],
                        **{k: summary[k] for k in ("ms_per_call", "power_w", "sm_clock_mhz")},
                        kcycles_per_call=round(ms * mhz, 1),
                        energy_j_per_call=summary["energy_j_per_call"],
                        power_capped=round(statistics.mean(g["capped"] for g in got), 2),
                        slowdown=round(statistics.mean(g["slowed"] for g in got), 2),
                    )
                )
        del fns, checks, measure  # the variants' tensors, before the next T's
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if reasons:
        reasons.close()
    if monitor:
        monitor.close()
    df = pd.DataFrame(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    df.to_csv(out / f"backward_power_{stamp}.csv", index=False)
    print(df.to_string(index=False))
    if failed:
        print("MISMATCH:", failed)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
