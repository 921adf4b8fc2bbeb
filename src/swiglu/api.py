"""The public entry point ``swiglu_mlp_backward`` and the questions about backends."""

from __future__ import annotations

import os

import torch

from . import ops
from .checks import ALL_NEEDS, check_backward_inputs
from .reference import Gradients


def _default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _device_arg(device) -> torch.device:
    """``device`` as a torch.device (None: ``_default_device()``); TypeError/ValueError naming it."""
    if device is None:
        return _default_device()
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(f"device must be a torch.device or a str such as 'cuda:0', got {type(device).__name__}")
    try:
        return torch.device(device)
    except RuntimeError:
        raise ValueError(f"device must name a torch device ('cpu', 'cuda', 'cuda:1'), got {device!r}") from None


def available_impls(device: torch.device | str | None = None) -> list[str]:
    """Names ``impl=`` can take on ``device`` (default: the current CUDA device when there is
    one, else the CPU), besides ``"auto"``: ``"reference"`` everywhere; ``"triton"`` only where
    its kernels can run (an NVIDIA sm_90+ GPU whose shared memory fits the tables, or any device
    under TRITON_INTERPRET=1, and Triton installed). ``backend_reason`` says why ``"auto"`` does
    or does not take it. A device this machine lacks is answered, not raised on. Raises
    TypeError for a ``device`` that is not a torch.device or str, ValueError for a str that
    names no device."""
    device = _device_arg(device)
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return ["reference"]  # without importing Triton (slow): device_reason says the same
    try:
        from .kernels.backward import device_reason

        reason = device_reason(device)
    except ImportError:
        reason = "Triton is not importable"
    return ["reference"] if reason else ["reference", "triton"]


def backend_reason(device: torch.device | str | None = None, dtype: torch.dtype = torch.bfloat16) -> str | None:
    """Why ``impl="auto"`` (``swiglu_mlp_backward``, ``swiglu_mlp``, ``SwiGLUMLP``) takes the
    PyTorch reference rather than the Triton kernels for ``dtype`` inputs on ``device`` (default
    as ``available_impls``); None when it takes Triton. Triton needs a CUDA, NVIDIA (not ROCm),
    sm_90+ GPU whose opt-in shared memory per block fits every tuned configuration, an
    architecture the tables were tuned for (sm_90: H100/H200), and bfloat16; at call time also
    hidden_size and intermediate_size multiples of 8. The same reason is logged at DEBUG level
    (logger ``swiglu``) when "auto" resolves. Raises as ``available_impls`` for a bad
    ``device``, TypeError for a ``dtype`` that is not a torch.dtype."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    return ops.auto_reason(_device_arg(device), dtype)


def swiglu_mlp_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    gate_output: torch.Tensor,
    up_output: torch.Tensor,
    activated_gate: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    *,
    impl: str = "auto",
) -> Gradients:
    """Gradients of ``out = down_proj(silu(gate_proj(x)) * up_proj(x))`` w.r.t. x and the three weights.

    Args:
        grad_output, x: [..., H] (e.g. [batch_size, seq_len, H] or [tokens, H]), any strides.
        gate_output, up_output, activated_gate: [..., I] with x's leading dims, as saved by the
            forward; used exactly as given (activated_gate is not recomputed), as in the benchmark.
        gate_weight, up_weight: [I, H]; down_weight: [H, I] (``nn.Linear`` / checkpoint layout).
        impl: ``"auto"`` (Triton for bf16 CUDA tensors on a GPU the tables were tuned for, sm_90,
            with H and I multiples of 8; the reference otherwise, ``backend_reason`` says why),
            ``"reference"`` (PyTorch, the benchmark's order of operations) or ``"triton"``.

    Returns:
        ``(grad_x, grad_gate_weight, grad_up_weight, grad_down_weight)`` shaped like x and the
        weights, in the inputs' dtype, freshly allocated; inputs are never modified. Zero tokens
        give an empty grad_x and zero weight gradients, with no kernel launch.

    Raises:
        TypeError: a non-tensor or sparse argument, a dtype that is not float16/bfloat16/float32/
            float64 or differs between arguments (triton: bfloat16 only), a non-str ``impl``.
        ValueError: wrong ranks, mismatched shapes (naming the argument), different devices, an
            empty H or I, an unknown ``impl``, or ``"triton"`` where it cannot run.

    Under compile, dispatch modes or inputs requiring grad: the op ``torch.ops.swiglu.mlp_backward``
    (differentiable gradients); under ``torch.func``: the reference. More: docs/usage.md.
    """
    tensors = (grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight)
    check_backward_inputs(*tensors)
    if torch.compiler.is_compiling():
        ops._check_impl(impl)
        return ops.mlp_backward(*tensors, *ALL_NEEDS, impl)
    if ops.transforms_active():
        ops._check_impl(impl)
        return ops.run_backward(tensors, ALL_NEEDS, "reference")
    if ops.dispatch_mode_active() or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        # The custom op: dispatch modes see it, and its autograd formula makes the gradients
        # differentiable whatever the backend.
        ops._check_impl(impl)
        return ops.mlp_backward(*tensors, *ALL_NEEDS, impl)
    return ops.run_backward(tensors, ALL_NEEDS, ops.resolve_impl(impl, x, gate_weight))
