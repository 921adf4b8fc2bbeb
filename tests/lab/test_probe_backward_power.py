"""lab/probes/probe_backward_power.py's wiring on the CPU (interpreter, tiny shape): every variant
runs, our kernels' outputs are checked against the reference, and a wrong one fails the probe."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
# Its sibling probe_wgrad_power imports as when the probe runs (``python lab/probes/<probe>.py``).
if str(ROOT / "lab" / "probes") not in sys.path:
    sys.path.insert(0, str(ROOT / "lab" / "probes"))
spec = importlib.util.spec_from_file_location("probe_backward_power", ROOT / "lab" / "probes" / "probe_backward_power.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU wiring check (on a GPU: run the probe)")
ARGS = [
    "--device",
    "cpu",
    "--tokens",
    "33",
    "--hidden-size",
    "64",
    "--intermediate-size",
    "96",
    "--seconds",
    "0.001",
    "--rounds",
    "1",
]


def test_every_variant_runs_and_ours_match_the_reference(capsys, tmp_path):
    assert probe.main([*ARGS, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for label in (
        "ours backward",
        "eager backward",
        "ours dSwiGLU",
        "cublas g = go @ down_w",
        "ours grad_x",
        "cublas grad_x (K = 2I)",
        "ours grad_down_weight [H,I]",
        "cublas grad_gate_weight [I,H]",
    ):
        assert label in out
    assert out.count("max error / max |reference|") == 3
    assert len(list(tmp_path.glob("backward_power_*.csv"))) == 1


def test_a_wrong_weight_gradient_fails_the_probe(capsys, monkeypatch, tmp_path):
    from swiglu.kernels import backward

    real = backward.launch_grad_weight_gluon_or_tl

    def off(a, b, out, *rest):
        real(a, b, out, *rest)
        out.mul_(1.05)  # a 5% bug

    monkeypatch.setattr(backward, "launch_grad_weight_gluon_or_tl", off)
    assert probe.main([*ARGS, "--out", str(tmp_path)]) == 1
    assert "MISMATCH: ['T=33 ours grad_gate_weight [I,H]', 'T=33 ours grad_down_weight [H,I]']" in capsys.readouterr().out
