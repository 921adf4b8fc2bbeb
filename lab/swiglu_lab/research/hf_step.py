"""The Hugging Face training-step runs that ``scripts/hf_step_gpu.py`` recorded under ``data/hf_step/``:
one table over every run (``load_runs``), drawn by ``plots.hf_step_plot`` in notebooks/06_training_memory.ipynb.

A run is a folder holding ``hf_step.csv`` (one row per variant) and ``hf_step.json`` (arguments,
commit, date). Runs whose arguments have ``rounds`` timed the eager variants side by side in
rotated blocks; the earlier ones timed them one after the other, where the machine's drifting
CPU moved the same code by up to 10% (docs/huggingface.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

#: Columns of ``load_runs``' table.
COLUMNS = [
    "run",
    "date_utc",
    "commit",
    "side_by_side",
    "shape",
    "layers",
    "hidden_size",
    "intermediate_size",
    "tokens",
    "variant",
    "ms_median",
    "speedup",
    "peak_gib",
    "host_ms_median",
]


def shape_label(layers: int, hidden_size: int, intermediate_size: int, tokens: int) -> str:
    """A model shape as the figure's panels name it: ``"4 layers of 4096 x 14336, 2048 tokens"``."""
    return f"{layers} layer{'s' if layers != 1 else ''} of {hidden_size} x {intermediate_size}, {tokens} tokens"


def _folder_commit(run: str) -> str:
    """The commit a run folder's name carries (``<UTC timestamp>-<short commit>/...``), for a run
    whose JSON did not come back from the GPU machine; "" when the name has none."""
    stamp, _, commit = run.split("/")[0].rpartition("-")
    return commit if stamp and commit.isalnum() else ""


def load_runs(path: str | Path) -> pd.DataFrame:
    """Every recorded run under ``path`` (searched recursively), one row per run and variant that
    ran (``status == "ok"``), ``COLUMNS``, in date order; ``speedup`` is over the run's unpatched
    model. A run without its JSON takes its date and commit from its folder's name. Empty (with
    the columns) when there is none."""
    rows = []
    for csv_path in sorted(Path(path).glob("**/hf_step.csv")):
        meta_path = csv_path.parent / "hf_step.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        table = pd.read_csv(csv_path)
        table = table[table["status"] == "ok"]
        run = csv_path.parent.relative_to(path).as_posix()
        for _, r in table.iterrows():
            rows.append(
                dict(
                    run=run,
                    date_utc=meta.get("date_utc", run.split("/")[0]),
                    commit=str(meta.get("git_commit") or _folder_commit(run))[:7],
                    side_by_side="rounds" in meta.get("args", {}),
                    shape=shape_label(int(r["layers"]), int(r["hidden_size"]), int(r["intermediate_size"]), int(r["tokens"])),
                    layers=int(r["layers"]),
                    hidden_size=int(r["hidden_size"]),
                    intermediate_size=int(r["intermediate_size"]),
                    tokens=int(r["tokens"]),
                    variant=r["variant"],
                    ms_median=float(r["ms_median"]),
                    speedup=float(r["speedup"]),
                    peak_gib=float(r["peak_gib"]),
                    host_ms_median=float(r["host_ms_median"])
                    if "host_ms_median" in r and pd.notna(r["host_ms_median"])
                    else float("nan"),
                )
            )
    out = pd.DataFrame(rows, columns=COLUMNS)
    return out.sort_values(["date_utc", "run"], kind="stable").reset_index(drop=True)


#: Columns of ``load_long_seq``' table (``scripts/hf_long_seq_gpu.py``'s CSV plus the run folder).
LONG_SEQ_COLUMNS = [
    "run",
    "variant",
    "seq_len",
    "layers",
    "activation_checkpointing",
    "step_ms",
    "tokens_per_s",
    "peak_gib",
    "oom",
]


def load_long_seq(path: str | Path) -> pd.DataFrame:
    """Every ``long_seq.csv`` under ``path`` (``data/hf_long_seq/``), one row per trial or timed
    configuration, ``LONG_SEQ_COLUMNS``, runs in folder order. Empty (with the columns) when there
    is none."""
    parts = []
    for csv_path in sorted(Path(path).glob("**/long_seq.csv")):
        table = pd.read_csv(csv_path)
        table.insert(0, "run", csv_path.parent.relative_to(path).as_posix())
        parts.append(table)
    if not parts:
        return pd.DataFrame(columns=LONG_SEQ_COLUMNS)
    out = pd.concat(parts, ignore_index=True)[LONG_SEQ_COLUMNS]
    for col in ("activation_checkpointing", "oom"):
        out[col] = out[col].astype(str).str.lower() == "true"
    return out


def longest_without_checkpointing(table: pd.DataFrame) -> pd.DataFrame:
    """Per variant the longest sequence that trained without checkpointing over every run, with its
    peak GiB and the shortest that ran out of memory above it."""
    plain = table[~table["activation_checkpointing"]]
    rows = []
    for variant, part in plain.groupby("variant", sort=False):
        fits = part[~part["oom"]]
        best = fits.loc[fits["seq_len"].idxmax()] if len(fits) else None
        longest = int(best["seq_len"]) if best is not None else 0
        over = part[part["oom"] & (part["seq_len"] > longest)]["seq_len"]
        rows.append(
            dict(
                variant=variant,
                longest_seq=longest,
                peak_gib=float(best["peak_gib"]) if best is not None else float("nan"),
                first_oom_seq=int(over.min()) if len(over) else 0,
            )
        )
    return pd.DataFrame(rows, columns=["variant", "longest_seq", "peak_gib", "first_oom_seq"])
