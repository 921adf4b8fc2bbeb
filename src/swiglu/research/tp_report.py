"""Tensor-parallel runs for notebook 05: load the records ``swiglu.bench.tp`` wrote, fall back to
one-GPU bench data for the model, and draw the two figures.

Arithmetic lives in ``swiglu.research.tp_model``; this module reads files and plots.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from . import analysis
from . import tp_model
from ..workloads import HIDDEN_SIZE, INTERMEDIATE_SIZE

#: When no TP run is recorded: the all-reduce bus bandwidth measured by a probe on the 2-GPU H200
#: machine (issue 11: a [4096, 16384] bf16 all-reduce, 268 MB, 297 GB/s bus bandwidth) and an
#: assumed fixed latency. Only used, and labelled as such, without a measured run.
ASSUMED_BUS_GBPS = 297.0
ASSUMED_LATENCY_MS = 0.02


@dataclass
class TPRun:
    """One recorded tensor-parallel run: timing rows, correctness rows (may be empty), metadata."""

    run_id: str
    rows: pd.DataFrame
    checks: pd.DataFrame = field(default_factory=pd.DataFrame)
    meta: dict = field(default_factory=dict)


def load_tp_run(tp_dir: str | Path, run_id: str = "") -> TPRun | None:
    """The recorded tensor-parallel measurements, or None when ``tp_dir`` holds none.

    ``run_id`` empty: every run in ``tp_dir`` with the latest run's TP size and shape merged (the
    parts are usually recorded by separate commands), a later run's row replacing an earlier one
    for the same case, impl and local I; correctness rows from the latest run that has them.
    ``run_id`` given (comma-separated for several): those runs only, merged the same way; the
    ``run_id`` of the result names every merged run. Raises ``ValueError`` for an unknown id."""
    tp_dir = Path(tp_dir)
    csvs = sorted(p for p in tp_dir.glob("tp_*.csv") if not p.name.endswith("_check.csv")) if tp_dir.is_dir() else []
    ids = [p.stem[len("tp_"):] for p in csvs]
    if run_id:
        wanted = [r.strip() for r in run_id.split(",") if r.strip()]
        missing = [r for r in wanted if r not in ids]
        if missing:
            raise ValueError(f"no tensor-parallel run {missing} in {tp_dir}; have {ids}")
        csvs = [p for p, i in zip(csvs, ids) if i in wanted]
    if not csvs:
        return None
    frames = {p.stem[len("tp_"):]: pd.read_csv(p) for p in csvs}
    # A run of the check part alone times nothing (an empty CSV): it contributes its correctness
    # records, never rows (an empty frame would turn every merged column into objects).
    timed = {k: f for k, f in frames.items() if not f.empty}
    key = ["tp", "hidden_size", "intermediate_size"]
    if not run_id and timed:
        target = timed[list(timed)[-1]][key].iloc[0].tolist()
        def key_of(rid: str) -> list:  # a check-only run's TP size and shape, from its metadata
            path = tp_dir / f"tp_{rid}.json"
            meta = json.loads(path.read_text()) if path.is_file() else {}
            shape = meta.get("shape") or {}
            return [meta.get("tp"), shape.get("hidden_size"), shape.get("intermediate_size")]

        frames = {k: f for k, f in frames.items() if (f[key].iloc[0].tolist() if not f.empty else key_of(k)) == target}
        timed = {k: f for k, f in timed.items() if k in frames}
    rows = pd.concat(list(timed.values()) or list(frames.values()), ignore_index=True)
    rows = rows.drop_duplicates(["case", "impl", "local_intermediate_size"], keep="last").reset_index(drop=True)
    checks, meta, train = pd.DataFrame(), {}, {}
    for rid in frames:  # oldest first: the latest run's records win
        check = tp_dir / f"tp_{rid}_check.csv"
        if check.is_file():
            checks = pd.read_csv(check)
        meta_path = tp_dir / f"tp_{rid}.json"
        if meta_path.is_file():
            meta = json.loads(meta_path.read_text())
            train = meta.get("train") or train
    meta = dict(meta, train=train, merged_runs=list(frames))
    return TPRun("+".join(frames), rows, checks, meta)


def single_gpu_source(table: pd.DataFrame, bench_dir: str | Path) -> tuple[pd.DataFrame, str]:
    """``tp_model.case_table`` with ``single_ms`` (and the efficiencies) filled from the latest full
    bench run's one-GPU Triton medians where the TP run did not time one GPU; says which source."""
    if table.empty or table["single_ms"].notna().all():
        return table, "one-GPU time measured in the same TP run (ours at I on each GPU, slowest rank)"
    bench = analysis.load_run(bench_dir, None, "full")
    if bench is None:
        return table, "no one-GPU time: not measured in the TP run and no full bench run recorded"
    ours = bench.rows[bench.rows["impl"] == "triton"].set_index("case")["median_ms"]
    t = table.copy()
    t["single_ms"] = t["single_ms"].fillna(t["case"].map(ours))
    n = t["tp"]
    t["efficiency"] = t["single_ms"] / (n * t["tp_ours_ms"])
    t["efficiency_module_ours"] = t["single_ms"] / (n * t["tp_ours_module_ms"])
    t["efficiency_module_plain"] = t["single_ms"] / (n * t["tp_plain_module_ms"])
    return t, f"one-GPU time from bench run {bench.run_id} (another session: clocks differ by ~1.5% between runs)"


def model_inputs(run: TPRun | None, bench_dir: str | Path) -> tuple[pd.DataFrame, float, float, str]:
    """Rows for ``tp_model.model_table`` and the collective's (latency_ms, bus_gbps), with a
    sentence saying where each came from. Preference: the TP run's own one-GPU timings at I, I/4,
    I/8 and its all-reduces; else the latest full bench run's one-GPU Triton times per case, with
    compute at I/N assumed to be the one-GPU time / N and the bandwidth assumed
    (``ASSUMED_BUS_GBPS``). Returns empty rows when neither exists."""
    if run is not None and not run.rows.empty:
        rows = run.rows
        try:
            latency, bw = tp_model.fit_allreduce(rows)
            source = f"measured in TP run {run.run_id}: compute per rank at I/N on one GPU, all-reduce fit"
        except ValueError:
            latency, bw = ASSUMED_LATENCY_MS, ASSUMED_BUS_GBPS
            source = f"TP run {run.run_id} (compute); all-reduce ASSUMED ({bw:.0f} GB/s, issue 11's probe)"
        return rows, latency, bw, source
    bench = analysis.load_run(bench_dir, None, "full")
    if bench is None:
        return pd.DataFrame(), ASSUMED_LATENCY_MS, ASSUMED_BUS_GBPS, "no data: no TP run and no full bench run"
    ours = bench.rows[bench.rows["impl"] == "triton"]
    H = int(ours["hidden_size"].iloc[0]) if "hidden_size" in ours else HIDDEN_SIZE
    I = int(ours["intermediate_size"].iloc[0]) if "intermediate_size" in ours else INTERMEDIATE_SIZE
    rows = []
    for _, r in ours.iterrows():
        for n in (1, 2, 4, 8):
            rows.append(dict(case=r["case"], tokens=int(r["tokens"]), hidden_size=H, intermediate_size=I, tp=2,
                             local_intermediate_size=I // n, impl=tp_model.COMPUTE, median_ms=r["median_ms"] / n))
    source = (f"NO TP RUN: one-GPU Triton times from bench run {bench.run_id}, compute at I/N ASSUMED = one-GPU / N, "
              f"all-reduce ASSUMED {ASSUMED_BUS_GBPS:.0f} GB/s + {ASSUMED_LATENCY_MS} ms")
    return pd.DataFrame(rows), ASSUMED_LATENCY_MS, ASSUMED_BUS_GBPS, source


def measured_plot(table: pd.DataFrame, footer: str = "", title: str = "Tensor parallel, measured") -> Figure:
    """Per case: milliseconds (ideal one-GPU/N, ours, the module variants, the collective) and
    efficiency / overlap, from ``tp_model.case_table``."""
    t = table.sort_values(["tokens", "case"])
    x = range(len(t))
    n = int(t["tp"].iloc[0])
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True, height_ratios=[3, 2])
    series = [("single_ms", f"one GPU / {n} (ideal)", "0.5", "--"), ("tp_ours_ms", f"ours, TP={n} (op + all-reduce)", "#d62728", "-"),
              ("tp_ours_module_ms", f"SwiGLUMLP module, TP={n}", "#ff9896", "-"),
              ("tp_plain_module_ms", f"nn.Linear module, TP={n}", "#4d4d4d", "-"),
              ("allreduce_ms", "grad_x all-reduce alone", "#1f77b4", ":")]
    for col, label, color, ls in series:
        if col in t and t[col].notna().any():
            y = t[col] / n if col == "single_ms" else t[col]
            ax.plot(list(x), y, ls, color=color, marker="o", ms=4, label=label)
    if {"tp_ours_ms", "compute_ms"} <= set(t) and t["compute_ms"].notna().any():
        # What the TP op costs over its local compute: the all-reduce where it is not hidden, plus the
        # wait for the slower rank. Above the all-reduce alone = nothing hidden (overlap < 0 in the table).
        ax.plot(list(x), t["tp_ours_ms"] - t["compute_ms"], "--s", color="#1f77b4", ms=4,
                label=f"ours, TP={n} minus its local compute (exposed communication)")
    ax.set_yscale("log")
    ax.set_ylabel("backward time per rank (ms, log)")
    ax.legend(fontsize=8)
    ax.set_title(title)
    ax2.plot(list(x), t["efficiency"], "-o", color="#d62728", ms=4, label="scaling efficiency, ours")
    if t["efficiency_module_plain"].notna().any():
        ax2.plot(list(x), t["efficiency_module_plain"], "-o", color="#4d4d4d", ms=4, label="efficiency, nn.Linear module")
    ax2.axhline(1.0, color="0.7", lw=0.8)
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("one-GPU time / (N x TP time)")
    ax2.set_xticks(list(x), [f"{c}\nT={tok}" for c, tok in zip(t["case"], t["tokens"])], rotation=90, fontsize=7)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    from .plots import add_footer

    add_footer(fig, footer)
    return fig


def model_plot(model: pd.DataFrame, measured: pd.DataFrame | None = None, footer: str = "",
               title: str = "Tensor-parallel scaling model") -> Figure:
    """Efficiency per token count for each TP size (serial: collective after the backward;
    hidden: collective fully overlapped), measured points beside; and the collective's share of
    the serial time against the window it could hide behind."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = {2: "#d62728", 4: "#1f77b4", 8: "#2ca02c"}
    for n, g in model.groupby("tp"):
        g = g.groupby("tokens").median(numeric_only=True).reset_index()
        c = colors.get(n, "0.4")
        ax.plot(g["tokens"], g["efficiency_serial"], "-", color=c, label=f"TP={n} model, serial")
        ax.plot(g["tokens"], g["efficiency_hidden"], "--", color=c, label=f"TP={n} model, all-reduce hidden")
        ax2.plot(g["tokens"], g["comm_ms"] / g["compute_ms"], "-o", color=c, ms=3, label=f"TP={n}: all-reduce / compute")
    if measured is not None and not measured.empty:
        m = measured.groupby("tokens").median(numeric_only=True).reset_index()
        n = int(measured["tp"].iloc[0])
        ax.plot(m["tokens"], m["efficiency"], "*", color=colors.get(n, "k"), ms=10, label=f"TP={n} measured")
    ax2.axhline(0.5, color="0.5", ls=":", label="hide window (weight-gradient GEMMs, 3 of 6)")
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xlabel("tokens T")
        a.legend(fontsize=7)
    ax.set_ylabel("scaling efficiency = one GPU / (N x TP time)")
    ax2.set_ylabel("all-reduce time / per-rank compute time")
    ax2.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax2.set_title("Where the all-reduce stops fitting behind the weight gradients", fontsize=10)
    fig.tight_layout()
    from .plots import add_footer

    add_footer(fig, footer)
    return fig
