"""Test helper: a ``SwiGLUMLP`` and the plain ``nn.Linear`` MLP with the same random weights."""

import torch

import swiglu
from swiglu.module import PlainSwiGLUMLP


def mlp_pair(gen: torch.Generator, hidden_size: int, intermediate_size: int, dtype, backward_impl: str, device):
    """(ours, plain) on ``device``: weights drawn from ``gen`` in float64 with std 1/sqrt(fan_in)
    (as swiglu.inputs), cast to ``dtype`` in the plain module, whose state dict ours loads."""
    plain = PlainSwiGLUMLP(hidden_size, intermediate_size, dtype=dtype)
    with torch.no_grad():
        for p in plain.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) / p.shape[1] ** 0.5)
    ours = swiglu.SwiGLUMLP(hidden_size, intermediate_size, impl=backward_impl, dtype=dtype)
    ours.load_state_dict(plain.state_dict())
    return ours.to(device), plain.to(device)
