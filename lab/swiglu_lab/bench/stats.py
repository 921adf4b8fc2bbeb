"""Pure arithmetic of the benchmark: latency statistics, SOL columns, speed-ups, summaries.

Nothing here touches a device, so all of it is tested on CPU (tests/lab/test_bench.py).

Sources: SOL time ``T_SOL = max(FLOPs / peak_flops, bytes / peak_bandwidth)`` and the geometric
mean over cases are SOL-ExecBench's (``docs/problem.md``); FLOPs ``12*T*H*I`` and minimum
bytes ``2*(4*T*H + 3*T*I + 6*I*H)`` come from ``swiglu.roofline``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import pandas as pd

from swiglu import roofline

#: Latency statistics written per row, in milliseconds.
STAT_COLUMNS = ("median_ms", "p20_ms", "p80_ms", "mean_ms", "min_ms")


def time_stats(times_ms: Iterable[float]) -> dict[str, float]:
    """Median, 20th/80th percentiles (numpy's linear interpolation), mean and minimum of
    per-iteration latencies.

    Args:
        times_ms: one latency per timed iteration, in milliseconds.

    Returns: ``{"median_ms", "p20_ms", "p80_ms", "mean_ms", "min_ms"}`` as floats (ms).

    Raises: ``ValueError`` for no times, or a time that is negative or not finite.
    """
    t = np.asarray(list(times_ms), dtype=np.float64)
    if t.size == 0:
        raise ValueError("time_stats needs at least one time")
    if not np.all(np.isfinite(t)) or np.any(t < 0):
        raise ValueError(f"times must be finite and non-negative, got {t.tolist()}")
    return {
        "median_ms": float(np.median(t)),
        "p20_ms": float(np.percentile(t, 20)),
        "p80_ms": float(np.percentile(t, 80)),
        "mean_ms": float(t.mean()),
        "min_ms": float(t.min()),
    }


def nan_stats() -> dict[str, float]:
    """The statistics of a row that has no timing (an implementation that raised)."""
    return {name: math.nan for name in STAT_COLUMNS}


@dataclass(frozen=True)
class Ceilings:
    """Device ceilings measured in the same run.

    copy_tbps: device-to-device copy bandwidth, bytes read + written per second, in TB/s.
    gemm_tflops: bf16 GEMM rate on random data at a large square shape, in TFLOP/s.
    Either may be NaN when not measured.
    """

    copy_tbps: float = math.nan
    gemm_tflops: float = math.nan


def sol_columns(
    tokens: int,
    hidden_size: int,
    intermediate_size: int,
    median_ms: float,
    hardware: roofline.Hardware | str | None,
    ceilings: Ceilings | None = None,
) -> dict[str, float]:
    """Throughput and speed-of-light columns of one row.

    Args:
        tokens, hidden_size, intermediate_size: T, H, I of the case.
        median_ms: the row's median latency in ms (NaN gives NaN rates and fractions).
        hardware: datasheet peak rates (``roofline.HARDWARE`` key or ``Hardware``) of the device
            the run was made on; ``""`` or ``None`` (no datasheet, e.g. a CPU run) gives NaN
            ``sol_ms`` and ``sol_fraction``.
        ceilings: measured ceilings; ``None`` or NaN fields give NaN measured-SOL columns.

    Returns:
        ``tflops`` = FLOPs / median (TFLOP/s), ``gbps`` = minimum bytes / median (GB/s),
        ``sol_ms`` = datasheet ``max(FLOPs/peak_flops, bytes/peak_bw)`` (ms),
        ``sol_fraction`` = sol_ms / median_ms, ``sol_ms_measured`` =
        ``max(FLOPs/measured_gemm_rate, bytes/measured_copy_bw)`` (ms) and
        ``sol_fraction_measured`` = sol_ms_measured / median_ms.
    """
    ceilings = ceilings or Ceilings()
    f = roofline.flops(tokens, hidden_size, intermediate_size)
    b = roofline.min_bytes(tokens, hidden_size, intermediate_size)
    sol_ms = roofline.sol_time_s(tokens, hardware, hidden_size, intermediate_size) * 1e3 if hardware else math.nan
    sol_measured_ms = max(f / (ceilings.gemm_tflops * 1e12), b / (ceilings.copy_tbps * 1e12)) * 1e3
    ok = math.isfinite(median_ms) and median_ms > 0
    seconds = median_ms * 1e-3
    return {
        "tflops": f / seconds / 1e12 if ok else math.nan,
        "gbps": b / seconds / 1e9 if ok else math.nan,
        "sol_ms": sol_ms,
        "sol_fraction": sol_ms / median_ms if ok else math.nan,
        "sol_ms_measured": sol_measured_ms,
        "sol_fraction_measured": sol_measured_ms / median_ms if ok else math.nan,
    }


def add_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Fill ``speedup_vs_eager`` and ``speedup_vs_compile``: per case, the median latency of
    ``eager`` (``compile``) divided by the row's median. NaN where that baseline was not run,
    failed, or the row itself has no median. Returns a new frame."""
    out = df.copy()
    for column, baseline in (("speedup_vs_eager", "eager"), ("speedup_vs_compile", "compile")):
        base = out.loc[out["impl"] == baseline].set_index("case")["median_ms"]
        out[column] = out["case"].map(base).astype("float64") / out["median_ms"]
    return out


def _gmean(values: pd.Series) -> float:
    vals = values.dropna()
    vals = vals[vals > 0]
    return roofline.geometric_mean(vals) if len(vals) else math.nan


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per implementation (in order of first appearance) over the cases it timed.

    Columns: ``n_cases`` (cases with a finite median), ``gmean_ms`` (geometric mean of medians),
    ``speedup_vs_eager`` / ``speedup_vs_compile`` (geometric mean of the per-case speed-ups, i.e.
    the ratio of geometric means over the shared cases), ``sol_fraction`` and
    ``sol_fraction_measured`` (gmean SOL time / gmean latency over the same cases, as
    docs/problem.md defines it), ``all_correct`` (True when every row passed the
    benchmark's criterion, False when one did not or errored, ``<NA>`` when correctness does
    not apply, e.g. the GEMM-only lower bound).
    """
    rows = []
    for impl, g in df.groupby("impl", sort=False):
        timed = g[g["median_ms"].notna()]
        correct = g["correct"].astype("boolean")
        known = correct.dropna()
        all_correct = pd.NA if known.empty else bool(known.all())
        gm = _gmean(timed["median_ms"])
        rows.append(
            {
                "impl": impl,
                "n_cases": int(len(timed)),
                "gmean_ms": gm,
                "speedup_vs_eager": _gmean(timed["speedup_vs_eager"]),
                "speedup_vs_compile": _gmean(timed["speedup_vs_compile"]),
                "sol_fraction": _gmean(timed["sol_ms"]) / gm if len(timed) else math.nan,
                "sol_fraction_measured": _gmean(timed["sol_ms_measured"]) / gm if len(timed) else math.nan,
                "all_correct": all_correct,
            }
        )
    table = pd.DataFrame(rows)
    if len(table):
        table["all_correct"] = table["all_correct"].astype("boolean")
    return table


def per_case_table(df: pd.DataFrame) -> pd.DataFrame:
    """Case x implementation median latencies (ms), one row per case in run order, with the
    case's ``tokens`` and datasheet ``sol_ms`` as the first and last columns."""
    cases = list(dict.fromkeys(df["case"]))
    impls = list(dict.fromkeys(df["impl"]))
    wide = df.set_index(["case", "impl"])["median_ms"].unstack("impl").reindex(index=cases, columns=impls)
    first = df.groupby("case", sort=False).first()
    wide.insert(0, "tokens", first["tokens"].reindex(cases).astype("int64"))
    wide["sol_ms"] = first["sol_ms"].reindex(cases)
    wide.columns.name = None
    return wide


def power_summary(df: pd.DataFrame) -> pd.DataFrame | None:
    """Per case x implementation: ``energy_per_backward_j`` (J), ``power_w`` (W) and
    ``sm_clock_mhz`` (MHz) as one wide table (columns ``(quantity, impl)``, rows in run order),
    or None when the rows hold no power data (CPU run, run recorded without power columns)."""
    columns = ["energy_per_backward_j", "power_w", "sm_clock_mhz"]
    if not set(columns) <= set(df.columns) or df[columns].notna().sum().sum() == 0:
        return None
    cases = list(dict.fromkeys(df["case"]))
    impls = list(dict.fromkeys(df["impl"]))
    wide = df.set_index(["case", "impl"])[columns].unstack("impl").reindex(index=cases)
    wide = wide.reindex(columns=pd.MultiIndex.from_product([columns, impls]))
    wide.columns = [f"{'J' if q.startswith('energy') else 'W' if q == 'power_w' else 'MHz'} {impl}" for q, impl in wide.columns]
    return wide
