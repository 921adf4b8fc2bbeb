"""The project's figures: roofline, validation errors, latency, speed-up, SOL fraction, energy,
history, training step.

Every function returns a matplotlib ``Figure`` with a title, axes with units and a footer line
(GPU and software versions); ``save`` writes it as PNG and a vector format. Works with any
backend (the notebooks' inline one, or Agg when run as plain Python).

Conventions, so that a figure reads right at the width the README shows it (about 800 px):

* every figure is at most ``MAX_WIDTH_IN`` inches wide and no text is smaller than
  ``MIN_FONT_PT`` points (tests/lab/test_plots.py measures both on the saved PNG);
* a comparison shows its spread: whiskers over the p20-p80 of the timed iterations (or min-max
  over recorded runs), and the figure says which and over how many iterations and runs; where no
  spread was recorded, the figure says that instead;
* cases and token counts are categories: markers side by side, never joined by lines;
* ``fig.plotted`` holds what was drawn as a DataFrame (``PLOTTED_COLUMNS``: panel, series,
  x, y, lo, hi), so tests can check a figure's values against the data it was given.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from swiglu import roofline
from ..bench import breakdown, timeline
from .analysis import IMPL_LABELS, display_path, order_impls

#: Widest figure (inches at 150 dpi: 1500 px, shown at ~800 px) and smallest type (points).
MAX_WIDTH_IN = 10.0
MIN_FONT_PT = 8.0
#: Columns of ``fig.plotted``: one row per drawn point (y) with its whisker (lo, hi; NaN: none).
PLOTTED_COLUMNS = ["panel", "series", "x", "y", "lo", "hi"]

#: One color and marker per implementation (stable across figures).
IMPL_STYLE = {
    "eager": ("#4d4d4d", "o"),
    "compile": ("#1f77b4", "s"),
    "compile-max-autotune": ("#17becf", "D"),
    "cublas-gemms": ("#9467bd", "v"),
    "liger": ("#ff7f0e", "^"),
    "quack": ("#8c564b", "P"),
    "triton": ("#d62728", "*"),
    "triton-tl": ("#e377c2", "X"),
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

# Type sizes (points) for everything drawn here; nothing below MIN_FONT_PT.
plt.rcParams.update(
    {
        "font.size": 9,
        "axes.titlesize": 10,
        "axes.labelsize": 9,
        "xtick.labelsize": 8,
        "ytick.labelsize": 8,
        "legend.fontsize": 8,
        "figure.titlesize": 10.5,
    }
)


def impl_style(impl: str, k: int = 0) -> tuple[str, str]:
    """(color, marker) for ``impl``; unknown names get a cycle color and a dot."""
    return IMPL_STYLE.get(impl, (_FALLBACK_COLORS[k % len(_FALLBACK_COLORS)], "o"))


def add_footer(fig: Figure, text: str) -> None:
    """Write ``text`` (GPU, software, run id) in small grey type under everything drawn so far,
    wrapped to the figure's width (call it last; ``save`` uses a tight bounding box, so the
    footer is kept)."""
    if not text:
        return
    fig.draw_without_rendering()  # lay out tick labels first (tight_layout moved the axes)
    renderer = fig.canvas.get_renderer()
    bottoms = [ax.get_tightbbox(renderer).y0 for ax in fig.axes if ax.get_visible()]
    bottoms += [t.get_window_extent(renderer).y0 for t in fig.texts if t.get_text()]
    bottoms += [lg.get_window_extent(renderer).y0 for lg in fig.legends]
    y = (min(bottoms) / fig.bbox.height if bottoms else 0.0) - 0.01
    # ~0.62 em per character: a line never runs past the figure's right edge.
    chars = max(40, int(fig.get_figwidth() * 72 / (0.62 * MIN_FONT_PT)) - 2)
    wrapped = "\n".join(textwrap.wrap(text, chars, break_on_hyphens=False))
    fig.text(0.01, y, wrapped, fontsize=MIN_FONT_PT, color="0.35", ha="left", va="top")


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
    """A figure that says, in words, why there is nothing to plot (``fig.plotted`` is empty)."""
    fig, ax = plt.subplots(figsize=(8, 2.8))
    ax.axis("off")
    ax.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=10.5, fontweight="bold")
    ax.text(0.5, 0.5, "\n".join(textwrap.wrap(message, 90)), ha="center", va="center", fontsize=9, transform=ax.transAxes)
    fig.plotted = pd.DataFrame(columns=PLOTTED_COLUMNS)
    add_footer(fig, footer)
    return fig


def _case_labels(table: pd.DataFrame) -> tuple[list[str], list[str]]:
    """Cases in token order and their tick labels ("s128_b8 (T=1024)")."""
    cases = table.drop_duplicates("case").sort_values(["tokens", "case"])
    return list(cases["case"]), [f"{c} (T={t})" for c, t in zip(cases["case"], cases["tokens"])]


def _case_ticks(ax, labels: Sequence[str]) -> None:
    ax.set_xticks(range(len(labels)), labels, rotation=40, ha="right", rotation_mode="anchor", fontsize=MIN_FONT_PT)


def _column(frame: pd.DataFrame, column: str) -> np.ndarray:
    return frame[column].to_numpy(float) if column in frame else np.full(len(frame), np.nan)


def _dodged(
    ax, categories: Sequence, series: Sequence[dict], records: list, panel: str, width: float = 0.72, horizontal: bool = False
) -> None:
    """Markers side by side within each category (x = 0, 1, ...), one group per ``series`` item:
    ``dict(key, label, y, lo, hi, color, marker, hollow)`` with y/lo/hi aligned to ``categories``
    (NaN: no point / no whisker). Appends one ``PLOTTED_COLUMNS`` record per drawn point."""
    n = max(1, len(series))
    step = width / n if n > 1 else 0.0
    for k, s in enumerate(series):
        y = np.asarray(s["y"], float)
        lo = np.asarray(s.get("lo", np.full(len(y), np.nan)), float)
        hi = np.asarray(s.get("hi", np.full(len(y), np.nan)), float)
        pos = np.arange(len(categories)) + (k - (n - 1) / 2) * step
        err = np.vstack([np.where(np.isnan(lo), 0, y - lo), np.where(np.isnan(hi), 0, hi - y)])
        has_err = not (np.isnan(lo).all() and np.isnan(hi).all())
        color, marker = s["color"], s["marker"]
        kw = dict(
            ls="none",
            marker=marker,
            color=color,
            ms=6 if marker != "*" else 8,
            elinewidth=1.3,
            mfc="white" if s.get("hollow") else color,
            mec=color,
            label=s["label"],
            zorder=3,
        )
        if horizontal:
            ax.errorbar(y, pos, xerr=err if has_err else None, **kw)
        else:
            ax.errorbar(pos, y, yerr=err if has_err else None, **kw)
        for c, yy, l, h in zip(categories, y, lo, hi):
            if not np.isnan(yy):
                records.append({"panel": panel, "series": s["key"], "x": c, "y": float(yy), "lo": float(l), "hi": float(h)})


def _impl_series(
    table: pd.DataFrame, cases: Sequence[str], impls: Iterable[str], column: str, lo: str | None = None, hi: str | None = None
) -> list[dict]:
    """``_dodged`` series per implementation: ``column`` (and whisker columns) per case."""
    out = []
    for k, impl in enumerate(impls):
        t = table[table["impl"] == impl].set_index("case").reindex(cases)
        if column not in t or t[column].notna().sum() == 0:
            continue
        color, marker = impl_style(impl, k)
        label = IMPL_LABELS.get(impl, impl)
        failed = "correct" in table and (table.loc[table["impl"] == impl, "correct"].astype(str) == "False").any()
        if failed:
            label += " (FAILS correctness)"
        out.append(
            dict(
                key=impl,
                label=label,
                y=_column(t, column),
                lo=_column(t, lo) if lo else None,
                hi=_column(t, hi) if hi else None,
                color=color,
                marker=marker,
                hollow=failed,
            )
        )
    for s in out:
        if s["lo"] is None:
            s.pop("lo"), s.pop("hi")
    return out


def _spread_note(table: pd.DataFrame, what: str = "timed iterations") -> str:
    """'whiskers: p20-p80 of the 50 timed iterations, one run' from the rows' ``iters``."""
    iters = int(table["iters"].max()) if "iters" in table and table["iters"].notna().any() else None
    runs = table["run_id"].nunique() if "run_id" in table else 1
    n = f"{iters} " if iters else ""
    return f"whiskers: p20-p80 of the {n}{what} per case; {runs} run{'s' if runs != 1 else ''}"


def _finish_panels(fig: Figure, records: list, footer: str, legend_axes=None, ncol: int = 3, note: str = "") -> Figure:
    """One legend for the figure under the panels (from ``legend_axes``' handles), a note line,
    the footer, and ``fig.plotted``."""
    if legend_axes is not None:
        handles, labels = [], []
        for ax in legend_axes if isinstance(legend_axes, (list, tuple, np.ndarray)) else [legend_axes]:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                if lab not in labels:
                    handles.append(h)
                    labels.append(lab)
        if handles:
            fig.legend(
                handles, labels, loc="upper left", bbox_to_anchor=(0.0, 0.0), ncol=ncol, frameon=False, fontsize=MIN_FONT_PT
            )
    if note:
        chars = max(40, int(fig.get_figwidth() * 72 / (0.55 * MIN_FONT_PT)) - 2)
        note = "\n".join(line for part in note.split("\n") for line in textwrap.wrap(part, chars))
        fig.draw_without_rendering()
        renderer = fig.canvas.get_renderer()
        bottoms = [ax.get_tightbbox(renderer).y0 for ax in fig.axes] + [lg.get_window_extent(renderer).y0 for lg in fig.legends]
        fig.text(0.01, min(bottoms) / fig.bbox.height - 0.01, note, fontsize=MIN_FONT_PT, va="top", ha="left")
    fig.plotted = pd.DataFrame(records, columns=PLOTTED_COLUMNS)
    add_footer(fig, footer)
    return fig


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
    fig, ax = plt.subplots(figsize=(8.5, 6.2))
    records: list = []
    ai = cases.drop_duplicates("case")["flop_per_byte"].to_numpy(float)
    lo, hi = max(1.0, ai.min() / 4), ai.max() * 4
    x = np.logspace(math.log10(lo), math.log10(hi), 400)
    for key, hw in hardware.items():
        color, ls = HARDWARE_STYLE.get(key, ("0.5", "-"))
        ax.plot(
            x,
            np.minimum(hw.peak_tflops, x * hw.peak_tbps),
            color=color,
            ls=ls,
            lw=1.6,
            label=f"{hw.name}: {hw.peak_tflops:.0f} TFLOP/s, {hw.peak_tbps:.2f} TB/s",
        )
    for v in np.unique(ai):
        ax.axvline(v, color="0.85", lw=0.6, zorder=0)
    # The token counts on a top axis at their intensities: powers of two first, then the others
    # where they fit (grey lines mark every case), so no two labels touch.
    ticks = cases.drop_duplicates("tokens").sort_values("tokens")
    width_pt = fig.get_figwidth() * 72 * 0.775
    where = {
        int(t): (math.log10(v) - math.log10(lo)) / math.log10(hi / lo) for t, v in zip(ticks["tokens"], ticks["flop_per_byte"])
    }
    chosen: list[int] = []
    for t in sorted(where, key=lambda t: (t & (t - 1) != 0, t)):
        half = lambda n: 0.65 * MIN_FONT_PT * (len(str(n)) + 2) / 2 / width_pt  # noqa: E731
        if all(abs(where[t] - where[c]) > half(t) + half(c) for c in chosen):
            chosen.append(t)
    chosen.sort()
    if points is not None and len(points):
        for k, impl in enumerate(order_impls(points["impl"])):
            p = points[(points["impl"] == impl) & points["tflops"].notna()]
            if p.empty:
                continue
            color, marker = impl_style(impl, k)
            ok = p["correct"].fillna(True).astype(bool) if "correct" in p else pd.Series(True, index=p.index)
            label = IMPL_LABELS.get(impl, impl)
            # One legend entry per implementation, hollow when its points fail the correctness check.
            for sel, failed in ((ok, False), (~ok, True)):
                if not sel.any():
                    continue
                ax.scatter(
                    p.loc[sel, "flop_per_byte"],
                    p.loc[sel, "tflops"],
                    marker=marker,
                    s=40,
                    zorder=3,
                    facecolor="none" if failed else color,
                    edgecolor=color if failed else "white",
                    linewidth=1.0 if failed else 0.4,
                    label=label + (" (FAILS correctness)" if failed else ""),
                )
                records += [
                    {"panel": "roofline", "series": impl, "x": float(a), "y": float(b), "lo": math.nan, "hi": math.nan}
                    for a, b in zip(p.loc[sel, "flop_per_byte"], p.loc[sel, "tflops"])
                ]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity of the minimum traffic (FLOP/byte)")
    top = ax.secondary_xaxis("top")
    intensity = dict(zip(ticks["tokens"].astype(int), ticks["flop_per_byte"]))
    top.set_ticks([intensity[t] for t in chosen], [str(t) for t in chosen], fontsize=MIN_FONT_PT)
    top.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    top.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    others = [str(t) for t in where if t not in chosen]
    top.set_xlabel(
        "tokens T of the cases (grey lines)" + (f"; also {', '.join(others)} between" if others else ""), fontsize=MIN_FONT_PT
    )
    ax.set_ylabel("attainable / achieved bf16 TFLOP/s")
    ax.set_title(title)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(fontsize=MIN_FONT_PT, loc="lower right")
    fig.plotted = pd.DataFrame(records, columns=PLOTTED_COLUMNS)
    add_footer(fig, footer)
    return fig


def sol_bar_plot(table: pd.DataFrame, footer: str = "", title: str = "Speed-of-light time per case") -> Figure:
    """SOL time (ms, log scale) per case for each hardware entry of ``analysis.roofline_table``:
    markers side by side (a log axis has no zero for bars to start from), hollow where the case
    is memory-bound on that hardware."""
    cases, labels = _case_labels(table)
    hws = list(dict.fromkeys(table["hardware"]))
    fig, ax = plt.subplots(figsize=(10, 4.8))
    records: list = []
    series = []
    for k, hw in enumerate(hws):
        t = table[table["hardware"] == hw].set_index("case").reindex(cases)
        color, _ = HARDWARE_STYLE.get(hw, (_FALLBACK_COLORS[k % len(_FALLBACK_COLORS)], "-"))
        series.append(dict(key=hw, label=hw, y=_column(t, "sol_ms"), color=color, marker="o"))
    _dodged(ax, cases, series, records, "sol")
    # Hollow markers for memory-bound cases: redraw those on top in white.
    n = len(hws)
    for k, hw in enumerate(hws):
        t = table[table["hardware"] == hw].set_index("case").reindex(cases)
        mem = (t["bound"] == "memory").to_numpy()
        pos = np.arange(len(cases)) + (k - (n - 1) / 2) * (0.72 / n if n > 1 else 0)
        color = series[k]["color"]
        ax.plot(pos[mem], t["sol_ms"].to_numpy(float)[mem], ls="none", marker="o", ms=6, mfc="white", mec=color, zorder=4)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    _case_ticks(ax, labels)
    ax.set_xlim(-0.6, len(cases) - 0.4)
    ax.set_ylabel("speed-of-light time (ms, log scale)")
    ax.set_title(title + " (hollow: memory-bound)")
    ax.grid(True, axis="y", which="both", lw=0.3, alpha=0.5)
    handles, names = ax.get_legend_handles_labels()
    handles.append(matplotlib.lines.Line2D([], [], ls="none", marker="o", mfc="white", mec="0.3", ms=6))
    names.append("memory-bound (hollow)")
    ax.legend(handles, names, fontsize=MIN_FONT_PT, ncol=3, loc="upper left")
    fig.tight_layout()
    fig.plotted = pd.DataFrame(records, columns=PLOTTED_COLUMNS)
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
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    records: list = []
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
            ax.hist(
                d[d > 0],
                bins=bins,
                histtype="step",
                lw=1.4,
                color=color,
                label=label,
                ls="--" if impl == "bf16 reference" else "-",
            )
            records.append(
                {
                    "panel": output,
                    "series": impl,
                    "x": "median",
                    "y": float(np.median(d)),
                    "lo": float(np.quantile(d, 0.2)),
                    "hi": float(np.quantile(d, 0.8)),
                }
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(output)
        ax.set_xlabel("|out - float64| / rms(float64)")
        ax.set_ylabel("elements (count)")
        ax.grid(True, which="both", lw=0.3, alpha=0.5)
        ax.legend(fontsize=MIN_FONT_PT)
    fig.suptitle(title)
    fig.tight_layout()
    fig.plotted = pd.DataFrame(records, columns=PLOTTED_COLUMNS)
    add_footer(fig, footer)
    return fig


def error_ratio_plot(
    rows: pd.DataFrame, factor: float = 2.0, footer: str = "", title: str = "Relative error / bf16 reference's own relative error"
) -> Figure:
    """Per shape (x) and output (panel): the float64 relative-error ratio of each implementation
    (``validate_case`` rows with status ok; the worst round), with the acceptance line at
    ``factor``. Rows whose status is not ok are listed under the figure, not drawn."""
    ok = rows[rows["status"] == "ok"]
    outputs = list(dict.fromkeys(rows["output"]))
    cases, labels = _case_labels(rows)  # the order and "(T=...)" labels of the latency figures
    width = min(MAX_WIDTH_IN, max(6.0, 0.45 * len(cases) + 2.5))
    fig, axes = plt.subplots(len(outputs), 1, figsize=(width, 1.5 * len(outputs) + 1.8), sharex=True, sharey=True, squeeze=False)
    records: list = []
    impls = list(dict.fromkeys(rows["impl"]))
    for ax, output in zip(axes.flat, outputs):
        series = []
        for k, impl in enumerate(impls):
            t = ok[(ok["output"] == output) & (ok["impl"] == impl)].groupby("case")["ratio"].max().reindex(cases)
            color, marker = impl_style(impl, k)
            # The reference's ratio is 1 by definition: a hollow ring, so a point at 1.0 shows through.
            series.append(dict(key=impl, label=impl, y=t.to_numpy(float), color=color, marker=marker, hollow=impl == "reference"))
        _dodged(ax, cases, series, records, output, width=0.4)
        ax.axhline(factor, color="red", lw=1, ls="--", label=f"accept <= {factor:g}")
        ax.text(0.005, 0.94, output, transform=ax.transAxes, fontsize=9, fontweight="bold", va="top")
        ax.set_ylabel("ratio")
        ax.grid(True, lw=0.3, alpha=0.5)
    _case_ticks(axes.flat[-1], labels)
    axes.flat[-1].set_xlabel("case (sorted by tokens T)")
    axes.flat[0].set_ylim(0, max(2.5, float(np.nanmax(ok["ratio"].to_numpy(float), initial=0)) * 1.1))
    axes.flat[0].legend(fontsize=MIN_FONT_PT, ncol=3, loc="lower right")
    fig.suptitle(title + "\n(relative error against float64, worst round, per output)")
    fig.tight_layout()
    bad = rows[rows["status"] != "ok"]
    note = ""
    if len(bad):
        note = "not drawn (status not ok): " + "; ".join(f"{i}: {s}" for (i, s), _ in bad.groupby(["impl", "status"], sort=False))
    return _finish_panels(fig, records, footer, note="\n".join(textwrap.wrap(note, 120)))


def _token_groups(table: pd.DataFrame) -> list[tuple[int, list[str]]]:
    cases = table.drop_duplicates("case").sort_values(["tokens", "case"])
    return [(int(t), list(g["case"])) for t, g in cases.groupby("tokens", sort=True)]


def latency_plot(table: pd.DataFrame, footer: str = "", title: str = "Latency per case") -> Figure:
    """Median latency (ms) per case for every implementation, one panel per token count T (each
    with its own linear axis: the implementations differ by a few percent, which one log axis
    over 3-130 ms hides), p20-p80 whiskers, the H200 datasheet SOL time in each panel's title.
    ``table``: ``analysis.latency_table`` output."""
    groups = _token_groups(table)
    impls = order_impls(table["impl"])
    # Two rows of panels, split where half of the cases are placed; widths follow the case counts.
    total = sum(len(c) for _, c in groups)
    split, count = len(groups), 0
    for k, (_, c) in enumerate(groups):
        count += len(c)
        if count >= total / 2:
            split = k + 1
            break
    layout = [groups[:split], groups[split:]] if split < len(groups) else [groups]
    fig = plt.figure(figsize=(MAX_WIDTH_IN, 3.6 * len(layout) + 0.8))
    outer = fig.add_gridspec(len(layout), 1, hspace=0.6)
    records: list = []
    first = None
    sol = table.drop_duplicates("case").set_index("case")
    for r, row_groups in enumerate(layout):
        inner = outer[r].subgridspec(1, len(row_groups), width_ratios=[len(c) + 0.6 for _, c in row_groups], wspace=0.55)
        for k, (T, cases) in enumerate(row_groups):
            ax = fig.add_subplot(inner[k])
            first = first or ax
            _dodged(ax, cases, _impl_series(table, cases, impls, "median_ms", "p20_ms", "p80_ms"), records, f"T={T}")
            ax.set_xticks(range(len(cases)), cases, rotation=40, ha="right", rotation_mode="anchor")
            ax.set_xlim(-0.6, len(cases) - 0.4)
            s = sol.loc[cases[0], "sol_ms"] if "sol_ms" in sol else math.nan
            ax.set_title(f"T={T}" + (f"\nSOL {s:.1f} ms" if pd.notna(s) else ""), fontsize=9)
            ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(4))
            ax.grid(True, axis="y", lw=0.3, alpha=0.5)
            if k == 0:
                ax.set_ylabel("median latency (ms)")
    fig.suptitle(title, y=1.0)
    return _finish_panels(
        fig, records, footer, first, ncol=2, note=_spread_note(table) + "; SOL: the H200 datasheet speed of light of the case"
    )


def _speedup_series(table: pd.DataFrame, base: str, cases: Sequence[str]) -> list[dict]:
    impls = [i for i in order_impls(table["impl"]) if i != base]
    col = f"speedup_vs_{base}"
    return _impl_series(table, cases, impls, col, f"{col}_lo", f"{col}_hi")


def speedup_plot(table: pd.DataFrame, footer: str = "", title: str = "Speed-up per case") -> Figure:
    """Speed-up (x, linear) per case over the eager reference and over torch.compile, one panel
    per baseline present in ``table`` (a baseline that is not among the plotted implementations
    gets no panel, and the title says so), p20-p80 whiskers (``analysis.latency_table``'s
    ``speedup_vs_<base>_lo/_hi``)."""
    cases, labels = _case_labels(table)
    bases = [
        b
        for b in ("eager", "compile")
        if b in set(table["impl"])
        and f"speedup_vs_{b}" in table
        and table.loc[table["impl"] != b, f"speedup_vs_{b}"].notna().any()
    ]
    missing = [IMPL_LABELS.get(b, b) for b in ("eager", "compile") if b not in bases]
    if not bases:
        return placeholder(
            title, f"No baseline to compare with: neither {' nor '.join(missing)} is among the plotted implementations.", footer
        )
    fig, axes = plt.subplots(len(bases), 1, figsize=(MAX_WIDTH_IN, 3.3 * len(bases) + 1.2), sharex=True, squeeze=False)
    records: list = []
    for ax, base in zip(axes.flat, bases):
        _dodged(ax, cases, _speedup_series(table, base, cases), records, f"over {base}")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_ylabel(f"speed-up over\n{IMPL_LABELS.get(base, base)} (x)")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.grid(True, axis="y", lw=0.3, alpha=0.5)
        ax.set_xlim(-0.6, len(cases) - 0.4)
    _case_ticks(axes.flat[-1], labels)
    axes.flat[-1].set_xlabel("case (sorted by tokens T)")
    axes.flat[0].set_title(
        title + (f"\n(no {', '.join(missing)} among the plotted implementations: no panel over it)" if missing else "")
    )
    fig.tight_layout()
    return _finish_panels(
        fig, records, footer, list(axes.flat), note=_spread_note(table, "timed iterations") + " (the baseline at its median)"
    )


def sol_fraction_plot(table: pd.DataFrame, footer: str = "", title: str = "Fraction of the H200 speed of light") -> Figure:
    """SOL time / latency per case (1.0 = at the speed of light), datasheet SOL and, when
    present, measured ceilings (second panel); p20-p80 whiskers."""
    measured = "sol_fraction_measured" in table and table["sol_fraction_measured"].notna().any()
    cases, labels = _case_labels(table)
    fig, axes = plt.subplots(
        2 if measured else 1, 1, figsize=(MAX_WIDTH_IN, 7.5 if measured else 4.5), sharex=True, squeeze=False
    )
    records: list = []
    t = table.copy()
    for col, sol in (("sol_fraction", "sol_ms"), ("sol_fraction_measured", "sol_ms_measured")):
        if sol in t and "p20_ms" in t:
            t[f"{col}_lo"], t[f"{col}_hi"] = t[sol] / t["p80_ms"], t[sol] / t["p20_ms"]
    for ax, (col, what) in zip(
        axes.flat, [("sol_fraction", "datasheet 989 TFLOP/s, 4.8 TB/s"), ("sol_fraction_measured", "measured ceilings")]
    ):
        series = _impl_series(
            t,
            cases,
            order_impls(t["impl"]),
            col,
            f"{col}_lo" if f"{col}_lo" in t else None,
            f"{col}_hi" if f"{col}_hi" in t else None,
        )
        _dodged(ax, cases, series, records, col)
        ax.axhline(1.0, color="#2ca02c", lw=1.2)
        top = float(np.nanmax(t[col].to_numpy(float), initial=1.0)) if col in t else 1.0
        ax.set_ylim(0, max(1.05, top * 1.05))
        ax.set_ylabel(f"SOL time / latency\n({what})")
        ax.grid(True, axis="y", lw=0.3, alpha=0.5)
        ax.set_xlim(-0.6, len(cases) - 0.4)
    axes.flat[0].set_title(title)
    _case_ticks(axes.flat[-1], labels)
    axes.flat[-1].set_xlabel("case (sorted by tokens T)")
    fig.tight_layout()
    return _finish_panels(fig, records, footer, axes.flat[0], note=_spread_note(table))


_NO_POWER_SPREAD = (
    "no spread recorded: one reading per case and implementation (means over the timed loop; "
    "energy from the board's energy counter), one run"
)


def energy_plot(table: pd.DataFrame, footer: str = "", title: str = "Energy per backward") -> Figure:
    """Two panels per case: energy efficiency (GFLOP per joule of board energy, one L2 flush's
    energy subtracted; linear, comparable across cases) for every implementation, and the energy
    per backward over torch.compile's (x; below 1: less energy). ``table``:
    ``analysis.power_table`` output. The run records one energy reading per case: no whiskers,
    and the figure says so."""
    cases, labels = _case_labels(table)
    fig, axes = plt.subplots(2, 1, figsize=(MAX_WIDTH_IN, 7.2), sharex=True)
    records: list = []
    impls = order_impls(table["impl"])
    _dodged(axes[0], cases, _impl_series(table, cases, impls, "gflop_per_j"), records, "gflop_per_j")
    axes[0].set_ylabel("GFLOP per joule\n(12*T*H*I / energy per backward)")
    axes[0].set_title(title)
    if table["energy_vs_compile"].notna().any():
        _dodged(
            axes[1],
            cases,
            _impl_series(table, cases, [i for i in impls if i != "compile"], "energy_vs_compile"),
            records,
            "energy_vs_compile",
        )
    else:
        axes[1].text(
            0.5, 0.5, "no torch.compile energy among the plotted implementations", ha="center", transform=axes[1].transAxes
        )
    axes[1].axhline(1.0, color="black", lw=0.8)
    axes[1].set_ylabel("energy per backward /\ntorch.compile's (x)")
    for ax in axes:
        ax.grid(True, axis="y", lw=0.3, alpha=0.5)
        ax.set_xlim(-0.6, len(cases) - 0.4)
    _case_ticks(axes[1], labels)
    axes[1].set_xlabel("case (sorted by tokens T)")
    fig.tight_layout()
    return _finish_panels(fig, records, footer, axes[0], note=_NO_POWER_SPREAD)


def clock_power_plot(
    table: pd.DataFrame,
    footer: str = "",
    title: str = "SM clock and board power",
    max_clock_mhz: float | None = None,
    power_limit_w: float | None = None,
) -> Figure:
    """Two panels per case: the mean SM clock (MHz) and mean board power (W) each
    implementation ran at during its timed loop, with the maximum clock and the power limit as
    lines when known. ``table``: ``analysis.power_table`` output."""
    cases, labels = _case_labels(table)
    fig, axes = plt.subplots(2, 1, figsize=(MAX_WIDTH_IN, 7.2), sharex=True)
    records: list = []
    impls = order_impls(table["impl"])
    for ax, column, label, limit, limit_label in (
        (axes[0], "sm_clock_mhz", "mean SM clock (MHz)", max_clock_mhz, "maximum SM clock"),
        (axes[1], "power_w", "mean board power (W)", power_limit_w, "power limit"),
    ):
        _dodged(ax, cases, _impl_series(table, cases, impls, column), records, column)
        if limit:
            unit = "MHz" if column == "sm_clock_mhz" else "W"
            ax.axhline(limit, color="#b00000", lw=1.2, ls="--")
            ax.text(
                len(cases) - 0.45,
                limit,
                f"{limit_label}, {limit:.0f} {unit}",
                color="#b00000",
                ha="right",
                va="bottom",
                fontsize=MIN_FONT_PT,
            )
        values = table[column].to_numpy(float) if column in table else np.array([])
        top = max(float(np.nanmax(values, initial=0.0)), limit or 0)
        ax.set_ylim(0.5 * float(np.nanmin(values, initial=top)) if values.size else 0, top * 1.06 or 1)
        ax.set_ylabel(label)
        ax.grid(True, axis="y", lw=0.3, alpha=0.5)
        ax.set_xlim(-0.6, len(cases) - 0.4)
    axes[0].set_title(title)
    _case_ticks(axes[1], labels)
    axes[1].set_xlabel("case (sorted by tokens T)")
    fig.tight_layout()
    return _finish_panels(fig, records, footer, axes[0], note=_NO_POWER_SPREAD)


def gmean_plot(summary: pd.DataFrame, footer: str = "", title: str = "Geometric mean over the cases") -> Figure:
    """The headline: per implementation (``analysis.latency_summary``), the geometric-mean
    speed-up over torch.compile (over the eager reference when compile is absent; geometric-mean
    ms when neither is) with its p20-p80 whisker, each row's milliseconds written above it.
    Rows that fail the correctness check are hollow and say so; a row that timed fewer cases
    says over how many."""
    s = summary[summary["gmean_ms"].notna()].reset_index(drop=True)
    if s.empty:
        return placeholder(title, "no implementation has a latency", footer)
    base = next((b for b in ("compile", "eager") if b in set(s["impl"]) and s[f"gmean_speedup_vs_{b}"].notna().any()), None)
    if base:
        col = f"gmean_speedup_vs_{base}"
        x, lo, hi = _column(s, col), _column(s, f"{col}_lo"), _column(s, f"{col}_hi")
        xlabel = f"speed-up over {IMPL_LABELS.get(base, base)} (x, geometric mean; right = faster)"
    else:
        x, lo, hi = _column(s, "gmean_ms"), _column(s, "gmean_p20_ms"), _column(s, "gmean_p80_ms")
        xlabel = "geometric-mean median latency (ms; left = faster)"
    n = len(s)
    fig, ax = plt.subplots(figsize=(8, 0.62 * n + 1.5))
    records: list = []
    fails = [str(r.get("all_correct")) == "False" for _, r in s.iterrows()]
    span = np.nanmax(np.r_[x, hi]) - np.nanmin(np.r_[x, lo])
    left, right = np.nanmin(np.r_[x, lo]) - 0.08 * span, np.nanmax(np.r_[x, hi]) + 0.08 * span
    if base:
        left, right = min(left, 1 - 0.08 * span), max(right, 1 + 0.08 * span)
    ax.set_xlim(left, right)
    for k, ((_, r), failed) in enumerate(zip(s.iterrows(), fails)):
        y = n - 1 - k  # first implementation on top
        color, marker = impl_style(r["impl"], k)
        ax.axhline(y, color="0.9", lw=0.6, zorder=0)
        err = None if np.isnan(lo[k]) else [[x[k] - lo[k]], [hi[k] - x[k]]]
        ax.errorbar(
            [x[k]],
            [y],
            xerr=err,
            ls="none",
            marker=marker,
            ms=9 if marker == "*" else 7,
            color=color,
            mfc="white" if failed else color,
            mec=color,
            elinewidth=1.6,
            capsize=3,
            zorder=3,
        )
        records.append(
            {"panel": "gmean", "series": r["impl"], "x": r["impl"], "y": float(x[k]), "lo": float(lo[k]), "hi": float(hi[k])}
        )
        parts = [f"{r['gmean_ms']:.2f} ms"]
        if pd.notna(r.get("gmean_p20_ms")):
            parts[0] += f" (p20-p80 {r['gmean_p20_ms']:.2f}-{r['gmean_p80_ms']:.2f})"
        if base and r["impl"] != base:
            parts.append(f"{x[k]:.3f}x")
        if "cases" in s and r["cases"] < s["cases"].max():  # its means are over its own cases only
            parts.append(f"over {int(r['cases'])} of {int(s['cases'].max())} cases")
        if failed:
            # A fast wrong answer must not read as a result (Liger recomputes silu(gate_output)).
            parts.append("FAILS the correctness check")
        ax.text(
            left + 0.005 * (right - left),
            y + 0.3,
            ", ".join(parts),
            va="center",
            fontsize=MIN_FONT_PT,
            color="#b00000" if failed else "black",
        )
    if base:
        ax.axvline(1.0, color=impl_style(base)[0], lw=0.8, ls=":")
    ax.set_yticks(range(n), [textwrap.fill(label, 28) for label in s["label"][::-1]])
    ax.set_ylim(-0.5, n - 0.2)
    ax.grid(True, axis="x", lw=0.3, alpha=0.5)
    iters = int(s["iters"].max()) if "iters" in s and s["iters"].notna().any() else None
    cases = int(s["cases"].max()) if "cases" in s else 0
    note = (
        f"whiskers: each implementation's p20-p80 of {f'{iters} ' if iters else ''}timed iterations per case "
        f"(the baseline at its median), geometric mean over {cases} cases; one run"
    )
    if "gmean_sol_ms" in s and s["gmean_sol_ms"].notna().any():
        note += f"\nH200 speed of light (datasheet), geometric mean: {float(s['gmean_sol_ms'].max()):.2f} ms"
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    fig.tight_layout()
    return _finish_panels(fig, records, footer, note=note)


def history_plot(history: pd.DataFrame, footer: str = "", title: str = "Geometric-mean latency across recorded runs") -> Figure:
    """Geometric-mean latency (ms) per implementation for each recorded run, oldest left
    (``analysis.run_history``), with p20-p80 whiskers. Runs that timed fewer cases than the most
    any run timed are left out (a geometric mean over other cases is not comparable) and listed
    under the figure."""
    h = history.copy()
    if "cases" not in h:
        h["cases"] = 0
    per_run = h.groupby("run_id", sort=False)["cases"].max()
    full = per_run[per_run == per_run.max()].index.tolist()
    partial = per_run[per_run < per_run.max()]
    h = h[h["run_id"].isin(full)]
    runs = list(dict.fromkeys(h["run_id"]))
    fig, ax = plt.subplots(figsize=(min(MAX_WIDTH_IN, 1.0 * len(runs) + 3.5), 4.8))
    records: list = []
    first = h.drop_duplicates("run_id").set_index("run_id")
    impls = order_impls(h["impl"])
    for k, impl in enumerate(impls):
        t = h[h["impl"] == impl].set_index("run_id").reindex(runs)
        y = _column(t, "gmean_ms")
        lo, hi = _column(t, "gmean_p20_ms"), _column(t, "gmean_p80_ms")
        color, marker = impl_style(impl, k)
        failed = (t["all_correct"].astype(str) == "False").to_numpy() if "all_correct" in t else np.zeros(len(runs), bool)
        label = IMPL_LABELS.get(impl, impl)
        measured = np.isfinite(y)
        if measured.any() and failed[measured].all():
            label += " (FAILS the correctness check)"
        elif failed.any():
            label += " (open: fails the correctness check)"
        # Side by side within a run, so whiskers do not hide each other.
        xs = np.arange(len(runs)) + (k - (len(impls) - 1) / 2) * (0.5 / max(1, len(impls)))
        ax.plot(xs, y, color=color, lw=0.8, alpha=0.5, zorder=2)  # the same code path over time
        err = np.vstack([np.where(np.isnan(lo), 0, y - lo), np.where(np.isnan(hi), 0, hi - y)])
        all_failed = measured.any() and failed[measured].all()
        ax.errorbar(
            xs,
            y,
            yerr=err,
            ls="none",
            marker=marker,
            color=color,
            ms=7 if marker == "*" else 5,
            mfc="white" if all_failed else color,
            mec=color,
            elinewidth=1.2,
            label=label,
            zorder=3,
        )
        for x in np.flatnonzero(failed & np.isfinite(y)):
            # An open marker where it fails: a fast wrong answer must not read as a result.
            ax.plot([xs[x]], [y[x]], marker=marker, color=color, mfc="white", ls="none", zorder=4)
        records += [
            {"panel": "history", "series": impl, "x": r, "y": float(v), "lo": float(a), "hi": float(b)}
            for r, v, a, b in zip(runs, y, lo, hi)
            if np.isfinite(v)
        ]
    ticks = []
    for r in runs:
        utc = str(first.loc[r, "utc"]) if "utc" in first and pd.notna(first.loc[r, "utc"]) else ""
        commit = str(first.loc[r, "commit"]) if "commit" in first and pd.notna(first.loc[r, "commit"]) else ""
        ticks.append(f"{utc[:10]}\n{utc[11:16]} {commit}".strip() if utc else r)
    ax.set_xticks(range(len(runs)), ticks, fontsize=MIN_FONT_PT)
    fig.draw_without_rendering()
    boxes = [t.get_window_extent() for t in ax.get_xticklabels() if t.get_text()]
    if any(a.x1 > b.x0 for a, b in zip(boxes, boxes[1:])):
        # Too many runs for level labels: one line each, slanted, so neighbours clear each other.
        ax.set_xticks(
            range(len(runs)),
            [t.replace("\n", " ") for t in ticks],
            fontsize=MIN_FONT_PT,
            rotation=45,
            ha="right",
            rotation_mode="anchor",
        )
        fig.set_figheight(fig.get_figheight() + 1.0)  # room for the slanted labels, not taken from the plot
    ax.set_xlim(-0.5, len(runs) - 0.5)
    ax.set_ylabel("geometric-mean median latency (ms)")
    ax.set_xlabel("recorded run (UTC start, commit; oldest left)")
    ax.set_title(title)
    ax.grid(True, axis="y", lw=0.3, alpha=0.5)
    fig.tight_layout()
    note = (
        f"each point: geometric mean over the {int(per_run.max())} cases of one run; whiskers: p20-p80 of "
        "the timed iterations per case (geometric mean); one run per point"
    )
    if len(partial):
        note += "\nleft out (fewer cases, not comparable): " + ", ".join(f"{r} ({int(c)} cases)" for r, c in partial.items())
    return _finish_panels(fig, records, footer, ax, ncol=2, note=note)


#: Labels of the training-step variants (``swiglu_lab.research.train_step``'s names).
STEP_LABELS = {
    "plain": "nn.Linear (eager)",
    "compile": "torch.compile(nn.Linear)",
    "saved": "ours, activated_gate saved",
    "lean": "ours, memory-lean",
    "lean_cublas": "ours, memory-lean, cuBLAS forward",
}
STEP_STYLE = {
    "plain": ("#4d4d4d", "o"),
    "compile": ("#1f77b4", "s"),
    "saved": ("#ff7f0e", "D"),
    "lean": ("#d62728", "*"),
    "lean_cublas": ("#9467bd", "v"),
}


def training_step_plot(
    steps: pd.DataFrame,
    runs: pd.DataFrame | None = None,
    footer: str = "",
    title: str = "Training step (forward + backward) of one MLP layer",
) -> Figure:
    """Three panels over the token counts T (categories), one marker per variant side by side:
    step speed-up over nn.Linear (x) with min-max whiskers over the recorded ``runs`` (all
    runs' step rows with a ``run_id`` column; none: no whiskers), saved activations per layer
    (GB) and the step's peak memory (GB) with the floor no implementation can go below (black
    dash per T; runs that recorded it). ``steps``: the latest run's rows (``train_step``'s
    ``tokens, variant, ms, saved_bytes, peak_bytes, floor_bytes, speedup_vs_plain``)."""
    tokens = sorted(set(int(t) for t in steps["tokens"]))
    variants = [v for v in STEP_LABELS if v in set(steps["variant"])]
    variants += sorted(set(steps["variant"]) - set(variants))
    fig, axes = plt.subplots(1, 3, figsize=(MAX_WIDTH_IN, 4.0))
    records: list = []
    n_runs = runs["run_id"].nunique() if runs is not None and len(runs) else 1

    def series(column: str, scale: float = 1.0, spread: bool = False) -> list[dict]:
        out = []
        for v in variants:
            d = steps[steps["variant"] == v].set_index("tokens").reindex(tokens)
            y = d[column].to_numpy(float) * scale
            color, marker = STEP_STYLE.get(v, ("0.4", "o"))
            label = STEP_LABELS.get(v, v)
            missing = [t for t, val in zip(tokens, y) if np.isnan(val)]
            if missing:
                label += f" (not run at T={', '.join(map(str, missing))}"
                lean = steps[(steps["variant"] == "lean") & steps["tokens"].isin(missing)]
                if v == "lean_cublas" and "forward" in lean and (lean["forward"] == "cublas").all() and len(lean):
                    label += ", where memory-lean's forward is cuBLAS already"
                label += ")"
            s = dict(key=v, label=label, y=y, color=color, marker=marker)
            if spread and runs is not None and n_runs > 1:
                g = runs[runs["variant"] == v].groupby("tokens")[column]
                s["lo"] = g.min().reindex(tokens).to_numpy(float) * scale
                s["hi"] = g.max().reindex(tokens).to_numpy(float) * scale
            out.append(s)
        return out

    ax_t, ax_m, ax_p = axes
    _dodged(ax_t, tokens, series("speedup_vs_plain", spread=True), records, "speed-up")
    ax_t.axhline(1.0, color="0.5", lw=0.8)
    ax_t.set_title("step speed-up over nn.Linear")
    ax_t.set_ylabel("speed-up (x)")
    _dodged(ax_m, tokens, series("saved_bytes", 1e-9), records, "saved")
    ax_m.set_title("saved activations per layer")
    ax_m.set_ylabel("GB")
    ax_m.set_ylim(bottom=0)
    _dodged(ax_p, tokens, series("peak_bytes", 1e-9), records, "peak")
    ax_p.set_title("peak memory of the step")
    ax_p.set_ylabel("GB")
    if "floor_bytes" in steps and steps["floor_bytes"].notna().any():
        floor = steps.groupby("tokens")["floor_bytes"].max().reindex(tokens).to_numpy(float) / 1e9
        ax_p.hlines(
            floor,
            np.arange(len(tokens)) - 0.45,
            np.arange(len(tokens)) + 0.45,
            color="k",
            lw=1.2,
            label="floor: weights, inputs, output, all gradients + one [T, I]",
            zorder=2,
        )
        records += [
            {"panel": "peak", "series": "floor", "x": t, "y": float(f), "lo": math.nan, "hi": math.nan}
            for t, f in zip(tokens, floor)
        ]
    for ax in axes:
        ax.set_xticks(range(len(tokens)), [f"T={t}" for t in tokens])
        ax.set_xlim(-0.6, len(tokens) - 0.4)
        ax.grid(True, axis="y", lw=0.3, alpha=0.5)
    fig.suptitle(title)
    fig.tight_layout()
    handles, labels = ax_t.get_legend_handles_labels()
    h2, l2 = ax_p.get_legend_handles_labels()
    handles += [h for h, lab in zip(h2, l2) if lab.startswith("floor")]
    labels += [lab for lab in l2 if lab.startswith("floor")]
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.0, 0.0), ncol=2, frameon=False, fontsize=MIN_FONT_PT)
    note = (
        f"speed-up whiskers: min-max over the {n_runs} recorded runs (their code differs: see each run's commit); "
        "marker: the latest run"
        if n_runs > 1
        else "one run: no spread recorded (medians of the timed steps)"
    )
    note += "; memory: the allocator's exact peak and saved bytes of the latest run (no spread)"
    return _finish_panels(fig, records, footer, note="\n".join(textwrap.wrap(note, 130)))


HF_LABELS = {
    "swiglu": "ours (swiglu_hf.apply)",
    "swiglu_pdl": "ours, PDL",
    "swiglu_nopdl": "ours, PDL off",
    "swiglu_reuse": "ours, reusing saved buffers",
    "liger": "Liger's SwiGLU MLP",
    "swiglu+compile": "ours + torch.compile",
    "unpatched+compile": "unpatched + torch.compile",
}
HF_STYLE = {
    "swiglu": ("#d62728", "*"),
    "swiglu_pdl": ("#e377c2", "P"),
    "swiglu_nopdl": ("#7f7f7f", "x"),
    "swiglu_reuse": ("#9467bd", "v"),
    "liger": ("#ff7f0e", "^"),
    "swiglu+compile": ("#8c564b", "D"),
    "unpatched+compile": ("#1f77b4", "s"),
}
#: The step speed-up the Hugging Face goal asks for (a dashed line in ``hf_step_plot``).
HF_TARGET = 1.05
#: ``hf_step_plot``'s y-axis top: a compiled model's speed-up over the eager one where the host is
#: the bound (3x and more) would flatten every eager comparison, so such points sit on the top
#: edge with their value written beside them.
HF_YMAX = 1.3


def hf_step_plot(
    runs: pd.DataFrame, footer: str = "", title: str = "Hugging Face training step: speed-up over the unpatched model"
) -> Figure:
    """One panel per model shape (``hf_step.load_runs``' ``shape``), the recorded runs in date order
    along x (labelled by commit): each variant's step speed-up over the same run's unpatched model,
    filled where the run timed the variants side by side, hollow where one after the other. A grey
    line at 1.0 and a dashed one at the goal (``HF_TARGET``); a speed-up above ``HF_YMAX`` on the
    top edge, its value written beside it."""
    runs = runs[runs["variant"] != "unpatched"]
    shapes = list(runs.groupby("shape")["run"].nunique().sort_values(ascending=False).index)
    widths = [max(4, runs[runs["shape"] == sh]["run"].nunique()) for sh in shapes]
    fig, axes = plt.subplots(
        1, len(shapes), figsize=(MAX_WIDTH_IN, 4.2), squeeze=False, gridspec_kw={"width_ratios": widths}, sharey=True
    )
    records: list = []
    for ax, shape in zip(axes[0], shapes):
        part = runs[runs["shape"] == shape]
        order = list(dict.fromkeys(part["run"]))
        variants = [v for v in HF_STYLE if v in set(part["variant"])] + sorted(set(part["variant"]) - set(HF_STYLE))
        n = len(variants)
        for k, v in enumerate(variants):
            d = part[part["variant"] == v].set_index("run").reindex(order)
            color, marker = HF_STYLE.get(v, ("0.4", "o"))
            pos = np.arange(len(order)) + (k - (n - 1) / 2) * (0.6 / max(1, n))
            side = d["side_by_side"].fillna(False).astype(bool).to_numpy()
            y = d["speedup"].to_numpy(float)
            shown = np.minimum(y, HF_YMAX - 0.01)
            for mask, fill in ((side, color), (~side, "white")):
                ax.plot(
                    pos[mask],
                    shown[mask],
                    ls="none",
                    marker=marker,
                    color=color,
                    mfc=fill,
                    mec=color,
                    ms=6 if marker != "*" else 8,
                    label=HF_LABELS.get(v, v) if fill == color else None,
                    zorder=3,
                )
            for xx, yy in zip(pos, y):
                if yy >= HF_YMAX:  # on the top edge, its value beside it (two variants' labels stacked)
                    ax.annotate(
                        f"{yy:.2f}x",
                        (xx, HF_YMAX - 0.01),
                        xytext=(0, -12 - 10 * (k % 2)),
                        textcoords="offset points",
                        ha="center",
                        fontsize=MIN_FONT_PT,
                        color=color,
                    )
            for run, yy in zip(order, y):
                if not np.isnan(yy):
                    records.append({"panel": shape, "series": v, "x": run, "y": float(yy), "lo": math.nan, "hi": math.nan})
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.axhline(HF_TARGET, color="0.3", lw=0.8, ls="--")
        commits = [part.loc[part["run"] == r, "commit"].iloc[0] or r.split("/")[0][-7:] for r in order]
        ax.set_xticks(range(len(order)), commits, rotation=60, ha="right")
        ax.set_xlim(-0.6, len(order) - 0.4)
        ax.set_title("\n".join(textwrap.wrap(shape, 22)), fontsize=MIN_FONT_PT + 1)
        ax.grid(True, axis="y", lw=0.3, alpha=0.5)
    axes[0][0].set_ylabel("step speed-up over unpatched (x)")
    axes[0][0].set_ylim(top=HF_YMAX)
    axes[0][0].plot([], [], ls="--", color="0.3", lw=0.8, label=f"the goal, {HF_TARGET:.2f}x")
    fig.suptitle(title)
    fig.tight_layout()
    note = (
        "filled: eager variants timed side by side in rotated blocks (one process); hollow: one after the other, "
        "where the machine's CPU drift moved the same code by up to 10%; each run's own unpatched model is 1.0x; "
        "x: the runs in date order, by commit (at dc30132 ours ran with PDL, mode 1, beside 'PDL off')"
    )
    return _finish_panels(fig, records, footer, legend_axes=list(axes[0]), ncol=4, note=note)


def long_seq_plot(
    table: pd.DataFrame,
    footer: str = "",
    title: str = "Full-depth Llama-3-8B shape on one GPU: memory and speed against sequence length",
) -> Figure:
    """Left: peak memory of a step against sequence length without activation checkpointing
    (``hf_step.load_long_seq`` rows), each variant's points joined, an x at a length that ran out
    of memory. Right: tokens/s at the lengths timed side by side, the stock model with
    checkpointing beside the others without it."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(MAX_WIDTH_IN, 4.2))
    records: list = []
    plain = table[~table["activation_checkpointing"]]
    labels = dict(HF_LABELS, unpatched="stock (nn.Linear MLP)")
    styles = dict(HF_STYLE, unpatched=("#1f77b4", "o"))
    for variant in [v for v in ("unpatched", "liger", "swiglu") if v in set(plain["variant"])]:
        color, marker = styles.get(variant, ("0.4", "o"))
        part = plain[plain["variant"] == variant]
        ok = part[~part["oom"]].groupby("seq_len")["peak_gib"].max().sort_index()
        ax.plot(ok.index / 1024, ok.to_numpy(), marker=marker, color=color, label=labels.get(variant, variant))
        oom = sorted(set(part[part["oom"]]["seq_len"]))
        top = float(plain["peak_gib"].max())
        ax.plot([s / 1024 for s in oom], [top * 1.02] * len(oom), ls="none", marker="x", color=color, ms=6)
        records += [
            {"panel": "peak", "series": variant, "x": int(s), "y": float(y), "lo": math.nan, "hi": math.nan}
            for s, y in ok.items()
        ]
    ax.set_xlabel("sequence length (thousand tokens)")
    ax.set_ylabel("peak GiB of a step (weights, gradients, AdamW included)")
    ax.set_title("no checkpointing (x: out of memory)", fontsize=MIN_FONT_PT + 1)
    ax.grid(True, lw=0.3, alpha=0.5)
    timed = table[table["tokens_per_s"].notna() & (table["run"].isin(table[table["activation_checkpointing"]]["run"]))]
    timed = timed[timed["seq_len"].isin(set(table[table["activation_checkpointing"]]["seq_len"]))]
    lengths = sorted(set(timed["seq_len"]))
    series = [
        ("unpatched", True, "stock + checkpointing"),
        ("swiglu", False, "ours, no checkpointing"),
        ("liger", False, "Liger, no checkpointing"),
    ]
    width = 0.8 / len(series)
    for k, (variant, ckpt, label) in enumerate(series):
        color = styles.get(variant, ("0.4", "o"))[0] if not ckpt else "0.55"
        ys = [
            timed[(timed["variant"] == variant) & (timed["activation_checkpointing"] == ckpt) & (timed["seq_len"] == s)][
                "tokens_per_s"
            ].max()
            for s in lengths
        ]
        pos = np.arange(len(lengths)) + (k - (len(series) - 1) / 2) * width
        bx.bar(pos, [0 if np.isnan(y) else y for y in ys], width, color=color, label=label)
        for xx, y in zip(pos, ys):
            if np.isnan(y):
                bx.annotate(
                    "OOM",
                    (xx, 0),
                    xytext=(0, 3),
                    textcoords="offset points",
                    ha="center",
                    fontsize=MIN_FONT_PT,
                    color=color,
                    rotation=90,
                )
        records += [
            {"panel": "tokens_per_s", "series": label, "x": int(s), "y": float(y), "lo": math.nan, "hi": math.nan}
            for s, y in zip(lengths, ys)
            if not np.isnan(y)
        ]
    bx.set_xticks(range(len(lengths)), [f"{s:,}" for s in lengths])
    bx.set_xlabel("sequence length (tokens)")
    bx.set_ylabel("tokens/s")
    bx.set_title("where the stock model needs checkpointing", fontsize=MIN_FONT_PT + 1)
    bx.grid(True, axis="y", lw=0.3, alpha=0.5)
    fig.suptitle(title)
    fig.tight_layout()
    return _finish_panels(fig, records, footer, legend_axes=[ax, bx], ncol=3)


def tp_timeline_plot(events: pd.DataFrame, footer: str = "", title: str = "Per-rank timeline of one TP backward") -> Figure:
    """One panel per variant (``tp_serial``, ``tp_early``, ...), one row per rank: each kernel a bar
    from its start to its end (``swiglu_lab.bench.timeline`` rows of one case, aligned), compute and
    communication in two colours, the communication no compute covered in the panel's title."""
    variants = list(dict.fromkeys(events["variant"]))
    fig, axes = plt.subplots(
        len(variants),
        1,
        figsize=(11, 1.1 + 1.0 * len(variants) * max(1, events["rank"].nunique()) / 2),
        sharex=True,
        squeeze=False,
    )
    stats = timeline.summary(events).groupby("variant")[["exposed_comm_us", "span_us"]].max()
    colours = {"compute": "#1f77b4", "comm": "#d62728"}
    for ax, variant in zip(axes[:, 0], variants):
        part = events[events["variant"] == variant]
        ranks = sorted(part["rank"].unique())
        for i, rank in enumerate(ranks):
            for kind, colour in colours.items():
                rows = part[(part["rank"] == rank) & (part["kind"] == kind)]
                spans = list(zip(rows["start_us"] / 1e3, (rows["end_us"] - rows["start_us"]) / 1e3))
                ax.broken_barh(
                    spans,
                    (i + (0.05 if kind == "compute" else 0.5), 0.45),
                    facecolors=colour,
                    label=kind if (i == 0 and ax is axes[0, 0]) else None,
                )
        ax.set_yticks([i + 0.5 for i in range(len(ranks))], [f"rank {r}" for r in ranks])
        ax.set_ylim(0, len(ranks))
        st = stats.loc[variant]
        ax.set_title(
            f"{variant}: span {st['span_us'] / 1e3:.3f} ms, communication not covered by compute "
            f"{st['exposed_comm_us'] / 1e3:.3f} ms (worst rank)",
            fontsize=9,
            loc="left",
        )
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("ms from the start of the backward")
    fig.suptitle(title)
    fig.legend(loc="upper right", ncol=2, fontsize=8)
    add_footer(fig, footer)
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    return fig


#: The GPU's idle time measured in the profiled loop (``breakdown``: lead + gaps), and the rest
#: of the timed median above the profiled kernels (kernels slower unprofiled, or in older runs
#: whatever separated the two).
MEASURED_IDLE = "GPU idle (profiled loop)"
IDLE = "timed - profiled kernels"
#: Segment colours of ``kernel_breakdown_plot``, by ``breakdown.kernel_role`` (the two above last).
ROLE_COLORS = {
    "dSwiGLU GEMM": "#1f77b4",
    "grad_x GEMM": "#2ca02c",
    "weight-gradient GEMM": "#ff7f0e",
    "GEMM (library)": "#9467bd",
    "elementwise / other": "#bcbd22",
    MEASURED_IDLE: "#7f7f7f",
    IDLE: "#d9d9d9",
}


def kernel_breakdown_plot(
    kernels: pd.DataFrame,
    impls: Sequence[str] | None = None,
    base: str | None = None,
    footer: str = "",
    title: str = "Where one backward's time goes, kernel by kernel",
) -> Figure:
    """Stacked bars per token count, one bar per implementation, as tall as its timed median:
    first the timed median minus the profiled kernels' busy time, split into the GPU idle time
    the profiled loop measured (lead + gaps, where the run has ``gaps_ms``) and the rest, then
    each kernel in launch order coloured by its role (its share of the profiled kernel time,
    filling the rest of the bar), all divided by ``base``'s timed median
    at that T (default quack's, else the first impl; at a T ``base`` did not time, the first impl
    that did, named under the tick). ``kernels``: ``breakdown.COLUMNS`` rows of one run (the
    first case of each token count). ``fig.plotted``: one row per segment (series "impl:
    segment", x = tokens, y = the segment's top, lo = its bottom, hi = its ms)."""
    k = breakdown.first_case_per_tokens(kernels).sort_values(["tokens", "impl", "position"])
    present = list(dict.fromkeys(k["impl"]))
    impls = [i for i in (impls or order_impls(present)) if i in present]
    if not impls:
        return placeholder(title, "no kernel breakdown recorded (bench --breakdown N on a GPU)", footer)
    base = base or ("quack" if "quack" in impls else impls[0])
    tokens = sorted(k["tokens"].unique())
    timed = k.groupby(["tokens", "impl"])["timed_ms"].first()
    roles = breakdown.per_role(k).set_index(["tokens", "impl"])  # timed - busy, and the measured idle
    fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN, 4.6))
    width = 0.8 / len(impls)
    records, seen = [], set()
    # Where the base did not time a T: that T relative to the first impl that did (tick says so).
    bases = {t: base if (t, base) in timed.index else next(i for i in impls if (t, i) in timed.index) for t in tokens}
    for j, impl in enumerate(impls):
        for xi, t in enumerate(tokens):
            rows = k[(k["tokens"] == t) & (k["impl"] == impl)]
            if rows.empty or not np.isfinite(rows["timed_ms"].iloc[0]):
                continue
            scale = timed[(t, bases[t])]
            total = rows["timed_ms"].iloc[0]
            idle = max(0.0, roles.loc[(t, impl), "timed_minus_busy_ms"])
            measured = roles.loc[(t, impl), "idle_ms"]
            split = [(MEASURED_IDLE, min(idle, max(0.0, measured)))] if np.isfinite(measured) else []
            # Kernel times are the profiled calls'; each kernel's share of them fills the rest of
            # the timed median (the profiled busy time can exceed it by a few percent).
            share = (total - idle) / rows["ms"].sum() if rows["ms"].sum() > 0 else 0.0
            segments = (
                split
                + [(IDLE, idle - sum(ms for _, ms in split))]
                + [(role, ms * share) for role, ms in zip(rows["role"], rows["ms"])]
            )
            bottom = 0.0
            x = xi + (j - (len(impls) - 1) / 2) * width
            for role, ms in segments:
                height = ms / scale
                ax.bar(
                    x,
                    height,
                    width * 0.92,
                    bottom=bottom,
                    color=ROLE_COLORS.get(role, "#7f7f7f"),
                    edgecolor="0.3",
                    linewidth=0.4,
                    label=role if role not in seen else None,
                )
                seen.add(role)
                records.append(dict(panel="breakdown", series=f"{impl}: {role}", x=t, y=bottom + height, lo=bottom, hi=ms))
                bottom += height
            ax.text(x, bottom + 0.01, "ours" if impl == "triton" else impl, rotation=90, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(tokens)), [str(t) if bases[t] == base else f"{t}\n(vs {bases[t]})" for t in tokens])
    ax.set_xlabel("tokens T")
    ax.set_ylabel(f"time / {base}'s timed median (ours = triton)")
    ax.axhline(1.0, color="0.4", linewidth=0.8, linestyle=":")
    top = max((r["y"] for r in records), default=1.0)
    ax.set_ylim(0, top * 1.22)
    ax.set_title(title)
    ax.legend(loc="upper center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, -0.24))
    ax.grid(axis="y", alpha=0.3)
    calls = int(k["profiled_calls"].max())
    looped = "gaps_ms" in k and k["gaps_ms"].notna().any()
    how = "in a loop like the timed one" if looped else "each flushed and synchronized"
    fig.tight_layout()
    add_footer(
        fig,
        f"Bar height: the timed median (the benchmark's protocol); kernels: their shares of the kernel time "
        f"torch.profiler measured, median of {calls} calls per bar ({how}). {footer}",
    )
    fig.plotted = pd.DataFrame(records, columns=PLOTTED_COLUMNS)
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


#: When set, ``finish`` also writes each figure's ``fig.plotted`` there as ``<name>.csv``: the
#: notebook tests read what every figure drew (the figures themselves live in a Jupyter kernel).
PLOTTED_DIR_ENV = "SWIGLU_PLOTTED_DIR"


def finish(fig: Figure, name: str, figures_dir: str | Path, formats: Sequence[str] = ("png", "svg")) -> None:
    """``save``, print where (relative to the repository root when inside it), then ``show``
    (which closes the figure). With the environment variable ``SWIGLU_PLOTTED_DIR`` set, also
    write ``fig.plotted`` to ``<that folder>/<name>.csv``."""
    import os

    plotted_dir = os.environ.get(PLOTTED_DIR_ENV)
    if plotted_dir:
        Path(plotted_dir).mkdir(parents=True, exist_ok=True)
        getattr(fig, "plotted", pd.DataFrame(columns=PLOTTED_COLUMNS)).to_csv(Path(plotted_dir) / f"{name}.csv", index=False)
    paths = save(fig, name, figures_dir, formats)
    print(f"saved {name}.{{{','.join(p.suffix[1:] for p in paths)}}} in {display_path(figures_dir)}")
    show(fig)
