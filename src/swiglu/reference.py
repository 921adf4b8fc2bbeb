"""The reference backward (the benchmark's bf16 order of operations) and its float64 oracle.

Formula and order of operations: ``shared/spec/problem.md``, section "The reference computation",
which transcribes SOL-ExecBench L2/005's reference. With ``go`` [T, H], ``x`` [T, H] and the
[T, I] activations flattened:

1. ``g = go @ down_weight``                                  [T, I]
2. ``h = activated_gate * up_output``; ``grad_down_weight = go.T @ h``   [H, I]
3. ``d_act = g * up_output``; ``d_up = g * activated_gate``
4. ``s = sigmoid(gate_output)`` in fp32; ``d_gate = d_act * s * (1 + gate_output * (1 - s))``
5. ``grad_x = d_gate @ gate_weight + d_up @ up_weight``      [T, H]
6. ``grad_gate_weight = d_gate.T @ x``; ``grad_up_weight = d_up.T @ x``   [I, H]
"""

from __future__ import annotations

import torch

Gradients = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


def reference_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    gate_output: torch.Tensor,
    up_output: torch.Tensor,
    activated_gate: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
) -> Gradients:
    """The benchmark's reference, operation for operation, in the inputs' dtype (bf16 there).

    Shapes as in ``swiglu.swiglu_mlp_backward``; no validation here (the public entry point
    validates). Returns ``(grad_x [*, H], grad_gate_weight [I, H], grad_up_weight [I, H],
    grad_down_weight [H, I])`` in the inputs' dtype; ``grad_x`` keeps ``x``'s leading dims.
    """
    go, xf = _flat(grad_output), _flat(x)
    gate, up, act = _flat(gate_output), _flat(up_output), _flat(activated_gate)
    g = go @ down_weight
    h = act * up
    grad_down_weight = go.t() @ h
    d_act = g * up
    d_up = g * act
    s = torch.sigmoid(gate.float())
    d_gate = (d_act.float() * s * (1 + gate * (1 - s))).to(x.dtype)
    grad_x = d_gate @ gate_weight + d_up @ up_weight
    grad_gate_weight = d_gate.t() @ xf
    grad_up_weight = d_up.t() @ xf
    return grad_x.reshape(x.shape), grad_gate_weight, grad_up_weight, grad_down_weight


def float64_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    gate_output: torch.Tensor,
    up_output: torch.Tensor,
    activated_gate: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
) -> Gradients:
    """The same formula with every input upcast to float64 and every step in float64: the
    accuracy oracle. Runs on the inputs' device; returns float64 tensors shaped as
    ``reference_backward``'s. Memory: about 4x the bf16 inputs plus float64 outputs.
    """
    up64 = [t.double() for t in (grad_output, x, gate_output, up_output, activated_gate)]
    go, xf, gate, up, act = (_flat(t) for t in up64)
    gw, uw, dw = gate_weight.double(), up_weight.double(), down_weight.double()
    g = go @ dw
    grad_down_weight = go.t() @ (act * up)
    s = torch.sigmoid(gate)
    d_gate = g * up * s * (1 + gate * (1 - s))
    d_up = g * act
    del g
    grad_x = d_gate @ gw + d_up @ uw
    grad_gate_weight = d_gate.t() @ xf
    grad_up_weight = d_up.t() @ xf
    return grad_x.reshape(x.shape), grad_gate_weight, grad_up_weight, grad_down_weight
