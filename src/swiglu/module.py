"""``SwiGLUMLP``: a drop-in Llama/Hermes MLP block whose backward is ours; ``SwiGLUExperts``:
the routed experts of a mixture-of-experts layer.

Usage in a training loop::

    mlp = swiglu.SwiGLUMLP(4096, 14336, device="cuda", dtype=torch.bfloat16)
    loss = loss_fn(mlp(x), target); loss.backward()   # Triton backward on H100/H200
    optimizer.step(); optimizer.zero_grad()

``measure_step_time`` times one training step against the plain module (``python3 -m
swiglu.module --tokens 4096`` on a GPU, ``data/validation/h200_step_time.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from .checks import FLOAT_DTYPES, check_bool
from .moe import check_swiglu_alpha, check_swiglu_limit, swiglu_moe
from .ops import IMPLS, _check_impl, _renamed, _swiglu_mlp, resolve_impl
from .workloads import HIDDEN_SIZE, INTERMEDIATE_SIZE


class SwiGLUMLP(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` with the fused backward, as a module.

    Parameters as in Llama/Hermes checkpoints (their MLP state dict loads unchanged):
    ``gate_proj.weight`` [I, H], ``up_proj.weight`` [I, H], ``down_proj.weight`` [H, I], held by
    ``nn.Linear(bias=False)`` submodules with ``nn.Linear``'s initialisation.

    Args:
        hidden_size, intermediate_size: H and I, positive ints.
        impl, save_activated_gate, reuse_saved_buffers: as ``swiglu.swiglu_mlp`` (``backward_impl``
            is impl's former name, DeprecationWarning).
        device, dtype: of the weights (dtype floating); the input must match them.
    Raises TypeError for a size that is not an int or a non-floating dtype; ValueError for a
    non-positive size, an unknown ``impl`` or a CUDA device without a GPU.

    forward(x): [..., H] -> [..., H]; errors as ``swiglu.swiglu_mlp``, with x and the weights
    checked against hidden_size and intermediate_size.

    The fused op reads the three weights directly, so the projections' own forward never runs.
    Where that would change the result (a projection that is not exactly ``nn.Linear``, has a
    weight that is a tensor subclass such as torchao's quantized weights, a bias, hooks other than
    DTensor's parallel styles', or parametrizations other than of its weight) the module runs the
    plain formula through the projections as modules and warns once per instance,
    naming the projection and the reason; under ``torch.func`` transforms it does so silently. The
    rules in full: docs/usage.md.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        *,
        impl: str = "auto",
        save_activated_gate: bool = False,
        reuse_saved_buffers: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        backward_impl: str | None = None,
    ) -> None:
        super().__init__()
        device = _check_module_args({"hidden_size": hidden_size, "intermediate_size": intermediate_size}, device, dtype)
        if backward_impl is not None:
            impl = _renamed(backward_impl, impl)
        _check_impl(impl)
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        check_bool("save_activated_gate", save_activated_gate)
        self.impl = impl
        self.save_activated_gate = save_activated_gate
        check_bool("reuse_saved_buffers", reuse_saved_buffers)
        self.reuse_saved_buffers = reuse_saved_buffers
        kw = dict(bias=False, device=device, dtype=dtype)
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)
        self._plain_path_warned = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``down_proj(silu(gate_proj(x)) * up_proj(x))`` for x [..., hidden_size] in the weights'
        dtype and device (or under ``torch.autocast``); returns [..., hidden_size]. The fused
        custom op with our backward (``swiglu.swiglu_mlp``), or the projections called as
        modules where hooks or adapters need them (class docstring; one UserWarning). Raises
        ``TypeError``/``ValueError`` as ``swiglu.swiglu_mlp``, naming the argument."""
        gate_proj, up_proj, down_proj = self.gate_proj, self.up_proj, self.down_proj
        if not (_fusable_fast(gate_proj) and _fusable_fast(up_proj) and _fusable_fast(down_proj)):
            reason = _plain_path_reason(self)
            if reason:
                return self._plain_forward(x, reason)
        return _swiglu_mlp(
            x,
            gate_proj.weight,
            up_proj.weight,
            down_proj.weight,
            self.impl,
            self.save_activated_gate,
            getattr(self, "reuse_saved_buffers", False),
            self.hidden_size,
            self.intermediate_size,
        )

    def _plain_forward(self, x: torch.Tensor, reason: str) -> torch.Tensor:
        if not getattr(self, "_plain_path_warned", False):
            self._plain_path_warned = True
            warnings.warn(
                f"SwiGLUMLP runs the plain PyTorch formula (its projections called as modules, no fused backward): {reason}",
                UserWarning,
                stacklevel=3,
            )
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.hidden_size:
            raise ValueError(
                f"x must be a tensor of shape [..., {self.hidden_size}] (hidden_size), got "
                f"{list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}"
            )
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    @property
    def backward_impl(self) -> str:
        """The former name of ``impl`` (read-only)."""
        return self.impl

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
            f"impl={self.impl!r}, save_activated_gate={self.save_activated_gate}, "
            f"reuse_saved_buffers={getattr(self, 'reuse_saved_buffers', False)}"
        )


class SwiGLUExperts(nn.Module):
    """The routed experts of a mixture-of-experts layer, as a module: ``swiglu.swiglu_moe`` over
    its own weights, for models built outside transformers (the router stays the caller's).

    Parameters in transformers' experts layout (a ``Qwen3MoeExperts``/``MixtralExperts`` state
    dict loads unchanged): ``gate_up_proj`` [E, 2I, H] (the gate rows, then the up rows) and
    ``down_proj`` [E, H, I], each expert initialised as ``nn.Linear`` would its weight.

    Args:
        num_experts, hidden_size, intermediate_size: E, H and I (intermediate_size per expert),
            positive ints.
        impl, reuse_saved_buffers, swiglu_limit, swiglu_alpha: as ``swiglu.swiglu_moe``.
        device, dtype: of the weights (dtype floating); the input must match them.
    Raises TypeError for a size that is not an int, a non-floating dtype or a non-float
    ``swiglu_limit``/``swiglu_alpha``; ValueError for a non-positive size, limit or alpha, an
    unknown ``impl`` or a CUDA device without a GPU.

    forward(x, top_k_index, top_k_weights): x [..., H], the router's top-k expert ids and weights
    [..., k] -> [..., H]; errors as ``swiglu.swiglu_moe``.
    """

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        *,
        impl: str = "auto",
        reuse_saved_buffers: bool = False,
        swiglu_limit: float | None = None,
        swiglu_alpha: float | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        sizes = {"num_experts": num_experts, "hidden_size": hidden_size, "intermediate_size": intermediate_size}
        device = _check_module_args(sizes, device, dtype)
        _check_impl(impl)
        check_bool("reuse_saved_buffers", reuse_saved_buffers)
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.impl, self.reuse_saved_buffers = impl, reuse_saved_buffers
        self.swiglu_limit = check_swiglu_limit(swiglu_limit)
        self.swiglu_alpha = check_swiglu_alpha(swiglu_alpha)
        kw = dict(device=device, dtype=dtype)
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size, **kw))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size, **kw))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Each expert's matrices as ``nn.Linear`` initialises a weight: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
        with torch.no_grad():
            for w in (self.gate_up_proj, self.down_proj):
                bound = 1 / math.sqrt(w.shape[-1])
                w.uniform_(-bound, bound)

    def forward(self, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        """``swiglu.swiglu_moe(x, top_k_index, top_k_weights, gate_up_proj, down_proj)`` with the
        module's ``impl``, ``reuse_saved_buffers``, ``swiglu_limit`` and ``swiglu_alpha``."""
        return swiglu_moe(
            x,
            top_k_index,
            top_k_weights,
            self.gate_up_proj,
            self.down_proj,
            impl=self.impl,
            reuse_saved_buffers=self.reuse_saved_buffers,
            swiglu_limit=self.swiglu_limit,
            swiglu_alpha=self.swiglu_alpha,
        )

    def extra_repr(self) -> str:
        act = "".join(f", {n}={v}" for n, v in (("swiglu_limit", self.swiglu_limit), ("swiglu_alpha", self.swiglu_alpha)) if v)
        return (
            f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
            f"intermediate_size={self.intermediate_size}, impl={self.impl!r}, reuse_saved_buffers={self.reuse_saved_buffers}"
            f"{act}"
        )


def _check_module_args(sizes: dict, device, dtype) -> torch.device | None:
    """The modules' constructor checks: positive int sizes, a floating dtype (or None), a device
    that exists here; returns the device as a ``torch.device`` (or None)."""
    for label, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"{label} must be a positive int, got {size!r} ({type(size).__name__})")
        if size <= 0:
            raise ValueError(f"{label} must be a positive int, got {size!r}")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {', '.join(map(str, FLOAT_DTYPES))} (the weights' dtype) or None, got {dtype!r}")
    if device is None:
        return None
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be a torch.device, a device string or None, got {device!r}") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={str(device)!r} but torch finds no CUDA GPU here (torch.cuda.is_available() is False); use device='cpu'"
        )
    return device


def _is_parallel_style_hook(fn) -> bool:
    # DTensor's ColwiseParallel/RowwiseParallel (distribute_module) hooks on the projections: the
    # fused plan replaces them with the MLP-level preparation (swiglu.parallel).
    fn = getattr(fn, "func", fn)  # functools.partial
    path = getattr(getattr(fn, "__code__", None), "co_filename", "").replace("\\", "/")
    return "torch/distributed/tensor/" in path


def forward_replaced(module: nn.Module) -> bool:
    """Whether ``module``'s forward is replaced on the instance (``module.forward = ...``), as
    accelerate's hooks do (``add_hook_to_module``: offloading, ``device_map``, ``cpu_offload``)
    instead of registering torch hooks: the fused op, reading the weights directly, would skip it."""
    return "forward" in module.__dict__ or "_hf_hook" in module.__dict__


def _fusable_fast(proj: nn.Module) -> bool:
    # The common case in a few attribute reads: a plain nn.Linear without bias or hooks whose
    # weight is a plain tensor. False only means "ask the full check" (parallel-style hooks,
    # parametrized weights, DTensor and tracing weights pass there).
    if type(proj) is not nn.Linear:
        return False
    params = proj._parameters  # read directly: Module.__getattr__ costs more than the whole check
    weight_type = type(params.get("weight"))
    return (
        (weight_type is nn.Parameter or weight_type is torch.Tensor)
        and params.get("bias", False) is None
        and not forward_replaced(proj)
        and not (proj._forward_hooks or proj._forward_pre_hooks or proj._backward_hooks or proj._backward_pre_hooks)
    )


# Tensor subclasses the fused op serves: DTensor (its sharding rules) and the tensors that stand
# for plain ones while torch.compile / torch.export trace (FakeTensor, FunctionalTensor).
_SERVED_SUBCLASSES = (
    ("torch.distributed.tensor", "DTensor"),
    ("torch._subclasses.fake_tensor", "FakeTensor"),
    ("torch._subclasses.functional_tensor", "FunctionalTensor"),
)


def _weight_reason(name: str, weight) -> str | None:
    """Why the fused op cannot read ``weight`` as the matrix itself (None: it can): a tensor
    subclass, such as torchao's quantized weights (``quantize_`` keeps the ``nn.Linear`` and
    swaps its weight), whose own dispatch computes the projection."""
    kind = type(weight)
    if kind is nn.Parameter or kind is torch.Tensor:
        return None
    for module, attr in _SERVED_SUBCLASSES:
        # Looked up where already imported: a weight cannot be of a class never imported.
        if kind is getattr(sys.modules.get(module), attr, None):
            return None
    return (
        f"{name}.weight is a {kind.__module__}.{kind.__qualname__}, not a plain tensor (a quantized weight, "
        "e.g. torchao's quantize_, computes the projection in its own dispatch, which the fused op bypasses)"
    )


def projection_reason(name: str, proj: nn.Module, *, parallel_style_hooks: bool = True) -> str | None:
    """Why the fused op, which reads ``proj.weight`` directly, would bypass something projection
    ``proj`` does (None: it would not): not exactly ``nn.Linear`` (a parametrized weight is fine),
    parametrizations of more than its weight, a weight that is a tensor subclass (a quantized
    weight; ``nn.Parameter``, DTensor and the fake/functional tensors of tracing are fine), a
    bias, hooks (DTensor parallel styles' pass when ``parallel_style_hooks``: ``swiglu.parallel``
    prepares the MLP's input and output itself), or a forward replaced on the instance. The one
    check of ``SwiGLUMLP`` and the HF integration."""
    if _fusable_fast(proj):  # the usual case, in a few attribute reads (it runs at every forward)
        return None
    kind = parametrize.type_before_parametrizations(proj)
    if kind is not nn.Linear:
        return (
            f"{name} is a {kind.__module__}.{kind.__qualname__}, not a plain nn.Linear (an adapter, quantized or "
            "float8 Linear, or a wrapper computes more than x @ weight.T)"
        )
    if parametrize.is_parametrized(proj):
        if set(proj.parametrizations) - {"weight"}:
            return f"{name} has parametrizations of {sorted(set(proj.parametrizations) - {'weight'})}"
        # The stored original(s), not proj.weight, which would run the parametrization.
        weights = proj.parametrizations["weight"]._parameters.values()
    else:
        weights = (getattr(proj, "weight", None),)
    for weight in weights:
        reason = _weight_reason(name, weight)
        if reason:
            return reason
    if proj.bias is not None:
        return f"{name} has a bias; the fused op has none"
    for kind_, hooks in (
        ("forward pre-hook", proj._forward_pre_hooks),
        ("forward hook", proj._forward_hooks),
        ("backward hook", proj._backward_hooks),
        ("backward pre-hook", proj._backward_pre_hooks),
    ):
        if any(not (parallel_style_hooks and _is_parallel_style_hook(h)) for h in hooks.values()):
            return f"{name} has a {kind_} (e.g. a tensor-parallel plan, PEFT), which the fused op would not run"
    if forward_replaced(proj):
        return (
            f"{name}'s forward is replaced on the instance (e.g. accelerate's offload or device hooks, "
            "which load the weight when it runs)"
        )
    return None


def _plain_path_reason(mlp: "SwiGLUMLP") -> str | None:
    """Why the fused op would bypass something ``mlp``'s projections do (None: it would not)."""
    for name in ("gate_proj", "up_proj", "down_proj"):
        reason = projection_reason(name, getattr(mlp, name))
        if reason:
            return reason
    return None


class PlainSwiGLUMLP(nn.Module):
    """The same MLP from plain ``nn.Linear`` layers and PyTorch autograd: the baseline and the
    test oracle (same parameter names as ``SwiGLUMLP``)."""

    def __init__(self, hidden_size: int, intermediate_size: int, *, device=None, dtype=None) -> None:
        super().__init__()
        kw = dict(bias=False, device=device, dtype=dtype)
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def _median_step_ms(module: nn.Module, x: torch.Tensor, grad_output: torch.Tensor, warmup: int, iters: int) -> float:
    times = []
    for i in range(warmup + iters):
        for p in module.parameters():
            p.grad = None  # each step allocates fresh gradients, as after zero_grad(set_to_none=True)
        x.grad = None
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        module(x).backward(grad_output)
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure_step_time(
    hidden_size: int = HIDDEN_SIZE,
    intermediate_size: int = INTERMEDIATE_SIZE,
    tokens: int = 4096,
    *,
    warmup: int = 3,
    iters: int = 10,
    impl: str = "auto",
    device: str = "cuda",
    seed: int = 0,
) -> dict:
    """Median forward+backward step time of ``SwiGLUMLP`` vs ``PlainSwiGLUMLP``, bf16, same weights.

    One step = ``module(x).backward(grad_output)`` with x [tokens, H] requiring grad and all
    gradients set to None first, timed with CUDA events around the step (no L2 flush), median
    of ``iters`` after ``warmup``. The modules are timed one after the other, each holding
    only its own gradients (weights are shared). Memory at full size (H=16384, I=53248,
    T=4096): 5.2 GB of weights + 5.2 GB of gradients plus ~2 GB of activations.

    Returns a dict: hidden_size, intermediate_size, tokens, impl (the resolved backend),
    ms_swiglu, ms_plain, speedup (ms_plain / ms_swiglu), tflops_swiglu, tflops_plain (the
    step's 3 forward + 6 backward GEMMs: 18 * T * H * I FLOPs), device name, torch version.

    Raises: ValueError when CUDA is not available or sizes are not positive.
    """
    if not torch.cuda.is_available():
        raise ValueError("measure_step_time needs a CUDA GPU (device='cuda')")
    if tokens <= 0:
        raise ValueError(f"tokens must be positive, got {tokens}")
    torch.manual_seed(seed)
    dtype = torch.bfloat16
    ours = SwiGLUMLP(hidden_size, intermediate_size, impl=impl, device=device, dtype=dtype)
    x = torch.randn(tokens, hidden_size, device=device, dtype=dtype, requires_grad=True)
    grad_output = torch.randn(tokens, hidden_size, device=device, dtype=dtype)
    resolved = resolve_impl(impl, x, ours.gate_proj.weight)
    ms_swiglu = _median_step_ms(ours, x, grad_output, warmup, iters)
    state = ours.state_dict()
    del ours
    plain = PlainSwiGLUMLP(hidden_size, intermediate_size, device="meta", dtype=dtype)
    plain.load_state_dict(state, assign=True)
    del state
    ms_plain = _median_step_ms(plain, x, grad_output, warmup, iters)
    flops = 18 * tokens * hidden_size * intermediate_size
    return dict(
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        tokens=tokens,
        impl=resolved,
        ms_swiglu=ms_swiglu,
        ms_plain=ms_plain,
        speedup=ms_plain / ms_swiglu,
        tflops_swiglu=flops / (ms_swiglu * 1e-3) / 1e12,
        tflops_plain=flops / (ms_plain * 1e-3) / 1e12,
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        warmup=warmup,
        iters=iters,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Step time of SwiGLUMLP vs the plain nn.Linear MLP (bf16, CUDA)")
    parser.add_argument("--hidden-size", type=int, default=HIDDEN_SIZE)
    parser.add_argument("--intermediate-size", type=int, default=INTERMEDIATE_SIZE)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--impl", default="auto", choices=IMPLS)
    args = parser.parse_args(argv)
    result = measure_step_time(
        args.hidden_size,
        args.intermediate_size,
        args.tokens,
        warmup=args.warmup,
        iters=args.iters,
        impl=args.impl,
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
