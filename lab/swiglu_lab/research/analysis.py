"""Recorded benchmark runs and the tables the notebooks derive from them.

Reads what ``swiglu_lab.bench`` records under ``data/bench/``:

* ``<run_id>.csv``: one row per case x implementation (columns ``run_id, case, tokens,
  hidden_size, intermediate_size, impl, protocol, median_ms, p20_ms, p80_ms, correct, ...``);
* ``<run_id>.json``: run metadata (``gpu_name, driver, cuda, torch, triton, utc, ...`` and the
  measured ``ceilings``);
* ``runs.csv``: an index of runs (``run_id, utc, gpu, protocol, commit, n_rows``).

Everything here is plain pandas (no papermill/jupyter), so the GPU machine can run it as well.
SOL formulas come from ``swiglu.roofline`` (``docs/problem.md``).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd

from swiglu import roofline
from swiglu.workloads import CASES, HIDDEN_SIZE, INTERMEDIATE_SIZE, Case

from ..bench.storage import KERNELS_DIR
from ..paths import repo_root

#: Display order and labels of the implementations ``swiglu_lab.bench`` records.
IMPL_LABELS = {
    "eager": "eager reference (PyTorch)",
    "compile": "torch.compile (default)",
    "compile-max-autotune": "torch.compile (max-autotune, no CUDA graphs)",
    "cublas-gemms": "cuBLAS GEMMs only (lower bound, no elementwise)",
    "liger": "Liger SiLU-mul + cuBLAS",
    "quack": "quack-kernels (CuTe-DSL, tuned)",
    "triton-tl": "swiglu, tl kernels only (no Gluon)",
    "triton": "swiglu Triton (ours)",
}

#: The H200 ceilings of the spec (``docs/problem.md``, "Measured on one H200"):
#: device-to-device copy 4.18 TB/s (read + write), cuBLAS bf16 GEMM 760 TFLOP/s at 8192^3.
#: Used only when no recorded run carries its own ceilings.
SPEC_H200_CEILINGS = {
    "copy_tbps": 4.18,
    "gemm_tflops": 760.0,
    "source": "docs/problem.md, H200 measured 2026-11-29",
}


@dataclass
class BenchRun:
    """One recorded run: its rows (a DataFrame, one per case x impl) and its metadata dict."""

    run_id: str
    rows: pd.DataFrame
    meta: dict = field(default_factory=dict)
    csv_path: Path | None = None

    @property
    def protocol(self) -> str:
        if "protocol" in self.rows and len(self.rows):
            return str(self.rows["protocol"].iloc[0])
        proto = self.meta.get("protocol")
        return str(proto.get("name", "unknown")) if isinstance(proto, dict) else str(proto or "unknown")


def resolve_path(path: str | Path, root: str | Path | None = None) -> Path:
    """``path`` as given when absolute, else relative to ``root`` (default: ``repo_root()``)."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(root or repo_root()) / p


#: Notebook parameters that say where results go (or in what format), not which results.
OUTPUT_PARAMETERS = ("figures_dir", "derived_dir", "scratch_figures_dir", "figure_formats", "overwrite")
#: Where a notebook run with other choices than its defaults writes, as ``make reproduce`` does.
SUBSET_OUTPUT = ("build/reproduce/figures", "build/reproduce/derived")


#: Each notebook's parameters as committed (its cell tagged ``parameters``; a test keeps the two
#: equal). The committed defaults are read from here, never from the notebook file: a save from
#: JupyterLab keeps an edited parameters cell, and the edit must not become the default.
NOTEBOOK_DEFAULTS = {
    "01_roofline": {
        "cases": "all",
        "hidden_size": 16384,
        "intermediate_size": 53248,
        "bench_dir": "data/bench",
        "run_id": "",
        "protocol": "full",
        "power_dir": "data/power",
        "figures_dir": "figures",
        "derived_dir": "data/derived",
        "overwrite": False,
        "figure_formats": "png,svg",
    },
    "02_validation": {
        "device": "auto",
        "impls": "reference,triton",
        "full_size": None,
        "cases": "all",
        "hidden_size": 16384,
        "intermediate_size": 53248,
        "cpu_hidden_size": 256,
        "cpu_intermediate_size": 512,
        "cpu_shapes": "1x1,1x7,1x211,8x16,16x13",
        "cpu_atol": 0.13,
        "rounds": 1,
        "mode": "benchmark",
        "seed": 200,
        "sample_size": 200000,
        "figures_dir": "figures",
        "scratch_figures_dir": "build/figures",
        "derived_dir": "data/derived",
        "overwrite": False,
        "recorded_validation": "data/derived/validation_cuda.csv",
        "figure_formats": "png,svg",
    },
    "03_latency": {
        "bench_dir": "data/bench",
        "run_id": "",
        "protocol": "full",
        "power_dir": "data/power",
        "live": False,
        "device": "auto",
        "cases": "all",
        "impls": "",
        "live_args": "",
        "figures_dir": "figures",
        "derived_dir": "data/derived",
        "overwrite": False,
        "figure_formats": "png,svg",
    },
    "04_history": {
        "bench_dir": "data/bench",
        "protocol": "full",
        "figures_dir": "figures",
        "derived_dir": "data/derived",
        "overwrite": False,
        "figure_formats": "png,svg",
    },
    "05_tensor_parallel": {
        "tp_dir": "data/tp",
        "tp_run_id": "",
        "bench_dir": "data/bench",
        "figures_dir": "figures",
        "derived_dir": "data/derived",
        "overwrite": False,
        "figure_formats": "png,svg",
    },
    "06_training_memory": {
        "train_step_dir": "data/train_step",
        "hf_step_dir": "data/hf_step",
        "hf_long_seq_dir": "data/hf_long_seq",
        "figures_dir": "figures",
        "derived_dir": "data/derived",
        "overwrite": False,
        "figure_formats": "png,svg",
    },
    "07_moe": {
        "moe_bench_dir": "data/moe_bench",
        "run": "",
        "gpu": "H200",
        "figures_dir": "figures",
        "derived_dir": "data/derived",
        "overwrite": False,
        "figure_formats": "png,svg",
    },
}


def parameter_defaults(notebook: str) -> dict:
    """The committed defaults of ``notebook``'s parameters (``NOTEBOOK_DEFAULTS``, a copy).
    Raises ``ValueError`` for a notebook that has none recorded."""
    if notebook not in NOTEBOOK_DEFAULTS:
        raise ValueError(f"no parameter defaults recorded for {notebook!r}; have {list(NOTEBOOK_DEFAULTS)}")
    return dict(NOTEBOOK_DEFAULTS[notebook])


def output_dirs(notebook: str, values: dict, root: str | Path | None = None) -> tuple[Path, Path]:
    """(figures folder, derived-tables folder) for a run of ``notebook`` with parameter ``values``
    (the notebook's ``globals()``): the committed ``figures/`` and ``data/derived/`` only when every
    choice is the notebook's default (``parameter_defaults``) or ``overwrite`` is True; a run
    with another choice (a subset of cases, another run, a live measurement) that still points at
    the committed folders writes under ``build/reproduce/`` and says so, the rule ``make
    reproduce`` follows. Folders given explicitly (not the defaults) are used as given."""
    defaults = parameter_defaults(notebook)
    changed = sorted(k for k, v in defaults.items() if k not in OUTPUT_PARAMETERS and values.get(k, v) != v)
    figures, derived = values["figures_dir"], values["derived_dir"]
    committed = (figures, derived) == (defaults["figures_dir"], defaults["derived_dir"])
    if changed and committed and not values.get("overwrite", False):
        figures, derived = SUBSET_OUTPUT
        print(
            f"{', '.join(changed)} differ from this notebook's defaults: figures and tables go to "
            f"{figures}/ and {derived}/, not the committed folders (overwrite = True writes those)"
        )
    return resolve_path(figures, root), resolve_path(derived, root)


def display_path(path: str | Path, root: str | Path | None = None) -> str:
    """``path`` relative to ``root`` (default: ``repo_root()``) when inside it, else as given."""
    try:
        return str(Path(path).resolve().relative_to(Path(root or repo_root()).resolve()))
    except ValueError:
        return str(path)


#: Significant digits of the floats in the derived tables (data/derived/): timings carry about
#: three, and the last bits of a geometric mean or a least-squares fit differ between machines.
TABLE_DIGITS = 6


def write_table(frame: pd.DataFrame, path: str | Path, *, index: bool = False, digits: int = TABLE_DIGITS) -> Path:
    """Write ``frame`` as CSV with floats at ``digits`` significant digits (``%g``), so the same
    data gives the same bytes on every machine. Returns the path."""
    path = Path(path)
    frame.to_csv(path, index=index, float_format=f"%.{digits}g")
    return path


def _read_meta(json_path: Path) -> dict:
    if not json_path.is_file():
        return {}
    try:
        return json.loads(json_path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _run_csvs(bench_dir: Path) -> list[Path]:
    return sorted(p for p in bench_dir.glob("*.csv") if p.name != "runs.csv")


def list_runs(bench_dir: str | Path) -> pd.DataFrame:
    """Every recorded run under ``bench_dir``, oldest first: columns ``run_id, utc, gpu,
    protocol, n_rows, n_cases, complete, csv``. Built from the run files themselves (``runs.csv`` may lag);
    an empty DataFrame when the folder is missing or holds no run."""
    bench_dir = Path(bench_dir)
    cols = ["run_id", "utc", "gpu", "protocol", "n_rows", "n_cases", "complete", "csv"]
    if not bench_dir.is_dir():
        return pd.DataFrame(columns=cols)
    records = []
    for csv in _run_csvs(bench_dir):
        try:
            head = pd.read_csv(csv, usecols=lambda c: c in {"run_id", "protocol", "impl", "case"})
        except (pd.errors.EmptyDataError, ValueError):
            continue
        if "impl" not in head:  # not a bench run file
            continue
        meta = _read_meta(csv.with_suffix(".json"))
        run_id = str(head["run_id"].iloc[0]) if "run_id" in head and len(head) else csv.stem
        protocol = str(head["protocol"].iloc[0]) if "protocol" in head and len(head) else "unknown"
        records.append(
            {
                "run_id": run_id,
                "utc": str(meta.get("utc", "")),
                "gpu": str(meta.get("gpu_name", "")),
                "protocol": protocol,
                "n_rows": len(head),
                "n_cases": int(head["case"].nunique()) if "case" in head else 0,
                # swiglu_lab.bench writes complete=false until a run finishes (a killed run stays so).
                "complete": bool(meta.get("complete", True)),
                "csv": str(csv),
            }
        )
    runs = pd.DataFrame(records, columns=cols)
    # Order by time, then id (ids sort by time when they start with a timestamp).
    return runs.sort_values(["utc", "run_id"], kind="stable").reset_index(drop=True)


def load_run(
    bench_dir: str | Path, run_id: str | None = None, protocol: str | None = "full", *, complete: bool = True
) -> BenchRun | None:
    """Load run ``run_id``, or when ``run_id`` is ``None`` the latest run whose protocol is
    ``protocol`` (any protocol when ``protocol`` is ``None``) among the finished runs (all runs
    with ``complete=False``) that time the most cases: a later run of a few cases (e.g. the
    max-autotune peer) does not replace the last run of all 18. Returns ``None`` when no run matches. Raises ``ValueError`` when a
    given ``run_id`` is not recorded there."""
    runs = list_runs(bench_dir)
    if run_id:
        hit = runs[(runs["run_id"] == run_id) | (runs["csv"].map(lambda p: Path(p).stem) == run_id)]
        if hit.empty:
            raise ValueError(f"run_id {run_id!r} is not recorded in {bench_dir}; have {list(runs['run_id'])}")
        row = hit.iloc[-1]
    else:
        if protocol:
            runs = runs[runs["protocol"] == protocol]
        if complete:
            runs = runs[runs["complete"]]
        if runs.empty:
            return None
        row = runs[runs["n_cases"] == runs["n_cases"].max()].iloc[-1]
    csv = Path(row["csv"])
    meta = _read_meta(csv.with_suffix(".json"))
    meta.setdefault("run_id", str(row["run_id"]))
    return BenchRun(str(row["run_id"]), pd.read_csv(csv), meta, csv)


def load_kernels(run: BenchRun | None) -> pd.DataFrame | None:
    """The per-kernel breakdown recorded with ``run`` (``<bench_dir>/kernels/<run_id>.csv``,
    ``swiglu_lab.bench.breakdown.COLUMNS``), or None when the run has none (recorded before the
    bench profiled kernels, or with ``--breakdown 0``)."""
    if run is None or run.csv_path is None:
        return None
    path = run.csv_path.parent / KERNELS_DIR / f"{run.run_id}.csv"
    return pd.read_csv(path) if path.is_file() else None


def measured_ceilings(meta: dict | None) -> dict | None:
    """The measured ceilings in a run's metadata as ``{"copy_tbps", "gemm_tflops", "source"}``.

    Looks in ``meta["ceilings"]`` (then the top level) for a copy-bandwidth key (``copy_tbps``,
    or any key with "copy" and a TB/s or GB/s unit) and a GEMM-rate key (``gemm_tflops`` or any
    key with "gemm" and "tflops"). Returns ``None`` when either is missing."""
    if not meta:
        return None
    pools = [meta.get("ceilings"), meta]
    copy = gemm = None
    for pool in pools:
        if not isinstance(pool, dict):
            continue
        for key, value in pool.items():
            if isinstance(value, dict) and "value" in value:
                value = value["value"]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                continue
            k = key.lower()
            if copy is None and "copy" in k:
                if "tbps" in k or "tb_s" in k:
                    copy = float(value)
                elif "gbps" in k or "gb_s" in k:
                    copy = float(value) / 1e3
            if gemm is None and "gemm" in k and "tflops" in k:
                gemm = float(value)
    if copy is None or gemm is None:
        return None
    return {"copy_tbps": copy, "gemm_tflops": gemm, "source": f"measured in run {meta.get('run_id', '?')}"}


def hardware_table(ceilings: dict | None = None) -> dict[str, roofline.Hardware]:
    """The datasheet entries of ``roofline.HARDWARE`` plus ``"H200-measured"`` built from
    ``ceilings`` (``measured_ceilings`` output; default: ``SPEC_H200_CEILINGS``)."""
    c = ceilings or SPEC_H200_CEILINGS
    table = dict(roofline.HARDWARE)
    table["H200-measured"] = roofline.Hardware(
        "H200 (measured ceilings)",
        float(c["gemm_tflops"]),
        float(c["copy_tbps"]),
        str(c.get("source", "measured")),
    )
    return table


def roofline_table(
    cases: Sequence[Case] = CASES,
    hardware: dict[str, roofline.Hardware] | None = None,
    hidden_size: int = HIDDEN_SIZE,
    intermediate_size: int = INTERMEDIATE_SIZE,
) -> pd.DataFrame:
    """One row per case x hardware: ``case, seq_len, batch_size, tokens, hidden_size,
    intermediate_size, gflop, gbyte, flop_per_byte, hardware, peak_tflops, peak_tbps,
    ridge_flop_per_byte, compute_ms, memory_ms, sol_ms, bound``.

    gflop = 12*T*H*I / 1e9, gbyte = minimum traffic / 1e9 (``swiglu.roofline``); compute_ms and
    memory_ms are the two SOL terms; sol_ms their maximum."""
    hardware = hardware or hardware_table()
    rows = []
    for case in cases:
        T, H, I = case.tokens, hidden_size, intermediate_size
        f, b = roofline.flops(T, H, I), roofline.min_bytes(T, H, I)
        for key, hw in hardware.items():
            compute_ms = f / (hw.peak_tflops * 1e12) * 1e3
            memory_ms = b / (hw.peak_tbps * 1e12) * 1e3
            rows.append(
                {
                    "case": case.name,
                    "seq_len": case.seq_len,
                    "batch_size": case.batch_size,
                    "tokens": T,
                    "hidden_size": H,
                    "intermediate_size": I,
                    "gflop": f / 1e9,
                    "gbyte": b / 1e9,
                    "flop_per_byte": f / b,
                    "hardware": key,
                    "peak_tflops": hw.peak_tflops,
                    "peak_tbps": hw.peak_tbps,
                    "ridge_flop_per_byte": hw.ridge_intensity,
                    "compute_ms": compute_ms,
                    "memory_ms": memory_ms,
                    "sol_ms": max(compute_ms, memory_ms),
                    "bound": roofline.bound(T, hw, H, I),
                }
            )
    return pd.DataFrame(rows)


def order_impls(impls: Iterable[str]) -> list[str]:
    """Implementations in ``IMPL_LABELS`` order, unknown names last (sorted)."""
    impls = list(dict.fromkeys(impls))
    known = [i for i in IMPL_LABELS if i in impls]
    return known + sorted(i for i in impls if i not in IMPL_LABELS)


def latency_table(rows: pd.DataFrame, ceilings: dict | None = None) -> pd.DataFrame:
    """Per case x impl latency with SOL and speed-ups recomputed from ``median_ms``.

    Adds ``tflops`` (12*T*H*I / median), ``sol_ms`` / ``sol_fraction`` (the datasheet named in
    the rows' ``hardware`` column, H200-SXM when there is no such column),
    ``sol_ms_measured`` / ``sol_fraction_measured`` (the measured ceilings, or the H200 spec's
    when an H200 run has none), and ``speedup_vs_eager`` / ``speedup_vs_compile`` (eager or compile median
    over this median, NaN when that implementation was not measured) with their spread
    ``speedup_vs_<base>_lo`` / ``_hi`` (base median / this p80, base median / this p20: this
    implementation's p20-p80; NaN without p20/p80 columns). Rows are sorted by tokens,
    then case name, then implementation order. Raises ``ValueError`` when a needed column
    (``case, tokens, impl, median_ms``) is missing."""
    need = {"case", "tokens", "impl", "median_ms"}
    missing = need - set(rows.columns)
    if missing:
        raise ValueError(f"bench rows lack columns {sorted(missing)}")
    df = rows.copy()
    if "hidden_size" not in df:
        df["hidden_size"] = HIDDEN_SIZE
    if "intermediate_size" not in df:
        df["intermediate_size"] = INTERMEDIATE_SIZE
    measured = hardware_table(ceilings)["H200-measured"]
    # Only the datasheet of the hardware a row ran on: none for a CPU run or an unlisted GPU
    # (hardware ""), whose SOL columns stay NaN.
    keys = df["hardware"] if "hardware" in df else pd.Series("H200-SXM", index=df.index)
    keys = [k if isinstance(k, str) and k in roofline.HARDWARE else "" for k in keys]
    shape = list(zip(df["tokens"], df["hidden_size"], df["intermediate_size"], keys))
    df["gflop"] = [roofline.flops(int(t), int(h), int(i)) / 1e9 for t, h, i, _ in shape]
    df["tflops"] = df["gflop"] / df["median_ms"]  # GFLOP / ms = TFLOP/s
    df["sol_ms"] = [roofline.sol_time_s(int(t), k, int(h), int(i)) * 1e3 if k else math.nan for t, h, i, k in shape]
    df["sol_ms_measured"] = [
        roofline.sol_time_s(int(t), measured, int(h), int(i)) * 1e3 if ceilings is not None or k == "H200-SXM" else math.nan
        for t, h, i, k in shape
    ]
    df["sol_fraction"] = df["sol_ms"] / df["median_ms"]
    df["sol_fraction_measured"] = df["sol_ms_measured"] / df["median_ms"]
    has_spread = {"p20_ms", "p80_ms"} <= set(df.columns)
    for base in ("eager", "compile"):
        ref = df[df["impl"] == base].set_index("case")
        df[f"speedup_vs_{base}"] = df["case"].map(ref["median_ms"]) / df["median_ms"]
        # The ratio's spread from this implementation's p20-p80 (the baseline at its median; the
        # baseline's own row shows its spread around 1).
        df[f"speedup_vs_{base}_lo"] = df["case"].map(ref["median_ms"]) / df["p80_ms"] if has_spread else math.nan
        df[f"speedup_vs_{base}_hi"] = df["case"].map(ref["median_ms"]) / df["p20_ms"] if has_spread else math.nan
    impl_rank = {impl: k for k, impl in enumerate(order_impls(df["impl"]))}
    df = df.assign(_rank=df["impl"].map(impl_rank))
    return df.sort_values(["tokens", "case", "_rank"]).drop(columns="_rank").reset_index(drop=True)


def _gmean(values: pd.Series) -> float:
    vals = [float(v) for v in values if pd.notna(v)]
    return roofline.geometric_mean(vals) if vals and all(v > 0 for v in vals) else math.nan


def latency_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Geometric means per implementation over the cases it was measured on (the benchmark's
    aggregation): ``impl, label, cases, gmean_ms, gmean_p20_ms, gmean_p80_ms (the spread of the
    timed iterations, per case, then the geometric mean), gmean_sol_ms, sol_fraction (gmean T_SOL /
    gmean T), gmean_speedup_vs_eager, gmean_speedup_vs_compile, their spread
    gmean_speedup_vs_<base>_lo / _hi (``latency_table``'s, geometric mean), iters (timed
    iterations per case), all_correct``.

    ``table`` is ``latency_table``'s output. gmean_sol_ms is over the same cases as gmean_ms, so
    an implementation missing some cases is still compared fairly."""
    out = []
    for impl in order_impls(table["impl"]):
        t = table[table["impl"] == impl]
        gm, gsol = _gmean(t["median_ms"]), _gmean(t["sol_ms"])
        # correct is <NA> where not applicable (the GEMM-only lower bound): ignore those.
        correct = t["correct"].dropna() if "correct" in t else pd.Series(dtype=object)
        out.append(
            {
                "impl": impl,
                "label": IMPL_LABELS.get(impl, impl),
                "cases": int(t.loc[t["median_ms"].notna(), "case"].nunique()),  # timed (an ERROR row has no time)
                "gmean_ms": gm,
                "gmean_p20_ms": _gmean(t["p20_ms"]) if "p20_ms" in t else math.nan,
                "gmean_p80_ms": _gmean(t["p80_ms"]) if "p80_ms" in t else math.nan,
                "gmean_sol_ms": gsol,
                "sol_fraction": gsol / gm if gm > 0 else math.nan,
                "gmean_speedup_vs_eager": _gmean(t["speedup_vs_eager"]),
                "gmean_speedup_vs_compile": _gmean(t["speedup_vs_compile"]),
                **{
                    f"gmean_speedup_vs_{base}_{end}": _gmean(t[f"speedup_vs_{base}_{end}"])
                    if f"speedup_vs_{base}_{end}" in t
                    else math.nan
                    for base in ("eager", "compile")
                    for end in ("lo", "hi")
                },
                "iters": int(t["iters"].max()) if "iters" in t and t["iters"].notna().any() else None,
                "all_correct": bool(correct.map(_truthy).all()) if len(correct) else None,
            }
        )
    return pd.DataFrame(out)


def _truthy(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"true", "1", "yes", "pass", "passed"}
    return bool(value) if pd.notna(value) else False


def run_history(bench_dir: str | Path, protocol: str | None = "full") -> pd.DataFrame:
    """Geometric-mean latency per implementation for every finished run (optionally only one
    protocol), oldest first: ``run_id, utc, gpu, protocol, commit, impl, cases, gmean_ms, gmean_p20_ms,
    gmean_p80_ms, sol_fraction, all_correct`` (``latency_summary``'s: None where not applicable).
    Each gmean is over the cases that run measured (runs with fewer cases are not comparable;
    the ``cases`` column says how many)."""
    runs = list_runs(bench_dir)
    runs = runs[runs["complete"] & (runs["n_rows"] > 0)]
    if protocol:
        runs = runs[runs["protocol"] == protocol]
    frames = []
    for _, r in runs.iterrows():
        run = load_run(bench_dir, run_id=str(r["run_id"]))
        summary = latency_summary(latency_table(run.rows, measured_ceilings(run.meta)))
        summary.insert(0, "run_id", run.run_id)
        summary.insert(1, "utc", r["utc"])
        summary.insert(2, "gpu", r["gpu"])
        summary.insert(3, "protocol", r["protocol"])
        summary.insert(4, "commit", str(run.meta.get("git_commit") or "")[:7])
        frames.append(summary[HISTORY_COLUMNS])
    if not frames:
        return pd.DataFrame(columns=HISTORY_COLUMNS)
    return pd.concat(frames, ignore_index=True)


#: Columns of ``run_history`` (data/derived/history.csv).
HISTORY_COLUMNS = [
    "run_id",
    "utc",
    "gpu",
    "protocol",
    "commit",
    "impl",
    "cases",
    "gmean_ms",
    "gmean_p20_ms",
    "gmean_p80_ms",
    "sol_fraction",
    "all_correct",
]


def run_footer(meta: dict | None, run_id: str | None = None) -> str:
    """One line naming the GPU and software of a run, for figure footers."""
    meta = meta or {}
    parts = [
        meta.get("gpu_name") or "GPU ?",
        f"driver {meta.get('driver') or '?'}",
        f"CUDA {meta.get('cuda') or '?'}",
        f"torch {meta.get('torch') or '?'}",
        f"triton {meta.get('triton') or '?'}",
        f"run {run_id or meta.get('run_id', '?')}",
    ]
    if meta.get("utc"):
        parts.append(str(meta["utc"]))
    commit = meta.get("git_commit")
    if commit:
        # "+dirty" only when the run said so: a commit given through SWIGLU_GIT_COMMIT records
        # git_dirty "unknown" (a truthy string), which is not a dirty tree.
        parts.append(f"commit {str(commit)[:10]}{'+dirty' if meta.get('git_dirty') is True else ''}")
    return " | ".join(str(p) for p in parts)


def environment_footer(device: str | None = None) -> str:
    """One line naming this machine's device and software (for figures computed here). On a CPU
    it names only what the numbers depend on (torch, triton: pinned by the Makefile), not the
    processor or the Python version, so a committed CPU figure redraws identically elsewhere."""
    import platform

    import torch

    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        triton_version = "n/a"
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name(torch.device(device))
        where = f"{name} | CUDA {torch.version.cuda} | driver {_driver_version()}"
    else:
        return f"CPU, Triton interpreter | torch {torch.__version__} | triton {triton_version}"
    return f"{where} | torch {torch.__version__} | triton {triton_version} | Python {platform.python_version()}"


def _driver_version() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001 - footer detail only
        return "?"


def measure_live(
    bench_dir: str | Path,
    cases: str = "all",
    impls: str | None = None,
    extra_args: Sequence[str] = (),
) -> BenchRun:
    """Run ``python -m swiglu_lab.bench --cases ... [--impls ...] --out bench_dir`` on this machine
    (needs a CUDA GPU) and return the run it recorded (the newest run in ``bench_dir`` after it).

    Raises ``RuntimeError`` when no CUDA GPU is present or the benchmark fails."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("live measurement needs a CUDA GPU; none is visible to torch")
    bench_dir = Path(bench_dir)
    before = set(list_runs(bench_dir)["run_id"])
    cmd = [sys.executable, "-m", "swiglu_lab.bench", "--cases", str(cases), "--out", str(bench_dir)]
    if impls:
        cmd += ["--impls", str(impls)]
    cmd += list(extra_args)
    result = subprocess.run(cmd, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed with exit status {result.returncode}")
    runs = list_runs(bench_dir)
    new = runs[~runs["run_id"].isin(before)]
    if new.empty:
        raise RuntimeError(f"{' '.join(cmd)} recorded no new run in {bench_dir}")
    return load_run(bench_dir, run_id=str(new.iloc[-1]["run_id"]))


def slug(text: str) -> str:
    """A file-name-safe lowercase form of ``text`` ("NVIDIA H200" -> "nvidia_h200")."""
    return re.sub(r"[^a-z0-9]+", "_", str(text).lower()).strip("_") or "unknown"


# ------------------------------------------------------------------------------ power and energy
#: Per-row power columns ``swiglu_lab.bench`` records since it samples power (absent in older runs).
POWER_COLUMNS = (
    "power_w",
    "sm_clock_mhz",
    "power_samples",
    "energy_j",
    "flush_energy_j",
    "energy_per_backward_j",
    "energy_iters",
    "energy_window_s",
)

#: The H200's maximum SM clock (MHz; nvidia-smi ``clocks.max.sm``), when a run does not record it.
H200_MAX_SM_CLOCK_MHZ = 1980.0


def has_power_data(rows: pd.DataFrame | None) -> bool:
    """True when ``rows`` (a run's rows) hold at least one measured energy per backward."""
    return (
        rows is not None
        and "energy_per_backward_j" in rows
        and pd.to_numeric(rows["energy_per_backward_j"], errors="coerce").notna().any()
    )


def power_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per case x implementation: ``case, seq_len, batch_size, tokens, impl, median_ms,
    power_w, sm_clock_mhz, power_samples, energy_j, flush_energy_j, energy_per_backward_j,
    energy_iters, energy_window_s, gflop_per_j, energy_vs_compile`` (and ``correct`` when the
    rows have it), sorted like
    ``latency_table``; power columns NaN where the run has none.

    energy_per_backward_j = energy per iteration minus one L2 flush's (``swiglu_lab.bench.power``);
    gflop_per_j = 12*T*H*I / 1e9 / energy_per_backward_j; energy_vs_compile = energy_per_backward_j
    over torch.compile's on the same case (NaN where compile has none). Raises ``ValueError``
    when ``case, tokens, impl`` are missing."""
    missing = {"case", "tokens", "impl"} - set(rows.columns)
    if missing:
        raise ValueError(f"bench rows lack columns {sorted(missing)}")
    df = rows.copy()
    for column in POWER_COLUMNS:
        df[column] = pd.to_numeric(df[column], errors="coerce") if column in df else math.nan
    for column, default in (("hidden_size", HIDDEN_SIZE), ("intermediate_size", INTERMEDIATE_SIZE)):
        if column not in df:
            df[column] = default
    gflop = [
        roofline.flops(int(t), int(h), int(i)) / 1e9 for t, h, i in zip(df["tokens"], df["hidden_size"], df["intermediate_size"])
    ]
    df["gflop_per_j"] = gflop / df["energy_per_backward_j"]
    base = df[df["impl"] == "compile"].set_index("case")["energy_per_backward_j"]
    df["energy_vs_compile"] = df["energy_per_backward_j"] / df["case"].map(base)
    keep = [c for c in ("case", "seq_len", "batch_size", "tokens", "impl", "median_ms") if c in df]
    keep += list(POWER_COLUMNS) + ["gflop_per_j", "energy_vs_compile"] + (["correct"] if "correct" in df else [])
    rank = {impl: k for k, impl in enumerate(order_impls(df["impl"]))}
    df = df.assign(_rank=df["impl"].map(rank)).sort_values(["tokens", "case", "_rank"])
    return df[keep].reset_index(drop=True)


def _number(value) -> float | None:
    """A positive number from ``1980``, ``1980.0`` or ``"1980 MHz"``, else None."""
    if isinstance(value, str):
        match = re.match(r"\s*([0-9.]+)", value)
        value = match.group(1) if match else None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 and math.isfinite(number) else None


def max_sm_clock_mhz(meta: dict | None) -> float | None:
    """The GPU's maximum SM clock (MHz) a run's metadata records: ``max_sm_clock_mhz`` (NVML),
    ``power.max_sm_clock_mhz``, or nvidia-smi's ``clocks.max.sm`` ("1980 MHz"); None if absent."""
    meta = meta or {}
    gpu = meta.get("gpu") if isinstance(meta.get("gpu"), dict) else {}
    smi = gpu.get("nvidia_smi") if isinstance(gpu.get("nvidia_smi"), dict) else {}
    record = meta.get("power") if isinstance(meta.get("power"), dict) else {}
    for value in (meta.get("max_sm_clock_mhz"), record.get("max_sm_clock_mhz"), smi.get("clocks.max.sm")):
        number = _number(value)
        if number is not None:
            return number
    return None


def sustained_sm_clock_mhz(rows: pd.DataFrame, hardware: str = "H200-SXM") -> float:
    """The SM clock the card sustains under the heaviest load of a run (MHz): the mean of the
    rows' mean SM clocks over the cases that are compute-bound on ``hardware`` (where the power
    cap binds), over every implementation measured there; over all rows when no compute-bound
    case has a clock; NaN without power data."""
    if "sm_clock_mhz" not in rows:
        return math.nan
    df = rows.assign(sm_clock_mhz=pd.to_numeric(rows["sm_clock_mhz"], errors="coerce"))
    df = df[df["sm_clock_mhz"].notna()]
    if df.empty:
        return math.nan
    shape = zip(
        df["tokens"],
        df.get("hidden_size", pd.Series(HIDDEN_SIZE, index=df.index)),
        df.get("intermediate_size", pd.Series(INTERMEDIATE_SIZE, index=df.index)),
    )
    compute = [roofline.bound(int(t), hardware, int(h), int(i)) == "compute" for t, h, i in shape]
    heavy = df[compute]
    return float((heavy if len(heavy) else df)["sm_clock_mhz"].mean())


def sustained_hardware(rows: pd.DataFrame, meta: dict | None, base: str = "H200-SXM") -> roofline.Hardware | None:
    """``base``'s roof at the run's sustained SM clock (``roofline.at_sm_clock``: datasheet
    peak x sustained / maximum clock, ``max_sm_clock_mhz(meta)`` or 1980 MHz for the H200), or
    None when the run has no SM clock data."""
    clock = sustained_sm_clock_mhz(rows, base)
    if not clock > 0:
        return None
    top = max_sm_clock_mhz(meta) or H200_MAX_SM_CLOCK_MHZ
    hw = roofline.HARDWARE[base]
    return roofline.at_sm_clock(hw, clock, top, f"{hw.name} at the sustained SM clock ({clock:.0f} of {top:.0f} MHz)")


def power_limit_w(meta: dict | None) -> float | None:
    """The board power limit (W) a run's metadata records: ``power_limit_w`` (NVML) or
    nvidia-smi's ``power.limit`` ("700.00 W"); None if absent."""
    meta = meta or {}
    gpu = meta.get("gpu") if isinstance(meta.get("gpu"), dict) else {}
    smi = gpu.get("nvidia_smi") if isinstance(gpu.get("nvidia_smi"), dict) else {}
    for value in (meta.get("power_limit_w"), smi.get("power.limit")):
        number = _number(value)
        if number is not None:
            return number
    return None


#: Columns of ``nvidia-smi dmon -s pc`` (power and clocks), as the traces in data/power/ hold them.
DMON_COLUMNS = ("gpu", "power_w", "gpu_temp_c", "mem_temp_c", "mem_clock_mhz", "sm_clock_mhz")


def read_dmon(path: str | Path) -> pd.DataFrame:
    """An ``nvidia-smi dmon -s pc`` trace (one sample a second, ``#`` header lines repeated) as a
    frame with ``DMON_COLUMNS`` plus ``sample`` (0, 1, ... in file order). Raises ``ValueError``
    when a data line does not have the six columns."""
    frame = pd.read_csv(path, sep=r"\s+", comment="#", header=None, engine="python")
    if frame.shape[1] != len(DMON_COLUMNS):
        raise ValueError(
            f"{path}: expected the {len(DMON_COLUMNS)} columns of `nvidia-smi dmon -s pc` "
            f"({', '.join(DMON_COLUMNS)}), got {frame.shape[1]}"
        )
    frame.columns = list(DMON_COLUMNS)
    frame = frame.apply(pd.to_numeric, errors="coerce")
    frame.insert(0, "sample", range(len(frame)))
    return frame


def dmon_summary(trace: pd.DataFrame, loaded_above_w: float = 650.0) -> dict:
    """Samples of a ``read_dmon`` trace, those drawing more than ``loaded_above_w`` W (under
    load at the power cap), their mean / min / max SM clock (MHz) and the largest power (W)."""
    loaded = trace[trace["power_w"] > loaded_above_w]
    clock = loaded["sm_clock_mhz"]
    return {
        "samples": int(len(trace)),
        "loaded_samples": int(len(loaded)),
        "loaded_above_w": loaded_above_w,
        "loaded_mean_sm_clock_mhz": float(clock.mean()) if len(loaded) else math.nan,
        "loaded_min_sm_clock_mhz": float(clock.min()) if len(loaded) else math.nan,
        "loaded_max_sm_clock_mhz": float(clock.max()) if len(loaded) else math.nan,
        "max_power_w": float(trace["power_w"].max()) if len(trace) else math.nan,
    }


def dmon_trace(power_dir: str | Path, run_id: str) -> Path | None:
    """The ``nvidia-smi dmon`` trace recorded beside run ``run_id`` (``<power_dir>/dmon_<run_id>.txt``,
    the naming of data/power/), or None."""
    path = Path(power_dir) / f"dmon_{run_id}.txt"
    return path if path.is_file() else None


def sustained_roof(
    run: BenchRun | None, power_dir: str | Path, base: str = "H200-SXM", loaded_above_w: float = 650.0
) -> tuple[roofline.Hardware | None, str]:
    """The roof at the SM clock a run sustained, and a line saying where the clock comes from:
    the run's per-case clocks (``sustained_hardware``), else the mean SM clock of the samples
    above ``loaded_above_w`` W in its ``dmon_trace`` (runs recorded before the harness sampled
    power), else ``(None, why)``."""
    if run is None:
        return None, "no recorded run: no roof at the sustained SM clock"
    hw = sustained_hardware(run.rows, run.meta, base)
    if hw is not None:
        return hw, f"{hw.name}: {hw.peak_tflops:.1f} TFLOP/s (per-case SM clocks of run {run.run_id})"
    trace = dmon_trace(power_dir, run.run_id)
    if trace is not None:
        s = dmon_summary(read_dmon(trace), loaded_above_w)
        if s["loaded_samples"]:
            clock, top = s["loaded_mean_sm_clock_mhz"], max_sm_clock_mhz(run.meta) or H200_MAX_SM_CLOCK_MHZ
            name = f"{roofline.HARDWARE[base].name} at the sustained SM clock ({clock:.0f} of {top:.0f} MHz, dmon)"
            hw = roofline.at_sm_clock(base, clock, top, name)
            return hw, (
                f"{hw.name}: {hw.peak_tflops:.1f} TFLOP/s (mean SM clock of the {s['loaded_samples']} of "
                f"{s['samples']} samples above {loaded_above_w:.0f} W in {trace.name})"
            )
    return None, (f"no power data recorded in run {run.run_id} and no dmon trace for it: no roof at the sustained SM clock")
