"""The SwiGLU MLP with our backward: ``swiglu_mlp``, its autograd and its ``torch.library`` ops.

``out = down_proj(silu(gate_proj(x)) * up_proj(x))`` (Llama/Hermes MLP, no biases). The backend
(``impl``) is resolved once per call at the public boundary, from a cache keyed by (device,
dtype, hidden_size, intermediate_size): "auto" never reaches the backward. Two carriers, one
backward route (``run_backward``):

* eager calls on plain tensors: ``_SwiGLUFunction``, an ``autograd.Function`` (two Python frames
  between autograd and the launcher);
* ``torch.compile`` tracing and tensor subclasses (DTensor under ``swiglu.parallel``): the custom
  ops ``swiglu::mlp_forward`` and ``swiglu::mlp_backward`` with fake implementations (no graph
  breaks) and DTensor sharding rules.

Memory-lean mode (``save_activated_gate=False``): two [T, I] activations saved, activated_gate
recomputed in the backward; the saved tensors are never written. ``reuse_saved_buffers=True``
(an explicit option) lets the eager Triton backward write d_gate/d_up over the saved gate/up and
free them (one [T, I] buffer allocated instead of three, two fewer at the backward's peak). The
forward allocates them and returns only ``out``, so only autograd reaches them, except through
a saved-tensor hook that keeps what it packs or a kept ``grad_fn.saved_tensors``: with the option
set, those read freed memory (which no public torch API lets us detect). It takes effect only
when autograd hands back the very tensors the forward saved (a hook that replaced them, e.g.
activation checkpointing or ``save_on_cpu``, turns it off for that call) and each spans its
whole storage.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import logging
import sys
import warnings
import weakref
from functools import lru_cache

import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F

from .checks import (
    bool_error,
    check_backward_inputs,
    check_floating,
    check_mlp_shapes,
    check_tensor,
    inputs_look_valid,
    spans_whole_storage,
)
from .reference import activated_gate_of, reference_gradients

#: The backends: ``impl=`` of ``swiglu_mlp``, ``SwiGLUMLP`` and ``swiglu_mlp_backward``.
IMPLS = ("auto", "reference", "triton")
#: ``swiglu_mlp(impl="auto")`` runs torch's ops (cuBLAS, autograd in C++) below this many
#: tokens x hidden_size x intermediate_size. Llama-3-8B's layer on one H200, 4-layer Hugging Face
#: step: at 512 tokens (3.0e10) the kernels' GPU time equals cuBLAS's (GPU busy 7.0 vs 7.1 ms), at
#: 1024 it gains 2.4% (12.2 vs 12.5) while the step is host-bound and the autograd.Function's host
#: time costs more (0.953x); at 2048 (1.2e11) the step is GPU-bound and gains (data/hf_step/).
AUTO_TORCH_OPS_BELOW = 2**36
_AUTOCAST_DEVICES = ("cuda", "cpu")
_log = logging.getLogger("swiglu")


#: The kernel modules once imported (an import statement costs host time at every call).
_KERNELS: dict = {}


def _triton():
    # Imported at first use: ``import swiglu`` does not import Triton.
    backend = _KERNELS.get("backward")
    if backend is None:
        from .kernels import backward as backend

        _KERNELS["backward"] = backend
    return backend


def _triton_forward():
    module = _KERNELS.get("forward")
    if module is None:
        from .kernels import forward as module

        _KERNELS["forward"] = module
    return module


# --------------------------------------------------------------------------- validation


def validate_forward_inputs(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    impl: str = "auto",
    *,
    hidden_size: int | None = None,
    intermediate_size: int | None = None,
    autocast: bool = False,
) -> None:
    """Check ``swiglu_mlp``'s arguments; raise ``TypeError``/``ValueError`` naming the argument.

    Expected: ``x`` [..., H] (any number of tokens, zero included); ``gate_weight`` and
    ``up_weight`` [I, H]; ``down_weight`` [H, I]; one floating dtype (any mix when ``autocast``:
    they are cast to autocast's dtype) and one device for all four; ``impl`` one of ``IMPLS``.
    ``hidden_size`` and ``intermediate_size``, when given (``SwiGLUMLP`` gives its own), are the
    declared sizes checked against (``swiglu.checks.check_mlp_shapes``: the argument named in a
    shape error is the one inconsistent with x and the declared sizes).
    """
    tensors = {"x": x, "gate_weight": gate_weight, "up_weight": up_weight, "down_weight": down_weight}
    for name, t in tensors.items():
        check_tensor(name, t)
    for name, t in tensors.items():
        check_floating(name, t)
        if t.dtype != x.dtype and not autocast:
            raise TypeError(f"{name} has dtype {t.dtype} but x has {x.dtype}; x and the weights must share one dtype")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; x and the weights must share one device")
    check_mlp_shapes(x, gate_weight, up_weight, down_weight, hidden_size=hidden_size, intermediate_size=intermediate_size)
    _check_impl(impl)


def _check_impl(impl) -> None:
    if not isinstance(impl, str):
        raise TypeError(f"impl must be a str, one of {list(IMPLS)}, got {type(impl).__name__}")
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {list(IMPLS)}, got {impl!r}")


# --------------------------------------------------------------------------- the backend decision


def auto_reason(
    device: torch.device | str,
    dtype: torch.dtype = torch.bfloat16,
    hidden_size: int | None = None,
    intermediate_size: int | None = None,
) -> str | None:
    """Why ``impl="auto"`` takes the reference rather than the Triton path for ``dtype`` inputs on
    ``device`` (None: it takes Triton). Triton needs all of: a CUDA device (the interpreter is for
    explicit ``"triton"`` only), bfloat16 (the kernels' dtype), an NVIDIA sm_90+ GPU whose shared
    memory fits the configuration tables and whose architecture they were tuned for
    (``swiglu.kernels.devices.device_reason`` and ``untuned_reason``), Triton installed, and, given
    the sizes, hidden_size and intermediate_size multiples of 8. Imports Triton only for a bf16
    CUDA device."""
    device = torch.device(device)
    if device.type != "cuda":
        return (
            f"impl='auto' takes the Triton path only on CUDA GPUs (got device {device}); "
            "under TRITON_INTERPRET=1 ask for the 'triton' implementation explicitly"
        )
    if dtype != torch.bfloat16:
        return f"the Triton kernels compute in bfloat16 (got {dtype}); cast to bfloat16 or use a bfloat16 autocast"
    try:
        backend = _triton()
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("triton"):
            raise
        return f"Triton is not installed ({e})"
    reason = backend.device_reason(device) or backend.untuned_reason(device)
    if reason is None and hidden_size is not None:
        reason = backend.sizes_reason(hidden_size, intermediate_size)
    return reason


def triton_reason(device: torch.device, hidden_size: int, intermediate_size: int) -> str | None:
    """Why explicit ``impl="triton"`` cannot run on ``device`` at these sizes (None when it can)."""
    if device.type == "meta":  # the interpreter would accept the device
        return "got meta tensors, which hold no data: use impl='reference' (it propagates shapes)"
    try:
        backend = _triton()
    except ImportError as e:
        return f"needs Triton, which is not importable ({e})"
    return backend.device_reason(device) or backend.sizes_reason(hidden_size, intermediate_size)


@lru_cache(maxsize=256)
def _resolve(impl: str, device: torch.device, dtype: torch.dtype, hidden: int, inter: int) -> str:
    if impl == "auto":
        reason = auto_reason(device, dtype, hidden, inter)
        if reason:
            _log.debug("impl='auto' -> 'reference': %s", reason)
            return "reference"
        return "triton"
    if impl == "triton":
        reason = triton_reason(device, hidden, inter)
        if reason:
            raise ValueError(f"impl='triton' {reason}")
        if dtype != torch.bfloat16:
            raise TypeError(f"impl='triton' needs bfloat16 x and weights, got {dtype}")
    return impl


def resolve_impl(impl: str, x: torch.Tensor, gate_weight: torch.Tensor) -> str:
    """The backend that runs for these inputs: ``"auto"`` -> ``"triton"`` where ``auto_reason``
    finds nothing against it, else ``"reference"`` (the reason logged at DEBUG level, logger
    ``swiglu``, once per key); ``"triton"`` where it cannot run is a ValueError (TypeError for
    a dtype other than bfloat16). Decided once per (impl, device, dtype, hidden_size,
    intermediate_size) and cached (``clear_plans`` forgets)."""
    _check_impl(impl)
    inter, hidden = gate_weight.shape
    return _resolve(impl, x.device, x.dtype, hidden, inter)


_CLEARS: list = []


def on_clear_plans(clear) -> None:
    """Call ``clear()`` from ``clear_plans`` (another op's cached decisions)."""
    _CLEARS.append(clear)


def clear_plans() -> None:
    """Forget every cached decision and launch plan (after faking device properties in a test,
    or changing the kernel tables or ``SWIGLU_GLUON`` in-process)."""
    _resolve.cache_clear()
    for clear in _CLEARS:
        clear()
    try:
        _triton().clear_plans()
    except ImportError:
        pass


# --------------------------------------------------------------------------- the backward route


def run_backward(
    tensors, needs: tuple[bool, bool, bool, bool], impl: str, consume: bool = False
) -> tuple[torch.Tensor | None, ...]:
    """The one route from every entry (``swiglu_mlp_backward``, the autograd formulas, the raw op)
    to the backends, for inputs already validated and ``impl`` already resolved ("reference" or
    "triton"). ``tensors``: the eight inputs in ``swiglu.checks.ARG_NAMES`` order
    (``activated_gate`` None: recomputed from gate_output with the forward's formula); ``needs``:
    which gradients (``GRAD_NAMES`` order), None for the others. ``consume`` (Triton only): write
    d_gate/d_up over gate_output/up_output and free them after their last reader."""
    if impl == "reference":
        if tensors[4] is None:
            tensors = (*tensors[:4], activated_gate_of(tensors[2]), *tensors[5:])
        return reference_gradients(tensors, needs)
    backend = _KERNELS.get("backward") or _triton()
    grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight = tensors
    inter, hidden = gate_weight.shape
    xf = _rows(x, hidden)
    plan = backend.backward_plan(xf.shape[0], hidden, inter, backend.plan_device(x.device))
    with on_device(x.device):
        grad_x, *grad_weights = backend.launch_backward(
            (
                _rows(grad_output, hidden),
                xf,
                _rows(gate_output, inter),
                _rows(up_output, inter),
                _rows(activated_gate, inter),
                gate_weight,
                up_weight,
                down_weight,
            ),
            plan=plan,
            needs=needs,
            overwrite_activations=consume,
            release_activations=consume,
        )
    # grad_x is contiguous: a view in x's shape (view_as parses faster than reshape's sizes).
    return (grad_x if grad_x is None or xf is x else grad_x.view_as(x), *grad_weights)


def _rows(t: torch.Tensor | None, size: int) -> torch.Tensor | None:
    # An activation [..., size] as [tokens, size] (a view where its strides allow).
    return t if t is None or t.dim() == 2 else t.reshape(-1, size)


def _autocast_type(x: torch.Tensor) -> str | None:
    """x's device type where an autocast region is active for it (``_AUTOCAST_DEVICES``), else None.
    (``is_cuda``/``is_cpu``: reading ``x.device.type`` costs more than the rest of the check.)"""
    device_type = "cuda" if x.is_cuda else "cpu" if x.is_cpu else None
    return device_type if device_type is not None and torch.is_autocast_enabled(device_type) else None


def _no_autocast(x: torch.Tensor):
    # The backends compute in their inputs' dtype, as the fake implementations promise, even when
    # a backward runs inside an autocast region. (The eager carrier's hot paths call
    # ``_autocast_type`` and enter no context manager outside autocast.)
    device_type = _autocast_type(x)
    return contextlib.nullcontext() if device_type is None else torch.autocast(device_type, enabled=False)


def _forward(x, gate_weight, up_weight, down_weight, impl: str, save_activated_gate: bool):
    """``(out, gate_output, up_output, activated_gate or None)``: the Triton forward where the
    lean mode's backward is Triton (its silu formula is the one that backward recomputes with),
    else nn.Linear's ops in nn.Linear's order (the same bits). Outside any autocast region."""
    device_type = _autocast_type(x)
    if device_type is not None:
        with torch.autocast(device_type, enabled=False):
            return _forward_ops(x, gate_weight, up_weight, down_weight, impl, save_activated_gate)
    return _forward_ops(x, gate_weight, up_weight, down_weight, impl, save_activated_gate)


def _forward_ops(x, gate_weight, up_weight, down_weight, impl: str, save_activated_gate: bool):
    if not save_activated_gate and impl == "triton":
        # Inputs validated, the Triton path resolved.
        with on_device(x.device):
            out, gate_output, up_output = (_KERNELS.get("forward") or _triton_forward()).run_forward(
                x, gate_weight, up_weight, down_weight
            )
        return out, gate_output, up_output, None
    gate_output = F.linear(x, gate_weight)
    activated_gate = activated_gate_of(gate_output)
    up_output = F.linear(x, up_weight)
    out = F.linear(activated_gate * up_output, down_weight)
    return out, gate_output, up_output, activated_gate if save_activated_gate else None


_SECOND_BACKWARD = (
    "swiglu: a second backward through a graph made with reuse_saved_buffers=True: the first one wrote its "
    "gradients over the saved gate/up activations. To backpropagate a graph more than once (also split "
    "backward passes, e.g. autograd.grad of x first and of the weights later), use "
    "reuse_saved_buffers=False (the default of SwiGLUMLP, swiglu_mlp and swiglu.integrations.transformers.apply) "
    "and pass retain_graph=True to every backward but the last"
)


def owns_saved_buffers(owned, *saved) -> bool:
    """Whether a backward may write over (and free) ``saved``: ``owned`` (weak references the
    forward took with ``reuse_saved_buffers``, else None) names exactly these tensors, each a
    whole allocation. Not when a saved-tensor hook handed back other tensors."""
    return (
        owned is not None
        and len(owned) == len(saved)
        and all(t is ref() for t, ref in zip(saved, owned))
        and all(spans_whole_storage(t) for t in saved)
    )


def _double_backward(grad_output, x, gate_weight, up_weight, down_weight, needs):
    # create_graph=True: the reference formula in differentiable PyTorch ops, on activations
    # recomputed from x and the weights (the saved ones carry no graph back to x).
    with _no_autocast(x):
        gate_output = F.linear(x, gate_weight)
        up_output = F.linear(x, up_weight)
        return reference_gradients(
            (grad_output, x, gate_output, up_output, F.silu(gate_output), gate_weight, up_weight, down_weight), needs
        )


class _SwiGLUFunction(torch.autograd.Function):
    """The eager carrier: forward saves x, the weights, gate/up (and activated_gate unless lean);
    backward calls ``run_backward`` with the impl the forward resolved."""

    @staticmethod
    def forward(ctx, x, gate_weight, up_weight, down_weight, impl, save_activated_gate, reuse_saved_buffers):
        out, gate_output, up_output, activated_gate = _forward(x, gate_weight, up_weight, down_weight, impl, save_activated_gate)
        ctx.save_for_backward(x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight)
        ctx.impl = impl
        # What the backward may consume: the forward's own gate/up, recognized by identity.
        ctx.owned = (
            (weakref.ref(gate_output), weakref.ref(up_output))
            if reuse_saved_buffers and impl == "triton" and not save_activated_gate
            else None
        )
        ctx.consumed = False
        return out

    @staticmethod
    def backward(ctx, grad_output):
        needs = ctx.needs_input_grad[:4]
        if not any(needs):
            return None, None, None, None, None, None, None
        if ctx.consumed:
            raise RuntimeError(_SECOND_BACKWARD)
        x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight = ctx.saved_tensors
        if torch.is_grad_enabled():
            grads = _double_backward(grad_output, x, gate_weight, up_weight, down_weight, needs)
            return (*grads, None, None, None)
        if torch.compiler.is_compiling() or legacy_batched(grad_output):
            # Compiled autograd traces this backward: the custom op is opaque to it, the
            # launcher's Python is not (and buffers are never consumed there). A batched
            # grad_output (``legacy_batched``): the op, once per example.
            grads = mlp_backward(
                grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight, *needs, ctx.impl
            )
            return (*(g if need else None for g, need in zip(grads, needs)), None, None, None)
        consume = owns_saved_buffers(ctx.owned, gate_output, up_output)
        ctx.consumed = consume  # before the launch: a failure after the overwrite must not let a retry read them
        tensors = (grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight)
        device_type = _autocast_type(x)
        if device_type is None:
            grads = run_backward(tensors, needs, ctx.impl, consume)
        else:
            with torch.autocast(device_type, enabled=False):
                grads = run_backward(tensors, needs, ctx.impl, consume)
        return (*grads, None, None, None)


# --------------------------------------------------------------------------- custom ops


@torch.library.custom_op("swiglu::mlp_forward", mutates_args=())
def mlp_forward(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    impl: str,
    save_activated_gate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, gate_output, up_output, activated_gate)`` of the SwiGLU MLP, as ``nn.Linear``
    computes it (same ops, same order, same bits); ``impl`` ("auto", "reference" or "triton")
    is resolved here and stored for the backward. ``save_activated_gate=False``: the fourth
    output is an empty ``[0]`` tensor, and where the backward is Triton the forward is
    ``swiglu.kernels.forward.triton_swiglu_forward`` (activated_gate may then differ from
    F.silu's by one bf16 ulp)."""
    validate_forward_inputs(x, gate_weight, up_weight, down_weight, impl)
    impl = resolve_impl(impl, x, gate_weight)
    out, gate_output, up_output, act = _forward(x, gate_weight, up_weight, down_weight, impl, save_activated_gate)
    return out, gate_output, up_output, x.new_empty(0) if act is None else act


@mlp_forward.register_fake
def _mlp_forward_fake(x, gate_weight, up_weight, down_weight, impl, save_activated_gate=True):
    lead = tuple(x.shape[:-1])
    inter, hidden = gate_weight.shape
    out = x.new_empty(lead + (hidden,))
    act = x.new_empty(lead + (inter,)) if save_activated_gate else x.new_empty(0)
    return out, x.new_empty(lead + (inter,)), x.new_empty(lead + (inter,)), act


@torch.library.custom_op("swiglu::mlp_backward", mutates_args=())
def mlp_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    gate_output: torch.Tensor,
    up_output: torch.Tensor,
    activated_gate: torch.Tensor | None,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    need_grad_x: bool,
    need_grad_gate_weight: bool,
    need_grad_up_weight: bool,
    need_grad_down_weight: bool,
    impl: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The four gradients (contiguous); a gradient not requested is an empty ``[0]`` tensor (a
    custom op cannot return None) and its GEMMs never run. ``activated_gate`` None: recomputed
    from gate_output (memory-lean mode). Never writes an input."""
    # A cheap check for direct callers (the autograd formula's inputs pass it at once).
    check_backward_inputs(
        grad_output,
        x,
        gate_output,
        up_output,
        gate_output if activated_gate is None else activated_gate,
        gate_weight,
        up_weight,
        down_weight,
        any_rank=True,
    )
    impl = resolve_impl(impl, x, gate_weight)
    needs = (need_grad_x, need_grad_gate_weight, need_grad_up_weight, need_grad_down_weight)
    with _no_autocast(x):
        grads = run_backward(
            (grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight), needs, impl
        )
    return tuple(g.contiguous() if need else x.new_empty(0) for g, need in zip(grads, needs))


def split_backward_args(args) -> tuple[tuple, tuple[bool, bool, bool, bool], str]:
    """``(tensors, needs, impl)`` from ``mlp_backward``'s arguments in its schema's order (the
    eight tensors in ``ARG_NAMES`` order, the four need_grad_* flags, impl), as the dispatcher
    passes them to the op's fake kernel and to its sharding rule (``swiglu.parallel``)."""
    return args[:8], args[8:12], args[12]


@mlp_backward.register_fake
def _mlp_backward_fake(*args):
    (_, x, _, _, _, *weights), needs, _ = split_backward_args(args)
    shapes = (x.shape, *(w.shape for w in weights))
    return tuple(x.new_empty(shape if need else (0,)) for shape, need in zip(shapes, needs))


def _setup_context(ctx, inputs, output):
    x, gate_weight, up_weight, down_weight, impl = inputs[:5]
    save_activated_gate = inputs[5] if len(inputs) > 5 else True
    _, gate_output, up_output, activated_gate = output
    ctx.save_for_backward(
        x, gate_output, up_output, activated_gate if save_activated_gate else None, gate_weight, up_weight, down_weight
    )
    ctx.mark_non_differentiable(gate_output, up_output, activated_gate)
    ctx.set_materialize_grads(False)  # no zero-filled [T, I] gradients for the three activations
    ctx.impl = impl  # as given under torch.compile; mlp_backward's body resolves it (cached)


def _op_backward(ctx, grad_output, *unused_grads):
    needs = tuple(bool(n) for n in ctx.needs_input_grad[:4])
    if grad_output is None or not any(needs):
        return None, None, None, None, None, None
    x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight = ctx.saved_tensors
    if torch.is_grad_enabled():
        return (*_double_backward(grad_output, x, gate_weight, up_weight, down_weight, needs), None, None)
    grads = mlp_backward(
        grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight, *needs, ctx.impl
    )
    return tuple(g if need else None for g, need in zip(grads, needs)) + (None, None)


mlp_forward.register_autograd(_op_backward, setup_context=_setup_context)


def _backward_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:8])
    ctx.needs = tuple(inputs[8:12])


def _backward_of_backward(ctx, *cotangents):
    """Gradients of ``mlp_backward``'s outputs: the reference formula's vector-Jacobian product
    (``torch.func.vjp``, traceable by torch.compile), whichever backend computed the values."""
    tensors, needs = ctx.saved_tensors, ctx.needs
    wanted = tuple(bool(w) for w in ctx.needs_input_grad[:8])
    grads = [None] * 8
    index = [i for i in range(8) if wanted[i] and tensors[i] is not None]
    kept = [(c, n) for c, n in zip(cotangents, needs) if n]
    if index and kept and not all(c is None for c, _ in kept):

        def formula(*primals):
            ts = list(tensors)
            for i, p in zip(index, primals):
                ts[i] = p
            if ts[4] is None:
                ts[4] = activated_gate_of(ts[2])
            return tuple(g for g, n in zip(reference_gradients(tuple(ts), needs), needs) if n)

        with _no_autocast(tensors[1]):
            outs, vjp = torch.func.vjp(formula, *(tensors[i] for i in index))
            ct = tuple(torch.zeros_like(o) if c is None else c.reshape(o.shape) for o, (c, _) in zip(outs, kept))
            for i, g in zip(index, vjp(ct)):
                grads[i] = g
    return (*grads, None, None, None, None, None)


mlp_backward.register_autograd(_backward_of_backward, setup_context=_backward_setup_context)


# --------------------------------------------------------------------------- FLOP formulas


def _gemm_sizes(x_shape, gate_weight_shape) -> tuple[int, int, int]:
    tokens = 1
    for d in x_shape[:-1]:
        tokens *= d
    inter, hidden = gate_weight_shape
    return tokens, hidden, inter


def _mlp_forward_flops(x_shape, gate_weight_shape, *args, out_shape=None, **kwargs) -> int:
    """Three GEMMs of 2 T H I FLOPs each (gate, up, down)."""
    tokens, hidden, inter = _gemm_sizes(x_shape, gate_weight_shape)
    return 6 * tokens * hidden * inter


def _mlp_backward_flops(
    grad_output_shape,
    x_shape,
    gate_output_shape,
    up_output_shape,
    activated_gate_shape,
    gate_weight_shape,
    up_weight_shape,
    down_weight_shape,
    need_grad_x,
    need_grad_gate_weight,
    need_grad_up_weight,
    need_grad_down_weight,
    *args,
    out_shape=None,
    **kwargs,
) -> int:
    """The GEMMs the requested gradients run, 2 T H I FLOPs each: g = grad_output @ down_weight
    (for any of grad_x, grad_gate_weight, grad_up_weight), grad_x's two, one per weight gradient."""
    tokens, hidden, inter = _gemm_sizes(x_shape, gate_weight_shape)
    gemms = (
        2 * need_grad_x
        + need_grad_gate_weight
        + need_grad_up_weight
        + need_grad_down_weight
        + (need_grad_x or need_grad_gate_weight or need_grad_up_weight)
    )
    return 2 * gemms * tokens * hidden * inter


_FLOP_FORMULAS = [("mlp_forward", _mlp_forward_flops), ("mlp_backward", _mlp_backward_flops)]


def _register_flop_formulas(flop_counter, formulas=None) -> None:
    for op, formula in _FLOP_FORMULAS if formulas is None else formulas:
        flop_counter.register_flop_formula(getattr(torch.ops.swiglu, op))(formula)


def add_flop_formula(op: str, formula) -> None:
    """Count ``torch.ops.swiglu.<op>`` under ``FlopCounterMode`` with ``formula`` (its input
    shapes -> FLOPs): at once if ``torch.utils.flop_counter`` is imported, else when it is."""
    _FLOP_FORMULAS.append((op, formula))
    if _OnFlopCounterImport.name in sys.modules:
        _register_flop_formulas(sys.modules[_OnFlopCounterImport.name], [(op, formula)])


class _OnFlopCounterImport(importlib.abc.MetaPathFinder):
    """Registers the formulas when ``torch.utils.flop_counter`` is first imported: importing it
    here would import Triton with ``import swiglu`` (flop_counter imports it)."""

    name = "torch.utils.flop_counter"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def exec_and_register(module):
                exec_module(module)
                _register_flop_formulas(module)

            spec.loader.exec_module = exec_and_register
        return spec


if _OnFlopCounterImport.name in sys.modules:
    _register_flop_formulas(sys.modules[_OnFlopCounterImport.name])
else:
    sys.meta_path.insert(0, _OnFlopCounterImport())


# --------------------------------------------------------------------------- functional API


def swiglu_mlp(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    *,
    impl: str = "auto",
    save_activated_gate: bool = False,
    reuse_saved_buffers: bool = False,
    backward_impl: str | None = None,
) -> torch.Tensor:
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` with our backward, differentiable in all four.

    Args:
        x: [..., H], any strides; zero tokens give an empty out and zero weight gradients.
        gate_weight, up_weight: [I, H]; down_weight: [H, I] (``nn.Linear`` layout), x's floating
            dtype and device (under ``torch.autocast`` all four are cast to its dtype).
        impl: ``"auto"`` | ``"reference"`` | ``"triton"`` as ``swiglu_mlp_backward``
            (``backward_impl``: its former name); "auto" runs torch's own ops (nn.Linear's bits)
            where it picks Triton but tokens x H x I < ``AUTO_TORCH_OPS_BELOW``.
        save_activated_gate: False (memory-lean: 2 saved [T, I] tensors, activated_gate recomputed
            with the forward's formula); True: 3 saved, ``nn.Linear``'s forward bit for bit.
        reuse_saved_buffers: lean mode on the eager Triton path: the backward writes d_gate/d_up
            over the saved gate/up and frees them (not with a saved-tensor hook that keeps what it
            packs). False (default): saved tensors are never written.

    Returns: out [..., H] in x's dtype (autocast's under autocast). Double backward and
    ``torch.func`` transforms run the reference formula in differentiable ops (docs/usage.md).

    Raises:
        TypeError: a non-tensor, a non-floating or mismatched dtype, ``"triton"`` with a dtype
            other than bf16, a non-str ``impl`` or non-bool ``save_activated_gate``.
        ValueError: mismatched shapes (naming the argument) or devices, an empty H or I, an
            unknown ``impl``, ``"triton"`` where it cannot run.
        RuntimeError: at backward, a second backward through a graph whose buffers were reused.
    """
    if backward_impl is not None:
        impl = _renamed(backward_impl, impl)
    return _swiglu_mlp(x, gate_weight, up_weight, down_weight, impl, save_activated_gate, reuse_saved_buffers)


def _renamed(backward_impl: str, impl: str) -> str:
    if impl != "auto" and impl != backward_impl:
        raise ValueError(f"got impl={impl!r} and its former name backward_impl={backward_impl!r}; pass impl only")
    warnings.warn("backward_impl= is now impl=", DeprecationWarning, stacklevel=3)
    return backward_impl


def _swiglu_mlp(
    x,
    gate_weight,
    up_weight,
    down_weight,
    impl,
    save_activated_gate,
    reuse_saved_buffers=False,
    hidden_size=None,
    intermediate_size=None,
):
    """``swiglu_mlp`` checked against declared sizes (``SwiGLUMLP``): validate once, decide once."""
    if save_activated_gate is not True and save_activated_gate is not False:
        raise bool_error("save_activated_gate", save_activated_gate)
    if reuse_saved_buffers is not True and reuse_saved_buffers is not False:
        raise bool_error("reuse_saved_buffers", reuse_saved_buffers)
    autocast = _autocast_type(x) if isinstance(x, torch.Tensor) else None
    if autocast is not None or not inputs_look_valid(
        x, gate_weight, up_weight, down_weight, hidden_size=hidden_size, intermediate_size=intermediate_size
    ):
        validate_forward_inputs(
            x,
            gate_weight,
            up_weight,
            down_weight,
            impl,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            autocast=autocast is not None,
        )
    given = x, gate_weight, up_weight, down_weight
    if autocast is not None:
        # What autocast does to nn.Linear: compute in its dtype (the casts' autograd returns
        # float32 gradients to float32 master weights).
        dtype = torch.get_autocast_dtype(autocast)
        x, gate_weight, up_weight, down_weight = (t.to(dtype) for t in (x, gate_weight, up_weight, down_weight))
    if torch.compiler.is_compiling():
        # The custom ops resolve impl in their bodies, at run time (the device queries behind
        # the decision are not traceable); the cached decision costs nothing there. Under a
        # torch.func transform (compile of grad, vmap...) the plain formula, as eager.
        _check_impl(impl)
        if transforms_active():
            return _plain_mlp(x, gate_weight, up_weight, down_weight)
        return mlp_forward(x, gate_weight, up_weight, down_weight, impl, save_activated_gate)[0]
    auto = impl == "auto"
    impl = resolve_impl(impl, x, gate_weight)
    if auto and impl == "triton" and x.numel() * gate_weight.shape[0] < AUTO_TORCH_OPS_BELOW:
        # Too little work for the kernels to gain GPU time over cuBLAS, while an autograd.Function
        # costs host time where the step waits on the host: torch's ops, nn.Linear's bits (on the
        # given tensors: autocast casts x per linear, so grad_x sums its two parts in x's dtype).
        x, gate_weight, up_weight, down_weight = given
        return _plain_mlp(x, gate_weight, up_weight, down_weight)
    if transforms_active() or has_tangent(x, gate_weight, up_weight, down_weight):
        # torch.func (grad, vmap, jacrev...) and forward-mode AD: the same formula in plain
        # differentiable ops, which every transform supports (the kernels cannot read functorch's
        # wrapped tensors, and the autograd.Function has no jvp).
        return _plain_mlp(x, gate_weight, up_weight, down_weight)
    if autocast is not None:
        with torch.autocast(autocast, enabled=False):
            return _eager(x, gate_weight, up_weight, down_weight, impl, save_activated_gate, reuse_saved_buffers)
    return _eager(x, gate_weight, up_weight, down_weight, impl, save_activated_gate, reuse_saved_buffers)


def _plain_mlp(x, gate_weight, up_weight, down_weight):
    # nn.Linear's ops in nn.Linear's order (its bits), differentiable by every transform.
    return F.linear(F.silu(F.linear(x, gate_weight)) * F.linear(x, up_weight), down_weight)


def _eager(x, gate_weight, up_weight, down_weight, impl, save_activated_gate, reuse_saved_buffers):
    # Plain tensors and no dispatch mode: the autograd.Function; else the custom op.
    plain = PLAIN_TENSOR_TYPES
    if (
        type(x) in plain
        and type(gate_weight) in plain
        and type(up_weight) in plain
        and type(down_weight) in plain
        and not dispatch_mode_active()
    ):
        return _SwiGLUFunction.apply(x, gate_weight, up_weight, down_weight, impl, save_activated_gate, reuse_saved_buffers)
    return mlp_forward(x, gate_weight, up_weight, down_weight, impl, save_activated_gate)[0]


def transforms_active() -> bool:
    """Whether a ``torch.func`` transform (grad, vmap, jacrev...) is running: its wrapped tensors
    have no storage the kernels could read. torch has no public query for it."""
    return torch._C._are_functorch_transforms_active()


def vmapped(t: torch.Tensor) -> bool:
    """Whether ``t`` is batched by ``torch.func.vmap`` at some level of the transforms wrapping it
    (call only where ``transforms_active``): its values cannot be read. torch has no public query
    for it."""
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(t):
        if functorch.is_batchedtensor(t):
            return True
        t = functorch.get_unwrapped(t)
    return False


def has_tangent(*tensors) -> bool:
    """Whether forward-mode AD (``torch.autograd.forward_ad``) carries a tangent on any of
    ``tensors`` (one integer compare outside a dual level). torch has no public query for the level."""
    return fwAD._current_level >= 0 and any(fwAD.unpack_dual(t).tangent is not None for t in tensors)


def on_device(device: torch.device):
    """A context in which ``device`` is the current CUDA device (a no-op where it already is, or
    off CUDA): Triton launches on the current device whatever its arguments' device, so a model
    spread over GPUs (``device_map="auto"``, pipeline stages) would run its layers' kernels on the
    wrong one."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return _SAME_DEVICE


_SAME_DEVICE = contextlib.nullcontext()


def legacy_batched(t: torch.Tensor | None) -> bool:
    """Whether ``t`` is a batched tensor of torch's older vmap, which ``autograd.grad(...,
    is_grads_batched=True)`` and ``autograd.functional.jacobian(vectorize=True)`` run a backward
    under: it has no storage the kernels could read; the custom ops' backward takes it (that vmap
    runs an op without a batching rule once per example). torch has no public query for it."""
    return t is not None and torch._C._functorch.is_legacy_batchedtensor(t)


def dispatch_mode_active() -> bool:
    """Whether a ``TorchDispatchMode`` (``FlopCounterMode``, ``FakeTensorMode``, selective
    activation checkpointing...) is active: the eager call then takes the custom ops, which such
    modes see (with their FLOP formulas) where the Triton launches are invisible to them. torch
    has no public query for it."""
    return torch._C._len_torch_dispatch_stack() > 0


#: A tensor or parameter, not a subclass (DTensor and other wrappers take the custom op, whose
#: dispatch they implement).
PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
