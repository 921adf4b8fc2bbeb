"""A real (not synthetic) MoE bench run for the tests: scripts/moe_bench_gpu.py on the CPU at the
tiny shape, ours under the Triton interpreter (~10 s on two cores)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_tiny(out: Path, *extra: str) -> subprocess.CompletedProcess:
    """The script on the CPU at the tiny shape into ``out``: tokens 16 (timed) and 40 (a faked
    out-of-memory error), both routings, 2 reps in 2 rounds, the float64 check at 8 tokens, the
    eager loop never skipped for its time."""
    cmd = [
        sys.executable,
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
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'lab'}",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "TRITON_INTERPRET": "1",
        "SWIGLU_GIT_COMMIT": "abc1234",
        "MPLBACKEND": "Agg",
    }
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
