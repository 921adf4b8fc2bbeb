"""Tensor-parallel runs for notebook 05: load the records ``swiglu_lab.bench.tp`` wrote, fall back to
one-GPU bench data for the model, and draw the two figures.

Arithmetic lives in ``swiglu_lab.bench.tp_model``; this module reads files and plots.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from swiglu.workloads import HIDDEN_SIZE, INTERMEDIATE_SIZE

from ..bench import tp_model
from . import analysis
from .plots import MAX_WIDTH_IN, MIN_FONT_PT, _dodged, _finish_panels

#: When no TP run is recorded: the all-reduce bus bandwidth measured by a probe on the 2-GPU H200
#: machine (a [4096, 16384] bf16 all-reduce, 268 MB, 297 GB/s bus bandwidth) and an
#: assumed fixed latency. Only used, and labelled as such, without a measured run.
ASSUMED_BUS_GBPS = 297.0
ASSUMED_LATENCY_MS = 0.02


@dataclass
class TPRun:
    """One recorded tensor-parallel run: timing rows, correctness rows and per-rank timeline
    events (``swiglu_lab.bench.timeline``; both may be empty), metadata."""

    run_id: str
    rows: pd.DataFrame
    checks: pd.DataFrame = field(default_factory=pd.DataFrame)
    meta: dict = field(default_factory=dict)
    timeline: pd.DataFrame = field(default_factory=pd.DataFrame)


def load_tp_run(tp_dir: str | Path, run_id: str = "") -> TPRun | None:
    """The recorded tensor-parallel measurements, or None when ``tp_dir`` holds none.

    ``run_id`` empty: every run in ``tp_dir`` with the latest run's TP size and shape merged (the
    parts are usually recorded by separate commands), a later run's row replacing an earlier one
    for the same case, impl and local I; correctness rows from the latest run that has them.
    ``run_id`` given (comma-separated for several): those runs only, merged the same way; the
    ``run_id`` of the result names every merged run. Raises ``ValueError`` for an unknown id."""
    tp_dir = Path(tp_dir)
    csvs = (
        sorted(p for p in tp_dir.glob("tp_*.csv") if not p.name.endswith(("_check.csv", "_timeline.csv")))
        if tp_dir.is_dir()
        else []
    )
    ids = [p.stem[len("tp_") :] for p in csvs]
    if run_id:
        wanted = [r.strip() for r in run_id.split(",") if r.strip()]
        missing = [r for r in wanted if r not in ids]
        if missing:
            raise ValueError(f"no tensor-parallel run {missing} in {tp_dir}; have {ids}")
        csvs = [p for p, i in zip(csvs, ids) if i in wanted]
    if not csvs:
        return None
    frames = {p.stem[len("tp_") :]: pd.read_csv(p) for p in csvs}
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
    checks, timeline, meta, train = pd.DataFrame(), pd.DataFrame(), {}, {}
    for rid in frames:  # oldest first: the latest run's records win
        check = tp_dir / f"tp_{rid}_check.csv"
        if check.is_file():
            checks = pd.read_csv(check)
        events = tp_dir / f"tp_{rid}_timeline.csv"
        if events.is_file():
            timeline = pd.read_csv(events)
        meta_path = tp_dir / f"tp_{rid}.json"
        if meta_path.is_file():
            meta = json.loads(meta_path.read_text())
            train = meta.get("train") or train
    meta = dict(meta, train=train, merged_runs=list(frames))
    return TPRun("+".join(frames), rows, checks, meta, timeline)


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
            source = f"TP run {run.run_id} (compute); all-reduce ASSUMED ({bw:.0f} GB/s, the 2-GPU probe)"
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
            rows.append(
                dict(
                    case=r["case"],
                    tokens=int(r["tokens"]),
                    hidden_size=H,
                    intermediate_size=I,
                    tp=2,
                    local_intermediate_size=I // n,
                    impl=tp_model.COMPUTE,
                    median_ms=r["median_ms"] / n,
                )
            )
    source = (
        f"NO TP RUN: one-GPU Triton times from bench run {bench.run_id}, compute at I/N ASSUMED = one-GPU / N, "
        f"all-reduce ASSUMED {ASSUMED_BUS_GBPS:.0f} GB/s + {ASSUMED_LATENCY_MS} ms"
    )
    return pd.DataFrame(rows), ASSUMED_LATENCY_MS, ASSUMED_BUS_GBPS, source


def measured_plot(table: pd.DataFrame, footer: str = "", title: str = "Tensor parallel, measured") -> Figure:
    """Per case (categories, markers side by side): the scaling efficiency ``one-GPU time / (N x TP
    time)`` of our TP op (p20-p80 whiskers of its timed iterations), the parallelized SwiGLUMLP
    module and the same sharded nn.Linear module; and what the TP op costs over its local compute
    (exposed communication and waiting) against the grad_x all-reduce alone (ms). From
    ``tp_model.case_table`` (with ``single_gpu_source``'s one-GPU time)."""
    t = table.sort_values(["tokens", "case"]).reset_index(drop=True)
    cases = list(t["case"])
    n = int(t["tp"].iloc[0])
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(MAX_WIDTH_IN, 7.5), sharex=True, height_ratios=[3, 2])
    records: list = []
    eff = []
    for col, key, label, color, marker in (
        ("tp_ours_ms", "ours", f"ours, TP={n} (op + all-reduce)", "#d62728", "*"),
        ("tp_ours_module_ms", "ours_module", f"SwiGLUMLP module, TP={n}", "#ff9896", "o"),
        ("tp_plain_module_ms", "plain_module", f"nn.Linear module, TP={n} (all-reduces grad_x twice)", "#4d4d4d", "s"),
    ):
        if col not in t or t[col].isna().all():
            continue
        s = dict(key=key, label=label, y=(t["single_ms"] / (n * t[col])).to_numpy(float), color=color, marker=marker)
        if key == "ours" and {"tp_ours_p20_ms", "tp_ours_p80_ms"} <= set(t):
            s["lo"] = (t["single_ms"] / (n * t["tp_ours_p80_ms"])).to_numpy(float)
            s["hi"] = (t["single_ms"] / (n * t["tp_ours_p20_ms"])).to_numpy(float)
        eff.append(s)
    _dodged(ax, cases, eff, records, "efficiency")
    ax.axhline(1.0, color="0.6", lw=0.8)
    ax.set_ylabel("scaling efficiency\none GPU / (N x TP time)")
    ax.set_title(title)
    ax.grid(True, axis="y", lw=0.3, alpha=0.5)
    ax.legend(loc="lower right", fontsize=8)
    comm = [
        dict(key="allreduce", label="grad_x all-reduce alone", y=t["allreduce_ms"].to_numpy(float), color="#1f77b4", marker="o")
    ]
    if "compute_ms" in t and t["compute_ms"].notna().any():
        comm.append(
            dict(
                key="exposed",
                label=f"ours, TP={n} minus its local compute (exposed + waiting)",
                y=(t["tp_ours_ms"] - t["compute_ms"]).to_numpy(float),
                color="#d62728",
                marker="D",
            )
        )
    _dodged(ax2, cases, comm, records, "communication")
    ax2.set_yscale("log")
    ax2.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax2.set_ylabel("ms per backward (log)")
    ax2.grid(True, axis="y", which="both", lw=0.3, alpha=0.5)
    ax2.legend(loc="upper left", fontsize=8)
    ax2.set_xticks(
        range(len(cases)),
        [f"{c} (T={tok})" for c, tok in zip(t["case"], t["tokens"])],
        rotation=40,
        ha="right",
        rotation_mode="anchor",
        fontsize=8,
    )
    ax2.set_xlim(-0.6, len(cases) - 0.4)
    fig.tight_layout()
    note = (
        "whiskers (ours): p20-p80 of the timed iterations of the TP backward (an iteration's time is the "
        "slower rank's); the modules and the all-reduce: medians, no whiskers; one run per case"
    )
    return _finish_panels(fig, records, footer, note=note)


def model_plot(
    model: pd.DataFrame, measured: pd.DataFrame | None = None, footer: str = "", title: str = "Tensor-parallel scaling model"
) -> Figure:
    """Left: modelled efficiency per token count T (categories) for each TP size, serial
    (all-reduce after the backward) and hidden (all-reduce fully overlapped), with the measured
    TP points beside. Right: the all-reduce's time over the per-rank compute against the window
    it could hide behind (0.5: the weight-gradient GEMMs, 3 of the 6). ``model``:
    ``tp_model.model_table``; medians over the cases of each T."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4.6))
    records: list = []
    colors = {2: "#d62728", 4: "#1f77b4", 8: "#2ca02c"}
    markers = {2: "o", 4: "s", 8: "D"}
    tokens = sorted(set(int(t) for t in model["tokens"]))
    g = model.groupby(["tp", "tokens"]).median(numeric_only=True)
    eff, ratio = [], []
    for n in sorted(set(model["tp"])):
        m = g.loc[n].reindex(tokens)
        c = colors.get(n, "0.4")
        eff.append(
            dict(
                key=f"TP={n} serial",
                label=f"TP={n} model, serial",
                y=m["efficiency_serial"].to_numpy(float),
                color=c,
                marker=markers.get(n, "o"),
            )
        )
        eff.append(
            dict(
                key=f"TP={n} hidden",
                label=f"TP={n} model, all-reduce hidden",
                y=m["efficiency_hidden"].to_numpy(float),
                color=c,
                marker=markers.get(n, "o"),
                hollow=True,
            )
        )
        ratio.append(
            dict(
                key=f"TP={n}",
                label=f"TP={n}",
                y=(m["comm_ms"] / m["compute_ms"]).to_numpy(float),
                color=c,
                marker=markers.get(n, "o"),
            )
        )
    if measured is not None and not measured.empty:
        mm = measured.groupby("tokens").median(numeric_only=True).reindex(tokens)
        n = int(measured["tp"].iloc[0])
        eff.append(
            dict(key=f"TP={n} measured", label=f"TP={n} measured", y=mm["efficiency"].to_numpy(float), color="k", marker="*")
        )
    _dodged(ax, tokens, eff, records, "efficiency", width=0.8)
    _dodged(ax2, tokens, ratio, records, "all-reduce / compute", width=0.6)
    ax.axhline(1.0, color="0.6", lw=0.8)
    ax2.axhline(0.5, color="0.3", ls=":", lw=1.2)
    ax2.text(
        len(tokens) - 0.5,
        0.45,
        "hide window: the weight-gradient\nGEMMs (3 of 6) = 0.5",
        ha="right",
        va="top",
        fontsize=MIN_FONT_PT,
        color="0.3",
    )
    for a in (ax, ax2):
        a.set_xticks(range(len(tokens)), [str(t) for t in tokens], rotation=40, ha="right", rotation_mode="anchor")
        a.set_xlim(-0.6, len(tokens) - 0.4)
        a.set_xlabel("tokens T")
        a.grid(True, axis="y", lw=0.3, alpha=0.5)
    ax.set_ylabel("scaling efficiency\none GPU / (N x TP time)")
    ax2.set_ylabel("all-reduce time / per-rank compute")
    ax2.set_yscale("log")
    ax2.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax2.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax2.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_title(title)
    ax2.set_title("Where the all-reduce stops fitting behind the weight gradients")
    fig.tight_layout()
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.0, 0.0), ncol=4, frameon=False, fontsize=MIN_FONT_PT)
    note = (
        "No spread: one modelled value per case (medians over the cases of each T). Efficiency above 1: one GPU ran "
        "the I/N shard in less than 1/N of the whole backward's time (measured per-rank compute), and the "
        "model adds nothing but the all-reduce."
    )
    import textwrap

    return _finish_panels(fig, records, footer, note="\n".join(textwrap.wrap(note, 125)))
