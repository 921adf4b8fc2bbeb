"""lab/probes/probe_in_step_gemms.py's wiring on the CPU (interpreter, tiny shape): every op it times
runs, and its check against cuBLAS's products catches a wrong one."""

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("probe_in_step_gemms", ROOT / "lab" / "probes" / "probe_in_step_gemms.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU wiring check (on a GPU: run the probe)")


def test_every_op_runs_and_matches_cublas(capsys, tmp_path):
    assert probe.main(["--device", "cpu", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for op in ("forward", "dswiglu", "grad_x", "grad_down_weight", "grad_gate_weight"):
        assert f"{op}: rel. error" in out


def test_a_wrong_kernel_fails_the_check(capsys, monkeypatch, tmp_path):
    from swiglu.kernels import backward

    real = backward.launch_grad_x

    def off(d_gate, d_up, gate_weight, up_weight, grad_x, *rest):
        real(d_gate, d_up, gate_weight, up_weight, grad_x, *rest)
        grad_x.mul_(1.05)  # a 5% bug

    monkeypatch.setattr(backward, "launch_grad_x", off)
    assert probe.main(["--device", "cpu", "--out", str(tmp_path)]) == 1
    assert "MISMATCH: ['grad_x']" in capsys.readouterr().out
