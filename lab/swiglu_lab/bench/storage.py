"""Append-only storage of runs: ``<out>/<run_id>.csv`` (rows), ``<out>/<run_id>.json``
(metadata), the optional kernel breakdown ``<out>/kernels/<run_id>.csv`` and one line per
finished run in ``<out>/runs.csv``. An existing run is never
overwritten: a run id already taken gets a ``-2``, ``-3``, ... suffix. Rows are written case by
case, so an interrupted run keeps what it measured (its JSON says ``"complete": false``)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pandas as pd

from .breakdown import COLUMNS as KERNEL_COLUMNS
from .schema import COLUMNS, coerce

INDEX_NAME = "runs.csv"
#: Subfolder of the per-kernel breakdowns, ``<out>/kernels/<run_id>.csv``.
KERNELS_DIR = "kernels"
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


class RunWriter:
    """Write one run incrementally, so a run that is killed (time limit, OOM) still leaves the
    cases it finished on disk.

    Creation reserves ``<out>/<run_id>.csv`` (header only) and ``<out>/<run_id>.json`` with
    exclusive creates, taking ``run_id-2``, ``-3``, ... when the id is already taken; earlier runs
    are never opened for writing. ``append`` adds rows; ``write_metadata`` (re)writes this run's
    own JSON, with ``complete`` false until ``finish``, which also appends the run to
    ``runs.csv`` (so the index lists finished runs only).
    """

    def __init__(self, out_dir: str | Path, run_id: str):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, 1000):
            final = run_id if attempt == 1 else f"{run_id}-{attempt}"
            csv_path, json_path = self.out_dir / f"{final}.csv", self.out_dir / f"{final}.json"
            if json_path.exists():
                continue
            try:
                with open(csv_path, "x", newline="") as f:  # "x": fails if it exists, never overwrites
                    f.write(",".join(COLUMNS) + "\n")
            except FileExistsError:
                continue
            try:
                with open(json_path, "x") as f:
                    f.write("{}\n")
            except FileExistsError:  # a run without its CSV owns this name: leave both alone
                csv_path.unlink()
                continue
            break
        else:
            raise FileExistsError(f"no free run id for {run_id} in {self.out_dir}")
        self.run_id, self.csv_path, self.json_path, self.n_rows = final, csv_path, json_path, 0

    def append(self, rows: pd.DataFrame) -> None:
        """Append rows (``schema.COLUMNS``); their ``run_id`` is set to this run's."""
        frame = coerce(rows.assign(run_id=self.run_id))
        frame.to_csv(self.csv_path, mode="a", header=False, index=False, float_format="%.6g")
        self.n_rows += len(frame)

    def append_kernels(self, kernels: pd.DataFrame) -> Path:
        """Append a kernel breakdown (``breakdown.COLUMNS``) to ``<out>/kernels/<run_id>.csv``
        (created with its header on the first call; a folder apart, so run listings never take it
        for a run). Returns its path."""
        path = self.out_dir / KERNELS_DIR / f"{self.run_id}.csv"
        path.parent.mkdir(exist_ok=True)
        frame = kernels.assign(run_id=self.run_id)[list(KERNEL_COLUMNS)]
        frame.to_csv(path, mode="a", header=not path.exists(), index=False, float_format="%.6g")
        return path

    def write_metadata(self, metadata: dict, complete: bool = False) -> None:
        """(Re)write this run's JSON: ``metadata`` plus ``run_id``, ``csv``, ``n_rows`` and
        ``complete``; NaN becomes null."""
        record = dict(metadata, run_id=self.run_id, csv=self.csv_path.name, n_rows=self.n_rows, complete=complete)
        text = json.dumps(_clean(record), indent=2, default=_json_default)
        self.json_path.write_text(text + "\n")

    def finish(self, metadata: dict) -> None:
        """Write the final metadata (``complete: true``) and append the run to ``runs.csv``."""
        self.write_metadata(metadata, complete=True)
        append_index(self.out_dir, self.run_id, dict(metadata, n_rows=self.n_rows))


def write_run(rows: pd.DataFrame, metadata: dict, out_dir: str | Path, run_id: str) -> tuple[str, Path, Path]:
    """Write a whole run at once (``RunWriter``): rows, metadata, index line.

    Returns: ``(final run id, csv path, json path)``; the id gets a ``-2``... suffix if taken.
    """
    writer = RunWriter(out_dir, run_id)
    writer.append(rows)
    writer.finish(metadata)
    return writer.run_id, writer.csv_path, writer.json_path


def append_index(out_dir: str | Path, run_id: str, metadata: dict) -> Path:
    """Append one line (``INDEX_COLUMNS``) for the run to ``<out_dir>/runs.csv``, writing the
    header when the file is new."""
    path = Path(out_dir) / INDEX_NAME
    new = not path.exists()
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=INDEX_COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(_index_line(run_id, metadata))
    return path


def _index_line(run_id: str, metadata: dict) -> dict:
    return {
        "run_id": run_id,
        "utc": metadata.get("utc", ""),
        "gpu": metadata.get("gpu", {}).get("name", metadata.get("gpu_name", "")),
        "protocol": metadata.get("protocol", {}).get("name", ""),
        "commit": metadata.get("git", {}).get("commit", metadata.get("git_commit", "")),
        "n_rows": metadata.get("n_rows", ""),
    }


def rebuild_index(out_dir: str | Path) -> Path:
    """Rewrite ``<out_dir>/runs.csv`` from the complete runs' JSON records, oldest first (the
    index is derived data; the runs themselves are not touched). Use it after copying runs in
    from another machine. Returns the index path."""
    out = Path(out_dir)
    records = []
    for json_path in sorted(out.glob("*.json")):
        try:
            record = json.loads(json_path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("complete") and record.get("run_id"):
            records.append(record)
    records.sort(key=lambda r: (str(r.get("utc", "")), r["run_id"]))
    path = out / INDEX_NAME
    tmp = out / f".{INDEX_NAME}.tmp"
    tmp.unlink(missing_ok=True)
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=INDEX_COLUMNS)
        writer.writeheader()
        for record in records:
            writer.writerow(_index_line(record["run_id"], record))
    tmp.replace(path)
    return path
