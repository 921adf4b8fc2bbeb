"""The SwiGLU MLP of routed experts (mixture of experts): ``swiglu_moe``, its reference and oracle.

For each token t and each of its k routed experts ``e = top_k_index[t, j]`` (weight
``w = top_k_weights[t, j]``)::

    gate, up = (x[t] @ gate_up_proj[e].T).chunk(2)          # gate_up_proj [E, 2I, H], gate rows first
    out[t] += w * (silu(gate) * up) @ down_proj[e].T          # down_proj [E, H, I]

which is transformers' experts module (``transformers.integrations.moe``) with its default
``_apply_gate``. Gradients flow to x, top_k_weights (the router learns through them),
gate_up_proj and down_proj. Backends: ``"reference"`` (transformers' eager loop over experts, in
its order of operations), ``"triton"`` (``swiglu.kernels.moe``: grouped GEMMs over the routed
pairs sorted by expert, the gathers fused into their loads, SwiGLU and dSwiGLU in their epilogues)
and ``"auto"``. Design and coverage: docs/moe.md.
"""

from __future__ import annotations

import sys
import weakref

import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F

from .checks import FLOAT_DTYPES, bool_error, check_dense, check_floating, traceable_cache
from .ops import (
    PLAIN_TENSOR_TYPES,
    add_flop_formula,
    auto_reason,
    dispatch_mode_active,
    has_tangent,
    legacy_batched,
    on_clear_plans,
    on_device,
    owns_saved_buffers,
    transforms_active,
    triton_reason,
    vmapped,
)

#: ``impl=`` of ``swiglu_moe``.
MOE_IMPLS = ("auto", "reference", "triton")
_INDEX_DTYPES = (torch.int32, torch.int64)
_AUTOCAST_CASTS = (torch.float16, torch.bfloat16, torch.float32)  # float64 is left alone, as by F.linear


# --------------------------------------------------------------------------- validation


def validate_moe_inputs(x, top_k_index, top_k_weights, gate_up_proj, down_proj, impl="auto") -> tuple[int, ...]:
    """Check ``swiglu_moe``'s arguments; return ``(T, H, I, E, k)``.

    Raises TypeError (a non-tensor, a sparse or nested tensor, an integer ``x``/weights, dtypes
    that differ between x and the expert weights, a floating ``top_k_index``, an integer
    ``top_k_weights``, a non-str ``impl``) or ValueError (ranks, shapes, devices, an unknown
    ``impl``, and an index outside [0, E) where that is known without a device synchronization:
    CPU tensors in eager mode), each naming the argument."""
    named = {
        "x": x,
        "top_k_index": top_k_index,
        "top_k_weights": top_k_weights,
        "gate_up_proj": gate_up_proj,
        "down_proj": down_proj,
    }
    dtensor = sys.modules.get("torch.distributed.tensor")  # loaded wherever a DTensor exists
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if dtensor is not None and isinstance(t, dtensor.DTensor):
            raise TypeError(
                f"{name} is a DTensor: swiglu_moe takes local tensors (shard the experts outside it, "
                "e.g. expert parallelism with local weights)"
            )
        check_dense(name, t)
    for name in ("x", "gate_up_proj", "down_proj"):
        t = named[name]
        check_floating(name, t)
        if t.dtype != x.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but x has {x.dtype}; x and the expert weights must share one dtype")
    if top_k_index.dtype not in _INDEX_DTYPES:
        raise TypeError(f"top_k_index must be int32 or int64 (expert ids), got {top_k_index.dtype}")
    if top_k_weights.dtype not in FLOAT_DTYPES:
        raise TypeError(f"top_k_weights must have a floating dtype, got {top_k_weights.dtype}")
    for name, t in named.items():
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; all arguments must share one device")
    if x.dim() < 1:
        raise ValueError("x must be [..., hidden_size], got a 0-d tensor")
    if gate_up_proj.dim() != 3:
        raise ValueError(
            f"gate_up_proj must be [num_experts, 2 * intermediate_size, hidden_size], got shape {tuple(gate_up_proj.shape)}"
        )
    E, two_i, H = gate_up_proj.shape
    if two_i % 2 or two_i == 0:
        raise ValueError(f"gate_up_proj's second dimension must be 2 * intermediate_size (gate rows, then up rows), got {two_i}")
    if E == 0 or H == 0:
        raise ValueError(
            f"gate_up_proj must have at least one expert and a nonzero hidden_size, got shape {tuple(gate_up_proj.shape)}"
        )
    I = two_i // 2
    if x.shape[-1] != H:
        raise ValueError(f"x's last dimension ({x.shape[-1]}) must be gate_up_proj's hidden_size ({H})")
    if tuple(down_proj.shape) != (E, H, I):
        raise ValueError(
            f"down_proj must be [num_experts, hidden_size, intermediate_size] = {(E, H, I)} to match "
            f"gate_up_proj, got {tuple(down_proj.shape)}"
        )
    T = x.numel() // H
    if top_k_index.dim() < 1 or top_k_index.numel() == 0 and T > 0:
        raise ValueError(f"top_k_index must be [..., k] with k >= 1, got shape {tuple(top_k_index.shape)}")
    k = top_k_index.shape[-1]
    lead = tuple(x.shape[:-1])
    if tuple(top_k_index.shape[:-1]) not in (lead, (T,)) or k == 0:
        shapes = f"[{''.join(f'{n}, ' for n in lead)}k]" + (f" or [{T}, k]" if lead != (T,) else "")
        raise ValueError(f"top_k_index must be {shapes} to match x {tuple(x.shape)}, got {tuple(top_k_index.shape)}")
    if top_k_weights.shape != top_k_index.shape:
        raise ValueError(
            f"top_k_weights must have top_k_index's shape {tuple(top_k_index.shape)} (one weight per "
            f"routed expert; [T, num_experts] routing weights are not supported), got "
            f"{tuple(top_k_weights.shape)}"
        )
    if not isinstance(impl, str):
        raise TypeError(f"impl must be a str, one of {list(MOE_IMPLS)}, got {type(impl).__name__}")
    if impl not in MOE_IMPLS:
        raise ValueError(f"impl must be one of {list(MOE_IMPLS)}, got {impl!r}")
    if (
        top_k_index.device.type == "cpu"
        and top_k_index.numel()
        and not torch.compiler.is_compiling()
        and not dispatch_mode_active()
        and not (transforms_active() and vmapped(top_k_index))
    ):
        lo, hi = int(top_k_index.min()), int(top_k_index.max())
        if lo < 0 or hi >= E:
            raise ValueError(f"top_k_index must hold expert ids in [0, {E}) (num_experts = {E}), got values in [{lo}, {hi}]")
    return T, H, I, E, k


def validate_moe_biases(x, gate_up_proj_bias, down_proj_bias, interleaved, E: int, H: int, I: int) -> None:
    """Check ``swiglu_moe``'s bias arguments against the sizes ``validate_moe_inputs`` returned:
    each None or a dense tensor of x's dtype and device, gate_up_proj_bias [E, 2I] and
    down_proj_bias [E, H] (TypeError / ValueError naming the argument); ``interleaved`` a bool."""
    if interleaved is not True and interleaved is not False:
        raise bool_error("interleaved", interleaved)
    for name, t, shape in (("gate_up_proj_bias", gate_up_proj_bias, (E, 2 * I)), ("down_proj_bias", down_proj_bias, (E, H))):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
        check_dense(name, t)
        check_floating(name, t)
        if t.dtype != x.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but x has {x.dtype}; the biases must share x's dtype")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}; all arguments must share one device")
        if tuple(t.shape) != shape:
            raise ValueError(
                f"{name} must be {list(shape)} (num_experts, {'2 * intermediate_size' if name.startswith('gate') else 'hidden_size'}), got {tuple(t.shape)}"
            )


# --------------------------------------------------------------------------- reference and oracle


def _anchor(*tensors) -> torch.Tensor:
    """A zero that depends on every tensor (through empty slices: no NaN can leak in), so that an
    output no routed pair reaches (T = 0, every id outside [0, E)) still gives zero gradients."""
    return sum(t[:0].sum() for t in tensors)


def _expert_rows(top_k_index, E):
    """``(e, pos, tok)`` for each expert e that a pair routes to, in expert order: its pairs'
    tokens and positions in their rows (transformers' loop; ids outside [0, E) left out)."""
    with torch.no_grad():
        mask = F.one_hot(top_k_index.long().clamp(-1, E) % (E + 1), num_classes=E + 1).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit[:, 0].tolist():
        if e < E:
            yield e, *torch.where(mask[e])


def _split(gate_up, interleaved: bool):
    """gate and up from the up projection's output: its halves, or its even and odd columns
    (``interleaved``: gpt-oss's rows gate0, up0, gate1, ...)."""
    if interleaved:
        return gate_up[..., ::2], gate_up[..., 1::2]
    return gate_up.chunk(2, dim=-1)


def _joined(d_gate, d_up, interleaved: bool):
    """``_split``'s inverse: [..., 2I] in gate_up_proj's row order."""
    if interleaved:
        return torch.stack([d_gate, d_up], dim=-1).flatten(-2)
    return torch.cat([d_gate, d_up], dim=-1)


def _biased(t, bias):
    """``t + bias`` in t's dtype, as transformers' ``x @ W + b`` (the product rounded first)."""
    return t if bias is None else t + bias


def _clamped(gate, up, swiglu_limit):
    """The gate and up projections as the activation takes them: with ``swiglu_limit`` L, gate
    clamped to at most L and up to [-L, L] (DeepSeek-V4's, GLM-5-Next's experts)."""
    if swiglu_limit is None:
        return gate, up
    return gate.clamp(max=swiglu_limit), up.clamp(min=-swiglu_limit, max=swiglu_limit)


def _glu(gate, up, swiglu_alpha):
    """h from the (clamped) gate and up: ``silu(gate) * up``, or with ``swiglu_alpha`` a the
    gpt-oss form (MiniMax-M3's experts) ``(up + 1) * (gate * sigmoid(a * gate))``, in that order of
    operations (transformers')."""
    if swiglu_alpha is None:
        return F.silu(gate) * up
    return (up + 1.0) * (gate * torch.sigmoid(gate * swiglu_alpha))


_FLOAT32_MAX = 3.4028234663852886e38


def _positive_float(name: str, value) -> float | None:
    """``value`` as a float (None stays None); TypeError naming ``name`` for a non-number,
    ValueError unless positive and finite."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float or None, got {type(value).__name__}")
    # Comparisons only (NaN fails them): torch.compile traces them for a float that changes between calls.
    if not 0 < value <= _FLOAT32_MAX:  # the kernels compute in float32
        got = "" if torch.compiler.is_compiling() else f", got {value}"  # a traced float has no text
        raise ValueError(f"{name} must be positive and finite in float32{got}")
    return value if isinstance(value, float) else float(value)


def check_swiglu_alpha(swiglu_alpha) -> float | None:
    """``swiglu_alpha`` as a float (None stays None); TypeError for a non-number, ValueError unless
    positive and finite."""
    return _positive_float("swiglu_alpha", swiglu_alpha)


def check_swiglu_limit(swiglu_limit) -> float | None:
    """``swiglu_limit`` as a float (None stays None); TypeError for a non-number, ValueError unless
    positive and finite."""
    return _positive_float("swiglu_limit", swiglu_limit)


def moe_reference(
    x,
    top_k_index,
    top_k_weights,
    gate_up_proj,
    down_proj,
    swiglu_limit=None,
    swiglu_alpha=None,
    gate_up_proj_bias=None,
    down_proj_bias=None,
    interleaved=False,
) -> torch.Tensor:
    """transformers' eager experts loop, in its order of operations (bf16 GEMM outputs, the
    routing weight applied in the product's promoted dtype, ``index_add_`` into an output of x's
    dtype in expert order). Differentiable by autograd. ``x`` [T, H], ``top_k_index`` /
    ``top_k_weights`` [T, k]; expert ids outside [0, E) contribute nothing (transformers' expert
    parallel sentinels); a duplicate id in a token's row counts once per occurrence;
    ``swiglu_limit``: gate and up clamped first (``_clamped``); ``swiglu_alpha``: ``_glu``; the
    biases added to each GEMM's output in its dtype (gpt-oss's loop); ``interleaved``: ``_split``."""
    biases = [t for t in (gate_up_proj_bias, down_proj_bias) if t is not None]
    out = torch.zeros_like(x) + _anchor(x, top_k_weights, gate_up_proj, down_proj, *biases).to(x.dtype)
    for e, pos, tok in _expert_rows(top_k_index, gate_up_proj.shape[0]):
        gu = _biased(F.linear(x[tok], gate_up_proj[e]), None if gate_up_proj_bias is None else gate_up_proj_bias[e])
        gate, up = _clamped(*_split(gu, interleaved), swiglu_limit)
        y = _biased(F.linear(_glu(gate, up, swiglu_alpha), down_proj[e]), None if down_proj_bias is None else down_proj_bias[e])
        out = out.index_add(0, tok, (y * top_k_weights[tok, pos, None]).to(out.dtype))
    return out


def moe_reference_masked(
    x,
    top_k_index,
    top_k_weights,
    gate_up_proj,
    down_proj,
    swiglu_limit=None,
    swiglu_alpha=None,
    gate_up_proj_bias=None,
    down_proj_bias=None,
    interleaved=False,
) -> torch.Tensor:
    """``moe_reference``'s formula without reading the routing's values, for ``torch.func.vmap``
    over per-sample routing: every expert over every token, a token's rows kept where it routes
    to the expert (the weights of a duplicate id summed), added in expert order; E / k times the
    reference's GEMM work."""
    biases = [t for t in (gate_up_proj_bias, down_proj_bias) if t is not None]
    out = torch.zeros_like(x) + _anchor(x, top_k_weights, gate_up_proj, down_proj, *biases).to(x.dtype)
    for e in range(gate_up_proj.shape[0]):
        hit = top_k_index == e
        routed = hit.any(-1, keepdim=True)
        # Unrouted rows enter as zeros and their weights as 0 (not 0 * w): an overflow or a NaN
        # outside the token's experts reaches neither the output nor any gradient.
        gu = F.linear(torch.where(routed, x, 0), gate_up_proj[e])
        gu = _biased(gu, None if gate_up_proj_bias is None else gate_up_proj_bias[e])
        gate, up = _clamped(*_split(gu, interleaved), swiglu_limit)
        y = _biased(F.linear(_glu(gate, up, swiglu_alpha), down_proj[e]), None if down_proj_bias is None else down_proj_bias[e])
        y = y * torch.where(hit, top_k_weights, 0).sum(-1, keepdim=True)
        out = out + torch.where(routed, y, 0).to(out.dtype)
    return out


def moe_float64(
    x,
    top_k_index,
    top_k_weights,
    gate_up_proj,
    down_proj,
    grad_out=None,
    swiglu_limit=None,
    swiglu_alpha=None,
    gate_up_proj_bias=None,
    down_proj_bias=None,
    interleaved=False,
):
    """The float64 oracle: ``out`` (and, given ``grad_out``, ``(out, grad_x, grad_top_k_weights,
    grad_gate_up_proj, grad_down_proj)``, then the gradient of each bias given) of the same
    formula, every input upcast to float64, on x's device. ``x`` [T, H], routing [T, k];
    ``swiglu_limit``, ``swiglu_alpha``, the biases and ``interleaved`` as ``swiglu_moe``'s."""
    f = lambda t: t.detach().to(torch.float64).requires_grad_(grad_out is not None)  # noqa: E731
    xd, wd, gu, dp = f(x), f(top_k_weights), f(gate_up_proj), f(down_proj)
    bgu = f(gate_up_proj_bias) if gate_up_proj_bias is not None else None
    bd = f(down_proj_bias) if down_proj_bias is not None else None
    biases = tuple(b for b in (bgu, bd) if b is not None)
    E = gu.shape[0]
    idx = top_k_index.long()
    out = torch.zeros_like(xd) + _anchor(xd, wd, gu, dp, *biases)
    gu_e, dp_e = gu.unbind(0), dp.unbind(0)  # one gradient buffer per weight, not one per expert
    bgu_e = bgu.unbind(0) if bgu is not None else None
    bd_e = bd.unbind(0) if bd is not None else None
    for e in range(E):  # one expert at a time: memory of the routed rows only
        tok, pos = torch.where(idx == e)
        if tok.numel() == 0:
            continue
        g_u = _biased(xd[tok] @ gu_e[e].T, None if bgu_e is None else bgu_e[e])
        gate, up = _clamped(*_split(g_u, interleaved), swiglu_limit)
        h = _glu(gate, up, swiglu_alpha)
        y = _biased(h @ dp_e[e].T, None if bd_e is None else bd_e[e])
        out = out.index_add(0, tok, y * wd[tok, pos, None])
    if grad_out is None:
        return out.detach()
    leaves = (xd, wd, gu, dp, *biases)
    grads = torch.autograd.grad(out, leaves, grad_out.to(torch.float64), allow_unused=True)
    grads = tuple(torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads))
    return (out.detach(), *grads)


# --------------------------------------------------------------------------- the public function


def moe_impl(impl: str, x: torch.Tensor) -> str:
    """The backend ``swiglu_moe`` runs for ``impl`` on x's device and dtype ("reference" or
    "triton"), decided once per (impl, device, dtype); ``"triton"`` where it cannot run is a
    ValueError (TypeError for a dtype other than bfloat16)."""
    return _resolve(impl, x.device, x.dtype)


@traceable_cache(64)  # compiled: traced once per graph, not per call
def _resolve(impl: str, device: torch.device, dtype: torch.dtype) -> str:
    if impl == "auto":
        # The dense op's rule (a CUDA sm_90 GPU the tables were tuned for, bfloat16, Triton importable).
        return "reference" if auto_reason(device, dtype) else "triton"
    if impl == "triton":
        reason = triton_reason(device, 8, 8)  # any size: the MoE kernels need no aligned rows
        if reason:
            raise ValueError(f"impl='triton' {reason}")
        if dtype != torch.bfloat16:
            raise TypeError(f"impl='triton' needs bfloat16 x and expert weights, got {dtype}")
    return impl


def swiglu_moe(
    x,
    top_k_index,
    top_k_weights,
    gate_up_proj,
    down_proj,
    *,
    impl: str = "auto",
    reuse_saved_buffers: bool = False,
    swiglu_limit: float | None = None,
    swiglu_alpha: float | None = None,
    gate_up_proj_bias: torch.Tensor | None = None,
    down_proj_bias: torch.Tensor | None = None,
    interleaved: bool = False,
) -> torch.Tensor:
    """Mixture-of-experts SwiGLU experts: ``out[t] = sum_j top_k_weights[t, j] * down_proj[e] @
    (silu(gate) * up)``, ``e = top_k_index[t, j]``, ``gate, up = (gate_up_proj[e] @ x[t]).chunk(2)``.

    Args:
        x: [..., H] tokens (e.g. [T, H] or [batch_size, seq_len, H]).
        top_k_index: [..., k] (x's leading dims, or [T, k]) int32/int64 expert ids in [0, E), a
            repeated id counting once per occurrence.
        top_k_weights: [..., k] routing weights, any floating dtype (its gradient's dtype).
        gate_up_proj: [E, 2I, H], gate rows first, then up rows (transformers' layout; any strides, e.g. an ``mT``).
        down_proj: [E, H, I]; x's dtype (under ``torch.autocast`` the three are cast to its dtype).
        impl: ``"auto"`` (Triton for bf16 tensors on an sm_90 GPU, else the reference), ``"reference"``, ``"triton"``.
        reuse_saved_buffers: the eager Triton backward frees the saved gate/up after their reader (lower peak).
        swiglu_limit, swiglu_alpha: L > 0 clamps gate to at most L and up to [-L, L] first
            (DeepSeek-V4); a > 0 takes ``(up + 1) * gate * sigmoid(a * gate)`` (MiniMax-M3).
        gate_up_proj_bias, down_proj_bias, interleaved: [E, 2I] / [E, H] biases; gate, up rows alternate (gpt-oss).

    Returns:
        out, x's shape and dtype, fresh (not a view). Differentiable in every floating input (never
        modified). T = 0 gives an empty out; an expert with no tokens gets zero weight gradients.

    Raises:
        TypeError / ValueError naming the argument; RuntimeError at a second eager Triton backward
        with ``reuse_saved_buffers``. An id outside [0, E): ValueError on CPU in eager mode; on CUDA,
        compiled or under dispatch modes the pair is skipped, never read out of bounds. docs/moe.md.
    """
    if isinstance(x, torch.Tensor) and x.device.type in ("cuda", "cpu") and torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)  # as F.linear under autocast
        x, gate_up_proj, down_proj, gate_up_proj_bias, down_proj_bias = (
            t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype in _AUTOCAST_CASTS else t
            for t in (x, gate_up_proj, down_proj, gate_up_proj_bias, down_proj_bias)
        )
    if reuse_saved_buffers is not True and reuse_saved_buffers is not False:
        raise bool_error("reuse_saved_buffers", reuse_saved_buffers)
    limit, alpha = check_swiglu_limit(swiglu_limit), check_swiglu_alpha(swiglu_alpha)
    T, H, I, E, k = validate_moe_inputs(x, top_k_index, top_k_weights, gate_up_proj, down_proj, impl)
    bgu, bd = gate_up_proj_bias, down_proj_bias
    validate_moe_biases(x, bgu, bd, interleaved, E, H, I)
    meta = x.device.type == "meta"
    impl = "triton" if meta else moe_impl(impl, x)  # meta: the ops' fakes propagate shapes, forward and backward
    x2 = x.reshape(T, H)
    idx = top_k_index.reshape(T, k)
    w = top_k_weights.reshape(T, k)
    biases = [t for t in (bgu, bd) if t is not None]
    if not meta and impl == "triton" and (transforms_active() or has_tangent(x, top_k_weights, gate_up_proj, down_proj, *biases)):
        impl = "reference"  # torch.func transforms and forward-mode AD: the ops have no rules for them
    if impl == "reference":
        # The loop over the experts present reads the routing's values: compiled (a graph break,
        # fullgraph fails) and under dispatch modes (FakeTensorMode has no values) it runs as one
        # op; not under torch.func or forward-mode AD (while tracing, a forward-AD level shows
        # where tangents do not).
        as_op = (torch.compiler.is_compiling() or dispatch_mode_active()) and not (
            transforms_active() or fwAD._current_level >= 0
        )
        run = moe_reference_op if as_op else moe_reference
        if transforms_active() and not torch.compiler.is_compiling() and vmapped(idx):
            run = moe_reference_masked  # per-sample routing: no read of the routing's values
        extra = (bgu, bd, interleaved) if biases or interleaved else ()  # the defaults' calls unchanged
        out = run(x2, idx, w, gate_up_proj, down_proj, limit, alpha, *extra)
    elif (
        meta
        or torch.compiler.is_compiling()
        or dispatch_mode_active()
        or not all(type(t) in PLAIN_TENSOR_TYPES for t in (x, w, gate_up_proj, down_proj, *biases))
    ):
        extra = (bgu, bd, interleaved) if biases or interleaved else ()
        out = moe_forward(x2, idx.contiguous(), w.contiguous(), gate_up_proj, down_proj, limit, alpha, *extra)[0]
    else:
        out = _MoEFunction.apply(
            x2,
            idx.contiguous(),
            w.contiguous(),
            gate_up_proj,
            down_proj,
            reuse_saved_buffers,
            x.shape,
            limit,
            alpha,
            bgu,
            bd,
            interleaved,
        )
    if out.shape == x.shape:
        return out
    # Not a view of another tensor (as nn.Linear's output is not): FSDP2 hooks the module's
    # output for its backward, and an in-place op on a view of it loses the hook. Compiled, views are free.
    out = out.reshape(x.shape)
    return out if torch.compiler.is_compiling() else out.clone()


# --------------------------------------------------------------------------- custom ops (the Triton path)


on_clear_plans(_resolve.cache_clear)


def _clear_kernel_plans() -> None:
    kernels = sys.modules.get("swiglu.kernels.moe")  # imported at the first Triton call
    if kernels is not None:
        kernels.clear_plans()


on_clear_plans(_clear_kernel_plans)


@torch.library.custom_op("swiglu::moe_forward", mutates_args=())
def moe_forward(
    x: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    swiglu_limit: float | None = None,
    swiglu_alpha: float | None = None,
    gate_up_proj_bias: torch.Tensor | None = None,
    down_proj_bias: torch.Tensor | None = None,
    interleaved: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out [T, H], gate [S, I], up [S, I], order [S], expert_start [E + 1])`` by the Triton
    kernels: gate, up are the forward's bf16 projections in expert-sorted order, order and
    expert_start the sort (int32), all kept for the backward. Validated inputs, [T, H] and
    contiguous [T, k]. An op, so torch.compile traces through it and dispatch modes see it.
    gate, up are kept unclamped under ``swiglu_limit``, with ``gate_up_proj_bias`` added;
    ``down_proj_bias`` is added in the combine."""
    return _run_forward(
        x,
        top_k_index,
        top_k_weights,
        gate_up_proj,
        down_proj,
        None,
        swiglu_limit,
        swiglu_alpha,
        gate_up_proj_bias,
        interleaved,
        down_proj_bias,
    )


def _run_forward(
    x,
    top_k_index,
    top_k_weights,
    gate_up_proj,
    down_proj,
    out_shape=None,
    swiglu_limit=None,
    swiglu_alpha=None,
    gate_up_proj_bias=None,
    interleaved=False,
    down_proj_bias=None,
):
    """The Triton forward: ``(out, gate, up, order, expert_start)``, the last four kept for the
    backward; out allocated as ``out_shape`` where given."""
    from .kernels.moe import moe_forward as run

    with on_device(x.device):
        out, gate, up, routing = run(
            x,
            top_k_index,
            top_k_weights,
            gate_up_proj,
            down_proj,
            out_shape=out_shape,
            swiglu_limit=swiglu_limit,
            swiglu_alpha=swiglu_alpha,
            gate_up_proj_bias=gate_up_proj_bias,
            interleaved=interleaved,
            down_proj_bias=down_proj_bias,
        )
    return out, gate, up, routing.order, routing.expert_start


@moe_forward.register_fake
def _moe_forward_fake(
    x,
    top_k_index,
    top_k_weights,
    gate_up_proj,
    down_proj,
    swiglu_limit=None,
    swiglu_alpha=None,
    gate_up_proj_bias=None,
    down_proj_bias=None,
    interleaved=False,
):
    S, I, E = top_k_index.numel(), down_proj.shape[2], down_proj.shape[0]
    index = top_k_index.new_empty(S, dtype=torch.int32)
    return x.new_empty(x.shape), x.new_empty(S, I), x.new_empty(S, I), index, index.new_empty(E + 1)


@torch.library.custom_op("swiglu::moe_backward", mutates_args=())
def moe_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    order: torch.Tensor,
    expert_start: torch.Tensor,
    need_grad_x: bool = True,
    need_grad_top_k_weights: bool = True,
    need_grad_gate_up_proj: bool = True,
    need_grad_down_proj: bool = True,
    swiglu_limit: float | None = None,
    swiglu_alpha: float | None = None,
    interleaved: bool = False,
    need_grad_gate_up_proj_bias: bool = False,
    down_proj_bias: torch.Tensor | None = None,
    need_grad_down_proj_bias: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(grad_x, grad_top_k_weights, grad_gate_up_proj, grad_down_proj, grad_gate_up_proj_bias,
    grad_down_proj_bias)`` by the Triton kernels, from ``moe_forward``'s saved outputs; a
    gradient not needed is an empty [0] tensor and its GEMM does not run. Not differentiable
    again: a double backward takes the reference formula (``_double_backward``)."""
    needs = (
        need_grad_x,
        need_grad_top_k_weights,
        need_grad_gate_up_proj,
        need_grad_down_proj,
        need_grad_gate_up_proj_bias,
        need_grad_down_proj_bias,
    )
    grads = _run_backward(
        grad_out,
        (x, top_k_index, top_k_weights, gate_up_proj, down_proj, gate, up, order, expert_start),
        needs,
        limit=swiglu_limit,
        alpha=swiglu_alpha,
        interleaved=interleaved,
        down_proj_bias=down_proj_bias,
    )
    like = (x, top_k_weights, gate_up_proj, down_proj, x, x)
    return tuple(g if need else t.new_empty(0) for g, t, need in zip(grads, like, needs))


def _run_backward(
    grad_out,
    saved,
    needs,
    reuse: bool = False,
    limit: float | None = None,
    alpha: float | None = None,
    interleaved=False,
    down_proj_bias=None,
):
    """The Triton backward from the forward's saved tensors (inputs, gate, up, order, expert_start):
    six gradients, the last two the biases' (gate_up_proj's, down_proj's: None unless ``needs``
    has a fifth / sixth flag set); ``reuse``: gate/up released after their reader; ``limit``,
    ``alpha``, ``interleaved``, ``down_proj_bias``: the forward's."""
    from .kernels.moe import Routing
    from .kernels.moe import moe_backward as run

    x, idx, w, gu, dp, gate, up, order, expert_start = saved
    routing = Routing(idx, gu.shape[0], saved=(order, expert_start))
    bias_grad, down_bias_grad = (bool(n) for n in (*needs[4:6], False, False)[:2])
    with on_device(x.device):
        grads = run(
            grad_out.contiguous(),
            x,
            idx,
            w,
            gu,
            dp,
            gate,
            up,
            routing=routing,
            needs=tuple(needs[:4]),
            reuse=reuse,
            swiglu_limit=limit,
            swiglu_alpha=alpha,
            interleaved=interleaved,
            bias_grad=bias_grad,
            down_proj_bias=down_proj_bias,
            down_bias_grad=down_bias_grad,
        )
    return (*grads, None, None) if len(grads) == 4 else grads


@moe_backward.register_fake
def _moe_backward_fake(
    grad_out,
    x,
    top_k_index,
    top_k_weights,
    gate_up_proj,
    down_proj,
    gate,
    up,
    order,
    expert_start,
    need_grad_x=True,
    need_grad_top_k_weights=True,
    need_grad_gate_up_proj=True,
    need_grad_down_proj=True,
    swiglu_limit=None,
    swiglu_alpha=None,
    interleaved=False,
    need_grad_gate_up_proj_bias=False,
    down_proj_bias=None,
    need_grad_down_proj_bias=False,
):
    needs = (
        need_grad_x,
        need_grad_top_k_weights,
        need_grad_gate_up_proj,
        need_grad_down_proj,
        need_grad_gate_up_proj_bias,
        need_grad_down_proj_bias,
    )
    # The weight gradients as the kernels allocate them: empty_like, the weight's own strides.
    like = (
        x.new_empty(x.shape),
        top_k_weights.new_empty(top_k_weights.shape),
        torch.empty_like(gate_up_proj),
        torch.empty_like(down_proj),
        x.new_empty(gate_up_proj.shape[:2]),
        x.new_empty(down_proj.shape[:2]),
    )
    return tuple(t if need else t.new_empty(0) for t, need in zip(like, needs))


def _save_op_context(ctx, inputs, kept=()):
    """Both forward ops' context: their inputs (x, top_k_index, top_k_weights, gate_up_proj,
    down_proj, swiglu_limit, swiglu_alpha, gate_up_proj_bias, down_proj_bias, interleaved; trailing
    defaults may be left out) saved as the four weights' inputs, ``kept`` (the Triton forward's
    outputs for its backward) and both biases (down_proj's where read: ``_kept_down_bias``)."""
    bgu, bd = (*inputs[7:9], None, None)[:2]
    ctx.save_for_backward(*inputs[:5], *kept, bgu, _kept_down_bias(ctx, bd, 8))
    ctx.limit = inputs[5] if len(inputs) > 5 else None
    ctx.alpha = inputs[6] if len(inputs) > 6 else None
    ctx.interleaved = bool(inputs[9]) if len(inputs) > 9 else False
    ctx.bias_at, ctx.n_biases = 7, 2


def _moe_setup_context(ctx, inputs, output):
    _save_op_context(ctx, inputs, output[1:])
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)


def _kept_down_bias(ctx, down_proj_bias, at: int):
    """down_proj's bias where the backward reads it (top_k_weights' gradient, or its own under a
    double backward; ``at``: its input index), else None: changing it in place after the forward
    then breaks no backward that does not read it."""
    needs = ctx.needs_input_grad
    return down_proj_bias if needs[2] or (len(needs) > at and needs[at]) else None


def _gradients(ctx, grad_out, direct: bool, owned=None):
    """Both carriers' backward: the six gradients autograd wants (x, top_k_weights, gate_up_proj,
    down_proj, gate_up_proj's bias, down_proj's bias), by the kernels (``direct``) or by the
    backward op. ``owned``: weak references to the forward's own gate/up (``reuse_saved_buffers``):
    when the saved ones are those, whole allocations, their memory is released after their reader
    (the dense op consumes its buffers likewise, ``ops._SwiGLUFunction``); a second backward then raises."""
    wanted = _wanted(ctx)
    if grad_out is None or not any(wanted):
        return (None,) * 6
    if getattr(ctx, "consumed", False):
        raise RuntimeError(_SECOND_BACKWARD)
    saved = ctx.saved_tensors
    core, bgu, bd = saved[:9], saved[9], saved[10]
    if torch.is_grad_enabled():
        grads = _double_backward(core[:5], grad_out, wanted, ctx.limit, ctx.alpha, (bgu, bd), ctx.interleaved)
    elif direct:
        consume = owns_saved_buffers(owned, core[5], core[6])  # gate, up
        ctx.consumed = consume
        grads = _run_backward(grad_out, core, wanted, consume, ctx.limit, ctx.alpha, ctx.interleaved, bd)
    else:
        grads = moe_backward(grad_out, *core, *wanted[:4], ctx.limit, ctx.alpha, ctx.interleaved, wanted[4], bd, wanted[5])
    return tuple(g if n else None for g, n in zip(grads, wanted))


def _wanted(ctx) -> tuple:
    """Which of (x, top_k_weights, gate_up_proj, down_proj) and the biases autograd wants a
    gradient for (the op's inputs are those with top_k_index second; ``ctx.bias_at``: where the
    bias inputs start, ``ctx.n_biases`` of them)."""
    needs = ctx.needs_input_grad
    at, n = getattr(ctx, "bias_at", len(needs)), getattr(ctx, "n_biases", 1)
    return needs[0], needs[2], needs[3], needs[4], *(needs[at + i] if at + i < len(needs) else False for i in range(n))


_SECOND_BACKWARD = (
    "swiglu_moe: a second backward through a graph made with reuse_saved_buffers=True: the first one freed "
    "the saved gate/up projections. To backpropagate a graph more than once (also split "
    "backward passes), use reuse_saved_buffers=False (the default) and retain_graph=True"
)


def _double_backward(inputs, grad_out, wanted, limit=None, alpha=None, biases=(), interleaved=False):
    """create_graph=True: the reference formula's gradients in differentiable ops (the kernels'
    have no graph), from the saved inputs, which carry the graph back to the caller's tensors.
    ``biases``: gate_up_proj's (and down_proj's) bias or None, ``wanted`` a flag for each after
    the four weights'."""
    x, idx, w, gu, dp = inputs
    bgu, bd = (*biases, None, None)[:2]
    with torch.autocast(x.device.type, enabled=False):
        out = moe_reference(x, idx, w, gu, dp, limit, alpha, bgu, bd, interleaved)
    leaves = (x, w, gu, dp, *biases)
    grads = iter(torch.autograd.grad(out, [t for t, n in zip(leaves, wanted) if n], grad_out, create_graph=True))
    return tuple(next(grads) if n else None for n in wanted)


def _moe_op_backward(ctx, grad_out, *unused):
    gx, gw, ggu, gdp, gbgu, gbd = _gradients(ctx, grad_out, direct=False)
    return gx, None, gw, ggu, gdp, None, None, gbgu, gbd, None  # none for swiglu_limit, swiglu_alpha, interleaved


moe_forward.register_autograd(_moe_op_backward, setup_context=_moe_setup_context)


class _MoEFunction(torch.autograd.Function):
    """The eager carrier on plain tensors outside dispatch modes: the custom ops' arithmetic
    without their Python layers between autograd and the launches (the host is the bound at
    small token counts). torch.compile and dispatch modes take the custom ops."""

    @staticmethod
    def forward(
        ctx,
        x,
        top_k_index,
        top_k_weights,
        gate_up_proj,
        down_proj,
        reuse_saved_buffers=False,
        out_shape=None,
        limit=None,
        alpha=None,
        gate_up_proj_bias=None,
        down_proj_bias=None,
        interleaved=False,
    ):
        # out_shape: the caller's shape of x, out allocated so (a view of it would be the module's
        # output, and FSDP2's backward hook on an output is lost by an in-place op on a view).
        out, *kept = _run_forward(
            x,
            top_k_index,
            top_k_weights,
            gate_up_proj,
            down_proj,
            out_shape,
            limit,
            alpha,
            gate_up_proj_bias,
            interleaved,
            down_proj_bias,
        )
        bd = _kept_down_bias(ctx, down_proj_bias, 10)
        ctx.save_for_backward(x, top_k_index, top_k_weights, gate_up_proj, down_proj, *kept, gate_up_proj_bias, bd)
        ctx.limit, ctx.alpha, ctx.interleaved, ctx.bias_at, ctx.n_biases = limit, alpha, interleaved, 9, 2
        ctx.set_materialize_grads(False)
        # What the backward may consume: the forward's own gate/up, recognized by identity.
        ctx.owned = (weakref.ref(kept[0]), weakref.ref(kept[1])) if reuse_saved_buffers else None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        # Compiled autograd traces this backward (the op is opaque to it); dispatch modes
        # (FlopCounterMode...) see the op where the launches are invisible to them; a batched
        # grad_out (``legacy_batched``) takes the op, once per example.
        direct = not (torch.compiler.is_compiling() or dispatch_mode_active() or legacy_batched(grad_out))
        if grad_out is not None and grad_out.dim() != 2:
            grad_out = grad_out.reshape(-1, grad_out.shape[-1])
        gx, gw, ggu, gdp, gbgu, gbd = _gradients(ctx, grad_out, direct, ctx.owned)
        return gx, None, gw, ggu, gdp, None, None, None, None, gbgu, gbd, None


def _moe_forward_flops(x_shape, top_k_index_shape, *args, out_shape=None, **kwargs) -> int:
    """Three GEMMs (gate, up, down) of 2 H I FLOPs per routed pair."""
    return 3 * _gemm_flops(x_shape, top_k_index_shape, args[2])  # args: top_k_weights, gate_up_proj, down_proj shapes


def _gemm_flops(x_shape, top_k_index_shape, down_proj_shape) -> int:
    """One [pairs, H] x [H, I]-sized GEMM over all routed pairs: 2 H I FLOPs per pair."""
    pairs = 1
    for d in top_k_index_shape:
        pairs *= d
    return 2 * pairs * x_shape[-1] * down_proj_shape[-1]


def _moe_backward_flops(
    grad_out_shape,
    x_shape,
    top_k_index_shape,
    top_k_weights_shape,
    gate_up_proj_shape,
    down_proj_shape,
    *args,
    out_shape=None,
    **kwargs,
) -> int:
    """The GEMMs the requested gradients run, 2 H I FLOPs each per routed pair: g = grad_out @
    down_proj (always), grad_x's two, grad_gate_up_proj's two, grad_down_proj's one (six in all).
    ``args``: the saved gate, up, order, expert_start, then the need_grad_* flags (trailing
    defaults may be left out by the dispatcher)."""
    names = ("need_grad_x", "need_grad_top_k_weights", "need_grad_gate_up_proj", "need_grad_down_proj")
    flags = list(args[4:8])
    needs = flags + [kwargs.get(n, True) for n in names[len(flags) :]]
    return _backward_gemm_flops(x_shape, top_k_index_shape, down_proj_shape, needs)


def _backward_gemm_flops(x_shape, top_k_index_shape, down_proj_shape, needs) -> int:
    """Both backward ops' count: 2 H I FLOPs per routed pair and GEMM, g always, then grad_x's
    two, grad_gate_up_proj's two, grad_down_proj's one as ``needs`` (x, top_k_weights,
    gate_up_proj, down_proj) asks; the biases' flags after them add no GEMM."""
    need_x, _, need_gu, need_dp = (bool(n) for n in needs[:4])
    return _gemm_flops(x_shape, top_k_index_shape, down_proj_shape) * (1 + 2 * need_x + 2 * need_gu + need_dp)


add_flop_formula("moe_forward", _moe_forward_flops)
add_flop_formula("moe_backward", _moe_backward_flops)


# --------------------------------------------------------------------------- the reference as ops (torch.compile)


@torch.library.custom_op("swiglu::moe_reference", mutates_args=())
def moe_reference_op(
    x: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    swiglu_limit: float | None = None,
    swiglu_alpha: float | None = None,
    gate_up_proj_bias: torch.Tensor | None = None,
    down_proj_bias: torch.Tensor | None = None,
    interleaved: bool = False,
) -> torch.Tensor:
    """``moe_reference`` as one op: what ``swiglu_moe(impl="reference")`` runs under
    torch.compile, where its loop over the experts present would need the routing's values.
    Contiguous out (its fake's layout, whatever x's strides)."""
    return moe_reference(
        x,
        top_k_index,
        top_k_weights,
        gate_up_proj,
        down_proj,
        swiglu_limit,
        swiglu_alpha,
        gate_up_proj_bias,
        down_proj_bias,
        interleaved,
    ).contiguous()


@moe_reference_op.register_fake
def _moe_reference_fake(
    x,
    top_k_index,
    top_k_weights,
    gate_up_proj,
    down_proj,
    swiglu_limit=None,
    swiglu_alpha=None,
    gate_up_proj_bias=None,
    down_proj_bias=None,
    interleaved=False,
):
    return x.new_empty(x.shape)


@torch.library.custom_op("swiglu::moe_reference_backward", mutates_args=())
def moe_reference_backward(
    grad_out: torch.Tensor,
    top_k_index: torch.Tensor,
    inputs: list[torch.Tensor],
    needs: list[bool],
    swiglu_limit: float | None = None,
    swiglu_alpha: float | None = None,
    gate_up_proj_bias: torch.Tensor | None = None,
    down_proj_bias: torch.Tensor | None = None,
    interleaved: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``moe_reference``'s gradients for ``inputs`` = [x, top_k_weights, gate_up_proj,
    down_proj], then the two biases' (an empty [0] tensor where ``needs`` says no or has no
    flag), by hand: an op's body runs below autograd. The reference's loop and dtypes; sums in
    another order than autograd's, so not its bits."""
    x, top_k_weights, gate_up_proj, down_proj = inputs
    bgu, bd = gate_up_proj_bias, down_proj_bias
    need_x, need_w, need_gu, need_dp, need_bgu, need_bd = (*needs, False, False)[:6]
    need_bgu, need_bd = need_bgu and bgu is not None, need_bd and bd is not None
    grads = [torch.zeros_like(t) if n else t.new_empty(0) for t, n in zip(inputs, needs)]
    gx, gw, ggu, gdp = grads
    gbgu = torch.zeros_like(bgu) if need_bgu else x.new_empty(0)
    gbd = torch.zeros_like(bd) if need_bd else x.new_empty(0)
    for e, pos, tok in _expert_rows(top_k_index, gate_up_proj.shape[0]):
        xe, we = x[tok], top_k_weights[tok, pos, None]
        gate_raw, up_raw = _split(_biased(F.linear(xe, gate_up_proj[e]), None if bgu is None else bgu[e]), interleaved)
        gate, up = _clamped(gate_raw, up_raw, swiglu_limit)
        if swiglu_alpha is None:
            act, up1 = F.silu(gate), up
        else:  # _glu's gpt-oss form: h = (up + 1) * act, act = gate * sigmoid(alpha * gate)
            sig = torch.sigmoid(gate * swiglu_alpha)
            act, up1 = gate * sig, up + 1.0
        h = act * up1
        g = grad_out[tok].to(torch.promote_types(h.dtype, we.dtype))  # (y * we)'s gradient
        if need_w:
            y = _biased(F.linear(h, down_proj[e]), None if bd is None else bd[e])
            gw.index_put_((tok, pos), (g * y).sum(-1).to(gw.dtype), accumulate=True)
        gy = (g * we).to(h.dtype)
        if need_dp:
            gdp[e] = gy.T @ h
        if need_bd:
            gbd[e] = gy.sum(0)
        if need_x or need_gu:
            gh = gy @ down_proj[e]
            if swiglu_alpha is None:
                d_gate = torch.ops.aten.silu_backward(gh * up, gate)
            else:  # autograd's steps through _glu: the product, then sigmoid(alpha * gate) and gate
                d_act = gh * up1
                d_gate = d_act * sig + torch.ops.aten.sigmoid_backward(d_act * gate, sig) * swiglu_alpha
            d_up = gh * act
            if swiglu_limit is not None:  # clamp's gradient: through where the input was in range
                d_gate = torch.where(gate_raw <= swiglu_limit, d_gate, 0)
                d_up = torch.where(up_raw.abs() <= swiglu_limit, d_up, 0)
            ggl = _joined(d_gate, d_up, interleaved)
            if need_gu:
                ggu[e] = ggl.T @ xe
            if need_bgu:
                gbgu[e] = ggl.sum(0)
            if need_x:
                gx.index_add_(0, tok, ggl @ gate_up_proj[e])
    return (*grads, gbgu, gbd)


@moe_reference_backward.register_fake
def _moe_reference_backward_fake(
    grad_out,
    top_k_index,
    inputs,
    needs,
    swiglu_limit=None,
    swiglu_alpha=None,
    gate_up_proj_bias=None,
    down_proj_bias=None,
    interleaved=False,
):
    flags = (*needs, False, False)[4:6]
    biases = tuple(
        torch.empty_like(b) if n and b is not None else inputs[0].new_empty(0)
        for b, n in zip((gate_up_proj_bias, down_proj_bias), flags)
    )
    return (*(torch.empty_like(t) if n else t.new_empty(0) for t, n in zip(inputs, needs)), *biases)


def _moe_reference_setup_context(ctx, inputs, output):
    _save_op_context(ctx, inputs)


def _moe_reference_op_backward(ctx, grad_out):
    wanted = _wanted(ctx)
    if grad_out is None or not any(wanted):
        return (None,) * 10
    x, idx, w, gu, dp, bgu, bd = ctx.saved_tensors
    limit, alpha, il = ctx.limit, ctx.alpha, ctx.interleaved
    if torch.is_grad_enabled():
        grads = _double_backward((x, idx, w, gu, dp), grad_out, wanted, limit, alpha, (bgu, bd), il)
    else:
        needs = list(wanted) if any(wanted[4:]) else list(wanted[:4])
        grads = moe_reference_backward(grad_out, idx, [x, w, gu, dp], needs, limit, alpha, bgu, bd, il)
    gx, gw, ggu, gdp, gbgu, gbd = (g if n else None for g, n in zip(grads, wanted))
    return gx, None, gw, ggu, gdp, None, None, gbgu, gbd, None


moe_reference_op.register_autograd(_moe_reference_op_backward, setup_context=_moe_reference_setup_context)
add_flop_formula("moe_reference", _moe_forward_flops)
add_flop_formula(
    "moe_reference_backward",
    lambda grad_out_shape, top_k_index_shape, input_shapes, needs, *a, **kw: _backward_gemm_flops(
        input_shapes[0], top_k_index_shape, input_shapes[3], needs
    ),
)
