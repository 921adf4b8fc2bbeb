"""The Triton paths launch on their tensors' device, not on whichever CUDA device is current
(Triton launches on the current one): a model spread over GPUs (``device_map="auto"``, pipeline
stages) runs each layer's kernels where its tensors are. On the CPU: ``ops.on_device``'s choice
with faked CUDA calls, and that the dense and MoE kernels' entries (forward and backward) run
inside it for their x's device; tests/kernels/test_moe_gpu.py runs both ops on a second GPU."""

from __future__ import annotations

import contextlib

import pytest
import torch

import swiglu
from swiglu import moe, ops

from moe_checks import make_moe, run


def test_on_device_switches_only_to_another_cuda_device(monkeypatch):
    entered = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda d: entered.append(d) or contextlib.nullcontext())
    with ops.on_device(torch.device("cuda", 1)):
        pass
    assert entered == [torch.device("cuda", 1)]
    for same in (torch.device("cuda", 0), torch.device("cpu"), torch.device("meta")):
        ops.on_device(same)
    assert entered == [torch.device("cuda", 1)]


@pytest.fixture
def devices_asked(monkeypatch):
    """The devices each kernel entry asked ``on_device`` for, recorded where the launches happen."""
    asked = []
    real = ops.on_device

    def record(device):
        asked.append(device)
        return real(device)

    monkeypatch.setattr(ops, "on_device", record)
    monkeypatch.setattr(moe, "on_device", record)
    return asked


def test_moe_forward_and_backward_launch_inside_the_device_guard(devices_asked):
    inp = make_moe(0, 24, 32, 32, 4, 2)
    run(inp, "triton")
    assert devices_asked == [inp.x.device, inp.x.device]  # the forward's, the backward's


def test_dense_lean_forward_and_backward_launch_inside_the_device_guard(devices_asked):
    t = swiglu.make_inputs(batch_size=1, seq_len=8, hidden_size=32, intermediate_size=64, seed=0, mode="forward")
    x, ws = t.x.clone().requires_grad_(), [w.clone().requires_grad_() for w in (t.gate_weight, t.up_weight, t.down_weight)]
    out = swiglu.swiglu_mlp(x, *ws, impl="triton", save_activated_gate=False)
    out.backward(torch.randn_like(out))
    assert devices_asked == [x.device, x.device]
