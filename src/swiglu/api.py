"""The public entry point ``swiglu_mlp_backward`` and its registry of implementations."""

from __future__ import annotations

import importlib
import os
from typing import Callable

import torch

from .reference import Gradients, reference_backward
from .checks import validate_backward_inputs

BackwardFn = Callable[..., Gradients]

_IMPLS: dict[str, BackwardFn] = {"reference": reference_backward}
# Implementations imported on first use (importing Triton is slow): name -> (module, function).
_LAZY = {"triton": ("swiglu.kernels.backward", "triton_swiglu_backward")}


def register_impl(name: str, fn: BackwardFn) -> None:
    """Register ``fn`` (same signature as ``reference_backward``) under ``impl=name``."""
    _IMPLS[name] = fn


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
    """Names ``swiglu_mlp_backward(impl=...)`` can run on ``device`` (default: the current CUDA
    device when there is one, else the CPU), besides ``"auto"``: ``"reference"`` and any
    registered implementation everywhere; ``"triton"`` only where its kernels can run (an NVIDIA
    sm_90+ GPU whose shared memory fits the tables, or any device under TRITON_INTERPRET=1, and
    Triton installed: ``swiglu.kernels.common.device_reason``). ``backend_reason`` says why
    ``"auto"`` does or does not take it. A device this machine lacks (``"cuda"`` without a GPU)
    is answered, not raised on. Raises TypeError for a ``device`` that is not a torch.device or
    str, ValueError for a str that names no device."""
    device = _device_arg(device)
    names = set(_IMPLS) | set(_LAZY)
    if _triton_device_reason(device):
        names.discard("triton")
    return sorted(names)


def _triton_device_reason(device: torch.device) -> str | None:
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        # Without importing Triton (slow): the kernels' own rule, common.device_reason, says the same.
        return f"needs CUDA tensors (got device {device}) or TRITON_INTERPRET=1"
    try:
        # swiglu.kernels.backward, not .common: importing it registers its table's shared memory.
        return importlib.import_module("swiglu.kernels.backward").device_reason(device)
    except ImportError as e:
        return f"Triton is not importable ({e})"


def backend_reason(device: torch.device | str | None = None, dtype: torch.dtype = torch.bfloat16) -> str | None:
    """Why ``impl="auto"`` (``swiglu_mlp_backward``, ``swiglu_mlp``, ``SwiGLUMLP``) takes the
    PyTorch reference rather than the Triton kernels for ``dtype`` inputs on ``device`` (default
    as ``available_impls``); None when it takes Triton. Triton needs a CUDA, NVIDIA (not ROCm),
    sm_90+ GPU whose opt-in shared memory per block fits every tuned configuration, an
    architecture the tables were tuned for (sm_90: H100/H200; sm_100 and sm_120 are not), and
    bfloat16; at call time also hidden_size and intermediate_size multiples of 8. The same
    reason is logged at DEBUG level (logger ``swiglu``) when "auto" resolves. Raises as
    ``available_impls`` for a bad ``device``, TypeError for a ``dtype`` that is not a torch.dtype."""
    from .ops import auto_reason

    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    return auto_reason(_device_arg(device), dtype)


def get_impl(name: str) -> BackwardFn:
    """The implementation registered as ``name`` (importing a lazily registered one, e.g.
    "triton"). Raises ``ValueError`` for an unknown name; an import failure propagates."""
    if not isinstance(name, str):
        raise TypeError(f"impl must be a str, one of {['auto'] + sorted(set(_IMPLS) | set(_LAZY))}, got "
                        f"{type(name).__name__}")
    if name not in _IMPLS and name in _LAZY:
        module, function = _LAZY[name]
        _IMPLS[name] = getattr(importlib.import_module(module), function)
    if name not in _IMPLS:
        raise ValueError(f"impl must be one of {['auto'] + sorted(set(_IMPLS) | set(_LAZY))}, got {name!r}")
    return _IMPLS[name]


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
    """Gradients of ``out = down_proj(silu(gate_proj(x)) * up_proj(x))`` w.r.t. x and the weights.

    Args:
        grad_output: [batch_size, seq_len, H] or [tokens, H], upstream gradient of ``out``.
        x: same shape as grad_output, the MLP input.
        gate_output, up_output, activated_gate: [..., I] with x's leading dims, saved by the
            forward. They are used exactly as given (``activated_gate`` is not recomputed from
            ``gate_output``), as in the benchmark's reference.
        gate_weight, up_weight: [I, H]; down_weight: [H, I] (``nn.Linear`` / checkpoint layout).
        impl: ``"reference"`` (PyTorch, the benchmark's bf16 order of operations), ``"triton"``
            (our Hopper kernels; bf16 tensors on an NVIDIA sm_90+ GPU whose shared memory fits
            the tables, or any device under ``TRITON_INTERPRET=1``), or ``"auto"``: triton for
            bf16 CUDA tensors on a GPU the tables were tuned for (sm_90) with hidden_size and
            intermediate_size multiples of 8, the reference otherwise (``backend_reason`` says
            why).

    Returns:
        ``(grad_x, grad_gate_weight, grad_up_weight, grad_down_weight)``: grad_x shaped like x,
        the weight gradients shaped like their weights, all in the inputs' dtype, freshly
        allocated (never aliasing an input). Inputs are never modified. Zero tokens (x [0, H],
        [0, S, H] or [B, 0, H]) work on every impl: empty grad_x, zero weight gradients, no
        kernel launch.

    Strides: any strides are accepted. The reference works on views; the Triton path copies an
    input to a contiguous buffer only when its layout is not usable by TMA (last-dim stride 1,
    16-byte-aligned base and row stride).

    Raises:
        TypeError: a non-tensor or sparse argument, a dtype other than float16, bfloat16, float32
            or float64, a dtype mismatch (triton: not bfloat16), or an ``impl`` that is not a str.
        ValueError: wrong ranks, mismatched shapes (naming the argument inconsistent with x),
            different devices, an empty hidden_size or intermediate_size, or an unknown ``impl``; triton also rejects unsupported devices or sizes (see
            ``swiglu.kernels.backward``).
    """
    validate_backward_inputs(
        grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight
    )
    if impl == "auto":
        from .ops import resolve_backward_impl  # one rule for "auto", shared with SwiGLUMLP

        impl = resolve_backward_impl("auto", x, gate_weight)
    fn = get_impl(impl)
    if impl == "triton" and x.device.type == "meta":  # the interpreter would accept the device
        raise ValueError("impl='triton' got meta tensors, which hold no data: use impl='reference' "
                         "(it propagates shapes)")
    return fn(grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight)
