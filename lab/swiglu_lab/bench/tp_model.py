"""Tensor-parallel results and scaling model: pure arithmetic on the rows ``swiglu_lab.bench.tp`` writes.

Nothing here touches a device (tested on CPU). Definitions (per case, at TP = N):

* ``compute_ms``: our backward on one rank's shard alone (``ours_local_compute`` at local I = I/N);
  ``single_ms``: the same at local I = I (one GPU, the whole MLP).
* ``allreduce_ms``: the all-reduce of grad_x alone ([T, H] bf16, ``tp_allreduce``).
* ``overlap``: the share of the collective hidden behind compute,
  ``(compute_ms + allreduce_ms - tp_ms) / allreduce_ms`` (0: run one after the other, 1: fully
  hidden; noise can push it slightly outside [0, 1]).
* ``efficiency``: ``single_ms / (N * tp_ms)`` (1: perfect scaling).
* Bus bandwidth of an all-reduce of B bytes over N ranks taking t: ``2 (N - 1) / N * B / t``
  (the ring algorithm's traffic per rank; NCCL's nccl-tests convention, PERFORMANCE.md there).
* Model for TP = N from one-GPU timings: ``compute_ms`` at I/N measured on one GPU, the
  collective ``latency + 2 (N - 1) / N * B / bus_bandwidth`` with latency and bandwidth fitted to
  the measured all-reduces; serial time = compute + collective. The collective can only hide
  behind the weight-gradient GEMMs that run after grad_x (3 of the 6 equal-FLOP GEMMs:
  ``hide_window_ms = compute_ms / 2``); where it exceeds that window, communication stops being
  hidden even with perfect overlap.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

#: Rows of one run: impl names written by swiglu_lab.bench.tp.
COMPUTE, ALLREDUCE, TP_OURS, TP_PLAIN_MODULE, TP_OURS_MODULE = (
    "ours_local_compute",
    "tp_allreduce",
    "tp_ours",
    "tp_plain_module",
    "tp_ours_module",
)
BYTES_PER_ELEMENT = 2  # bf16


def bus_bytes(tokens, hidden_size: int, tp: int):
    """Bytes each rank moves in a ring all-reduce of a [tokens, H] bf16 tensor over ``tp`` ranks."""
    return 2 * (tp - 1) / tp * np.asarray(tokens, dtype=float) * hidden_size * BYTES_PER_ELEMENT


def _median(rows: pd.DataFrame, impl: str, tp_local: int | None = None, column: str = "median_ms") -> pd.Series:
    sel = rows[rows["impl"] == impl]
    if tp_local is not None:
        sel = sel[sel["local_intermediate_size"] == tp_local]
    if column not in sel:
        return pd.Series(dtype=float)
    return sel.groupby("case")[column].median()


def fit_allreduce(rows: pd.DataFrame) -> tuple[float, float]:
    """``(latency_ms, bus_gbps)`` of a least-squares line ``t = latency + bus_bytes / bw`` through
    the measured ``tp_allreduce`` medians (one point per token count). Raises ``ValueError`` with
    fewer than two distinct token counts."""
    sel = (
        rows[rows["impl"] == ALLREDUCE]
        .groupby("tokens")
        .agg(t=("median_ms", "median"), hidden=("hidden_size", "first"), tp=("tp", "first"))
    )
    if len(sel) < 2:
        raise ValueError(f"need tp_allreduce rows at >= 2 token counts to fit bandwidth, got {len(sel)}")
    x = bus_bytes(sel.index.values, int(sel["hidden"].iloc[0]), int(sel["tp"].iloc[0]))
    slope, intercept = np.polyfit(x, sel["t"].values, 1)
    bw = float(1e-9 / (slope * 1e-3)) if slope > 0 else float("inf")
    # Rounded to the digits that carry meaning (timings have ~3): the least-squares solve differs
    # between machines in the last bits, and the model's table is committed (byte-stable).
    return significant(float(intercept), FIT_DIGITS), significant(bw, FIT_DIGITS)


#: Significant digits kept of the fitted latency and bandwidth.
FIT_DIGITS = 6


def significant(value: float, digits: int) -> float:
    """``value`` rounded to ``digits`` significant digits (0, NaN and inf unchanged)."""
    if value == 0 or not np.isfinite(value):
        return value
    return float(f"{value:.{digits}g}")


def case_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per case, measured at the run's TP (``tp`` column): single_ms, compute_ms, allreduce_ms,
    tp_ours_ms, tp_plain_module_ms, tp_ours_module_ms, tp_ours_p20_ms / tp_ours_p80_ms (the
    spread of ours' timed iterations), overlap, efficiency (ours, DTensor op
    path), efficiency_module_ours and efficiency_module_plain. Missing measurements are NaN."""
    if rows.empty:
        return pd.DataFrame()
    tp = int(rows["tp"].iloc[0])
    inter = int(rows["intermediate_size"].iloc[0])
    cases = rows.drop_duplicates("case").set_index("case")[["tokens"]]
    t = cases.assign(
        single_ms=_median(rows, COMPUTE, inter),
        compute_ms=_median(rows, COMPUTE, inter // tp),
        allreduce_ms=_median(rows, ALLREDUCE),
        tp_ours_ms=_median(rows, TP_OURS),
        tp_plain_module_ms=_median(rows, TP_PLAIN_MODULE),
        tp_ours_module_ms=_median(rows, TP_OURS_MODULE),
        tp_ours_p20_ms=_median(rows, TP_OURS, column="p20_ms"),
        tp_ours_p80_ms=_median(rows, TP_OURS, column="p80_ms"),
    )
    t["overlap"] = (t["compute_ms"] + t["allreduce_ms"] - t["tp_ours_ms"]) / t["allreduce_ms"]
    t["efficiency"] = t["single_ms"] / (tp * t["tp_ours_ms"])
    t["efficiency_module_ours"] = t["single_ms"] / (tp * t["tp_ours_module_ms"])
    t["efficiency_module_plain"] = t["single_ms"] / (tp * t["tp_plain_module_ms"])
    t.insert(0, "tp", tp)
    return t.reset_index()


def model_table(
    rows: pd.DataFrame, tps=(2, 4, 8), latency_ms: float | None = None, bus_gbps: float | None = None
) -> pd.DataFrame:
    """Modelled TP scaling per case and TP size from one-GPU compute times at local I = I/N
    (``ours_local_compute`` rows) and the collective model (module docstring); latency and
    bandwidth default to ``fit_allreduce(rows)``. Columns: case, tokens, tp, compute_ms,
    comm_ms, serial_ms, hide_window_ms, comm_fraction (comm / serial), hidden (comm <= window),
    efficiency_serial, efficiency_hidden (comm fully hidden: compute only). A TP size whose
    local-I timing is missing is left out."""
    if latency_ms is None or bus_gbps is None:
        latency_ms, bus_gbps = fit_allreduce(rows)
    inter = int(rows["intermediate_size"].iloc[0])
    hidden = int(rows["hidden_size"].iloc[0])
    cases = rows.drop_duplicates("case").set_index("case")["tokens"]
    single = _median(rows, COMPUTE, inter)
    out = []
    for n in tps:
        compute = _median(rows, COMPUTE, inter // n)
        if compute.empty:
            continue
        for case, c_ms in compute.items():
            tokens = int(cases[case])
            comm = latency_ms + float(bus_bytes(tokens, hidden, n)) / (bus_gbps * 1e9) * 1e3
            serial = c_ms + comm
            out.append(
                dict(
                    case=case,
                    tokens=tokens,
                    tp=n,
                    compute_ms=c_ms,
                    comm_ms=comm,
                    serial_ms=serial,
                    hide_window_ms=c_ms / 2,
                    comm_fraction=comm / serial,
                    hidden=comm <= c_ms / 2,
                    efficiency_serial=single.get(case, np.nan) / (n * serial),
                    efficiency_hidden=single.get(case, np.nan) / (n * c_ms),
                )
            )
    return pd.DataFrame(out)
