"""The project's figures: roofline, validation errors, latency, speed-up, SOL fraction, history.

Every function returns a matplotlib ``Figure`` with a title, axes with units and a footer line
(GPU and software versions); ``save`` writes it as PNG and a vector format. Works with any
backend (the notebooks' inline one, or Agg when run as plain Python).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .. import roofline
from .analysis import IMPL_LABELS, order_impls

#: One color and marker per implementation (stable across figures).
IMPL_STYLE = {
    "eager": ("#4d4d4d", "o"),
    "compile": ("#1f77b4", "s"),
    "compile-max-autotune": ("#17becf", "D"),
    "cublas-gemms": ("#9467bd", "v"),
    "liger": ("#ff7f0e", "^"),
    "triton": ("#d62728", "*"),
    "reference": ("#4d4d4d", "o"),
    "bf16 reference": ("#4d4d4d", "o"),
}
HARDWARE_STYLE = {
    "H100-SXM": ("#7f7f7f", ":"),
    "H200-SXM": ("#2ca02c", "-"),
    "H200-measured": ("#98df8a", "--"),
    "H200-sustained": ("#006400", "-."),
    "B200-HGX": ("#bcbd22", ":"),
    "B200-benchmark": ("#8c564b", "-."),
}
_FALLBACK_COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def impl_style(impl: str, k: int = 0) -> tuple[str, str]:
    """(color, marker) for ``impl``; unknown names get a cycle color and a dot."""
    return IMPL_STYLE.get(impl, (_FALLBACK_COLORS[k % len(_FALLBACK_COLORS)], "."))


def add_footer(fig: Figure, text: str) -> None:
    """Write ``text`` (GPU, software, run id) in small grey type under everything drawn so far
    (call it last; ``save`` uses a tight bounding box, so the footer is kept)."""
    if not text:
        return
    fig.draw_without_rendering()  # lay out tick labels first (tight_layout moved the axes)
    renderer = fig.canvas.get_renderer()
    bottoms = [ax.get_tightbbox(renderer).y0 for ax in fig.axes if ax.get_visible()]
    y = (min(bottoms) / fig.bbox.height if bottoms else 0.0) - 0.01
    fig.text(0.01, y, text, fontsize=7, color="0.35", ha="left", va="top")


def save(fig: Figure, name: str, figures_dir: str | Path, formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """Save ``fig`` as ``figures_dir/name.<fmt>`` for each format (PNG at 150 dpi); returns the
    paths. Creates the folder. Raises ``ValueError`` for a format matplotlib cannot write."""
    out = Path(figures_dir)
    out.mkdir(parents=True, exist_ok=True)
    supported = fig.canvas.get_supported_filetypes()
    paths = []
    for fmt in formats:
        if fmt not in supported:
            raise ValueError(f"format {fmt!r} is not one matplotlib writes; have {sorted(supported)}")
        path = out / f"{name}.{fmt}"
        fig.savefig(path, dpi=150, bbox_inches="tight", metadata=_metadata(fmt))
        paths.append(path)
    return paths


# matplotlib draws SVG element ids from a random salt unless one is set: fix it, so a redrawn
# figure of the same data is byte-identical (figures are committed).
plt.rcParams["svg.hashsalt"] = "swiglu"


def _metadata(fmt: str) -> dict | None:
    # Fixed metadata keeps vector files byte-stable between runs (no date, no version string).
    if fmt == "svg":
        return {"Date": None, "Creator": None}
    if fmt == "pdf":
        return {"CreationDate": None, "Producer": None, "Creator": None}
    if fmt == "png":
        return {"Software": None}
    return None


def placeholder(title: str, message: str, footer: str = "") -> Figure:
    """A figure that says, in words, why there is nothing to plot."""
    fig, ax = plt.subplots(figsize=(9, 3.2))
    ax.axis("off")
    ax.set_title(title, fontsize=12, fontweight="bold")
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=11, wrap=True, transform=ax.transAxes)
    add_footer(fig, footer)
    return fig


def _case_labels(table: pd.DataFrame) -> tuple[list[str], list[str]]:
    """Cases in token order and their tick labels ("s128_b8 (T=1024)")."""
    cases = table.drop_duplicates("case").sort_values(["tokens", "case"])
    return list(cases["case"]), [f"{c} (T={t})" for c, t in zip(cases["case"], cases["tokens"])]


def _case_ticks(ax, labels: Sequence[str]) -> None:
    ax.set_xticks(range(len(labels)), labels, rotation=40, ha="right", rotation_mode="anchor", fontsize=7.5)


def roofline_plot(
    hardware: Mapping[str, roofline.Hardware],
    cases: pd.DataFrame,
    points: pd.DataFrame | None = None,
    footer: str = "",
    title: str = "Roofline of the SwiGLU MLP backward (bf16)",
) -> Figure:
    """Log-log roofline: attainable TFLOP/s vs arithmetic intensity (FLOP/byte) for each
    ``hardware`` entry, the cases' intensities as vertical ticks, and measured points.

    Args:
        hardware: key -> ``roofline.Hardware`` (``analysis.hardware_table()``).
        cases: rows with ``case, tokens, flop_per_byte`` (``analysis.roofline_table``).
        points: optional measured rows with ``impl, flop_per_byte, tflops`` (and ``correct``).
    """
    fig, ax = plt.subplots(figsize=(9, 6))
    ai = cases.drop_duplicates("case")["flop_per_byte"].to_numpy(float)
    lo, hi = max(1.0, ai.min() / 4), ai.max() * 4
    x = np.logspace(math.log10(lo), math.log10(hi), 400)
    for key, hw in hardware.items():
        color, ls = HARDWARE_STYLE.get(key, ("0.5", "-"))
        ax.plot(x, np.minimum(hw.peak_tflops, x * hw.peak_tbps), color=color, ls=ls, lw=1.6,
                label=f"{hw.name}: {hw.peak_tflops:.0f} TFLOP/s, {hw.peak_tbps:.2f} TB/s")
    for v in np.unique(ai):
        ax.axvline(v, color="0.85", lw=0.6, zorder=0)
    ticks = cases.drop_duplicates("tokens").sort_values("tokens")
    rows = _label_rows([(math.log10(v) - math.log10(lo)) / math.log10(hi / lo) for v in ticks["flop_per_byte"]],
                       [f"T={t}" for t in ticks["tokens"]], fig.get_figwidth() * 72 * 0.775, fontsize=7)
    for t, v, row in zip(ticks["tokens"], ticks["flop_per_byte"], rows):
        ax.annotate(f"T={t}", (v, 1.0), xycoords=("data", "axes fraction"), xytext=(0, 3 + 11 * row),
                    textcoords="offset points", fontsize=7, color="0.35", ha="center", va="bottom",
                    arrowprops={"arrowstyle": "-", "color": "0.75", "lw": 0.5, "shrinkA": 0, "shrinkB": 0})
    if points is not None and len(points):
        for k, impl in enumerate(order_impls(points["impl"])):
            p = points[(points["impl"] == impl) & points["tflops"].notna()]
            if p.empty:
                continue
            color, marker = impl_style(impl, k)
            ok = p["correct"].fillna(True).astype(bool) if "correct" in p else pd.Series(True, index=p.index)
            ax.scatter(p.loc[ok, "flop_per_byte"], p.loc[ok, "tflops"], color=color, marker=marker, s=36,
                       label=IMPL_LABELS.get(impl, impl), zorder=3, edgecolor="white", linewidth=0.4)
            if (~ok).any():
                ax.scatter(p.loc[~ok, "flop_per_byte"], p.loc[~ok, "tflops"], facecolor="none",
                           edgecolor=color, marker=marker, s=36, zorder=3,
                           label=f"{IMPL_LABELS.get(impl, impl)} (failed correctness)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity of the minimum traffic (FLOP/byte)")
    ax.set_ylabel("attainable / achieved bf16 TFLOP/s")
    # The T= labels sit above the axes (grey lines mark the cases): leave them room.
    ax.set_title(title, pad=7 + 11 * (max(rows, default=0) + 1))
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(fontsize=7.5, loc="lower right")
    add_footer(fig, footer)
    return fig


def _label_rows(positions: Sequence[float], texts: Sequence[str], width_pt: float, fontsize: float) -> list[int]:
    """Row index (0 = nearest the axes) for horizontal labels centred at ``positions`` (axes
    fraction, increasing) on an axes ``width_pt`` points wide: each label takes the first row
    where it clears the previous label of that row (text width estimated at 0.6 em a character)."""
    ends: list[float] = []
    rows = []
    for x, text in zip(positions, texts):
        half = 0.6 * fontsize * (len(text) + 2) / 2 / width_pt
        row = next((k for k, end in enumerate(ends) if x - half > end), len(ends))
        if row == len(ends):
            ends.append(x + half)
        ends[row] = x + half
        rows.append(row)
    return rows


def sol_bar_plot(table: pd.DataFrame, footer: str = "", title: str = "Speed-of-light time per case") -> Figure:
    """SOL time (ms, log scale) per case for each hardware entry of ``analysis.roofline_table``,
    hatched where the case is memory-bound on that hardware."""
    cases, labels = _case_labels(table)
    hws = list(dict.fromkeys(table["hardware"]))
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / max(1, len(hws))
    x = np.arange(len(cases))
    for k, hw in enumerate(hws):
        t = table[table["hardware"] == hw].set_index("case").loc[cases]
        color, _ = HARDWARE_STYLE.get(hw, (_FALLBACK_COLORS[k % len(_FALLBACK_COLORS)], "-"))
        bars = ax.bar(x + (k - (len(hws) - 1) / 2) * width, t["sol_ms"], width, color=color,
                      alpha=0.9, label=hw, edgecolor="white", linewidth=0.3)
        for bar, b in zip(bars, t["bound"]):
            if b == "memory":
                bar.set_hatch("///")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks(x, labels, rotation=40, ha="right", rotation_mode="anchor", fontsize=7.5)
    ax.set_ylabel("speed-of-light time (ms, log scale)")
    ax.set_title(title + " (hatched: memory-bound)")
    ax.grid(True, axis="y", which="both", lw=0.3, alpha=0.5)
    # Plain swatches per hardware (the hatch of a legend entry would come from its first bar,
    # which may be memory-bound), and one hatched swatch that says what hatching means.
    handles = [matplotlib.patches.Patch(facecolor=HARDWARE_STYLE.get(hw, (_FALLBACK_COLORS[k % len(_FALLBACK_COLORS)],))[0],
                                        alpha=0.9, label=hw) for k, hw in enumerate(hws)]
    handles.append(matplotlib.patches.Patch(facecolor="0.55", edgecolor="white", hatch="///", label="memory-bound"))
    ax.legend(handles=handles, fontsize=8, ncol=len(handles), loc="upper left")
    add_footer(fig, footer)
    return fig


def error_histograms(
    samples: Mapping[tuple, np.ndarray],
    footer: str = "",
    title: str = "Error against the float64 oracle",
    outputs: Sequence[str] = ("grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight"),
) -> Figure:
    """One panel per output: histograms (log-log) of ``|out - oracle| / rms(oracle)`` per
    implementation, pooled over the validated shapes. ``samples`` keys end with
    ``(impl, output)`` (``validate.run_validation``'s ``samples``)."""
    pooled: dict[tuple[str, str], list] = {}
    for key, values in samples.items():
        impl, output = key[-2], key[-1]
        pooled.setdefault((impl, output), []).append(np.asarray(values, dtype=float))
    impls = list(dict.fromkeys(k[0] for k in pooled))
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, output in zip(axes.flat, outputs):
        data = {i: np.concatenate(pooled[(i, output)]) for i in impls if (i, output) in pooled}
        positive = np.concatenate([d[d > 0] for d in data.values()]) if data else np.array([])
        if positive.size == 0:
            ax.text(0.5, 0.5, "no nonzero errors", ha="center", transform=ax.transAxes)
            ax.set_title(output)
            continue
        bins = np.logspace(np.log10(positive.min()), np.log10(positive.max()), 60)
        for k, (impl, d) in enumerate(data.items()):
            color, _ = impl_style(impl, k)
            zeros = int((d == 0).sum())
            label = f"{impl} ({d.size:,} elements{f', {zeros:,} exact' if zeros else ''})"
            ax.hist(d[d > 0], bins=bins, histtype="step", lw=1.4, color=color, label=label,
                    ls="--" if impl == "bf16 reference" else "-")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(output)
        ax.set_xlabel("|out - float64| / rms(float64)  (dimensionless)")
        ax.set_ylabel("elements (count)")
        ax.grid(True, which="both", lw=0.3, alpha=0.5)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    add_footer(fig, footer)
    return fig


def error_ratio_plot(rows: pd.DataFrame, factor: float = 2.0, footer: str = "",
                     title: str = "Relative error / bf16 reference's own relative error") -> Figure:
    """Per shape (x) and output (panel): the float64 relative-error ratio of each implementation
    (``validate_case`` rows with status ok), with the acceptance line at ``factor``."""
    ok = rows[rows["status"] == "ok"]
    outputs = list(dict.fromkeys(rows["output"]))
    cases, labels = _case_labels(rows)  # the order and "(T=...)" labels of the latency figures
    # One output per row, all sharing the case axis: 18 case labels need the whole width.
    width = max(7.0, 0.5 * len(cases) + 2.0)
    fig, axes = plt.subplots(len(outputs), 1, figsize=(width, 1.55 * len(outputs) + 1.6), sharex=True,
                             sharey=True, squeeze=False)
    for ax, output in zip(axes.flat, outputs):
        for k, impl in enumerate(dict.fromkeys(rows["impl"])):
            t = ok[(ok["output"] == output) & (ok["impl"] == impl)].groupby("case")["ratio"].max()
            t = t.reindex(cases)
            color, marker = impl_style(impl, k)
            # The reference's ratio is 1 by definition: a hollow ring, so a point at 1.0 shows through.
            hollow = impl == "reference"
            ax.plot(range(len(cases)), t.to_numpy(float), marker=marker, color=color, ls="none", label=impl,
                    markerfacecolor="none" if hollow else color, markersize=9 if hollow else 6)
        ax.axhline(factor, color="red", lw=1, ls="--", label=f"accept <= {factor:g}")
        ax.text(0.005, 0.94, output, transform=ax.transAxes, fontsize=9, fontweight="bold", va="top")
        ax.set_ylabel("ratio", fontsize=8)
        ax.grid(True, lw=0.3, alpha=0.5)
    axes.flat[-1].set_xticks(range(len(cases)), labels, rotation=90, fontsize=8)
    axes.flat[-1].set_xlabel("case (sorted by tokens T)")
    axes.flat[0].set_ylim(0, max(2.5, float(np.nanmax(ok["ratio"].to_numpy(float), initial=0)) * 1.1))
    axes.flat[0].legend(fontsize=7.5, ncol=3, loc="lower right")
    fig.suptitle(title + "\n(relative error against float64, worst round, per output)", fontsize=10)
    fig.tight_layout()
    add_footer(fig, footer)
    return fig


def _per_case_lines(ax, table: pd.DataFrame, column: str, impls: Iterable[str]) -> list[str]:
    cases, labels = _case_labels(table)
    for k, impl in enumerate(impls):
        t = table[table["impl"] == impl].set_index("case")[column].reindex(cases)
        if t.notna().sum() == 0:
            continue
        color, marker = impl_style(impl, k)
        label = IMPL_LABELS.get(impl, impl)
        if "correct" in table and (table.loc[table["impl"] == impl, "correct"].astype(str) == "False").any():
            label += " (fails correctness)"
        ax.plot(range(len(cases)), t.to_numpy(float), marker=marker, color=color, lw=1.2, ms=6, label=label)
    _case_ticks(ax, labels)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    return cases


def latency_plot(table: pd.DataFrame, footer: str = "", title: str = "Latency per case") -> Figure:
    """Median latency (ms, log scale) per case for every implementation, with the H200 SOL
    (datasheet, and measured ceilings when present) as shaded references.
    ``table``: ``analysis.latency_table`` output."""
    fig, ax = plt.subplots(figsize=(12, 5.5))
    cases = _per_case_lines(ax, table, "median_ms", order_impls(table["impl"]))
    sol = table.drop_duplicates("case").set_index("case").reindex(cases)
    ax.plot(range(len(cases)), sol["sol_ms"].to_numpy(float), color="#2ca02c", lw=2, ls="-",
            label="H200 SOL (datasheet)")
    if "sol_ms_measured" in sol and sol["sol_ms_measured"].notna().any():
        ax.plot(range(len(cases)), sol["sol_ms_measured"].to_numpy(float), color="#2ca02c", lw=1.5,
                ls="--", label="H200 SOL (measured ceilings)")
    ax.set_yscale("log")
    ax.set_ylabel("median latency (ms, log scale)")
    ax.set_xlabel("case (sorted by tokens T)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    add_footer(fig, footer)
    return fig


def speedup_plot(table: pd.DataFrame, footer: str = "", title: str = "Speed-up per case") -> Figure:
    """Two panels: speed-up over the eager reference and over torch.compile (x, log scale),
    per case, for every implementation but the baseline itself."""
    fig, axes = plt.subplots(2, 1, figsize=(12, 8), sharex=True)
    for ax, base in zip(axes, ("eager", "compile")):
        col = f"speedup_vs_{base}"
        impls = [i for i in order_impls(table["impl"]) if i != base]
        if col not in table or table[col].notna().sum() == 0:
            ax.text(0.5, 0.5, f"no '{base}' measurement in this run", ha="center", transform=ax.transAxes)
            _per_case_lines(ax, table.assign(**{col: np.nan}), col, [])
        else:
            _per_case_lines(ax, table, col, impls)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2fx"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.2fx"))
        ax.set_ylabel(f"speed-up over {IMPL_LABELS.get(base, base)} (x)", fontsize=9)
        ax.legend(fontsize=7.5)
    axes[0].set_title(title)
    axes[1].set_xlabel("case (sorted by tokens T)")
    fig.tight_layout()
    add_footer(fig, footer)
    return fig


def sol_fraction_plot(table: pd.DataFrame, footer: str = "", title: str = "Fraction of the H200 speed of light") -> Figure:
    """SOL time / latency per case (1.0 = at the speed of light): datasheet SOL (solid) and,
    when present, measured ceilings (panel 2)."""
    measured = "sol_fraction_measured" in table and table["sol_fraction_measured"].notna().any()
    fig, axes = plt.subplots(2 if measured else 1, 1, figsize=(12, 8 if measured else 4.5), sharex=True, squeeze=False)
    for ax, (col, what) in zip(axes.flat, [("sol_fraction", "datasheet 989 TFLOP/s, 4.8 TB/s"),
                                           ("sol_fraction_measured", "measured ceilings")]):
        _per_case_lines(ax, table, col, order_impls(table["impl"]))
        ax.axhline(1.0, color="#2ca02c", lw=1.2)
        top = float(np.nanmax(table[col].to_numpy(float), initial=1.0)) if col in table else 1.0
        ax.set_ylim(0, max(1.05, top * 1.05))
        ax.set_ylabel(f"SOL time / latency\n({what})", fontsize=9)
        ax.legend(fontsize=7.5, loc="lower right")
    axes.flat[0].set_title(title)
    axes.flat[-1].set_xlabel("case (sorted by tokens T)")
    fig.tight_layout()
    add_footer(fig, footer)
    return fig


def energy_plot(table: pd.DataFrame, footer: str = "", title: str = "Energy per backward") -> Figure:
    """Two panels per case: energy per backward (J, log scale; board energy with one L2 flush's
    subtracted) for every implementation, and that energy over torch.compile's (x; below 1: less
    energy). ``table``: ``analysis.power_table`` output."""
    fig, axes = plt.subplots(2, 1, figsize=(12, 8), sharex=True)
    impls = order_impls(table["impl"])
    _per_case_lines(axes[0], table, "energy_per_backward_j", impls)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("energy per backward (J, log scale)")
    axes[0].set_title(title)
    axes[0].legend(fontsize=7.5)
    if table["energy_vs_compile"].notna().any():
        _per_case_lines(axes[1], table, "energy_vs_compile", [i for i in impls if i != "compile"])
        axes[1].legend(fontsize=7.5)
    else:
        axes[1].text(0.5, 0.5, "no torch.compile energy in this run", ha="center", transform=axes[1].transAxes)
        _per_case_lines(axes[1], table, "energy_vs_compile", [])
    axes[1].axhline(1.0, color="black", lw=0.8)
    axes[1].set_ylabel("energy / torch.compile's (x)", fontsize=9)
    axes[1].set_xlabel("case (sorted by tokens T)")
    fig.tight_layout()
    add_footer(fig, footer)
    return fig


def clock_power_plot(table: pd.DataFrame, footer: str = "", title: str = "SM clock and board power",
                     max_clock_mhz: float | None = None, power_limit_w: float | None = None) -> Figure:
    """Two panels per case: the mean SM clock (MHz) and mean board power (W) each
    implementation ran at during its timed loop, with the maximum clock and the power limit as
    lines when known. ``table``: ``analysis.power_table`` output."""
    fig, axes = plt.subplots(2, 1, figsize=(12, 8), sharex=True)
    impls = order_impls(table["impl"])
    for ax, column, label, limit, limit_label in (
        (axes[0], "sm_clock_mhz", "mean SM clock (MHz)", max_clock_mhz, "maximum SM clock"),
        (axes[1], "power_w", "mean board power (W)", power_limit_w, "power limit"),
    ):
        _per_case_lines(ax, table, column, impls)
        if limit:
            unit = "MHz" if column == "sm_clock_mhz" else "W"
            ax.axhline(limit, color="#b00000", lw=1.2, ls="--", label=f"{limit_label}, {limit:.0f} {unit}")
        ax.set_ylim(0, max(float(np.nanmax(table[column].to_numpy(float), initial=0.0)), limit or 0) * 1.08 or 1)
        ax.set_ylabel(label, fontsize=9)
        ax.legend(fontsize=7.5, loc="lower right")
    axes[0].set_title(title)
    axes[1].set_xlabel("case (sorted by tokens T)")
    fig.tight_layout()
    add_footer(fig, footer)
    return fig


def gmean_plot(summary: pd.DataFrame, footer: str = "", title: str = "Geometric mean over the cases") -> Figure:
    """Geometric-mean latency (ms) per implementation (``analysis.latency_summary``) as dots on
    an axis that spans the data (the differences are tenths of a ms out of ~34), with a top
    axis in speed-ups over torch.compile when it was measured, and each row's ms, speed-ups and SOL
    fraction written above its line. The geometric-mean SOL time, far to the left, is named in
    the axis label instead of drawn."""
    s = summary[summary["gmean_ms"].notna()].iloc[::-1].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(10, 0.7 * len(s) + 1.9))
    if s.empty:
        ax.text(0.5, 0.5, "no implementation has a latency", ha="center", transform=ax.transAxes)
        ax.set_title(title)
        add_footer(fig, footer)
        return fig
    values = s["gmean_ms"].to_numpy(float)
    span = max(float(values.max() - values.min()), 0.01 * float(values.max()))
    lo, hi = float(values.min()) - 0.12 * span, float(values.max()) + 0.12 * span
    ax.set_xlim(lo, hi)
    ax.set_ylim(-0.5, len(s) - 0.2)
    fails = [r.get("all_correct") is False or str(r.get("all_correct")) == "False" for _, r in s.iterrows()]
    for y, ((_, r), failed) in enumerate(zip(s.iterrows(), fails)):
        color, marker = impl_style(r["impl"], y)
        ax.axhline(y, color="0.85", lw=0.6, zorder=0)  # a row guide (no bar: the axis does not start at 0)
        ax.scatter([r["gmean_ms"]], [y], color="white" if failed else color, edgecolor=color, marker=marker,
                   s=90, zorder=3, linewidth=1.5)
        parts = [f"{r['gmean_ms']:.2f} ms"]
        for base in ("compile", "eager"):
            v = r.get(f"gmean_speedup_vs_{base}")
            if pd.notna(v) and r["impl"] != base:
                parts.append(f"{v:.3f}x vs {base}")
        if pd.notna(r.get("sol_fraction")):
            parts.append(f"SOL {r['sol_fraction']:.2f}")
        if pd.notna(r.get("cases")):
            parts.append(f"{int(r['cases'])} cases")
        if failed:
            # A fast wrong answer must not read as a result (Liger recomputes silu(gate_output)).
            parts.append("FAILS the correctness check")
        ax.text(lo + 0.005 * (hi - lo), y + 0.36, ", ".join(parts), va="center", fontsize=8,
                color="#b00000" if failed else "black")
    ax.set_yticks(range(len(s)), s["label"])
    ax.grid(True, axis="x", lw=0.3, alpha=0.5)
    label = "geometric-mean median latency over the cases (ms)"
    if s["gmean_sol_ms"].notna().any():
        label += f"\nH200 speed of light (datasheet): {float(s['gmean_sol_ms'].max()):.2f} ms, off the axis to the left"
    ax.set_xlabel(label)
    compile_ms = s.loc[s["impl"] == "compile", "gmean_ms"]
    if len(compile_ms):
        c = float(compile_ms.iloc[0])
        ax.axvline(c, color=impl_style("compile")[0], lw=0.8, ls=":")
        top = ax.secondary_xaxis("top", functions=(_over(c), _over(c)))
        top.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2fx"))
        top.set_xlabel("speed-up over torch.compile (x; faster to the left)", fontsize=8)
        top.tick_params(labelsize=8)
    ax.set_title(title)
    fig.tight_layout()
    add_footer(fig, footer)
    return fig


def _over(c: float):
    """x -> c / x (its own inverse), quiet at 0 where matplotlib probes the transform."""
    def f(x):
        with np.errstate(divide="ignore"):
            return c / np.asarray(x, float)
    return f


def history_plot(history: pd.DataFrame, footer: str = "", title: str = "Geometric-mean latency across recorded runs") -> Figure:
    """Geometric-mean latency (ms) per implementation for each recorded run, oldest left
    (``analysis.run_history``)."""
    runs = list(dict.fromkeys(history["run_id"]))
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(runs) + 4), 5))
    for k, impl in enumerate(order_impls(history["impl"])):
        h = history[history["impl"] == impl].set_index("run_id").reindex(runs)
        t = h["gmean_ms"]
        color, marker = impl_style(impl, k)
        failed = (h["all_correct"].astype(str) == "False").to_numpy() if "all_correct" in h else np.zeros(len(runs), bool)
        label = IMPL_LABELS.get(impl, impl)
        if failed.all() and t.notna().any():
            label += " (FAILS the correctness check)"
        elif failed.any():
            label += " (open: fails the correctness check)"
        ax.plot(range(len(runs)), t.to_numpy(float), color=color, label=label, marker=marker,
                markerfacecolor="none" if failed.all() else color)
        for x in np.flatnonzero(failed & t.notna().to_numpy()):
            # Open marker and a note at the point: a fast wrong answer must not read as a result.
            ax.plot([x], [t.iloc[x]], marker=marker, color=color, markerfacecolor="white", ls="none")
            ax.annotate("fails the correctness check", (x, t.iloc[x]), xytext=(8, 0), textcoords="offset points",
                        fontsize=7.5, color="#b00000", va="center")
    ax.set_xticks(range(len(runs)), runs, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("geometric-mean median latency (ms)")
    ax.set_xlabel("recorded run (oldest left)")
    ax.set_title(title)
    ax.grid(True, lw=0.3, alpha=0.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    add_footer(fig, footer)
    return fig


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def show(obj) -> None:
    """Display ``obj`` richly in a notebook (IPython present) or print it (plain Python).
    A figure is displayed (notebook only) and then closed, so it is shown exactly once."""
    if _in_notebook():
        from IPython.display import display

        display(obj)
    elif not isinstance(obj, Figure):
        print(obj.to_string() if isinstance(obj, pd.DataFrame) else obj)
    if isinstance(obj, Figure):
        plt.close(obj)


def finish(fig: Figure, name: str, figures_dir: str | Path, formats: Sequence[str] = ("png", "svg")) -> None:
    """``save``, print where, then ``show`` (which closes the figure)."""
    paths = save(fig, name, figures_dir, formats)
    print(f"saved {name}.{{{','.join(p.suffix[1:] for p in paths)}}} in {Path(figures_dir)}")
    show(fig)
