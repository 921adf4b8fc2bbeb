"""scripts/host_overhead.py runs on the CPU and writes a consistent CSV (no timing assertion)."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import swiglu

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("host_overhead", ROOT / "scripts" / "host_overhead.py")
host_overhead = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host_overhead)


def test_host_overhead_smoke(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # not the script's 1 (conftest gives an xdist worker one): a lost restore shows
    try:
        result = host_overhead.main(["--device", "cpu", "--warmup", "1", "--iters", "4", "--rounds", "2", "--out", str(tmp_path)])
        assert torch.get_num_threads() == threads + 1  # restored
    finally:
        torch.set_num_threads(threads)
    with open(tmp_path / "host_overhead.csv", newline="") as f:
        rows = {row["implementation"]: row for row in csv.DictReader(f)}
    expected = {"swiglu_SwiGLUMLP_fwd_bwd", "nn_linear_fwd_bwd", "backward_reference"}
    if "triton" in swiglu.available_impls("cpu"):  # TRITON_INTERPRET=1 (conftest)
        expected.add("backward_triton")
    if importlib.util.find_spec("transformers") is not None:
        expected |= {"hf_LlamaMLP_fwd_bwd", "hf_LlamaMLP_swiglu_fwd_bwd"}
    assert set(rows) == expected
    base = float(rows["nn_linear_fwd_bwd"]["us_median"])
    for name, row in rows.items():
        values = {k: float(row[k]) for k in ("us_median", "us_p20", "us_p80", "us_min", "ratio_to_nn_linear")}
        assert all(math.isfinite(v) and v > 0 for v in values.values()), (name, values)
        assert values["us_min"] <= values["us_p20"] <= values["us_median"] <= values["us_p80"], (name, values)
        assert int(row["calls"]) == 4
        assert math.isclose(values["ratio_to_nn_linear"], values["us_median"] / base, rel_tol=1e-9), (name, values)
    assert math.isclose(float(rows["nn_linear_fwd_bwd"]["ratio_to_nn_linear"]), 1.0)
    meta = json.loads((tmp_path / "host_overhead.json").read_text())
    assert meta["shape"] == {"name": "overhead", "H": 16, "I": 32, "T": 2}
    assert meta["iters"] == 4 and meta["implementations"] == [r["implementation"] for r in result["rows"]]


def test_profile_writes_both_blocks_by_both_orders(tmp_path):
    host_overhead.main(["--device", "cpu", "--warmup", "1", "--iters", "3", "--rounds", "1", "--profile", "--out", str(tmp_path)])
    text = (tmp_path / "cprofile.txt").read_text()
    headers = [line for line in text.splitlines() if line.startswith("=====")]
    assert len(headers) == 4, headers
    for block in ("swiglu.SwiGLUMLP forward+backward", "PlainSwiGLUMLP (3x nn.Linear) forward+backward"):
        for order in ("tottime", "cumulative"):
            assert any(block in h and h.endswith(f"by {order}") for h in headers), (block, order, headers)
    assert "swiglu/ops.py" in text  # our frames are in the profile


def test_stub_launches_refuses_the_interpreter():
    """Under TRITON_INTERPRET=1 (conftest on a CPU) every launch takes Triton's path: nothing to stub."""
    from swiglu.kernels import devices

    if not devices.INTERPRET:
        pytest.skip("TRITON_INTERPRET unset in this process")
    with pytest.raises(RuntimeError, match="without TRITON_INTERPRET"):
        with host_overhead.stubbed_launches():
            pass


def test_stub_launches_runs_the_gpu_path_on_the_cpu(tmp_path):
    """``--stub-launches``: the Triton rows run on the CPU with the H200's kernel choices at
    Llama-3-8B, 512 tokens (its Gluon weight-gradient launcher in the profile), in a process
    without TRITON_INTERPRET."""
    if torch.cuda.is_available():
        pytest.skip("a CPU measurement")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "lab"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "host_overhead.py"),
            "--stub-launches",
            "--warmup",
            "1",
            "--iters",
            "3",
            "--rounds",
            "1",
            "--profile",
            "--out",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "host_overhead.csv", newline="") as f:
        rows = {row["implementation"]: row for row in csv.DictReader(f)}
    assert "backward_triton" in rows
    if importlib.util.find_spec("transformers") is not None:
        assert {"hf_LlamaMLP_fwd", "hf_LlamaMLP_swiglu_fwd", "hf_LlamaMLP_swiglu_fwd_bwd"} <= set(rows)
        text = (tmp_path / "cprofile.txt").read_text()
        assert "gluon_wgrad.py" in text and "launch_backward" in text
    meta = json.loads((tmp_path / "host_overhead.json").read_text())
    assert meta["stub_launches"]["plan_shape"] == {"T": 512, "H": 4096, "I": 14336}
