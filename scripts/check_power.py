"""Check the bench's power measurement on the GPU (swiglu_lab.bench.power), in one process.

    PYTHONPATH=src:lab python3 scripts/check_power.py

Which backend and power source the harness gets, and whether its two energy figures agree:
for an idle window, a window of back-to-back bf16 GEMMs (8192^3, ~2 s) and a window of L2
flushes, the energy counter's delta over the window (``nvmlDeviceGetTotalEnergyConsumption``)
against the mean sampled power times the window's duration. They should agree within a few
percent on the loaded windows (the counter moves in ~100 ms steps; the instantaneous power
field refreshes at ~50 Hz). Prints a short table last; writes check_power.json under $OUT when set.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from swiglu_lab.bench.power import measure_flush_energy, open_monitor
from swiglu_lab.bench.timing import L2Flusher


def _row(name: str, columns: dict, iterations: int) -> dict:
    duration = columns["energy_window_s"]
    counter_w = columns["energy_j"] * iterations / duration if duration > 0 else float("nan")
    return {
        "window": name,
        "seconds": duration,
        "samples": columns["power_samples"],
        "sampled_w": columns["power_w"],
        "counter_w": counter_w,
        "counter_vs_sampled": counter_w / columns["power_w"] if columns["power_w"] > 0 else float("nan"),
        "sm_clock_mhz": columns["sm_clock_mhz"],
        "energy_per_iter_j": columns["energy_j"],
    }


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("check_power.py needs a CUDA GPU")
    device = torch.device("cuda", torch.cuda.current_device())
    monitor, status = open_monitor(device, min_window_s=1.0)
    print(f"power backend: {status}")
    if monitor is None:
        raise SystemExit("no power backend: the bench will leave the power columns empty")
    info = monitor.describe()
    print(json.dumps(info, indent=1))
    rows = []
    try:
        torch.cuda.synchronize(device)
        time.sleep(0.5)
        window = monitor.open_window()
        time.sleep(1.0)
        rows.append(_row("idle 1 s", monitor.close_window(window, 1), 1))

        n = 8192
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
        for _ in range(20):  # warm up to the loaded clock
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize(device)
        window, iters = monitor.open_window(), 0
        while window.elapsed_s() < 2.0:
            for _ in range(50):
                torch.matmul(a, b, out=c)
            iters += 50
            torch.cuda.synchronize(device)
        columns = monitor.close_window(window, iters)
        row = _row(f"GEMM {n}^3 x {iters}", columns, iters)
        row["tflops"] = 2 * n**3 * iters / columns["energy_window_s"] / 1e12
        row["gflop_per_j"] = 2 * n**3 / 1e9 / columns["energy_j"]
        rows.append(row)
        del a, b, c

        flush = L2Flusher(device)
        t0 = time.time()
        flush_j = measure_flush_energy(monitor, flush, device)
        rows.append(
            {
                "window": f"L2 flush ({flush.nbytes / 1e6:.0f} MB zeroed)",
                "seconds": time.time() - t0,
                "energy_per_iter_j": flush_j,
            }
        )
    finally:
        monitor.close()

    import pandas as pd

    table = pd.DataFrame(rows)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "check_power.json").write_text(json.dumps({"backend": info, "rows": rows}, indent=1, default=str))
    print()
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}", na_rep="-"))


if __name__ == "__main__":
    main()
