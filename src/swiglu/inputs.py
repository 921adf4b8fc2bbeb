"""Input generation for the backward, as the public benchmark draws it or from a real forward.

Benchmark mode (``docs/problem.md``, "How the public benchmark judges it"): the five
activation tensors are ``randn`` (N(0, 1)) in bf16, drawn independently of each other, and each
weight is ``randn / sqrt(fan_in)`` with fan_in its last dimension. Forward mode draws ``x``,
``grad_output`` and the weights the same way, then computes ``gate_output``, ``up_output`` and
``activated_gate`` with a bf16 forward pass, as a training step would save them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from .workloads import HIDDEN_SIZE, INTERMEDIATE_SIZE

#: The benchmark's seed (set once per run there).
BENCHMARK_SEED = 200
MODES = ("benchmark", "forward")


@dataclass
class BackwardInputs:
    """The eight backward inputs, in the benchmark's order. ``as_tuple()`` unpacks into
    ``swiglu_mlp_backward(*inputs.as_tuple())``."""

    grad_output: torch.Tensor  # [batch_size, seq_len, H]
    x: torch.Tensor  # [batch_size, seq_len, H]
    gate_output: torch.Tensor  # [batch_size, seq_len, I]
    up_output: torch.Tensor  # [batch_size, seq_len, I]
    activated_gate: torch.Tensor  # [batch_size, seq_len, I]
    gate_weight: torch.Tensor  # [I, H]
    up_weight: torch.Tensor  # [I, H]
    down_weight: torch.Tensor  # [H, I]

    def as_tuple(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


def make_inputs(
    batch_size: int,
    seq_len: int,
    hidden_size: int = HIDDEN_SIZE,
    intermediate_size: int = INTERMEDIATE_SIZE,
    *,
    mode: str = "benchmark",
    seed: int | None = BENCHMARK_SEED,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
) -> BackwardInputs:
    """Draw one set of backward inputs.

    Args:
        batch_size, seq_len: leading dimensions; tokens T = batch_size * seq_len.
        hidden_size, intermediate_size: H and I (default: Hermes-4-405B, 16384 and 53248).
        mode: ``"benchmark"`` (five independent N(0,1) activations) or ``"forward"``
            (gate_output, up_output, activated_gate from a forward pass over x).
        seed: seeds a fresh generator on ``device``; ignored when ``generator`` is given.
            ``None`` with no generator draws from the global RNG.
        generator: draw from this generator (successive calls give fresh inputs).
        device, dtype: where and in what dtype the tensors live (bf16 as in the benchmark).

    Returns: ``BackwardInputs`` with activations [batch_size, seq_len, *] and weights [I, H],
    [I, H], [H, I]; weights have std ``1/sqrt(fan_in)`` (1/128 and 1/sqrt(53248) at full size).

    Raises: ``ValueError`` for a non-positive size, an unknown mode or device, or the meta
    device; ``TypeError`` for a size that is not an int (bools included) or a dtype other than
    float16, bfloat16, float32 or float64.
    """
    for label, size in (
        ("batch_size", batch_size),
        ("seq_len", seq_len),
        ("hidden_size", hidden_size),
        ("intermediate_size", intermediate_size),
    ):
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"{label} must be a positive int, got {size!r} ({type(size).__name__})")
        if size <= 0:
            raise ValueError(f"{label} must be a positive int, got {size!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    from .checks import FLOAT_DTYPES

    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {list(FLOAT_DTYPES)}, got {dtype!r}")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must name a torch device ('cpu', 'cuda', 'cuda:1'), got {device!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={str(device)!r} but torch finds no CUDA GPU here (torch.cuda.is_available() is False); use device='cpu'"
        )
    if device.type == "meta":
        raise ValueError("device='meta' holds no values to draw; make the inputs on a real device")
    if generator is None and seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device, dtype=dtype)

    def weight(out_features: int, in_features: int) -> torch.Tensor:
        return randn(out_features, in_features) / math.sqrt(in_features)

    H, I = hidden_size, intermediate_size
    lead = (batch_size, seq_len)
    if mode == "benchmark":
        grad_output, x = randn(*lead, H), randn(*lead, H)
        gate_output, up_output, activated_gate = randn(*lead, I), randn(*lead, I), randn(*lead, I)
        gate_weight, up_weight, down_weight = weight(I, H), weight(I, H), weight(H, I)
    else:
        x = randn(*lead, H)
        gate_weight, up_weight, down_weight = weight(I, H), weight(I, H), weight(H, I)
        gate_output = x @ gate_weight.t()
        up_output = x @ up_weight.t()
        activated_gate = torch.nn.functional.silu(gate_output)
        grad_output = randn(*lead, H)
    return BackwardInputs(grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight)
