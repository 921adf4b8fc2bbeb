"""Append-only storage of runs: ``<out>/<run_id>.csv`` (rows), ``<out>/<run_id>.json``
(metadata) and one line per run in ``<out>/runs.csv``. An existing run is never overwritten: a
run id already taken gets a ``-2``, ``-3``, ... suffix."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pandas as pd

from .schema import coerce

INDEX_NAME = "runs.csv"
INDEX_COLUMNS = ("run_id", "utc", "gpu", "protocol", "commit", "n_rows")


def _json_default(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return str(value)


def _clean(value):
    """Replace NaN/inf floats (not valid JSON) with None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_run(rows: pd.DataFrame, metadata: dict, out_dir: str | Path, run_id: str) -> tuple[str, Path, Path]:
    """Write one run's rows and metadata without touching any earlier run.

    Args:
        rows: the tidy frame (``schema.COLUMNS``); its ``run_id`` column is set to the final id.
        metadata: JSON-serialisable record (NaN becomes null); ``run_id``, ``csv`` and ``n_rows``
            are set here.
        out_dir: folder, created if needed. run_id: the wished id.

    Returns: ``(final run id, csv path, json path)``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        final = run_id if attempt == 1 else f"{run_id}-{attempt}"
        csv_path, json_path = out / f"{final}.csv", out / f"{final}.json"
        if json_path.exists():
            continue
        try:
            handle = open(csv_path, "x", newline="")  # "x": fails if it exists, never overwrites
        except FileExistsError:
            continue
        break
    else:
        raise FileExistsError(f"no free run id for {run_id} in {out}")
    frame = coerce(rows.assign(run_id=final))
    with handle:
        frame.to_csv(handle, index=False, float_format="%.6g")
    record = dict(metadata, run_id=final, csv=csv_path.name, n_rows=int(len(frame)))
    with open(json_path, "x") as f:
        json.dump(_clean(record), f, indent=2, default=_json_default)
        f.write("\n")
    append_index(out, final, record)
    return final, csv_path, json_path


def append_index(out_dir: str | Path, run_id: str, metadata: dict) -> Path:
    """Append one line (``INDEX_COLUMNS``) for the run to ``<out_dir>/runs.csv``, writing the
    header when the file is new."""
    path = Path(out_dir) / INDEX_NAME
    new = not path.exists()
    line = {
        "run_id": run_id,
        "utc": metadata.get("utc", ""),
        "gpu": metadata.get("gpu", {}).get("name", ""),
        "protocol": metadata.get("protocol", {}).get("name", ""),
        "commit": metadata.get("git", {}).get("commit", ""),
        "n_rows": metadata.get("n_rows", ""),
    }
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=INDEX_COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(line)
    return path
