"""The tidy CSV schema: one row per case x implementation, columns and dtypes fixed here.

Every row links to its run's metadata record ``<run_id>.json`` through ``run_id``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

#: Column name -> kind ("str", "int", "int?": integer or <NA>, "float", "bool?": True/False/<NA>),
#: in CSV order.
COLUMNS: dict[str, str] = {
    "run_id": "str",
    "case": "str",
    "seq_len": "int",
    "batch_size": "int",
    "tokens": "int",
    "hidden_size": "int",
    "intermediate_size": "int",
    "impl": "str",
    "protocol": "str",  # "full", "quick" or "cpu-smoke"
    "warmup": "int",
    "iters": "int",
    "median_ms": "float",
    "p20_ms": "float",
    "p80_ms": "float",
    "mean_ms": "float",
    "min_ms": "float",
    "first_call_s": "float",  # first call incl. compile / autotune, host wall clock
    "host_ms": "float",  # median host time to enqueue one timed call (wall clock around the call), ms
    "tflops": "float",  # FLOPs / median, TFLOP/s
    "gbps": "float",  # minimum bytes / median, GB/s
    "hardware": "str",  # roofline.HARDWARE key behind sol_ms
    "sol_ms": "float",  # datasheet speed of light
    "sol_fraction": "float",
    "sol_ms_measured": "float",  # from the ceilings measured in this run
    "sol_fraction_measured": "float",
    "speedup_vs_eager": "float",
    "speedup_vs_compile": "float",
    "peak_mem_gb": "float",  # the call's own extra memory, 1e9 bytes
    "correct": "bool?",  # <NA>: not applicable (the GEMM-only lower bound)
    "min_match_fraction": "float",
    # Power and energy (swiglu_lab.bench.power), NaN / empty on CPU and where no backend worked:
    "power_w": "float",  # mean sampled board power over the energy window, W
    "sm_clock_mhz": "float",  # mean sampled SM clock over the energy window, MHz
    "power_samples": "int?",  # readings in the window
    "energy_j": "float",  # board energy per iteration, J, L2 flush included
    "flush_energy_j": "float",  # one L2 flush alone, J (flush-only loop, same case)
    "energy_per_backward_j": "float",  # energy_j - flush_energy_j
    "energy_iters": "int?",  # iterations in the energy window (timed + untimed extension)
    "energy_window_s": "float",  # the window's duration, s
    "note": "str",
}

#: Columns added after the first recorded runs; a CSV without them reads back with them empty.
LATER_COLUMNS = (
    "power_w",
    "sm_clock_mhz",
    "power_samples",
    "energy_j",
    "flush_energy_j",
    "energy_per_backward_j",
    "energy_iters",
    "energy_window_s",
)
#: Added after the power columns: runs recorded before read back with it empty.
HOST_COLUMNS = ("host_ms",)

_PANDAS_DTYPES = {"str": object, "int": "int64", "int?": "Int64", "float": "float64", "bool?": "boolean"}


def check_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``row`` as a dict in column order.

    Raises: ``ValueError`` naming the missing or unknown columns.
    """
    missing = [c for c in COLUMNS if c not in row]
    unknown = [c for c in row if c not in COLUMNS]
    if missing or unknown:
        raise ValueError(f"row does not match the CSV schema: missing {missing}, unknown {unknown}")
    return {c: row[c] for c in COLUMNS}


def rows_to_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Build the tidy frame with the schema's columns and dtypes (see ``COLUMNS``).

    Raises: ``ValueError`` for a row with missing or unknown columns.
    """
    frame = pd.DataFrame([check_row(r) for r in rows], columns=list(COLUMNS))
    return coerce(frame)


def coerce(frame: pd.DataFrame) -> pd.DataFrame:
    """Cast every column to the schema's dtype (strings as Python ``str``, missing notes as "")."""
    out = frame.copy()
    for column, kind in COLUMNS.items():
        if kind == "str":
            out[column] = out[column].fillna("").astype(str).astype(object)
        elif kind == "bool?":
            out[column] = out[column].astype("boolean")
        else:
            out[column] = out[column].astype(_PANDAS_DTYPES[kind])
    return out


def read_rows(path: str | Path) -> pd.DataFrame:
    """Read a run's CSV back with the schema's dtypes. A run recorded before ``LATER_COLUMNS``
    or ``HOST_COLUMNS`` existed reads back with those columns empty (NaN / <NA>).

    Raises: ``ValueError`` when the file's columns are not the schema's (nor its earlier form).
    """
    frame = pd.read_csv(path, dtype={c: str for c, k in COLUMNS.items() if k == "str"}, keep_default_na=True)
    for absent in (LATER_COLUMNS + HOST_COLUMNS, HOST_COLUMNS):
        if list(frame.columns) == [c for c in COLUMNS if c not in absent]:
            frame = frame.reindex(columns=list(COLUMNS))
    if list(frame.columns) != list(COLUMNS):
        raise ValueError(f"{path}: columns {list(frame.columns)} are not the schema's {list(COLUMNS)}")
    return coerce(frame)
