"""The implementations the harness times side by side, each behind one small interface.

Every implementation takes the eight backward inputs in the benchmark's order and returns the
four gradients, freshly allocated. ``build(device)`` runs once per case outside the timed region
(``torch.compile`` resets and wraps there); ``prepare(args)`` runs outside the timed region,
before every iteration where the call writes into its arguments (Liger's in-place kernel gets
fresh clones there), else once per input set (quack's interleaved layout).

Timing assumption (see ``swiglu_lab.bench.timing``): an implementation may use side streams but must
join the current stream before returning; the harness records CUDA events on the current stream.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Callable

import torch

from swiglu.reference import reference_backward
from . import quack_peer

BackwardFn = Callable[..., tuple[torch.Tensor, ...]]


def _identity(args: tuple) -> tuple:
    return args


@dataclass(frozen=True)
class BenchImpl:
    """One implementation as the harness runs it.

    name: the CSV ``impl`` value. note: what the row measures, written to every row.
    build: ``device -> callable`` run once per case, untimed. prepare: argument preparation,
    untimed. prepare_every_call: True when the call writes into what ``prepare`` made (Liger's
    clones), so it runs before every iteration (and its GPU work sits inside the power window);
    False for a read-only layout change (quack's interleave), made once per input set and reused,
    so neither the power window nor the clock it reads contains it. checks_correctness: False for
    stand-ins whose outputs are not the gradients (their ``correct`` is <NA>).
    """

    name: str
    note: str
    build: Callable[[torch.device], BackwardFn]
    prepare: Callable[[tuple], tuple] = field(default=_identity)
    checks_correctness: bool = True
    prepare_every_call: bool = True


# ----------------------------------------------------------------------------------- eager, compile
def _build_eager(device: torch.device) -> BackwardFn:
    return reference_backward


def _build_compile(mode: str | None) -> Callable[[torch.device], BackwardFn]:
    def build(device: torch.device) -> BackwardFn:
        # A fresh dynamo state per case: with dynamic=False every shape recompiles, and dynamo
        # silently falls back to eager past its recompile limit (8 by default).
        torch._dynamo.reset()
        return torch.compile(reference_backward, dynamic=False, mode=mode)

    return build


# ---------------------------------------------------------------------------- the six GEMMs alone
def cublas_gemms(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    gate_output: torch.Tensor,
    up_output: torch.Tensor,
    activated_gate: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """The reference's six GEMMs with its shapes and operand layouts, and no elementwise work:
    a lower bound for any approach built on cuBLAS (torch.matmul) GEMMs.

    The elementwise intermediates are replaced by inputs of the same shape: ``h`` by
    ``activated_gate``, ``d_gate`` by ``g = grad_output @ down_weight`` and ``d_up`` by
    ``up_output``. The reference's ``d_gate @ gate_weight + d_up @ up_weight`` becomes a GEMM and
    an in-place ``addmm_`` (beta = 1, the add folded into cuBLAS's epilogue). The outputs have the
    gradients' shapes but not their values.
    """
    go, xf = grad_output.reshape(-1, grad_output.shape[-1]), x.reshape(-1, x.shape[-1])
    up = up_output.reshape(-1, up_output.shape[-1])
    act = activated_gate.reshape(-1, activated_gate.shape[-1])
    g = go @ down_weight  # [T, I]
    grad_down_weight = go.t() @ act  # [H, I]
    grad_x = g @ gate_weight  # [T, H]
    grad_x.addmm_(up, up_weight)
    grad_gate_weight = g.t() @ xf  # [I, H]
    grad_up_weight = up.t() @ xf  # [I, H]
    return grad_x.reshape(x.shape), grad_gate_weight, grad_up_weight, grad_down_weight


# ------------------------------------------------------------------------------------------- liger
def make_liger_backward(swiglu_backward: Callable) -> BackwardFn:
    """The backward with Liger-Kernel's SiLU-mul backward kernel between cuBLAS GEMMs, as
    ``LigerSwiGLUMLP`` runs it.

    ``swiglu_backward(a, b, dc)`` is Liger's ``liger_kernel.ops.swiglu.swiglu_backward``: it
    overwrites ``a`` (gate_output) with d_gate and ``b`` (up_output) with d_up, recomputing
    ``silu(gate_output)`` instead of reading ``activated_gate``. So the returned function
    must be given clones of gate_output and up_output (``liger_prepare``), and its results equal
    the reference only when ``activated_gate == silu(gate_output)``; on the benchmark's
    independent inputs grad_x and grad_up_weight differ from the reference by design.
    """

    def liger_backward(grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight):
        go, xf = grad_output.reshape(-1, grad_output.shape[-1]), x.reshape(-1, x.shape[-1])
        n = gate_output.shape[-1]
        gate, up = gate_output.view(-1, n), up_output.view(-1, n)
        act = activated_gate.reshape(-1, n)
        g = go @ down_weight
        grad_down_weight = go.t() @ (act * up)  # before the kernel overwrites up
        d_gate, d_up = swiglu_backward(gate, up, g)
        d_gate, d_up = d_gate.view(-1, n), d_up.view(-1, n)
        grad_x = d_gate @ gate_weight + d_up @ up_weight
        grad_gate_weight = d_gate.t() @ xf
        grad_up_weight = d_up.t() @ xf
        return grad_x.reshape(x.shape), grad_gate_weight, grad_up_weight, grad_down_weight

    return liger_backward


def liger_prepare(args: tuple) -> tuple:
    """Fresh contiguous clones of gate_output and up_output (Liger writes into them)."""
    args = list(args)
    args[2] = args[2].contiguous().clone()
    args[3] = args[3].contiguous().clone()
    return tuple(args)


def _build_liger(device: torch.device) -> BackwardFn:
    from liger_kernel.ops.swiglu import swiglu_backward

    return make_liger_backward(swiglu_backward)


# ------------------------------------------------------------------------------------------ triton
def _build_triton(device: torch.device) -> BackwardFn:
    from swiglu.api import swiglu_mlp_backward

    importlib.import_module("swiglu.kernels.backward")  # raises here, not in a timed call, if Triton is absent
    return functools.partial(swiglu_mlp_backward, impl="triton")


def _build_triton_tl(device: torch.device) -> BackwardFn:
    from swiglu.kernels.backward import config_for, triton_swiglu_backward

    def triton_tl(*args):
        # An explicit config selects the tl kernel (its table entry) for dSwiGLU and the weight gradients.
        tokens = args[1].numel() // args[1].shape[-1]
        return triton_swiglu_backward(*args, configs={k: config_for(k, tokens) for k in ("dswiglu", "grad_weights")})

    return triton_tl


# -------------------------------------------------------------------------------------- registry
IMPLS: dict[str, BenchImpl] = {
    impl.name: impl
    for impl in (
        BenchImpl("eager", "swiglu.reference_backward (PyTorch eager, cuBLAS GEMMs)", _build_eager),
        BenchImpl(
            "compile",
            "torch.compile(reference_backward, dynamic=False), default mode; compile time in first_call_s",
            _build_compile(None),
        ),
        BenchImpl(
            "compile-max-autotune",
            'torch.compile(reference_backward, dynamic=False, mode="max-autotune-no-cudagraphs"): '
            "max-autotune without the CUDA graphs the protocol excludes; autotune time in first_call_s",
            _build_compile("max-autotune-no-cudagraphs"),
        ),
        BenchImpl(
            "cublas-gemms",
            "LOWER BOUND, not an implementation: the six GEMMs alone, no elementwise work; "
            "outputs are not the gradients (correct n/a)",
            lambda device: cublas_gemms,
            checks_correctness=False,
        ),
        BenchImpl(
            "liger",
            "Liger-Kernel swiglu_backward between cuBLAS GEMMs; gate/up cloned untimed before each "
            "call (written in place); recomputes silu(gate_output) instead of reading activated_gate, "
            "so it fails the reference check on the benchmark's independent inputs",
            _build_liger,
            prepare=liger_prepare,
        ),
        BenchImpl("triton", 'swiglu.swiglu_mlp_backward(..., impl="triton")', _build_triton),
        BenchImpl(
            "triton-tl",
            "ours with the tl kernels at every T (no Gluon): the same-run baseline of the Gluon "
            "kernels (swiglu.kernels.gluon_wgrad, swiglu.kernels.gluon_dswiglu)",
            _build_triton_tl,
        ),
        BenchImpl("quack", quack_peer.NOTE, quack_peer.build, prepare=quack_peer.to_quack_layout, prepare_every_call=False),
    )
}

#: Implementations run only when named in ``--impls`` (never by default): quack autotunes for
#: minutes on a shape its tuning cache lacks.
EXPLICIT_ONLY = ("quack",)

#: Run order (eager first: the speed-ups divide by it).
ORDER = tuple(IMPLS)


def unavailable_reason(name: str, device: torch.device) -> str | None:
    """Why implementation ``name`` cannot run on ``device`` (then it is skipped with this note),
    or None when it can be attempted. Raises ``ValueError`` for an unknown name."""
    if name not in IMPLS:
        raise ValueError(f"unknown impl {name!r}; expected some of {list(IMPLS)}")
    if device.type == "cpu":
        if name in ("compile-max-autotune", "liger"):
            return f"{name} is skipped in the CPU smoke mode"
        if name in ("triton", "triton-tl") and os.environ.get("TRITON_INTERPRET") != "1":
            return "triton on CPU needs TRITON_INTERPRET=1 (the Triton interpreter); skipped"
    if name == "quack":
        return quack_peer.unavailable_reason(device)
    if name == "liger" and importlib.util.find_spec("liger_kernel") is None:
        return "liger_kernel is not installed (pip install liger-kernel, or the lab's [liger] extra); skipped"
    return None


def default_impls(device: torch.device, max_autotune: bool = False) -> list[str]:
    """Every implementation that can run on ``device``; compile-max-autotune only when asked,
    ``EXPLICIT_ONLY`` ones never."""
    names = [n for n in ORDER if (n != "compile-max-autotune" or max_autotune) and n not in EXPLICIT_ONLY]
    return [n for n in names if unavailable_reason(n, device) is None]
