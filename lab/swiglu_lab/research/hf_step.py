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
COLUMNS = ["run", "date_utc", "commit", "side_by_side", "shape", "layers", "hidden_size", "intermediate_size",
           "tokens", "variant", "ms_median", "speedup", "peak_gib", "host_ms_median"]


def shape_label(layers: int, hidden_size: int, intermediate_size: int, tokens: int) -> str:
    """A model shape as the figure's panels name it: ``"4 layers of 4096 x 14336, 2048 tokens"``."""
    return f"{layers} layer{'s' if layers != 1 else ''} of {hidden_size} x {intermediate_size}, {tokens} tokens"


def load_runs(path: str | Path) -> pd.DataFrame:
    """Every recorded run under ``path`` (searched recursively), one row per run and variant that
    ran (``status == "ok"``), ``COLUMNS``, in date order; ``speedup`` is over the run's unpatched
    model. Empty (with the columns) when there is none."""
    rows = []
    for csv_path in sorted(Path(path).glob("**/hf_step.csv")):
        meta_path = csv_path.parent / "hf_step.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        table = pd.read_csv(csv_path)
        table = table[table["status"] == "ok"]
        run = csv_path.parent.relative_to(path).as_posix()
        for _, r in table.iterrows():
            rows.append(dict(
                run=run, date_utc=meta.get("date_utc", run.split("/")[0]), commit=str(meta.get("git_commit") or "")[:7],
                side_by_side="rounds" in meta.get("args", {}),
                shape=shape_label(int(r["layers"]), int(r["hidden_size"]), int(r["intermediate_size"]), int(r["tokens"])),
                layers=int(r["layers"]), hidden_size=int(r["hidden_size"]), intermediate_size=int(r["intermediate_size"]),
                tokens=int(r["tokens"]), variant=r["variant"], ms_median=float(r["ms_median"]),
                speedup=float(r["speedup"]), peak_gib=float(r["peak_gib"]),
                host_ms_median=float(r["host_ms_median"]) if "host_ms_median" in r and pd.notna(r["host_ms_median"])
                else float("nan")))
    out = pd.DataFrame(rows, columns=COLUMNS)
    return out.sort_values(["date_utc", "run"], kind="stable").reset_index(drop=True)
