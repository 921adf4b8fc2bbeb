"""The tables of numbers in README.md and docs/, generated from the derived tables (data/derived/).

A document holds each generated table between two markers::

    <!-- generated: headline (swiglu_lab.research.docs_tables; make reproduce) -->
    | ... |
    <!-- end generated: headline -->

``update`` (called by ``make reproduce`` after the notebooks) rewrites what lies between them;
the prose around stays as written. ``render`` gives every block's text, so a test can check that
the committed documents match the committed data. Each table names the run it comes from. A new
implementation in a run (a new peer) gets its own row or column with no change here.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from .analysis import IMPL_LABELS, load_run, order_impls

#: Documents that hold generated blocks (relative to the repository root).
DOCUMENTS = ("README.md", "docs/results.md", "docs/history.md", "docs/tensor-parallel.md", "docs/training.md")
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) [^>]*-->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)", re.S)
OURS = "triton"


def _read(derived_dir: Path, name: str) -> pd.DataFrame | None:
    path = Path(derived_dir) / name
    return pd.read_csv(path) if path.is_file() else None


def _label(impl: str) -> str:
    text = IMPL_LABELS.get(impl, impl)
    return f"**{text}**" if impl == OURS else text


def _range(lo: float, hi: float, fmt: str) -> str:
    return f"{lo:{fmt}}-{hi:{fmt}}" if pd.notna(lo) and pd.notna(hi) else "-"


def _gmean(values) -> float:
    v = np.asarray([x for x in values if pd.notna(x)], float)
    return float(np.exp(np.log(v).mean())) if len(v) else float("nan")


def _run_line(run_id: str, bench_dir: Path, cases: int, spread: str) -> str:
    run = load_run(bench_dir, run_id) if bench_dir is not None and (Path(bench_dir) / f"{run_id}.csv").is_file() else None
    meta = run.meta if run is not None else {}
    proto = meta.get("protocol") if isinstance(meta.get("protocol"), dict) else {}
    iters = proto.get("iters", "?")
    return (
        f"Run `{run_id}` ({meta.get('gpu_name', 'GPU ?')}, {meta.get('utc', '?')[:10]}, commit "
        f"{str(meta.get('git_commit', '?'))[:7]}; torch {meta.get('torch', '?')}, triton {meta.get('triton', '?')}): "
        f"{cases} cases, {proto.get('warmup', '?')} warm-ups and {iters} timed iterations per case and implementation, "
        "median, L2 flushed before each iteration. " + spread
    )


def headline(derived_dir: Path, bench_dir: Path) -> str:
    """Ours against every implementation of the latest run: geometric-mean ms with its spread,
    speed-ups, SOL fraction and correctness (``latency_summary.csv``, ``latency_per_case.csv``)."""
    s = _read(derived_dir, "latency_summary.csv")
    per_case = _read(derived_dir, "latency_per_case.csv")
    if s is None or s.empty:
        return "(no recorded full-protocol run: `make bench` on the GPU, then `make reproduce`)\n"
    cases = int(s["cases"].max())
    spread = (
        "Geometric means over the cases; p20-p80: the same over each case's 20th and 80th percentile "
        "(a speed-up's: this implementation's, torch.compile at its median)."
    )
    lines = [
        _run_line(str(s["run_id"].iloc[0]), bench_dir, cases, spread),
        "",
        "| implementation | ms (p20-p80) | speed-up over torch.compile (p20-p80) | over eager | fraction of H200 SOL "
        f"| correct on all {cases} cases |",
        "|---|---|---|---|---|---|",
    ]
    for _, r in s.iterrows():
        vs_c = (
            f"{r['gmean_speedup_vs_compile']:.3f}x ({_range(r['gmean_speedup_vs_compile_lo'], r['gmean_speedup_vs_compile_hi'], '.3f')})"
            if pd.notna(r.get("gmean_speedup_vs_compile"))
            else "-"
        )
        correct = {"True": "yes", "False": "**no**"}.get(str(r["all_correct"]), "n/a (not the gradients)")
        ms = f"{r['gmean_ms']:.2f} ({_range(r['gmean_p20_ms'], r['gmean_p80_ms'], '.2f')})"
        if r["impl"] == OURS:
            ms, vs_c = f"**{ms}**", f"**{vs_c}**"
        label = _label(r["impl"]) + (f" ({int(r['cases'])} of {cases} cases)" if int(r["cases"]) < cases else "")
        lines.append(f"| {label} | {ms} | {vs_c} | {r['gmean_speedup_vs_eager']:.3f}x | {r['sol_fraction']:.2f} | {correct} |")
    sol = float(s["gmean_sol_ms"].max())
    lines.append(f"| H200 speed of light, datasheet (989.4 TFLOP/s, 4.8 TB/s) | {sol:.2f} | | | 1 | |")
    if per_case is not None and per_case["sol_ms_measured"].notna().any():
        measured = _gmean(per_case.drop_duplicates("case")["sol_ms_measured"])
        lines.append(f"| H200 speed of light, ceilings measured in the run | {measured:.2f} | | | | |")
    if per_case is not None and (s["cases"] < cases).any():
        lines += ["", _common_cases_line(per_case, s)]
    return "\n".join(lines) + "\n"


def _common_cases_line(per_case: pd.DataFrame, summary: pd.DataFrame) -> str:
    """The geometric means over only the cases every implementation timed, for a run where some
    timed fewer (their gmean above is over their own cases, so not comparable row by row)."""
    timed = per_case[per_case["median_ms"].notna()]
    common = set.intersection(*(set(g["case"]) for _, g in timed.groupby("impl")))
    missing = sorted(set(per_case["case"]) - common)
    means = {i: _gmean(g.loc[g["case"].isin(common), "median_ms"]) for i, g in timed.groupby("impl")}
    partial = ", ".join(_label(i) for i in summary.loc[summary["cases"] < summary["cases"].max(), "impl"])
    text = (
        f"{partial} timed fewer cases (no time for {', '.join(missing)}: see the run's notes); over the "
        f"{len(common)} cases every implementation timed, geometric means: "
        + ", ".join(f"{_label(i)} {means[i]:.2f} ms" for i in order_impls(means))
    )
    if OURS in means:
        text += "; speed-up of ours over " + ", ".join(
            f"{_label(i)} {means[i] / means[OURS]:.3f}x" for i in order_impls(means) if i != OURS
        )
    return text + "."


def per_case(derived_dir: Path, bench_dir: Path) -> str:
    """Per case: every implementation's median ms, ours over torch.compile with its p20-p80
    range, energy per backward (ours / compile), ours' power and SM clock, and the H200 SOL."""
    t = _read(derived_dir, "latency_per_case.csv")
    if t is None or t.empty:
        return "(no recorded run)\n"
    power = _read(derived_dir, "power_per_case.csv")
    impls = order_impls(t["impl"])
    failing = set(t.loc[t["correct"].astype(str) == "False", "impl"]) if "correct" in t else set()
    head = ["case", "T"] + [IMPL_LABELS.get(i, i) + ("\\*" if i in failing else "") for i in impls]
    if OURS in impls and "compile" in impls:
        head.append("ours over torch.compile (p20-p80)")
    if power is not None:
        head += ["J per backward, ours / torch.compile", "ours' board power, SM clock"]
    head.append("H200 SOL (datasheet)")
    spread = "Ours over torch.compile: the ratio of medians; p20-p80: ours' 20th and 80th percentile over compile's median."
    lines = [
        _run_line(str(t["run_id"].iloc[0]), bench_dir, t["case"].nunique(), spread),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for (T, case), g in t.groupby(["tokens", "case"], sort=False):
        g = g.set_index("impl")
        cells = [case, str(T)]
        for i in impls:
            v = g["median_ms"].get(i, np.nan)
            cells.append("-" if pd.isna(v) else (f"**{v:.2f}**" if i == OURS else f"{v:.2f}"))
        if OURS in impls and "compile" in impls:
            r = g.loc[OURS]
            cells.append(
                f"{r['speedup_vs_compile']:.3f}x ({_range(r['speedup_vs_compile_lo'], r['speedup_vs_compile_hi'], '.3f')})"
            )
        if power is not None:
            p = power[power["case"] == case].set_index("impl")
            e = lambda i: p["energy_per_backward_j"].get(i, np.nan)  # noqa: E731
            cells.append(f"{e(OURS):.1f} / {e('compile'):.1f}")
            cells.append(f"{p['power_w'].get(OURS, np.nan):.0f} W, {p['sm_clock_mhz'].get(OURS, np.nan):.0f} MHz")
        cells.append(f"{g['sol_ms'].iloc[0]:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    if failing:
        lines += ["", "\\* fails the benchmark's correctness check in this run."]
    return "\n".join(lines) + "\n"


def history(derived_dir: Path, bench_dir: Path) -> str:
    """Every recorded full-protocol run: geometric-mean ms per implementation and ours over
    torch.compile (``history.csv``); runs that timed fewer cases are marked."""
    h = _read(derived_dir, "history.csv")
    if h is None or h.empty:
        return "(no recorded run)\n"
    impls = order_impls(h["impl"])
    most = int(h["cases"].max())
    head = ["run", "UTC", "commit", "cases"] + [IMPL_LABELS.get(i, i) for i in impls] + ["ours over torch.compile"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run_id, g in h.groupby("run_id", sort=False):
        g = g.set_index("impl")
        cases = int(g["cases"].max())
        cells = [
            f"`{run_id}`",
            str(g["utc"].iloc[0]).replace("T", " ").rstrip("Z"),
            str(g["commit"].iloc[0]),
            f"{cases}" + ("" if cases == most else " (not comparable)"),
        ]
        for i in impls:
            v = g["gmean_ms"].get(i, np.nan)
            bad = str(g["all_correct"].get(i, "")) == "False"
            cells.append("-" if pd.isna(v) else f"{v:.2f}" + ("\\*" if bad else ""))
        ours, comp = g["gmean_ms"].get(OURS, np.nan), g["gmean_ms"].get("compile", np.nan)
        cells.append(f"{comp / ours:.3f}x" if pd.notna(ours) and pd.notna(comp) else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Geometric-mean median latency (ms) over the cases each run timed; \\* fails the correctness check. "
        f"A run of fewer than {most} cases averages other cases: compare it only with itself.",
    ]
    return "\n".join(lines) + "\n"


def tp_per_case(derived_dir: Path, bench_dir: Path) -> str:
    """Tensor parallel per case (``tp_measured.csv``): one GPU, ours at TP=N with its p20-p80, the
    two modules, the all-reduce alone and the scaling efficiency, then geometric means."""
    t = _read(derived_dir, "tp_measured.csv")
    if t is None or t.empty:
        return "(no recorded tensor-parallel run)\n"
    n = int(t["tp"].iloc[0])
    t = t.sort_values(["tokens", "case"])
    lines = [
        f"| case | T | ours, one GPU | **ours, TP={n}** (op + all-reduce; p20-p80) | `SwiGLUMLP` module, TP={n} | "
        f"`nn.Linear` module, TP={n} | grad_x all-reduce alone | scaling efficiency |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for _, r in t.iterrows():
        spread = _range(r.get("tp_ours_p20_ms"), r.get("tp_ours_p80_ms"), ".2f")
        lines.append(
            f"| {r['case']} | {r['tokens']} | {r['single_ms']:.2f} | **{r['tp_ours_ms']:.2f}** ({spread}) | "
            f"{r['tp_ours_module_ms']:.2f} | {r['tp_plain_module_ms']:.2f} | {r['allreduce_ms']:.3f} | "
            f"{r['efficiency']:.3f} |"
        )
    g1, gn = _gmean(t["single_ms"]), _gmean(t["tp_ours_ms"])
    lines += [
        "",
        f"Geometric means: {g1:.2f} ms on one GPU, {gn:.2f} ms at TP = {n} (efficiency {g1 / (n * gn):.3f}); "
        f"ours over the `nn.Linear` module {_gmean(t['tp_plain_module_ms']) / gn:.3f}x "
        f"({(t['tp_plain_module_ms'] / t['tp_ours_ms']).min():.3f}-{(t['tp_plain_module_ms'] / t['tp_ours_ms']).max():.3f}x "
        f"per case), the parallelized `SwiGLUMLP` module's backward over it "
        f"{_gmean(t['tp_plain_module_ms']) / _gmean(t['tp_ours_module_ms']):.3f}x.",
    ]
    return "\n".join(lines) + "\n"


STEP_VARIANTS = {
    "plain": "nn.Linear",
    "compile": "torch.compile(nn.Linear)",
    "saved": "ours, activated_gate saved",
    "lean": "**ours, memory-lean**",
    "lean_cublas": "ours, memory-lean with the cuBLAS forward",
}


def train_step(derived_dir: Path, bench_dir: Path) -> str:
    """Per T and variant (``train_step_summary.csv``): saved [T, I] tensors, saved GB per layer,
    the step's peak GB and median ms; the floor, and memory-lean against nn.Linear."""
    s = _read(derived_dir, "train_step_summary.csv")
    if s is None or s.empty:
        return "(no recorded training-step run)\n"
    variants = [v for v in STEP_VARIANTS if v in set(s["variant"])]
    head = ["T"] + [STEP_VARIANTS[v] for v in variants] + ["floor", "lean vs nn.Linear (speed, peak)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for T, g in s.groupby("tokens"):
        g = g.set_index("variant")
        cells = [str(T)]
        for v in variants:
            if v not in g.index:
                cells.append("-")
                continue
            r = g.loc[v]
            cells.append(f"{int(r['saved_TxI'])}, {r['saved_MB'] / 1e3:.2f} GB, {r['peak_GB']:.2f} GB, {r['ms']:.1f} ms")
        floor = g["floor_GB"].max() if "floor_GB" in g else np.nan
        cells.append(f"{floor:.2f} GB" if pd.notna(floor) else "-")
        lean = g.loc["lean"] if "lean" in g.index else None
        cells.append(f"{lean['speedup_vs_plain']:.3f}x, {lean['peak_vs_plain']:.3f}x" if lean is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Each cell: saved [T, I] tensors per layer, saved GB per layer, peak memory of the step (weights "
        "and their gradients included), median step time.",
    ]
    return "\n".join(lines) + "\n"


#: Block name -> renderer(derived_dir, bench_dir).
BLOCKS = {"headline": headline, "per-case": per_case, "history": history, "tp-per-case": tp_per_case, "train-step": train_step}


def render(derived_dir: str | Path, bench_dir: str | Path | None = None) -> dict[str, str]:
    """Every block's markdown from the tables in ``derived_dir`` (run details from ``bench_dir``)."""
    return {name: fn(Path(derived_dir), Path(bench_dir) if bench_dir else None) for name, fn in BLOCKS.items()}


def fill(text: str, blocks: dict[str, str]) -> str:
    """``text`` with every generated block replaced by ``blocks[name]``. Raises ``ValueError`` for
    a block name ``blocks`` lacks."""

    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in blocks:
            raise ValueError(f"unknown generated block {name!r}; have {sorted(blocks)}")
        return m.group(1) + blocks[name] + m.group(4)

    return BLOCK.sub(sub, text)


def update(
    root: str | Path, derived_dir: str | Path, bench_dir: str | Path | None, target: str | Path | None = None
) -> list[Path]:
    """Rewrite the generated blocks of ``DOCUMENTS`` under ``root`` from ``derived_dir``; write the
    results under ``target`` (default: ``root``, in place; a build folder for a subset run).
    Returns the paths written with new content."""
    root = Path(root)
    target = Path(target) if target else root
    blocks = render(derived_dir, bench_dir)
    changed = []
    for name in DOCUMENTS:
        src = root / name
        if not src.is_file():
            continue
        text = src.read_text()
        new = fill(text, blocks)
        out = target / name
        if out.resolve() == src.resolve() and new == text:
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(new)
        changed.append(out)
    return changed
