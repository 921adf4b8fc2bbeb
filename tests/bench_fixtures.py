"""A SYNTHETIC recorded bench run for tests: schema of ``swiglu_lab.bench``, made-up latencies.

The numbers are derived from the datasheet SOL times times fixed factors, so tests can check
aggregates exactly. They go to a tmp folder only: never commit them under data/.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from swiglu import CASES, HIDDEN_SIZE, INTERMEDIATE_SIZE, roofline

#: Synthetic latency (the median) = factor x H200 datasheet SOL time; p20, p80, mean and min are
#: 0.99, 1.01, 1.04 and 0.98 times it, so code that reads the wrong statistic gets another number.
FACTORS = {"eager": 1.65, "compile": 1.55, "cublas-gemms": 1.52, "triton": 1.3}
#: With ``power=True``: board power (W) and SM clock (MHz) per implementation, the same in every
#: case; energy per iteration = power x latency; one L2 flush costs FLUSH_J.
POWER_W = {"eager": 600.0, "compile": 650.0, "cublas-gemms": 660.0, "triton": 640.0}
CLOCK_MHZ = {"eager": 1500.0, "compile": 1450.0, "cublas-gemms": 1440.0, "triton": 1480.0}
FLUSH_J = 0.01
POWER_COLUMNS = [
    "power_w",
    "sm_clock_mhz",
    "power_samples",
    "energy_j",
    "flush_energy_j",
    "energy_per_backward_j",
    "energy_iters",
    "energy_window_s",
]

COLUMNS = [
    "run_id",
    "case",
    "seq_len",
    "batch_size",
    "tokens",
    "hidden_size",
    "intermediate_size",
    "impl",
    "protocol",
    "warmup",
    "iters",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "mean_ms",
    "min_ms",
    "first_call_s",
    "tflops",
    "gbps",
    "hardware",
    "sol_ms",
    "sol_fraction",
    "sol_ms_measured",
    "sol_fraction_measured",
    "speedup_vs_eager",
    "speedup_vs_compile",
    "peak_mem_gb",
    "correct",
    "min_match_fraction",
    "note",
]


def write_synthetic_run(
    bench_dir: Path,
    run_id: str = "20261201T000000Z-synthetic",
    protocol: str = "full",
    utc: str = "2026-12-01T00:00:00Z",
    factors: dict[str, float] = FACTORS,
    cases=CASES,
    power: bool = False,
    kernels: bool = False,
) -> Path:
    """Write ``<run_id>.csv`` + ``.json`` (and append ``runs.csv``) into ``bench_dir``. Without
    ``power`` the CSV has the columns of runs recorded before power was sampled (none of
    ``POWER_COLUMNS``); with it, those columns too (``POWER_W``, ``CLOCK_MHZ``, ``FLUSH_J``).
    ``kernels``: also ``kernels/<run_id>.csv``, a breakdown per case and impl: ``KERNEL_SPLIT``
    of the median minus ``IDLE_MS`` per kernel (so the GPU idles ``IDLE_MS`` in the timed median)."""
    bench_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in cases:
        T, H, I = case.tokens, HIDDEN_SIZE, INTERMEDIATE_SIZE
        sol_ms = roofline.sol_time_s(T, "H200-SXM") * 1e3
        for impl, factor in factors.items():
            ms = sol_ms * factor
            rows.append(
                {
                    "run_id": run_id,
                    "case": case.name,
                    "seq_len": case.seq_len,
                    "batch_size": case.batch_size,
                    "tokens": T,
                    "hidden_size": H,
                    "intermediate_size": I,
                    "impl": impl,
                    "protocol": protocol,
                    "warmup": 10,
                    "iters": 50,
                    "median_ms": ms,
                    "p20_ms": ms * 0.99,
                    "p80_ms": ms * 1.01,
                    "mean_ms": ms * 1.04,
                    "min_ms": ms * 0.98,
                    "first_call_s": 1.0,
                    "tflops": roofline.flops(T) / ms / 1e9,
                    "gbps": roofline.min_bytes(T) / ms / 1e6,
                    "hardware": "H200-SXM",
                    "sol_ms": sol_ms,
                    "sol_fraction": 1 / factor,
                    "sol_ms_measured": float("nan"),
                    "sol_fraction_measured": float("nan"),
                    "speedup_vs_eager": factors.get("eager", math.nan) / factor,
                    "speedup_vs_compile": factors.get("compile", math.nan) / factor,
                    "peak_mem_gb": 1.0,
                    "correct": None if impl == "cublas-gemms" else True,
                    "min_match_fraction": 1.0,
                    "note": "SYNTHETIC test fixture",
                }
            )
            if power:
                w = POWER_W.get(impl, 500.0)
                energy = w * ms / 1e3 + FLUSH_J
                rows[-1].update(
                    {
                        "power_w": w,
                        "sm_clock_mhz": CLOCK_MHZ.get(impl, 1500.0),
                        "power_samples": 40,
                        "energy_j": energy,
                        "flush_energy_j": FLUSH_J,
                        "energy_per_backward_j": energy - FLUSH_J,
                        "energy_iters": 50,
                        "energy_window_s": 1.0,
                    }
                )
    if kernels:
        write_synthetic_kernels(bench_dir, run_id, rows)
    csv = bench_dir / f"{run_id}.csv"
    columns = COLUMNS[:-1] + POWER_COLUMNS + COLUMNS[-1:] if power else COLUMNS
    pd.DataFrame(rows, columns=columns).to_csv(csv, index=False)
    meta = {
        "run_id": run_id,
        "gpu_name": "SYNTHETIC H200",
        "sm_count": 132,
        "driver": "000.00",
        "cuda": "13.0",
        "torch": "2.11.0",
        "triton": "3.6.0",
        "python": "3.12",
        "git_commit": "0" * 40,
        "git_dirty": False,
        "utc": utc,
        "complete": True,
        "protocol": {"name": protocol, "warmup": 10, "iters": 50},
        "ceilings": {"copy_tbps": 4.2, "gemm_tflops": 750.0},
    }
    if power:
        meta.update(
            max_sm_clock_mhz=1980.0,
            power_limit_w=700.0,
            power={"backend": "SYNTHETIC", "max_sm_clock_mhz": 1980.0, "power_limit_w": 700.0},
        )
    (bench_dir / f"{run_id}.json").write_text(json.dumps(meta, indent=1))
    index = bench_dir / "runs.csv"
    entry = pd.DataFrame(
        [
            {
                "run_id": run_id,
                "utc": utc,
                "gpu": meta["gpu_name"],
                "protocol": protocol,
                "commit": meta["git_commit"],
                "n_rows": len(rows),
            }
        ]
    )
    entry.to_csv(index, mode="a", header=not index.exists(), index=False)
    return csv


#: Synthetic breakdown: kernel (name) -> share of the row's median; the host lead before the first kernel.
KERNEL_SPLIT = {"dswiglu_gemm_kernel": 0.2, "grad_weight_kernel": 0.5, "grad_x_kernel": 0.3}
IDLE_MS = 0.1  # timed median - profiled busy time
LEAD_MS, GAPS_MS = 0.02, 0.03  # of which the profiled loop measured as GPU idle


def write_synthetic_kernels(bench_dir: Path, run_id: str, rows: list[dict]) -> Path:
    """``kernels/<run_id>.csv`` for ``rows`` (see ``write_synthetic_run``)."""
    from swiglu_lab.bench import breakdown

    out = []
    for r in rows:
        for position, (name, share) in enumerate(KERNEL_SPLIT.items()):
            out.append(
                dict(
                    run_id=run_id,
                    case=r["case"],
                    tokens=r["tokens"],
                    impl=r["impl"],
                    position=position,
                    kernel=name,
                    role=breakdown.kernel_role(name),
                    ms=share * (r["median_ms"] - IDLE_MS),
                    seen=3,
                    busy_ms=r["median_ms"] - IDLE_MS,
                    lead_ms=LEAD_MS,
                    gaps_ms=GAPS_MS,
                    span_ms=r["median_ms"] - IDLE_MS + LEAD_MS + GAPS_MS,
                    profiled_calls=3,
                    timed_ms=r["median_ms"],
                )
            )
    path = bench_dir / "kernels" / f"{run_id}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(out, columns=list(breakdown.COLUMNS)).to_csv(path, index=False)
    return path


def write_synthetic_tp_run(
    tp_dir: Path,
    run_id: str = "20261201T000000Z-synthetic",
    tp: int = 2,
    bus_gbps: float = 300.0,
    latency_ms: float = 0.02,
    hidden: float = 0.5,
) -> Path:
    """A SYNTHETIC ``swiglu_lab.bench.tp`` run: one-GPU time = triton factor x SOL, compute at I/N =
    one-GPU / N x 1.02, the all-reduce exactly ``latency + bus bytes / bus_gbps``, ``tp_ours`` with
    the fraction ``hidden`` of it overlapped. Writes ``tp_<run_id>.csv``, ``_check.csv``, ``.json``."""
    from swiglu_lab.bench import tp_model

    tp_dir.mkdir(parents=True, exist_ok=True)
    rows, checks = [], []
    H, I = HIDDEN_SIZE, INTERMEDIATE_SIZE
    for case in CASES:
        single = roofline.sol_time_s(case.tokens, "H200-SXM") * 1e3 * FACTORS["triton"]
        comm = latency_ms + float(tp_model.bus_bytes(case.tokens, H, tp)) / (bus_gbps * 1e9) * 1e3
        compute = single / tp * 1.02

        def add(impl, ms, local=I // tp):
            rows.append(
                dict(
                    run_id=run_id,
                    case=case.name,
                    seq_len=case.seq_len,
                    batch_size=case.batch_size,
                    tokens=case.tokens,
                    hidden_size=H,
                    intermediate_size=I,
                    tp=tp,
                    local_intermediate_size=local,
                    impl=impl,
                    protocol="full",
                    warmup=10,
                    iters=50,
                    median_ms=ms,
                    p20_ms=ms * 0.99,
                    p80_ms=ms * 1.01,
                    mean_ms=ms * 1.04,
                    min_ms=ms * 0.98,
                    note="SYNTHETIC",
                )
            )

        for n in (1, tp, 4, 8):
            add("ours_local_compute", single if n == 1 else single / n * 1.02, I // n)
        add("tp_allreduce", comm)
        add("tp_ours", compute + (1 - hidden) * comm)
        add("tp_ours_module", compute * 1.01 + comm)
        add("tp_plain_module", compute * 1.08 + 2 * comm)
        add("tp_serial", compute + comm)
        add("tp_early", compute + 0.5 * comm)
        for name in ("grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight"):
            checks.append(
                dict(
                    case=case.name,
                    tokens=case.tokens,
                    output=name,
                    passed=True,
                    match_fraction=1.0,
                    nonfinite=0,
                    bitwise_repeatable=True,
                    run_id=run_id,
                )
            )
    csv = tp_dir / f"tp_{run_id}.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    pd.DataFrame(checks).to_csv(tp_dir / f"tp_{run_id}_check.csv", index=False)
    meta = {
        "run_id": run_id,
        "tp": tp,
        "shape": {"hidden_size": H, "intermediate_size": I, "local_intermediate_size": I // tp},
        "gpu": {"name": "SYNTHETIC H200"},
        "nccl_version": "0.0.0",
        "software": {"torch": "2.11.0", "triton": "3.6.0"},
        "git_commit": "synthetic",
        "parts": ["all"],
        "protocol": {"name": "full"},
        "train": {"passed": True},
    }
    (tp_dir / f"tp_{run_id}.json").write_text(json.dumps(meta, indent=1))
    return csv
