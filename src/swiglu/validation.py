"""Input validation shared by every implementation of the backward.

Every check raises ``TypeError`` (not a tensor, wrong dtype) or ``ValueError`` (rank, shape,
device, empty size) naming the argument and what was expected. Nothing here copies or mutates a
tensor; callers decide how to handle strides (see ``swiglu.api``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ARG_NAMES = (
    "grad_output",
    "x",
    "gate_output",
    "up_output",
    "activated_gate",
    "gate_weight",
    "up_weight",
    "down_weight",
)


@dataclass(frozen=True)
class Problem:
    """Sizes of one backward call: ``tokens`` (T), ``hidden_size`` (H), ``intermediate_size`` (I),
    and the leading dimensions of ``x`` (``()`` for flattened [T, H] inputs)."""

    tokens: int
    hidden_size: int
    intermediate_size: int
    leading_shape: tuple[int, ...]


def validate_backward_inputs(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    gate_output: torch.Tensor,
    up_output: torch.Tensor,
    activated_gate: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    *,
    dtypes: tuple[torch.dtype, ...] | None = None,
) -> Problem:
    """Check the eight backward inputs and return the problem sizes.

    Activations are [batch_size, seq_len, size] or flattened [tokens, size]; all five share their
    leading dimensions. Weights: gate_weight and up_weight [I, H], down_weight [H, I]. All tensors
    share one floating dtype (one of ``dtypes`` when given) and one device.

    Raises:
        TypeError: an argument is not a tensor, or has a non-floating / disallowed dtype, or the
            dtypes differ.
        ValueError: wrong rank, mismatched shapes, different devices, or an empty dimension.
    """
    tensors = dict(
        zip(
            ARG_NAMES,
            (grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight),
        )
    )
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    # Per-tensor dtype checks before the comparison with x, so a bad x is blamed on x.
    for name, t in tensors.items():
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must have a floating dtype, got {t.dtype}")
        if dtypes is not None and t.dtype not in dtypes:
            raise TypeError(f"{name} must have dtype in {list(dtypes)}, got {t.dtype}")
    dtype = x.dtype
    for name, t in tensors.items():
        if t.dtype != dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but x has {dtype}; all inputs must share one dtype")
    device = x.device
    for name, t in tensors.items():
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but x is on {device}; all inputs must share one device")

    for name in ("gate_weight", "up_weight", "down_weight"):
        if tensors[name].dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(tensors[name].shape)}")
    inter, hidden = gate_weight.shape
    for name, expected in (("up_weight", (inter, hidden)), ("down_weight", (hidden, inter))):
        if tuple(tensors[name].shape) != expected:
            raise ValueError(
                f"{name} must have shape {list(expected)} to match gate_weight {list(gate_weight.shape)} "
                f"([intermediate_size, hidden_size]), got {list(tensors[name].shape)}"
            )

    if x.dim() not in (2, 3):
        raise ValueError(
            f"x must be [tokens, hidden_size] or [batch_size, seq_len, hidden_size], got shape {tuple(x.shape)}"
        )
    leading = tuple(x.shape[:-1])
    for name, last in (
        ("x", hidden),
        ("grad_output", hidden),
        ("gate_output", inter),
        ("up_output", inter),
        ("activated_gate", inter),
    ):
        expected = leading + (last,)
        if tuple(tensors[name].shape) != expected:
            raise ValueError(
                f"{name} must have shape {list(expected)} (leading dims of x {list(x.shape)}, sizes of "
                f"gate_weight {list(gate_weight.shape)}), got {list(tensors[name].shape)}"
            )

    tokens = 1
    for d in leading:
        tokens *= d
    for label, size in (("tokens (batch_size * seq_len)", tokens), ("hidden_size", hidden), ("intermediate_size", inter)):
        if size <= 0:
            raise ValueError(f"{label} must be positive, got {size} (empty inputs are not supported)")
    return Problem(tokens, hidden, inter, leading)
