"""Input validation shared by every implementation of the backward.

Every check raises ``TypeError`` (not a tensor, wrong dtype) or ``ValueError`` (rank, shape,
device, empty hidden or intermediate size) naming the argument and what was expected. Nothing here copies or mutates a
tensor; callers decide how to handle strides (see ``swiglu.api``). ``traceable_cache``: the cache
of the decisions taken once per device (the kernels' device checks, the MoE op's backend).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache, wraps

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
#: The four gradients, in the order every backward returns them; ``needs`` tuples follow it.
GRAD_NAMES = ("grad_x", "grad_gate_weight", "grad_up_weight", "grad_down_weight")
ALL_NEEDS = (True, True, True, True)


@dataclass(frozen=True)
class Problem:
    """Sizes of one backward call: ``tokens`` (T), ``hidden_size`` (H), ``intermediate_size`` (I),
    and the leading dimensions of ``x`` (``()`` for flattened [T, H] inputs)."""

    tokens: int
    hidden_size: int
    intermediate_size: int
    leading_shape: tuple[int, ...]


#: The dtypes the op computes in (float8 types are floating point too, but torch's matmul and
#: type promotion do not take them).
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def validate_backward_inputs(*tensors: torch.Tensor, dtypes: tuple[torch.dtype, ...] | None = None) -> Problem:
    """Check the eight backward inputs (``ARG_NAMES`` order) and return the problem sizes.

    Activations are [batch_size, seq_len, size] or flattened [tokens, size]; all five share their
    leading dimensions, which may be 0 (no tokens). Weights: gate_weight and up_weight [I, H],
    down_weight [H, I]. All tensors share one floating dtype (one of ``dtypes`` when given) and
    one device. Shapes are checked by ``check_mlp_shapes`` (H and the leading dims from x), so a
    shape error names the argument inconsistent with x and the majority of the others.

    Raises:
        TypeError: an argument is not a tensor, or has a non-floating / disallowed dtype, or the
            dtypes differ.
        ValueError: wrong rank, mismatched shapes, different devices, or an empty hidden_size or
            intermediate_size.
    """
    if len(tensors) != len(ARG_NAMES):
        raise TypeError(f"the backward takes {len(ARG_NAMES)} tensors {ARG_NAMES}, got {len(tensors)}")
    grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight = tensors
    tensors = dict(zip(ARG_NAMES, tensors))
    for name, t in tensors.items():
        check_tensor(name, t)
    # Per-tensor dtype checks before the comparison with x, so a bad x is blamed on x.
    for name, t in tensors.items():
        check_floating(name, t)
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

    if x.dim() not in (2, 3):
        raise ValueError(f"x must be [tokens, hidden_size] or [batch_size, seq_len, hidden_size], got shape {tuple(x.shape)}")
    hidden, inter = check_mlp_shapes(
        x,
        gate_weight,
        up_weight,
        down_weight,
        like_x={"grad_output": grad_output},
        activations={"gate_output": gate_output, "up_output": up_output, "activated_gate": activated_gate},
    )
    leading = tuple(x.shape[:-1])
    tokens = 1
    for d in leading:
        tokens *= d
    return Problem(tokens, hidden, inter, leading)


def _describe(sizes: dict[str, int], declared: str | None) -> str:
    return declared or "from " + " and ".join(sizes)


def check_mlp_shapes(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    *,
    like_x: dict[str, torch.Tensor] | None = None,
    activations: dict[str, torch.Tensor] | None = None,
    hidden_size: int | None = None,
    intermediate_size: int | None = None,
) -> tuple[int, int]:
    """Check the shapes of the MLP's tensors and return ``(hidden_size, intermediate_size)``.

    Expected: ``x`` [..., H]; ``like_x`` tensors (e.g. grad_output) exactly x's shape;
    ``gate_weight`` and ``up_weight`` [I, H]; ``down_weight`` [H, I]; ``activations`` (name ->
    tensor, e.g. gate_output) [*x.shape[:-1], I]. Tensors must be tensors already (no type check).

    The sizes come first, so that an error names the argument that is actually wrong: H is the
    declared ``hidden_size`` when given (then x itself is checked against it), else x's last
    dimension; I is the declared ``intermediate_size`` when given, else the value most of the
    I-carrying dimensions agree on (weights, then activations; a tie goes to gate_weight's). Then
    every argument is compared with its expected shape, x first, and the first mismatch is
    reported with where H and I came from. A bad gate_weight [128, 32] with x [..., 64] is
    reported as gate_weight's error, not as up_weight's mismatch with it.

    Raises:
        ValueError: a weight that is not 2-D, x with no dimension, a shape that differs from the
            expected one (naming that argument), or an empty hidden_size or intermediate_size.
    """
    like_x = like_x or {}
    activations = activations or {}
    weights = {"gate_weight": gate_weight, "up_weight": up_weight, "down_weight": down_weight}
    for name, t in weights.items():
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got shape {list(t.shape)}")
    if x.dim() < 1:
        raise ValueError("x must have shape [..., hidden_size], got a 0-d tensor")
    for name, t in activations.items():
        if t.dim() < 1:
            raise ValueError(f"{name} must have shape [..., intermediate_size], got a 0-d tensor")

    declared_h = None if hidden_size is None else f"declared hidden_size {hidden_size}"
    hidden = x.shape[-1] if hidden_size is None else hidden_size
    h_from = declared_h or f"hidden_size {hidden} from x"
    if intermediate_size is None:
        votes = {
            "gate_weight": gate_weight.shape[0],
            "up_weight": up_weight.shape[0],
            "down_weight": down_weight.shape[1],
            **{n: t.shape[-1] for n, t in activations.items()},
        }
        counts = [list(votes.values()).count(v) for v in votes.values()]
        inter = list(votes.values())[counts.index(max(counts))]  # first of the most common
        agreeing = [n for n, v in votes.items() if v == inter]
        i_from = f"intermediate_size {inter} from {', '.join(agreeing)}"
    else:
        inter = intermediate_size
        i_from = f"declared intermediate_size {inter}"

    leading = list(x.shape[:-1])
    expected = {"x": (leading + [hidden], f"[..., hidden_size]: {h_from}")}
    for name in like_x:
        expected[name] = (list(x.shape), "the shape of x")
    expected["gate_weight"] = ([inter, hidden], f"[intermediate_size, hidden_size]: {h_from}, {i_from}")
    expected["up_weight"] = expected["gate_weight"]
    expected["down_weight"] = ([hidden, inter], f"[hidden_size, intermediate_size]: {h_from}, {i_from}")
    for name in activations:
        expected[name] = (leading + [inter], f"[*leading dims of x {list(x.shape)}, intermediate_size]: {i_from}")
    tensors = {"x": x, **like_x, **weights, **activations}
    for name, (shape, why) in expected.items():
        if list(tensors[name].shape) != shape:
            hint = ""
            weight_h = {gate_weight.shape[1], up_weight.shape[1], down_weight.shape[0]}
            if hidden_size is None and len(weight_h) == 1 and hidden not in weight_h:
                hint = f"; the three weights agree on hidden_size {weight_h.pop()}: is x {list(x.shape)} the wrong one?"
            raise ValueError(f"{name} must have shape {shape} ({why}), got {list(tensors[name].shape)}{hint}")
    for label, size in (("hidden_size", hidden), ("intermediate_size", inter)):
        if size <= 0:
            raise ValueError(
                f"{label} must be positive, got {size} (x {list(x.shape)}, gate_weight "
                f"{list(gate_weight.shape)}); zero tokens are supported, an empty {label} is not"
            )
    return hidden, inter


_FLOAT_SET = frozenset(FLOAT_DTYPES)


def check_tensor(name: str, t) -> None:
    """TypeError naming ``name`` unless ``t`` is a torch.Tensor, dense and strided (``check_dense``)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_dense(name, t)


def check_bool(name: str, value) -> None:
    """TypeError naming ``name`` unless ``value`` is True or False (``bool_error``)."""
    if value is not True and value is not False:
        raise bool_error(name, value)


def bool_error(name: str, value) -> TypeError:
    """The TypeError of a flag ``name`` that is not a bool, naming its type with its module where
    that is not Python's own (``numpy.bool``: numpy 2 names its boolean ``bool``)."""
    kind = type(value)
    where = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
    return TypeError(f"{name} must be a bool (True or False), got {where}{kind.__qualname__}")


def check_floating(name: str, t: torch.Tensor) -> None:
    """TypeError naming ``name`` unless ``t``'s dtype is one of ``FLOAT_DTYPES``."""
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have a floating dtype ({', '.join(map(str, FLOAT_DTYPES))}), got {t.dtype}")


def check_dense(name: str, t: torch.Tensor) -> None:
    """TypeError naming ``name`` unless ``t`` is a dense strided tensor: not sparse, not a nested
    tensor (torch's older nested tensors report the strided layout but have no single shape)."""
    if t.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if t.is_nested:
        raise TypeError(f"{name} must be a dense (strided) tensor, got a nested tensor")


def inputs_look_valid(
    x, gate_weight, up_weight, down_weight, *activations, like_x=(), hidden_size=None, intermediate_size=None, ranks=None
) -> bool:
    """True when the tensors are surely what the validators above accept (the common case, in a
    few comparisons: one dense floating dtype, one device, x [..., H] (rank in ``ranks`` when
    given), ``like_x`` tensors x's shape, weights [I, H] / [I, H] / [H, I], ``activations``
    [*x.shape[:-1], I], H and I positive and equal to the declared sizes when given). False
    means only "not proven": the caller runs the full validator, which raises naming the
    argument or accepts."""
    tensors = (x, gate_weight, up_weight, down_weight, *activations, *like_x)
    dtype, device = getattr(x, "dtype", None), getattr(x, "device", None)
    if dtype not in _FLOAT_SET:
        return False
    strided, tensor = torch.strided, torch.Tensor
    for t in tensors:
        if not isinstance(t, tensor) or t.dtype != dtype or t.layout != strided or t.is_nested or t.device != device:
            return False
    if gate_weight.dim() != 2 or x.dim() < 1 or (ranks is not None and x.dim() not in ranks):
        return False
    inter, hidden = gate_weight.shape
    if (
        hidden <= 0
        or inter <= 0
        or x.shape[-1] != hidden
        or up_weight.shape != gate_weight.shape
        or down_weight.shape != (hidden, inter)
    ):
        return False
    if (hidden_size is not None and hidden_size != hidden) or (intermediate_size is not None and intermediate_size != inter):
        return False
    if not (like_x or activations):  # the forward's call: nothing else to compare
        return True
    shape = x.shape
    act_shape = shape[:-1] + (inter,)
    return all(t.shape == shape for t in like_x) and all(t.shape == act_shape for t in activations)


def check_backward_inputs(*tensors: torch.Tensor, any_rank: bool = False) -> None:
    """The eight backward inputs (``ARG_NAMES`` order) checked once: ``inputs_look_valid`` (a few comparisons), and
    only when that does not prove them valid, ``validate_backward_inputs`` for the verdict and a
    message naming the argument. ``any_rank``: activations of any rank >= 1 (validated as their
    [tokens, size] flattening), as the reference and the raw op take; otherwise x is [T, H] or
    [B, S, H], as ``swiglu_mlp_backward`` documents."""
    grad_output, x, gate_output, up_output, activated_gate, gate_weight, up_weight, down_weight = tensors
    acts = tensors[:5]
    if inputs_look_valid(
        x,
        gate_weight,
        up_weight,
        down_weight,
        gate_output,
        up_output,
        activated_gate,
        like_x=(grad_output,),
        ranks=None if any_rank else (2, 3),
    ):
        return
    if any_rank:
        acts = tuple(t.reshape(-1, t.shape[-1]) if isinstance(t, torch.Tensor) and t.dim() > 3 else t for t in acts)
    validate_backward_inputs(*acts, gate_weight, up_weight, down_weight)


def spans_whole_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` spans all of its storage (no view into a larger buffer that others use):
    what may be written over and freed without touching anyone else's data."""
    return t.storage_offset() == 0 and t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def traceable_cache(maxsize: int | None):
    """``functools.lru_cache(maxsize)`` that torch.compile traces through: while compiling, the
    function itself runs (once per traced graph), as Dynamo would otherwise warn that it ignores
    the cache. ``cache_clear`` as lru_cache's."""

    def wrap(fn):
        cached = lru_cache(maxsize=maxsize)(fn)

        @wraps(fn)
        def call(*args):
            return fn(*args) if torch.compiler.is_compiling() else cached(*args)

        call.cache_clear = cached.cache_clear
        return call

    return wrap
