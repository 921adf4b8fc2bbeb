"""The SwiGLU experts of a mixture-of-experts layer (``swiglu.swiglu_moe``): workload shapes,
roofline and speed of light, and the runs ``scripts/moe_bench_gpu.py`` records under
``data/moe_bench/<run>/`` (read by ``latest_run`` / ``load_run``, drawn by ``moe_plot`` in
notebooks/07_moe.ipynb).

Roofline of one grouped SwiGLU MLP over the S = T*k routed pairs (bf16 tensors, 2 bytes; fp32
routing weights and int64 expert ids, as transformers' routers give them):

* FLOPs: forward ``6*S*H*I`` (the [S, H] x [H, 2I] up projection and the [S, I] x [I, H] down
  projection); backward ``12*S*H*I`` (grad_x through both projections, both weight gradients);
  forward + backward ``18*S*H*I``. The SwiGLU, routing-weight and combine elementwise work is
  left out (O(S*(I + H)), under 1% at these shapes).
* Minimum bytes, each input read once and each output written once, nothing saved between the
  passes (a backward that recomputes the forward's projections; saving them is a choice):
  forward reads x [T, H], the weights of the experts that receive tokens (``min(E, S)`` of them,
  ``3*H*I`` each) and the routing [T, k], writes out [T, H]; backward reads grad_out and x
  [T, H], those weights and the routing, writes grad_x [T, H], grad_top_k_weights [T, k] (fp32)
  and both weight gradients for all E experts (an expert without tokens gets zeros, still
  written); forward + backward is their sum (two passes, the weights read in each).
* SOL time ``max(FLOPs / peak_flops, bytes / peak_bandwidth)`` with ``swiglu.roofline.HARDWARE``
  (the dense roofline's constants: H200 SXM 989.4 dense bf16 TFLOP/s, 4.8 TB/s).

The expert weights dominate the bytes at a few thousand tokens: at 2048 tokens every shape here
is memory bound in the forward (Qwen3-30B-A3B's 1.2 GB of bf16 weights against 155 GFLOP), and
the ridge moves with S / E, the pairs per expert.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from swiglu import roofline

BF16 = roofline.BYTES_PER_ELEMENT
#: Bytes per routed pair of the routing tensors: an int64 expert id and an fp32 weight.
ROUTING_BYTES = 8 + 4
#: fp32 routing-weight gradient, bytes per routed pair.
GRAD_WEIGHT_BYTES = 4
MODES = ("forward", "backward", "forward+backward")


@dataclass(frozen=True)
class MoEShape:
    """One model's routed experts: hidden size H, expert intermediate size I, E experts, top-k."""

    name: str
    label: str
    hidden_size: int
    intermediate_size: int
    num_experts: int
    top_k: int


#: The benchmark's shapes (the models' configs: hidden_size, moe_intermediate_size (Mixtral:
#: intermediate_size), num_experts (n_routed_experts), num_experts_per_tok); ``tiny`` is for
#: CPU tests only.
MOE_SHAPES: dict[str, MoEShape] = {
    s.name: s
    for s in (
        MoEShape("qwen3-30b-a3b", "Qwen3-30B-A3B", 2048, 768, 128, 8),
        MoEShape("qwen3-235b-a22b", "Qwen3-235B-A22B", 4096, 1536, 128, 8),
        MoEShape("mixtral-8x7b", "Mixtral-8x7B", 4096, 14336, 8, 2),
        MoEShape("deepseek-v3", "DeepSeek-V3 (routed)", 7168, 2048, 256, 8),
        MoEShape("tiny", "tiny (CPU tests)", 64, 96, 8, 2),
    )
}
#: The shapes a default run measures (all but ``tiny``) and its token counts.
DEFAULT_SHAPES = ("qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b", "deepseek-v3")
DEFAULT_TOKENS = (2048, 8192, 32768)


def shape_of(name: str) -> MoEShape:
    """The shape called ``name``; ValueError naming the known ones otherwise."""
    if name not in MOE_SHAPES:
        raise ValueError(f"unknown MoE shape {name!r}; have {', '.join(MOE_SHAPES)}")
    return MOE_SHAPES[name]


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def flops(tokens: int, shape: MoEShape, mode: str = "forward+backward") -> int:
    """GEMM FLOPs of ``mode`` over the ``tokens * top_k`` routed pairs: 6, 12 or 18 ``* S*H*I``."""
    _check_mode(mode)
    per_pair = {"forward": 6, "backward": 12, "forward+backward": 18}[mode]
    return per_pair * tokens * shape.top_k * shape.hidden_size * shape.intermediate_size


def experts_hit(tokens: int, shape: MoEShape) -> int:
    """Experts whose weights a pass must read at least: ``min(E, T*k)``."""
    return min(shape.num_experts, tokens * shape.top_k)


def min_bytes(tokens: int, shape: MoEShape, mode: str = "forward+backward") -> int:
    """Fewest bytes through device memory (module docstring)."""
    _check_mode(mode)
    T, H, I, E, k = tokens, shape.hidden_size, shape.intermediate_size, shape.num_experts, shape.top_k
    weights_read = BF16 * 3 * H * I * experts_hit(tokens, shape)
    forward = BF16 * 2 * T * H + weights_read + ROUTING_BYTES * T * k
    backward = BF16 * 3 * T * H + weights_read + ROUTING_BYTES * T * k + BF16 * 3 * H * I * E + GRAD_WEIGHT_BYTES * T * k
    return {"forward": forward, "backward": backward, "forward+backward": forward + backward}[mode]


def sol_time_s(
    tokens: int, shape: MoEShape, mode: str = "forward+backward", hardware: roofline.Hardware | str = "H200-SXM"
) -> float:
    """``max(FLOPs / peak_flops, bytes / peak_bandwidth)`` in seconds."""
    hw = roofline.HARDWARE[hardware] if isinstance(hardware, str) else hardware
    return max(flops(tokens, shape, mode) / (hw.peak_tflops * 1e12), min_bytes(tokens, shape, mode) / (hw.peak_tbps * 1e12))


def roofline_table(
    shapes: Iterable[str] = DEFAULT_SHAPES,
    tokens: Iterable[int] = DEFAULT_TOKENS,
    modes: Sequence[str] = MODES,
    hardware: str = "H200-SXM",
) -> pd.DataFrame:
    """One row per shape, token count and mode: GFLOP, minimum GB, intensity (FLOP/byte), the
    bound, SOL ms and the rate at SOL (TFLOP/s)."""
    hw = roofline.HARDWARE[hardware]
    rows = []
    for name in shapes:
        s = shape_of(name)
        for t in tokens:
            for mode in modes:
                f, b = flops(t, s, mode), min_bytes(t, s, mode)
                sol = sol_time_s(t, s, mode, hw)
                rows.append(
                    dict(
                        shape=name,
                        H=s.hidden_size,
                        I=s.intermediate_size,
                        E=s.num_experts,
                        k=s.top_k,
                        tokens=t,
                        mode=mode,
                        gflop=f / 1e9,
                        min_gb=b / 1e9,
                        intensity=f / b,
                        bound="compute" if f / b >= hw.ridge_intensity else "memory",
                        sol_ms=sol * 1e3,
                        sol_tflops=f / sol / 1e12,
                        hardware=hardware,
                    )
                )
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------- recorded runs
BENCH_CSV, CHECK_CSV, META_JSON = "moe_bench.csv", "moe_check.csv", "moe_bench.json"


def load_run(folder: str | Path) -> dict:
    """A run written by ``scripts/moe_bench_gpu.py``: ``{"path", "run", "meta", "rows", "checks"}``
    (``rows``: ``moe_bench.csv``; ``checks``: ``moe_check.csv``, empty when the run has none)."""
    folder = Path(folder)
    meta = json.loads((folder / META_JSON).read_text())
    rows = pd.read_csv(folder / BENCH_CSV)
    for col in ("oom",):
        if col in rows:
            rows[col] = rows[col].astype(str).str.lower() == "true"
    check_path = folder / CHECK_CSV
    checks = pd.read_csv(check_path) if check_path.is_file() and check_path.stat().st_size else pd.DataFrame()
    return dict(path=folder, run=meta.get("run_id") or folder.name, meta=meta, rows=rows, checks=checks)


def latest_run(folder: str | Path, gpu: str = "") -> dict | None:
    """The most recent run (by its metadata's ``date_utc``, then folder name) among the run
    folders under ``folder`` (each holding ``moe_bench.json`` and ``moe_bench.csv``) whose GPU name
    (the metadata's ``gpu.name``) contains ``gpu`` ("": any GPU), or None."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    dated = []
    for p in sorted(folder.glob(f"**/{META_JSON}")):
        meta = json.loads(p.read_text())
        if (p.parent / BENCH_CSV).is_file() and gpu in str((meta.get("gpu") or {}).get("name", "")):
            dated.append((str(meta.get("date_utc", "")), p.parent.as_posix(), p.parent))
    return load_run(max(dated)[2]) if dated else None


def latency_table(rows: pd.DataFrame, hardware: str = "H200-SXM") -> pd.DataFrame:
    """The timed rows (``status == "ok"``) with the SOL ms of their shape, tokens and mode and the
    fraction of it reached (``sol_fraction = sol_ms / ms``), the speed-up over transformers'
    grouped_mm in the same case and mode (``speedup_vs_grouped_mm``), in case order."""
    ok = rows[rows["status"] == "ok"].copy()
    if ok.empty:
        return ok.assign(sol_ms=[], sol_fraction=[], speedup_vs_grouped_mm=[])
    ok["sol_ms"] = [
        sol_time_s(int(r.tokens), MoEShape(r.shape, r.shape, int(r.H), int(r.I), int(r.E), int(r.k)), r.mode, hardware) * 1e3
        for r in ok.itertuples()
    ]
    ok["sol_fraction"] = ok["sol_ms"] / ok["ms"]
    key = ["shape", "tokens", "routing", "mode"]
    base = ok[ok["impl"] == "grouped_mm"].set_index(key)["ms"]
    ok["speedup_vs_grouped_mm"] = [base.get(tuple(r[k] for k in key), math.nan) / r["ms"] for _, r in ok.iterrows()]
    cols = [
        "shape",
        "H",
        "I",
        "E",
        "k",
        "tokens",
        "routing",
        "impl",
        "mode",
        "ms",
        "p20_ms",
        "p80_ms",
        "reps",
        "tflops",
        "sol_ms",
        "sol_fraction",
        "speedup_vs_grouped_mm",
        "peak_gib",
    ]
    return ok[[c for c in cols if c in ok]].reset_index(drop=True)


def validation_table(checks: pd.DataFrame) -> pd.DataFrame:
    """Per shape and implementation the relative error (Frobenius, against float64) of out and
    each gradient, and the largest ratio to transformers' eager bf16 loop's own error
    (``max_ratio_vs_eager``): a wide table, one row per shape x impl."""
    if checks.empty:
        return pd.DataFrame(columns=["shape", "impl", "status"])
    ok = checks[checks["status"] == "ok"]
    wide = ok.pivot_table(
        index=["shape", "check_tokens", "check_experts", "impl"], columns="output", values="rel_err", aggfunc="first"
    )
    wide.columns = [f"rel_err_{c}" for c in wide.columns]
    ratio = ok.groupby(["shape", "check_tokens", "check_experts", "impl"])["ratio_vs_eager"].max()
    wide["max_ratio_vs_eager"] = ratio
    out = wide.reset_index()
    failed = checks[checks["status"] != "ok"].drop_duplicates(["shape", "impl"])
    if len(failed):
        out = pd.concat([out, failed[["shape", "check_tokens", "check_experts", "impl", "status"]]], ignore_index=True)
    out["status"] = out["status"].fillna("ok") if "status" in out else "ok"
    return out


# ------------------------------------------------------------------------- the figure
#: Display labels and styles of the implementations a run records (ours last, on top).
MOE_LABELS = {
    "eager": "transformers eager (loop over experts)",
    "grouped_mm": "transformers grouped_mm",
    "liger": "Liger fused MoE",
    "triton": "swiglu Triton (ours)",
}
MOE_STYLE = {"eager": ("#4d4d4d", "o"), "grouped_mm": ("#1f77b4", "s"), "liger": ("#ff7f0e", "^"), "triton": ("#d62728", "*")}


def case_label(tokens: int, routing: str) -> str:
    return f"T={tokens} {routing[:4]}."


def moe_plot(
    table: pd.DataFrame,
    footer: str = "",
    mode: str = "forward+backward",
    title: str = "MoE experts, forward + backward: latency and rate per case",
) -> "object":
    """Two rows of panels, one column per shape: the median ``mode`` latency (log scale,
    whiskers p20-p80, a black dash at the H200 SOL) and the TFLOP/s it reaches, per case
    (tokens x routing) and implementation (``latency_table`` rows)."""
    import matplotlib.pyplot as plt

    from . import plots

    part = table[table["mode"] == mode]
    shapes = [s for s in MOE_SHAPES if s in set(part["shape"])] + sorted(set(part["shape"]) - set(MOE_SHAPES))
    n = max(1, len(shapes))
    fig, axes = plt.subplots(2, n, figsize=(plots.MAX_WIDTH_IN, 6.4), squeeze=False)
    records: list = []
    impls = [i for i in MOE_STYLE if i in set(part["impl"])] + sorted(set(part["impl"]) - set(MOE_STYLE))
    for col, name in enumerate(shapes):
        d = part[part["shape"] == name]
        cases = d.drop_duplicates(["tokens", "routing"]).sort_values(["tokens", "routing"])
        keys = [case_label(t, r) for t, r in zip(cases["tokens"], cases["routing"])]
        d = d.assign(case=[case_label(t, r) for t, r in zip(d["tokens"], d["routing"])])
        for row, (column, unit) in enumerate((("ms", "ms"), ("tflops", "TFLOP/s"))):
            ax = axes[row][col]
            series = []
            for k, impl in enumerate(impls):
                t = d[d["impl"] == impl].set_index("case").reindex(keys)
                if t[column].notna().sum() == 0:
                    continue
                color, marker = MOE_STYLE.get(impl, plots.impl_style(impl, k))
                s = dict(key=impl, label=MOE_LABELS.get(impl, impl), y=t[column].to_numpy(float), color=color, marker=marker)
                if column == "ms":
                    s.update(lo=t["p20_ms"].to_numpy(float), hi=t["p80_ms"].to_numpy(float))
                series.append(s)
            plots._dodged(ax, keys, series, records, f"{name}: {column}")
            if column == "ms":
                sol = d.drop_duplicates("case").set_index("case").reindex(keys)["sol_ms"].to_numpy(float)
                ax.plot(
                    np.arange(len(keys)),
                    sol,
                    ls="none",
                    marker="_",
                    ms=14,
                    mew=2,
                    color="black",
                    label="H200 SOL (989 TFLOP/s, 4.8 TB/s)",
                    zorder=4,
                )
                records += [
                    {"panel": f"{name}: sol_ms", "series": "sol", "x": c, "y": float(v), "lo": math.nan, "hi": math.nan}
                    for c, v in zip(keys, sol)
                    if not np.isnan(v)
                ]
                ax.set_yscale("log")
                ax.set_title(MOE_SHAPES[name].label if name in MOE_SHAPES else name, fontsize=plots.MIN_FONT_PT + 1)
            else:
                ax.set_ylim(bottom=0)
            ax.set_xticks(range(len(keys)), keys, rotation=50, ha="right", rotation_mode="anchor", fontsize=plots.MIN_FONT_PT)
            ax.grid(True, axis="y", lw=0.3, alpha=0.5)
            if col == 0:
                ax.set_ylabel(f"{mode} {unit}" if column == "ms" else f"{unit} ({mode})")
    fig.suptitle(title)
    fig.tight_layout()
    iters = int(part["reps"].max()) if "reps" in part and part["reps"].notna().any() else None
    note = (
        f"whiskers: p20-p80 of the {iters or ''} timed iterations per case (CUDA events, L2 flushed before each); "
        "bal.: softmax of random logits, top-k; skew.: a third of the tokens route to expert 0; "
        "a missing marker: not run (eager where slow) or out of memory"
    )
    return plots._finish_panels(fig, records, footer, legend_axes=list(axes[0]), ncol=3, note=note)
