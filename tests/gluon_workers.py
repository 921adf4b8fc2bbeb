"""The sm_90 compile tests' side of tests/gluon_compile_worker.py: the worker started with each
triton the Gluon kernels are written for, both at once (CI has two cores), and its report. For
tests/kernels/test_gluon.py and tests/kernels/test_moe_gluon.py; a test module that calls
``compile_report`` imports ``_stop_unused_workers`` too (an autouse fixture)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swiglu.kernels.devices import GLUON_TRITONS, triton_minor

from compile_worker import wait_for_worker

ROOT = Path(__file__).resolve().parents[1]
EXTRA_TRITON_DIR = os.environ.get("SWIGLU_EXTRA_TRITON_DIR")

WHICH_TRITONS = ("gpu-image", "own")
#: Compile workers started per worker arguments, both tritons at once where both are given (CI has two cores): the
#: test for one triton waits on its own, the other's runs meanwhile.
_STARTED: dict[tuple, dict] = {}


def _start_worker(which: str, worker_args: tuple, folder) -> tuple | str:
    """tests/gluon_compile_worker.py started with one of the tritons the kernels are written for:
    "gpu-image" the GPU machine's (``SWIGLU_EXTRA_TRITON_DIR``, installed by make test-gpu-triton), "own" this
    environment's (pip pairs triton 3.7 with torch 2.13); (process, report path, log files), or
    why that triton is missing or not one of ``GLUON_TRITONS``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # This checkout's src/ and lab/ (the worker imports swiglu and swiglu_lab), not an installed copy.
    if which == "gpu-image":
        if not EXTRA_TRITON_DIR:
            return "SWIGLU_EXTRA_TRITON_DIR unset (make test-gpu-triton sets it to the GPU machine's triton)"
        env["PYTHONPATH"] = os.pathsep.join([EXTRA_TRITON_DIR, str(ROOT / "src"), str(ROOT / "lab")])
    else:
        import triton

        if triton_minor(triton.__version__) not in GLUON_TRITONS:
            return f"this environment's triton {triton.__version__} is not one the Gluon kernels are written for"
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "lab")])
    env["TRITON_CACHE_DIR"] = str(folder / "cache")
    out = folder / "results.json"
    # Output to files, not pipes: a pipe nobody reads yet could fill and stall the worker.
    logs = [open(folder / name, "w+") for name in ("stdout.txt", "stderr.txt")]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "gluon_compile_worker.py"), str(out), *worker_args],
        env=env,
        stdout=logs[0],
        stderr=logs[1],
        text=True,
    )
    return proc, out, logs


@pytest.fixture(scope="module", autouse=True)
def _stop_unused_workers():
    """A worker started for a triton no selected test used is stopped with the module."""
    yield
    for started in _STARTED.values():
        for entry in started.values():
            if not isinstance(entry, str):
                entry[0].kill()
                entry[0].wait()
                for f in entry[2]:
                    f.close()
    _STARTED.clear()


def compile_report(tmp_path_factory, which: str, *worker_args: str) -> dict:
    """tests/gluon_compile_worker.py's report (``_start_worker``) for ``which`` triton; the first
    call per ``worker_args`` starts the workers of both, side by side. Skips where that triton is
    missing or not one the kernels are written for."""
    if worker_args not in _STARTED:
        _STARTED[worker_args] = {
            w: _start_worker(w, worker_args, tmp_path_factory.mktemp("gluon_compile")) for w in WHICH_TRITONS
        }
    started = _STARTED[worker_args].pop(which)
    if isinstance(started, str):
        pytest.skip(started)
    proc, out, logs = started
    err = wait_for_worker(proc, logs)[1]
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.read_text())
