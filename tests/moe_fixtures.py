"""A real (not synthetic) MoE bench run for the tests: scripts/moe_bench_gpu.py on the CPU at the
tiny shape, ours under the Triton interpreter (~30 s on a 2-core CPU), made once per test
session and copied to each test that reads it (``tiny_run_copy``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import fast_interpreter

ROOT = Path(__file__).resolve().parents[1]


def run_tiny(out: Path, *extra: str) -> subprocess.CompletedProcess:
    """The script on the CPU at the tiny shape into ``out``: tokens 16 (timed) and 40 (a faked
    out-of-memory error), both routings, 2 reps in 2 rounds, the float64 check at 8 tokens, the
    eager loop never skipped for its time."""
    cmd = [
        sys.executable,
        "-c",
        fast_interpreter.PRELUDE,  # the interpreter without its re-patching (tests/fast_interpreter.py)
        str(ROOT / "scripts" / "moe_bench_gpu.py"),
        "--device",
        "cpu",
        "--shapes",
        "tiny",
        "--tokens",
        "16,40",
        "--routings",
        "balanced,skewed",
        "--check-tokens",
        "8",
        "--reps",
        "2",
        "--rounds",
        "2",
        "--warmup",
        "0",
        "--fake-oom-tokens",
        "20",
        "--out",
        str(out),
        # the eager loop always runs here: its time gate would skip it on a busy CPU
        "--eager-max-ms",
        "1e9",
        *extra,
    ]
    env = {
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'lab'}:{ROOT / 'tests'}",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "TRITON_INTERPRET": "1",
        "SWIGLU_GIT_COMMIT": "abc1234",
        "MPLBACKEND": "Agg",
    }
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def tiny_run_copy(tmp_path_factory, dest: Path) -> str:
    """A copy at ``dest`` of the session's one ``run_tiny`` run (made by the first test that asks,
    under a file lock that the pytest-xdist workers share: their base temp dirs' parent); returns
    the run's stdout."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    shared = root / "moe_tiny_run"
    with FileLock(f"{shared}.lock"):
        if not (shared / "complete").is_file():
            shutil.rmtree(shared, ignore_errors=True)
            done = run_tiny(shared / "run")
            assert done.returncode == 0, done.stderr[-3000:]
            (shared / "stdout.txt").write_text(done.stdout)
            (shared / "complete").write_text("")
    shutil.copytree(shared / "run", dest)
    return (shared / "stdout.txt").read_text()
