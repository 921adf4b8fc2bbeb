"""The reference backward (the benchmark's bf16 order of operations) and its float64 oracle.

Formula and order of operations: ``docs/problem.md``, section "The reference computation",
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
import torch.nn.functional as F

from .checks import ALL_NEEDS, check_backward_inputs

Gradients = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # entries None only when not requested


def activated_gate_of(gate_output: torch.Tensor) -> torch.Tensor:
    """``activated_gate = silu(gate_output)`` in gate_output's dtype and shape (``F.silu``, as the
    nn.Linear module computes it). The one silu formula of the PyTorch path: ``swiglu_mlp``'s
    forward and its memory-lean backward (which recomputes activated_gate) both call it, so the
    recomputed values are bitwise the forward's. The Triton path's counterpart is
    ``swiglu.kernels.tl_kernels._activated_gate``."""
    return F.silu(gate_output)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


def _gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # One indirection so tests can count the GEMMs (a gradient not requested skips its GEMMs).
    if a.is_cpu and a.dtype == torch.bfloat16 and a.stride(-1) == 1 and a.stride(-2) != a.shape[-1]:
        # oneDNN's AMX bf16 GEMM reads each row of its first operand past its end (K rounded up to
        # 32, times zeros): a row-strided view's padding would reach the result, NaN * 0 = NaN.
        # docs/usage.md, "bf16 matmul on CPUs with AMX".
        a = a.contiguous()
    return a @ b


def reference_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    gate_output: torch.Tensor,
    up_output: torch.Tensor,
    activated_gate: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    *,
    need_grad_x: bool = True,
    need_grad_gate_weight: bool = True,
    need_grad_up_weight: bool = True,
    need_grad_down_weight: bool = True,
) -> Gradients:
    """The benchmark's reference, operation for operation, in the inputs' dtype (bf16 there).

    Shapes as in ``swiglu.swiglu_mlp_backward`` (activations [..., size]). Returns ``(grad_x
    [*, H], grad_gate_weight [I, H], grad_up_weight [I, H], grad_down_weight [H, I])`` in the
    inputs' dtype; ``grad_x`` keeps ``x``'s leading dims. A gradient whose ``need_*`` flag is False
    comes back as None and every step only it uses is skipped. The sigmoid factor is computed in
    ``promote_types(dtype, float32)`` (float32 for bf16, fp16, fp32 inputs, as the benchmark does).
    Inputs may be strided views: what lies outside them never reaches the result.

    Raises: TypeError/ValueError naming the argument, as ``swiglu.swiglu_mlp_backward``.
    """
    tensors = (grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight)
    check_backward_inputs(*tensors, any_rank=True)
    return reference_gradients(tensors, (need_grad_x, need_grad_gate_weight, need_grad_up_weight, need_grad_down_weight))


def reference_gradients(tensors, needs: tuple[bool, bool, bool, bool] = ALL_NEEDS) -> Gradients:
    """``reference_backward`` without its input check, for callers that validated already:
    ``tensors`` the eight inputs in ``swiglu.checks.ARG_NAMES`` order, ``needs`` which of
    (grad_x, grad_gate_weight, grad_up_weight, grad_down_weight) to compute. A gradient not needed
    comes back as None and every step only it uses is skipped (a frozen gate_weight costs no
    ``d_gate.T @ x``), as the autograd op needs. The sigmoid factor is computed in
    ``promote_types(dtype, float32)``: float32 for bf16, fp16 and fp32 inputs, as the benchmark
    does, and float64 for float64 inputs.
    """
    grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight = tensors
    need_grad_x, need_grad_gate_weight, need_grad_up_weight, need_grad_down_weight = needs
    go, xf = _flat(grad_output), _flat(x)
    gate, up, act = _flat(gate_output), _flat(up_output), _flat(activated_gate)
    need_d_gate = need_grad_x or need_grad_gate_weight
    need_d_up = need_grad_x or need_grad_up_weight
    grad_x = grad_gate_weight = grad_up_weight = grad_down_weight = d_gate = d_up = None
    g = _gemm(go, down_weight) if (need_d_gate or need_d_up) else None
    if need_grad_down_weight:
        h = act * up
        grad_down_weight = _gemm(go.t(), h)
    if need_d_gate:
        d_act = g * up
    if need_d_up:
        d_up = g * act
    if need_d_gate:
        s = torch.sigmoid(gate.to(torch.promote_types(gate.dtype, torch.float32)))
        d_gate = (d_act.to(s.dtype) * s * (1 + gate * (1 - s))).to(x.dtype)
    if need_grad_x:
        grad_x = (_gemm(d_gate, gate_weight) + _gemm(d_up, up_weight)).reshape(x.shape)
    if need_grad_gate_weight:
        grad_gate_weight = _gemm(d_gate.t(), xf)
    if need_grad_up_weight:
        grad_up_weight = _gemm(d_up.t(), xf)
    return grad_x, grad_gate_weight, grad_up_weight, grad_down_weight


@torch.no_grad()
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
    ``reference_backward``'s. Each input is upcast when first needed and each float64 operand
    dropped after its last use: ~27 GB at Hermes' size with T = 8192 (at the end, the four float64
    gradients and one [T, intermediate_size] tensor), beside the caller's tensors; no autograd
    graph (it would keep every operand alive). Raises as ``reference_backward`` (mixed dtypes
    included).
    """
    check_backward_inputs(
        grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight, any_rank=True
    )
    go = _flat(grad_output).double()
    dw = down_weight.double()
    g = go @ dw
    del dw
    up, act = _flat(up_output).double(), _flat(activated_gate).double()
    h = act * up
    grad_down_weight = go.t() @ h
    del go, h
    d_up = g * act
    del act
    # d_gate = g * up * s * (1 + gate * (1 - s)), in place: the same operations, so the same bits
    d_gate = g * up
    del g, up
    gate = _flat(gate_output).double()
    s = torch.sigmoid(gate)
    d_gate *= s
    s.neg_().add_(1).mul_(gate).add_(1)
    del gate
    d_gate *= s
    del s
    gw = gate_weight.double()
    grad_x = d_gate @ gw
    del gw
    uw = up_weight.double()
    grad_x += d_up @ uw
    del uw
    xf = _flat(x).double()
    grad_gate_weight = d_gate.t() @ xf
    del d_gate
    grad_up_weight = d_up.t() @ xf
    return grad_x.reshape(x.shape), grad_gate_weight, grad_up_weight, grad_down_weight
