"""The SwiGLU MLP as ``torch.library`` custom ops with autograd: ``swiglu_mlp`` and its two ops.

``out = down_proj(silu(gate_proj(x)) * up_proj(x))`` (Llama/Hermes MLP, no biases).

* ``swiglu::mlp_forward(x, gate_weight, up_weight, down_weight, backward_impl, save_activated_gate)``
  returns ``(out, gate_output, up_output, activated_gate)``; the last three are what the backward
  needs (they are marked non-differentiable: only ``out`` carries a gradient). Memory-lean mode
  (``save_activated_gate=False``, the default of ``swiglu_mlp``): activated_gate comes back empty
  (``[0]``), is not saved, and the backward recomputes it from gate_output with the forward's
  formula (``reference.activated_gate_of`` on the PyTorch path; ``kernels._activated_gate`` in the
  Triton forward, ``swiglu.kernels.forward``, and in the Triton backward's epilogue).
* ``swiglu::mlp_backward_lean`` (same arguments less activated_gate): the memory-lean backward on
  the Triton path, writing d_gate/d_up over the saved gate_output/up_output (declared mutated).
  The autograd formula calls it only on buffers nothing else can reach: the node saves its own
  aliases of the forward's gate/up outputs, and the backward consumes them only when no other
  tensor shares their storage and nothing else holds them (``_sole_owner``: a caller that kept
  the op's outputs, a view or ``.detach()`` of them, a saved-tensor hook such as an offloader
  or ``save_on_cpu`` or non-reentrant checkpointing, ``grad_fn.saved_tensors`` kept). Otherwise
  it runs ``swiglu::mlp_backward``, which leaves them as they are: the same gradients, bit for
  bit, one more [T, I] buffer at the peak.
* ``swiglu::mlp_backward(grad_output, x, gate_output, up_output, activated_gate, gate_weight,
  up_weight, down_weight, need_grad_x, need_grad_gate_weight, need_grad_up_weight,
  need_grad_down_weight, impl)`` returns the four gradients. A custom op cannot return ``None``,
  so a gradient that is not needed comes back as an empty tensor (shape ``[0]``) and the autograd
  formula maps it to ``None``; its GEMMs are never run.

Both ops have fake (meta) implementations, so ``torch.compile(fullgraph=True)`` traces them
without graph breaks. Backward dispatch (``backward_impl``): ``"triton"`` is
``swiglu.kernels.backward.triton_swiglu_backward`` (bf16; an NVIDIA sm_90+ GPU whose shared memory
fits the tables, not ROCm, or any device under ``TRITON_INTERPRET=1``); ``"reference"`` is the benchmark's order of operations
(``swiglu.reference``) with the GEMMs of unneeded gradients skipped, in the inputs' dtype;
``"auto"`` picks triton for bf16 CUDA tensors on a GPU the configuration tables were tuned for
(sm_90) whose shared memory fits them, and the reference otherwise (``auto_reason``;
``swiglu.backend_reason`` is its public form).
``swiglu::mlp_backward`` takes ``activated_gate=None`` for the memory-lean mode.

Double backward: under ``create_graph=True`` the autograd formula does not call
``swiglu::mlp_backward`` (which has no derivative of its own) but the reference formula in plain
differentiable ops, on gate/up activations recomputed from the saved x and weights.
"""

import contextlib
import importlib
import logging
import sys

import torch
import torch.nn.functional as F

from .reference import activated_gate_of, reference_backward
from .checks import FLOAT_DTYPES, check_mlp_shapes, validate_backward_inputs

BACKWARD_IMPLS = ("auto", "reference", "triton")
# Under torch.autocast on these devices the forward op runs in bfloat16 (our kernels' dtype).
_AUTOCAST_DEVICES = ("cuda", "cpu")
_TRITON_MODULE = "swiglu.kernels.backward"
_log = logging.getLogger("swiglu")


# --------------------------------------------------------------------------- validation


def validate_forward_inputs(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    backward_impl: str = "auto",
    *,
    hidden_size: int | None = None,
    intermediate_size: int | None = None,
) -> None:
    """Check ``swiglu_mlp``'s arguments; raise ``TypeError``/``ValueError`` naming the argument.

    Expected: ``x`` [..., H] (any number of tokens, zero included); ``gate_weight`` and
    ``up_weight`` [I, H]; ``down_weight`` [H, I]; one floating dtype and one device for all four;
    ``backward_impl`` one of ``BACKWARD_IMPLS`` (``"triton"`` needs bfloat16). Inside an autocast
    region on x's device the dtypes need not match (autocast casts all four to bfloat16).
    ``hidden_size`` and ``intermediate_size``, when given (``SwiGLUMLP`` gives its own), are the
    declared H and I that x and the weights are checked against; otherwise H is x's and I the
    weights' (see ``swiglu.checks.check_mlp_shapes``: the argument named in a shape error is
    the one inconsistent with x and the declared sizes).
    """
    tensors = {"x": x, "gate_weight": gate_weight, "up_weight": up_weight, "down_weight": down_weight}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    autocast = x.device.type in _AUTOCAST_DEVICES and torch.is_autocast_enabled(x.device.type)
    for name, t in tensors.items():
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must have a floating dtype ({', '.join(map(str, FLOAT_DTYPES))}), got {t.dtype}")
        if t.dtype != x.dtype and not autocast:
            raise TypeError(f"{name} has dtype {t.dtype} but x has {x.dtype}; x and the weights must share one dtype")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; x and the weights must share one device")
    check_mlp_shapes(x, gate_weight, up_weight, down_weight, hidden_size=hidden_size,
                     intermediate_size=intermediate_size)
    if backward_impl not in BACKWARD_IMPLS:
        raise ValueError(f"backward_impl must be one of {BACKWARD_IMPLS}, got {backward_impl!r}")
    if backward_impl == "triton" and x.dtype != torch.bfloat16 and not autocast:
        raise TypeError(f"backward_impl='triton' needs bfloat16 x and weights, got {x.dtype}")


def _triton_problem(x: torch.Tensor, gate_weight: torch.Tensor) -> str | None:
    """Why the Triton backward cannot run on these tensors (None when it can). Imports
    ``swiglu.kernels.backward`` (an ImportError propagates)."""
    return importlib.import_module(_TRITON_MODULE).unsupported_reason(x, gate_weight)


# --------------------------------------------------------------------------- backward kernels


def auto_reason(device: torch.device | str, dtype: torch.dtype = torch.bfloat16, gate_weight: torch.Tensor | None = None,
                x: torch.Tensor | None = None) -> str | None:
    """Why ``backward_impl="auto"`` takes the reference rather than the Triton path for inputs of
    ``dtype`` on ``device`` (None: it takes Triton). Triton needs all of: a CUDA device (the
    interpreter is for explicit ``"triton"`` only), bfloat16 (the kernels' dtype: float16
    takes the reference), an NVIDIA sm_90+ GPU whose shared memory fits the configuration
    tables and whose architecture they were tuned for (``swiglu.kernels.common.device_reason``
    and ``untuned_reason``: sm_90 today), Triton installed, and, given the tensors, hidden_size
    and intermediate_size multiples of 8. Imports Triton only for a bf16 CUDA device."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"impl='auto' takes the Triton path only on CUDA GPUs (got device {device}); " \
               "under TRITON_INTERPRET=1 ask for the 'triton' implementation explicitly"
    if dtype != torch.bfloat16:
        return f"the Triton kernels compute in bfloat16 (got {dtype}); cast to bfloat16 or use torch.autocast"
    try:
        common = importlib.import_module(_TRITON_MODULE)  # registers its table's shared memory
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("triton"):
            raise
        return f"Triton is not installed ({e})"
    reason = common.device_reason(device) or common.untuned_reason(device)
    if reason is None and x is not None and gate_weight is not None:
        reason = _triton_problem(x, gate_weight)
    return reason


def resolve_backward_impl(backward_impl: str, x: torch.Tensor, gate_weight: torch.Tensor) -> str:
    """``"auto"`` -> ``"triton"`` where ``auto_reason`` finds nothing against it (bf16 CUDA tensors
    on a tuned NVIDIA GPU that fits, sizes multiples of 8), ``"reference"`` otherwise, with the
    reason logged at DEBUG level (logger ``swiglu``); other names are returned unchanged."""
    if backward_impl != "auto":
        return backward_impl
    reason = auto_reason(x.device, x.dtype, gate_weight, x)
    if reason:
        _log.debug("backward_impl='auto' -> 'reference': %s", reason)
        return "reference"
    return "triton"


def run_backward(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    gate_output: torch.Tensor,
    up_output: torch.Tensor,
    activated_gate: torch.Tensor | None,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    *,
    need_grad_x: bool,
    need_grad_gate_weight: bool,
    need_grad_up_weight: bool,
    need_grad_down_weight: bool,
    impl: str,
    overwrite_activations: bool = False,
    release_activations: bool = False,
) -> tuple[torch.Tensor | None, ...]:
    """Dispatch the backward to ``impl`` (see ``resolve_backward_impl``); ``None`` for each
    gradient not requested. The eager body of ``swiglu::mlp_backward``. ``activated_gate`` None:
    recomputed from gate_output with the formula the forward used (memory-lean mode).
    ``overwrite_activations`` / ``release_activations``: the Triton backward writes d_gate/d_up
    over gate_output and up_output, then frees their storage after its last read
    (``swiglu::mlp_backward_lean``); the reference leaves them as they are."""
    needs = dict(
        need_grad_x=need_grad_x,
        need_grad_gate_weight=need_grad_gate_weight,
        need_grad_up_weight=need_grad_up_weight,
        need_grad_down_weight=need_grad_down_weight,
    )
    impl = resolve_backward_impl(impl, x, gate_weight)
    if impl == "reference":
        # The raw ops reach this without the public entry points' checks (the Triton launcher has its
        # own): check on [tokens, size] views (the module passes x of any rank; no view: no copy, no check).
        acts = [grad_output, x, gate_output, up_output, gate_output if activated_gate is None else activated_gate]
        flat = [t.view(-1, t.shape[-1]) if isinstance(t, torch.Tensor) and t.dim() > 3 and t.is_contiguous() else t
                for t in acts]
        if all(not isinstance(t, torch.Tensor) or t.dim() <= 3 for t in flat):
            validate_backward_inputs(*flat, gate_weight, up_weight, down_weight)
        if activated_gate is None:
            activated_gate = activated_gate_of(gate_output)
        return reference_backward(
            grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight, **needs
        )
    if impl != "triton":
        raise ValueError(f"backward_impl must be one of {BACKWARD_IMPLS}, got {impl!r}")
    # The Triton launcher takes [T, *] or [B, S, *]: flatten any leading dims (views when possible).
    flat = [None if t is None else t.reshape(-1, t.shape[-1])
            for t in (grad_output, x, gate_output, up_output, activated_gate)]
    fn = importlib.import_module(_TRITON_MODULE).triton_swiglu_backward
    grad_x, *grad_weights = fn(*flat, gate_weight, up_weight, down_weight, **needs,
                               overwrite_activations=overwrite_activations,
                               release_activations=release_activations)
    return (None if grad_x is None else grad_x.reshape(x.shape), *grad_weights)


# --------------------------------------------------------------------------- custom ops


def _no_autocast(x: torch.Tensor):
    # The ops compute in their inputs' dtype, as their fake implementations promise, even when
    # called (e.g. a backward) inside an autocast region.
    return torch.autocast(x.device.type, enabled=False) if x.device.type in _AUTOCAST_DEVICES else contextlib.nullcontext()


@torch.library.custom_op("swiglu::mlp_forward", mutates_args=())
def mlp_forward(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    backward_impl: str,
    save_activated_gate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, gate_output, up_output, activated_gate)`` of the SwiGLU MLP, as ``nn.Linear``
    computes it (same ops, same order, same bits). ``backward_impl`` is checked here (the Triton
    path must be runnable) and stored for the backward. ``save_activated_gate=False``: the
    fourth output is an empty ``[0]`` tensor, and where the backward resolves to Triton the
    forward is ``swiglu.kernels.forward.triton_swiglu_forward`` (its silu formula is the one the Triton
    backward recomputes with; activated_gate may then differ from F.silu's by one bf16 ulp)."""
    if backward_impl == "triton":
        problem = _triton_problem(x, gate_weight)
        if problem:
            # The kernels room names its argument impl=; here it is backward_impl=.
            raise ValueError(f"backward_impl='triton' {problem}".replace(" impl='", " backward_impl='"))
    validate_forward_inputs(x, gate_weight, up_weight, down_weight, backward_impl)  # also for the raw op
    if not save_activated_gate and resolve_backward_impl(backward_impl, x, gate_weight) == "triton":
        from .kernels.forward import triton_swiglu_forward

        with _no_autocast(x):
            out, gate_output, up_output = triton_swiglu_forward(x, gate_weight, up_weight, down_weight)
        return out, gate_output, up_output, x.new_empty(0)
    with _no_autocast(x):
        gate_output = F.linear(x, gate_weight)
        activated_gate = activated_gate_of(gate_output)
        up_output = F.linear(x, up_weight)
        out = F.linear(activated_gate * up_output, down_weight)
    return out, gate_output, up_output, activated_gate if save_activated_gate else x.new_empty(0)


@mlp_forward.register_fake
def _mlp_forward_fake(x, gate_weight, up_weight, down_weight, backward_impl, save_activated_gate=True):
    lead = tuple(x.shape[:-1])
    inter, hidden = gate_weight.shape
    out = x.new_empty(lead + (hidden,))
    act = x.new_empty(lead + (inter,)) if save_activated_gate else x.new_empty(0)
    return out, x.new_empty(lead + (inter,)), x.new_empty(lead + (inter,)), act


def _op_gradients(grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight,
                  needs: tuple[bool, bool, bool, bool], impl: str, **flags) -> tuple[torch.Tensor, ...]:
    """The body of both backward ops: ``run_backward`` in the inputs' dtype (``flags``: its
    overwrite/release switches), each gradient contiguous (so the fake implementation's strides
    always match) or an empty ``[0]`` tensor where not needed."""
    with _no_autocast(x):
        grads = run_backward(
            grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight,
            **dict(zip(("need_grad_x", "need_grad_gate_weight", "need_grad_up_weight", "need_grad_down_weight"), needs)),
            impl=impl, **flags,
        )
    return tuple(g.contiguous() if need else x.new_empty(0) for g, need in zip(grads, needs))


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
    """The four gradients (contiguous); a gradient not requested is an empty ``[0]`` tensor.
    ``activated_gate`` None: recomputed from gate_output (memory-lean mode)."""
    return _op_gradients(
        grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight,
        (need_grad_x, need_grad_gate_weight, need_grad_up_weight, need_grad_down_weight), impl,
    )


@mlp_backward.register_fake
def _mlp_backward_fake(
    grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight,
    need_grad_x, need_grad_gate_weight, need_grad_up_weight, need_grad_down_weight, impl,
):
    shapes = (x.shape, gate_weight.shape, up_weight.shape, down_weight.shape)
    needs = (need_grad_x, need_grad_gate_weight, need_grad_up_weight, need_grad_down_weight)
    return tuple(x.new_empty(shape if need else (0,)) for shape, need in zip(shapes, needs))


@torch.library.custom_op("swiglu::mlp_backward_lean", mutates_args=("gate_output", "up_output"))
def mlp_backward_lean(
    grad_output: torch.Tensor,
    x: torch.Tensor,
    gate_output: torch.Tensor,
    up_output: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    need_grad_x: bool,
    need_grad_gate_weight: bool,
    need_grad_up_weight: bool,
    need_grad_down_weight: bool,
    impl: str,
    release_activations: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``swiglu::mlp_backward`` of the memory-lean mode (activated_gate recomputed) that consumes
    gate_output and up_output on the Triton path: d_gate/d_up are written over them (one [T, I]
    buffer allocated instead of three); with ``release_activations`` their storage is also freed
    after its last read (so they are not held beside the weight gradients;
    ``triton_swiglu_backward``'s ``release_activations``), which the schema cannot express: only
    the eager autograd formula asks for it (a traced graph that runs the op on copies and copies
    them back would read freed memory). The reference path leaves both as they are. Declared as
    mutating both, so their version counters move: a second backward through the same graph
    (``retain_graph=True``) is a RuntimeError (the autograd formula says why), never a silent
    read of gradients as activations."""
    return _op_gradients(
        grad_output, x, gate_output, up_output, None, gate_weight, up_weight, down_weight,
        (need_grad_x, need_grad_gate_weight, need_grad_up_weight, need_grad_down_weight), impl,
        overwrite_activations=True, release_activations=release_activations,
    )


@mlp_backward_lean.register_fake
def _mlp_backward_lean_fake(grad_output, x, gate_output, up_output, gate_weight, up_weight, down_weight,
                            need_grad_x, need_grad_gate_weight, need_grad_up_weight, need_grad_down_weight, impl,
                            release_activations=False):
    return _mlp_backward_fake(grad_output, x, gate_output, up_output, None, gate_weight, up_weight, down_weight,
                              need_grad_x, need_grad_gate_weight, need_grad_up_weight, need_grad_down_weight, impl)


def _overwrite_ok(gate_output: torch.Tensor) -> bool:
    # The overwriting op on plain tensors and on DTensors (tensor parallelism: each rank consumes
    # its own shards; sharding rule in swiglu.parallel), not on other tensor subclasses, and not
    # under torch.compile's tracing (the compiled graph plans its own buffers; a mutation there
    # would only add copies).
    if torch.compiler.is_compiling():
        return False
    dtensor = sys.modules.get("torch.distributed.tensor")
    return type(gate_output) is torch.Tensor or (dtensor is not None and type(gate_output) is dtensor.DTensor)


def _hooks_active() -> bool:
    # A saved-tensor hook (torch.autograd.graph.saved_tensors_hooks: offloaders, save_on_cpu,
    # non-reentrant checkpointing, loggers) sees what we save and may keep it or hand back a tensor
    # it still holds: we cannot prove the buffers private then.
    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


def _setup_context(ctx, inputs, output):
    x, gate_weight, up_weight, down_weight, backward_impl = inputs[:5]
    save_activated_gate = inputs[5] if len(inputs) > 5 else True
    _, gate_output, up_output, activated_gate = output
    saved_gate, saved_up = gate_output, up_output
    # Memory-lean mode: two [T, I] activations saved, activated_gate recomputed in the backward,
    # which may consume them (write d_gate/d_up over them, then free them). The op's outputs go to
    # its caller, so the node saves its own aliases (new tensors over the same storage): the
    # backward consumes them only when nothing else references that storage (_sole_owner).
    ctx.may_consume = not save_activated_gate and not _hooks_active()
    if ctx.may_consume:
        saved_gate, saved_up = gate_output.detach(), up_output.detach()
    saved_act = activated_gate if save_activated_gate else None
    ctx.save_for_backward(x, saved_gate, saved_up, saved_act, gate_weight, up_weight, down_weight)
    ctx.mark_non_differentiable(gate_output, up_output, activated_gate)
    # No zero-filled [T, I] gradients for the three saved activations (never used).
    ctx.set_materialize_grads(False)
    ctx.backward_impl = backward_impl
    ctx.activations_overwritten = False


def _local_counts(t) -> tuple[int, int]:
    # A DTensor's shard on this rank: (Python references, tensors over its storage).
    local = t._local_tensor
    return sys.getrefcount(local), torch._C._storage_Use_Count(local.untyped_storage()._cdata)


def _references(t: torch.Tensor) -> tuple[int, ...]:
    """(Python references to t, tensors over its storage) as counted from ``_sole_owner``; for a
    DTensor, (Python references to t, ``_local_counts``)."""
    if hasattr(t, "_local_tensor"):  # a DTensor wrapper has no storage of its own
        return (sys.getrefcount(t),) + _local_counts(t)
    return sys.getrefcount(t), torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class _Probe(torch.autograd.Function):
    # The counts of a buffer that nothing but the node holds, measured once with this torch and
    # Python through the same path as _backward's (a non-differentiable output, an alias of it
    # saved, unpacked into a local name, passed to _sole_owner).
    @staticmethod
    def forward(x):
        return x.clone(), torch.empty(4)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output[1].detach())
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, grad, _):
        (saved,) = ctx.saved_tensors
        ctx.counts = _sole_owner(saved, calibrate=True)
        return grad


class _Shard:
    __slots__ = ("_local_tensor",)  # as DTensor holds its local tensor


def _private_counts() -> tuple[int, ...]:
    x = torch.zeros(1, requires_grad=True)
    with torch.enable_grad():
        out = _Probe.apply(x)[0]
        node = out.grad_fn
        out.sum().backward()
    shard = _Shard()
    shard._local_tensor = torch.empty(4)
    return node.counts + _local_counts(shard)


def _sole_owner(t: torch.Tensor, calibrate: bool = False):
    """Whether the saved ``t`` (unpacked into a local name of ``_backward``) is the only tensor
    over its storage and nothing but autograd holds it: no op output a caller kept, no view or
    alias (``.detach()``, ``.data``, ``to_local()``), no ``grad_fn.saved_tensors`` kept. For a
    DTensor: the wrapper so, and its local tensor held by the wrapper alone."""
    counts = _references(t)
    if calibrate:
        return counts
    return counts == (_PRIVATE[:2] if len(counts) == 2 else _PRIVATE[:1] + _PRIVATE[2:])


_PRIVATE = _private_counts()


def _backward(ctx, grad_output, *unused_grads):
    needs = tuple(bool(n) for n in ctx.needs_input_grad[:4])
    if grad_output is None or not any(needs):
        return None, None, None, None, None, None
    if ctx.activations_overwritten:  # before unpacking: the overwritten gate/up would fail it
        raise RuntimeError(
            "swiglu: a second backward through the same graph in the memory-lean mode: the first one wrote its "
            "gradients over the saved gate/up activations. To backpropagate a graph more than once (also split "
            "backward passes, e.g. autograd.grad of x first and of the weights later), use "
            "save_activated_gate=True (SwiGLUMLP or swiglu_mlp) and pass retain_graph=True to every backward but the last")
    x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight = ctx.saved_tensors
    if torch.is_grad_enabled():
        # create_graph=True (double backward): the reference formula in differentiable PyTorch ops,
        # on activations recomputed from x and the weights (the saved ones are non-differentiable
        # outputs of the custom op, so the graph would not reach x through them).
        with _no_autocast(x):
            gate_output = F.linear(x, gate_weight)
            up_output = F.linear(x, up_weight)
            grads = reference_backward(
                grad_output, x, gate_output, up_output, F.silu(gate_output), gate_weight, up_weight, down_weight,
                need_grad_x=needs[0], need_grad_gate_weight=needs[1], need_grad_up_weight=needs[2],
                need_grad_down_weight=needs[3],
            )
        return tuple(grads) + (None, None)  # backward_impl, save_activated_gate
    if activated_gate is None and ctx.may_consume and _overwrite_ok(gate_output) and \
            resolve_backward_impl(ctx.backward_impl, x, gate_weight) == "triton" and \
            _sole_owner(gate_output) and _sole_owner(up_output):
        # Memory-lean mode: the saved gate/up buffers are private and dead after this backward;
        # d_gate/d_up go there. Otherwise (a caller, hook or logger holds them) the backward
        # that leaves them as they are: the same gradients, bit for bit, one more [T, I] buffer.
        # Flagged first: a failure after the overwrite must not let a retry read them.
        ctx.activations_overwritten = True
        grads = mlp_backward_lean(grad_output, x, gate_output, up_output, gate_weight, up_weight, down_weight,
                                  *needs, ctx.backward_impl, True)
    else:
        grads = mlp_backward(
            grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight,
            *needs, ctx.backward_impl,
        )
    return tuple(g if need else None for g, need in zip(grads, needs)) + (None, None)


mlp_forward.register_autograd(_backward, setup_context=_setup_context)
for _device_type in _AUTOCAST_DEVICES:
    # torch.autocast: cast x and the weights to bf16 (the autograd of the cast returns float32
    # gradients to float32 master weights), whatever dtype autocast was given.
    torch.library.register_autocast(mlp_forward, _device_type, torch.bfloat16)


# --------------------------------------------------------------------------- functional API


def swiglu_mlp(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    *,
    backward_impl: str = "auto",
    save_activated_gate: bool = False,
) -> torch.Tensor:
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` with our backward, differentiable in all four.

    Args:
        x: [..., H] (e.g. [batch_size, seq_len, H] or [tokens, H]), any strides. Zero tokens are
            fine (empty out, zero weight gradients, no kernel launch), as with ``nn.Linear``.
        gate_weight, up_weight: [I, H]; down_weight: [H, I] (``nn.Linear`` / Llama checkpoint
            layout). Same floating dtype and device as ``x``.
        backward_impl: ``"auto"`` (Triton for bf16 on a tuned NVIDIA GPU, sm_90, whose shared
            memory fits the tables; else the reference: ``swiglu.backend_reason`` says why),
            ``"reference"`` (PyTorch, the benchmark's order of operations, in the inputs' dtype;
            float64 works) or ``"triton"`` (bf16 only; CUDA or ``TRITON_INTERPRET=1``).
        save_activated_gate: False (default, memory-lean): the forward saves x, the weights,
            gate_output and up_output (2 [T, I] tensors) and the backward recomputes
            activated_gate = silu(gate_output) with the forward's own formula (bitwise the same
            values); with the Triton backward the forward is ``swiglu.kernels.forward``'s (fused kernel
            or cuBLAS per token bucket), and the backward writes d_gate/d_up over the saved
            gate/up buffers (one more [T, I] buffer, h, instead of three), so a second backward
            through the same graph (``retain_graph=True``) raises a RuntimeError saying so: use
            True there. Only buffers that nothing else references are consumed: under a
            saved-tensor hook (offloading, ``save_on_cpu``, checkpointing) or with the custom
            op's gate/up outputs kept, the backward leaves them intact (same gradients). True: activated_gate is saved too
            (3 [T, I] tensors), the forward is nn.Linear's ops, bit for bit, and the saved tensors
            are never written.

    Returns: ``out`` [..., H] in x's dtype. Gradients accumulate into ``.grad`` as
    usual; inputs that do not require grad skip their GEMMs. Double backward
    (``create_graph=True``, e.g. a gradient penalty) works: the gradients are then the reference
    formula in differentiable PyTorch ops on activations recomputed from x and the weights,
    whatever ``backward_impl`` (no Triton kernel; two more [T, I] GEMMs). Under
    ``torch.autocast`` (cuda or cpu) x and the weights are cast to bfloat16, whatever dtype
    autocast was given: out is bf16, float32 weights get float32 gradients. Under ``torch.func``
    transforms (``torch.func.grad`` / ``vmap`` / ``jacrev``, e.g. of
    ``functional_call(SwiGLUMLP(...), params, x)``) the same formula runs in plain PyTorch ops
    (nn.Linear's forward and PyTorch's autograd, no custom op): torch.library's autograd
    registration does not support functorch transforms.

    Raises:
        TypeError: a non-tensor, non-floating or mismatched dtype; ``"triton"`` with non-bf16;
            a non-bool ``save_activated_gate``.
        ValueError: mismatched shapes (naming the argument inconsistent with x) or devices, an
            empty hidden_size or intermediate_size, unknown ``backward_impl``, or
            ``"triton"`` where it cannot run.
        RuntimeError: (at backward) a second backward through one graph in the memory-lean mode
            on the Triton path (its first backward overwrote the saved activations).
    """
    validate_forward_inputs(x, gate_weight, up_weight, down_weight, backward_impl)
    if not isinstance(save_activated_gate, bool):
        raise TypeError(f"save_activated_gate must be a bool, got {type(save_activated_gate).__name__}")
    if torch._C._are_functorch_transforms_active():
        # torch.func (grad, vmap, jacrev...): torch.library's register_autograd has no functorch
        # rule ("must override the setup_context staticmethod"), so the same formula in plain
        # differentiable ops, which every transform supports.
        return F.linear(F.silu(F.linear(x, gate_weight)) * F.linear(x, up_weight), down_weight)
    return mlp_forward(x, gate_weight, up_weight, down_weight, backward_impl, save_activated_gate)[0]
